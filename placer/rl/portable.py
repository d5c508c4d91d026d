"""A placement policy whose weights do not depend on the graph's size or on the device count (issue 13), so
that one policy can be trained over many graphs and clusters (`placer pretrain`) and place a graph it never saw.

The network is the seq2seq policy of `placer.rl.policy` (a bidirectional LSTM over the groups, an LSTM
decoder with additive attention) with two changes that remove every dimension tied to one problem:

- groups are described by per-graph-normalised features only (`group_features`: op count, compute, bytes,
  position, coarse op families; no adjacency rows, no graph-specific op-type columns);
- devices are not output classes with their own weights. Each device is *scored*: its key is computed from
  its properties (`device_features`, supplied by the caller: speed, memory, links, CPU or not) and from the
  state of the placement being decoded (the compute and memory already put on it, relative to its fair share
  and to its capacity, before and after this group; whether the previous group went there; the fraction of this
  group's input bytes that already lives there), and the logit is v · tanh(q_t + W_k x_d) with q_t the decoder's
  query. The decoder reads the previous device's properties, not its index. Any number of devices works.

`PortableWeights` holds the variables (saved as `policy.npz` + `policy.json`: numpy arrays without pickle and a
versioned JSON header); `PortablePolicy` binds them to one problem and offers the interface `Reinforce`
uses (`sample`, `_log_probs`, `get_state`, `set_state`). What the policy needs from a problem is a
`PolicyInputs`: group features and adjacency (from the Grouping: `group_inputs`), and per device×group the
compute load and memory share (from the problem's costs and cluster: `placer.problem`, which rl does not
import).

Example:
    >>> import numpy as np
    >>> w = PortableWeights(hidden_size=16, attn_size=8)
    >>> G, D = 5, 3
    >>> inp = PolicyInputs(np.random.rand(G, len(GROUP_FEATURES)).astype("float32"), np.zeros((G, G), "float32"),
    ...                    np.full((G, D), 0.2, "float32"), np.full((G, D), 0.01, "float32"),
    ...                    np.zeros((D, len(DEVICE_FEATURES)), "float32"))
    >>> pol = PortablePolicy(w, inp, np.ones((G, D), bool))
    >>> pol.sample(4)[0].shape
    (4, 5)
"""
from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from placer._npz import load_npz
from placer.errors import SearchError
from placer.rl.policy import _NEG, POLICY_DEVICE, PolicyCommon, _glorot, _lstm_bias, _lstm_gates, _lstm_seq, _loop

FORMAT = "placer-portable-policy"
VERSION = 1
# the group features (columns of `group_features`): Grouping's per-graph-normalised scalars, the group's share of
# the graph's compute and persistent bytes (× G: 1 = an average group), and the share of op families
SCALARS = ("ops", "compute", "out_bytes", "persistent_bytes", "bytes_out", "bytes_in", "cpu_only", "position")
FAMILIES = ("matmul", "conv", "elementwise", "reduce", "move", "optimizer", "recurrent", "other")
GROUP_FEATURES = SCALARS + ("compute_share", "persistent_share", "from_prev", "to_next") + tuple(
    f"family:{f}" for f in FAMILIES)
# the device features (columns of PolicyInputs.device): computed by `placer.problem.policy_inputs`
DEVICE_FEATURES = ("speed", "memory", "is_cpu", "link_mean", "link_min", "comm_ratio", "num_devices")
# per (sample, group, device) features of the placement so far, computed while decoding
DYNAMIC = ("load", "load_after", "mem", "mem_after", "prev", "inflow", "group_load", "group_mem")


def _family(op_type: str) -> str:
    t = op_type
    if t.startswith(("Apply", "ResourceApply", "ResourceSparseApply", "SparseApply")) or t in ("AssignAddVariableOp",
                                                                                                "AssignSubVariableOp"):
        return "optimizer"
    if "Conv" in t or "Pool" in t:
        return "conv"
    if t in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "SparseMatMul"):
        return "matmul"
    if t.startswith(("LSTM", "GRU", "BlockLSTM", "CudnnRNN", "While", "TensorList", "TensorArray")):
        return "recurrent"
    if t.startswith(("Sum", "Mean", "Max", "Min", "Prod", "Softmax", "LogSoftmax", "ArgMax", "All", "Any",
                     "SparseSoftmax", "BiasAddGrad", "FusedBatchNorm", "L2Loss")):
        return "reduce"
    if t in ("Reshape", "Transpose", "ConcatV2", "Concat", "Slice", "StridedSlice", "StridedSliceGrad", "Gather",
             "GatherV2", "ResourceGather", "Identity", "IdentityN", "Pack", "Unpack", "Split", "SplitV", "Tile",
             "Pad", "ExpandDims", "Squeeze", "Shape", "ShapeN", "Fill", "ZerosLike", "OnesLike", "Cast",
             "ReadVariableOp", "UnsortedSegmentSum", "ScatterNd", "BroadcastTo", "Select", "SelectV2"):
        return "move"
    if t in ("Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Div", "Neg", "Relu", "Relu6", "ReluGrad", "Relu6Grad",
             "Sigmoid", "SigmoidGrad", "Tanh", "TanhGrad", "Exp", "Log", "Sqrt", "Rsqrt", "Square", "SquaredDifference",
             "Maximum", "Minimum", "BiasAdd", "Erf", "Pow", "Reciprocal", "Gelu", "Softplus", "Elu", "EluGrad",
             "LeakyRelu", "LeakyReluGrad", "Greater", "Less", "Equal", "LogicalAnd", "Cos", "Sin"):
        return "elementwise"
    return "other"


def group_features(grouping) -> np.ndarray:
    """float32[G, len(GROUP_FEATURES)] from a Grouping (its `features`/`feature_names`, `group_cost`, `adjacency`):
    every column normalised per graph, so graphs of any size share one scale."""
    names = list(getattr(grouping, "feature_names", ()) or ())
    F = np.asarray(grouping.features, np.float64)
    G = int(grouping.num_groups)
    col = {n: j for j, n in enumerate(names)}
    missing = [n for n in SCALARS if n not in col]
    if missing:
        raise SearchError(f"the grouping has no feature {missing[0]!r}: a portable policy needs Grouping.feature_names")
    out = [F[:, col[n]] for n in SCALARS]
    cost = np.asarray(grouping.group_cost, np.float64)
    out.append(np.clip(cost / max(cost.sum(), 1e-30) * G, 0, 8) / 8)
    pers = F[:, col["persistent_bytes"]]
    out.append(np.clip(pers / max(pers.mean(), 1e-9), 0, 8) / 8)
    adj = np.asarray(grouping.adjacency, np.float64)
    idx = np.arange(G)
    out.append(np.where(idx > 0, adj[np.maximum(idx - 1, 0), idx], 0.0))          # bytes from the previous group
    out.append(np.where(idx < G - 1, adj[idx, np.minimum(idx + 1, G - 1)], 0.0))   # bytes to the next group
    fam = np.zeros((G, len(FAMILIES)))
    for j, n in enumerate(names):
        if n.startswith("type:"):
            t = n[5:]
            fam[:, FAMILIES.index("other" if t == "other" else _family(t))] += F[:, j]
    return np.concatenate([np.stack(out, 1), fam], 1).astype(np.float32)


@dataclass
class PolicyInputs:
    """Everything a PortablePolicy reads from one problem (G groups, D devices)."""
    group: np.ndarray        # float32[G, len(GROUP_FEATURES)]: `group_features(grouping)`
    adjacency: np.ndarray    # float32[G, G]: bytes from group i to group j, normalised to [0, 1] (Grouping.adjacency)
    load: np.ndarray         # float32[G, D]: the group's compute on device d / (the graph's compute / #accelerators)
    mem: np.ndarray          # float32[G, D]: the group's persistent bytes / device d's memory
    device: np.ndarray       # float32[D, len(DEVICE_FEATURES)]

    def check(self) -> None:
        G, D = self.load.shape
        shapes = {"group": (self.group.shape, (G, len(GROUP_FEATURES))), "adjacency": (self.adjacency.shape, (G, G)),
                  "mem": (self.mem.shape, (G, D)), "device": (self.device.shape, (D, len(DEVICE_FEATURES)))}
        for k, (got, want) in shapes.items():
            if tuple(got) != want:
                raise SearchError(f"policy input {k} has shape {tuple(got)}, expected {want}")


class PortableWeights(tf.Module):
    """The variables of a portable policy: sizes depend only on hidden_size and attn_size."""

    def __init__(self, hidden_size: int = 128, attn_size: int = 32, forget_bias: float = 1.0, seed: int = 0,
                 name: str = "portable_policy"):
        super().__init__(name=name)
        if hidden_size % 2:
            raise SearchError("hidden_size must be even (two encoder directions)")
        self.hidden_size, self.attn_size = int(hidden_size), int(attn_size)
        H, A, h2 = self.hidden_size, self.attn_size, self.hidden_size // 2
        FG, FD, FX = len(GROUP_FEATURES), len(DEVICE_FEATURES), len(DEVICE_FEATURES) + len(DYNAMIC)
        rng = np.random.default_rng(seed)
        with tf.device(POLICY_DEVICE), self.name_scope:
            v = lambda a, n: tf.Variable(a, name=n)  # noqa: E731
            self.enc_fw_wx = v(_glorot(rng, (FG, 4 * h2)), "enc_fw_wx")
            self.enc_fw_wh = v(_glorot(rng, (h2, 4 * h2)), "enc_fw_wh")
            self.enc_fw_b = v(_lstm_bias(h2, forget_bias), "enc_fw_b")
            self.enc_bw_wx = v(_glorot(rng, (FG, 4 * h2)), "enc_bw_wx")
            self.enc_bw_wh = v(_glorot(rng, (h2, 4 * h2)), "enc_bw_wh")
            self.enc_bw_b = v(_lstm_bias(h2, forget_bias), "enc_bw_b")
            self.dec_in = v(_glorot(rng, (FD + 1, 4 * H)), "dec_in")      # previous device's features (+ "go" flag)
            self.dec_we = v(_glorot(rng, (H, 4 * H)), "dec_we")
            self.dec_wh = v(_glorot(rng, (H, 4 * H)), "dec_wh")
            self.dec_b = v(_lstm_bias(H, forget_bias), "dec_b")
            self.attn_w1 = v(_glorot(rng, (H, A)), "attn_w1")
            self.attn_w2 = v(_glorot(rng, (H, A)), "attn_w2")
            self.attn_v = v(_glorot(rng, (A, 1))[:, 0], "attn_v")
            self.out_q = v(_glorot(rng, (H + A, A)), "out_q")             # query from [h_t; context_t]
            self.key_w = v(_glorot(rng, (FX, A)), "key_w")                # device key from its features
            self.key_b = v(np.zeros(A, np.float32), "key_b")
            self.out_v = v(_glorot(rng, (A, 1))[:, 0], "out_v")

    def state(self) -> dict[str, np.ndarray]:
        return {v.name.split("/", 1)[-1].split(":")[0]: v.numpy() for v in self.trainable_variables}

    def load_state(self, state: dict[str, np.ndarray], source: str = "the policy file") -> None:
        for v in self.trainable_variables:
            k = v.name.split("/", 1)[-1].split(":")[0]
            if k not in state or tuple(state[k].shape) != tuple(v.shape):
                raise SearchError(f"{source} has no weight {k} of shape {tuple(v.shape)}: not a policy of this version")
            v.assign(np.asarray(state[k], np.float32))

    # ------------------------------------------------------------------ files (no pickle)
    def save(self, out_dir: str | os.PathLike, info: dict | None = None) -> Path:
        """Write `policy.npz` (weights) and `policy.json` (format, version, sizes, features, `info`)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "policy.npz.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **self.state())
        os.replace(tmp, out / "policy.npz")
        head = {"format": FORMAT, "version": VERSION, "hidden_size": self.hidden_size, "attn_size": self.attn_size,
                "group_features": list(GROUP_FEATURES), "device_features": list(DEVICE_FEATURES),
                "dynamic_features": list(DYNAMIC),
                "saved": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), **(info or {})}
        (out / "policy.json").write_text(json.dumps(head, indent=1) + "\n")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PortableWeights":
        """Read a policy directory (or its policy.json / policy.npz). SearchError (one line) when it is missing,
        corrupt, or from another format version."""
        p = Path(path)
        if not p.exists():
            raise SearchError(f"{p} does not exist (a policy directory holds policy.json and policy.npz)")
        d = p if p.is_dir() else p.parent
        head_p, npz_p = d / "policy.json", d / "policy.npz"
        if not head_p.exists() or not npz_p.exists():
            raise SearchError(f"{p} is not a policy directory (it needs policy.json and policy.npz)")
        try:
            head = json.loads(head_p.read_text())
        except (OSError, ValueError) as e:
            raise SearchError(f"{head_p} is not a readable policy header: {e}") from None
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            raise SearchError(f"{head_p} is not a placer portable policy (format {head.get('format')!r})"
                              if isinstance(head, dict) else f"{head_p} is not a placer portable policy")
        if head.get("version") != VERSION or list(head.get("group_features", [])) != list(GROUP_FEATURES) \
                or list(head.get("device_features", [])) != list(DEVICE_FEATURES):
            raise SearchError(f"{d} holds a policy of format version {head.get('version')} with other features; this "
                              f"placer reads version {VERSION}: pretrain again (placer pretrain --out DIR)")
        try:
            with load_npz(npz_p) as z:
                state = {k: z[k] for k in z.files}
        except Exception as e:     # a truncated or foreign file: numpy raises several kinds
            raise SearchError(f"{npz_p} cannot be read as policy weights: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        try:
            w = cls(hidden_size=int(head["hidden_size"]), attn_size=int(head["attn_size"]))
        except (KeyError, ValueError, TypeError) as e:
            raise SearchError(f"{head_p} lacks the policy sizes: {e}") from None
        w.load_state(state, source=str(npz_p))
        w.info = head
        return w


class PortablePolicy(PolicyCommon, tf.Module):
    """`PortableWeights` bound to one problem: `PolicyInputs` (G groups, D devices) and allowed bool[G, D].
    Same interface as `PlacementPolicy` (sample, log_probs, get_state, set_state)."""

    def __init__(self, weights: PortableWeights, inputs: PolicyInputs, allowed: np.ndarray, *,
                 temperature: float = 1.0, tanh_constant: float = 5.0, explore: float = 0.0, seed: int = 0,
                 jit: bool = True, name: str = "bound_policy"):
        from placer._tf import hide_gpus

        hide_gpus()
        super().__init__(name=name)
        inputs.check()
        allowed = np.asarray(allowed, bool)
        G, D = inputs.load.shape
        if allowed.shape != (G, D):
            raise SearchError(f"allowed mask has shape {allowed.shape}, expected ({G}, {D})")
        if not allowed.any(axis=1).all():
            raise SearchError(f"group {int(np.flatnonzero(~allowed.any(axis=1))[0])} has no allowed device")
        if not 0.0 <= explore < 1.0:
            raise SearchError(f"explore must be in [0, 1), got {explore}")
        self.w = weights
        self.num_groups, self.num_devices = G, D
        self.hidden_size, self.attn_size = weights.hidden_size, weights.attn_size
        self.temperature, self.tanh_constant, self.explore = float(temperature), float(tanh_constant), float(explore)
        with tf.device(POLICY_DEVICE):
            # the graph's inputs: non-trainable variables, so a traced policy can take another's (`reset_to`)
            c = lambda a, n: tf.Variable(a, trainable=False, name=n)  # noqa: E731
            self.features = c(np.asarray(inputs.group, np.float32), "features")
            adj = np.asarray(inputs.adjacency, np.float32)
            self.adj = c(np.triu(adj, 1), "adj")              # only earlier groups feed a later one's inflow
            tot = np.triu(adj, 1).sum(0)
            self.adj_in = c((1.0 / np.maximum(tot, 1e-6)).astype(np.float32), "adj_in")   # [G]
            self.gload = c(np.asarray(inputs.load, np.float32), "gload")
            self.gmem = c(np.asarray(inputs.mem, np.float32), "gmem")
            dev = np.asarray(inputs.device, np.float32)
            self.dev = c(dev, "dev")
            self.dev_in = c(np.concatenate([np.concatenate([dev, np.zeros((D, 1), np.float32)], 1),
                                            np.eye(1, dev.shape[1] + 1, dev.shape[1], dtype=np.float32)]), "dev_in")
            self.allowed = c(allowed, "allowed")
            self.not_allowed = c(np.where(allowed, 0.0, _NEG).astype(np.float32), "not_allowed")
            self.rng = tf.random.Generator.from_seed(seed)
        self._compile(jit)

    INPUTS = ("features", "adj", "adj_in", "gload", "gmem", "dev", "dev_in", "allowed", "not_allowed")

    def core_key(self) -> tuple:
        """What this policy's traced functions depend on besides variable values: its weights object (the same
        variables), the shapes and the traced settings."""
        return ("portable", id(self.w), self.num_groups, self.num_devices, tuple(self.features.shape),
                tuple(self.dev.shape), self.temperature, self.tanh_constant, self.explore, self.jit)

    @classmethod
    def from_config(cls, weights: PortableWeights, inputs: PolicyInputs, allowed: np.ndarray, config,
                    seed: int | None = None, jit: bool = True) -> "PortablePolicy":
        """Bound with a `ReinforceConfig`'s temperature, tanh clipping and exploration (seed: the config's)."""
        return cls(weights, inputs, allowed, temperature=config.temperature, tanh_constant=config.tanh_constant,
                   seed=config.seed if seed is None else seed, explore=config.explore_for(inputs.load.shape[0]),
                   jit=jit)

    # ------------------------------------------------------------------ pieces
    def _encoder_inputs(self):
        w = self.w
        return (self.features, w.enc_fw_wx, w.enc_fw_wh, w.enc_fw_b, w.enc_bw_wx, w.enc_bw_wh, w.enc_bw_b, w.attn_w1)

    def _logits(self, q, load, mem, prev, inflow, gload, gmem):
        """Device scores [..., D] from the query q [..., A] and the placement state (each [..., D]); gload and
        gmem (this group's load and memory share per device) broadcast against them."""
        w = self.w
        shape = tf.shape(load)
        dev = tf.broadcast_to(self.dev, tf.concat([shape, [self.dev.shape[1]]], 0))
        gl = tf.broadcast_to(gload, shape)
        gm = tf.broadcast_to(gmem, shape)
        x = tf.concat([dev, tf.stack([tf.math.log1p(load), tf.math.log1p(load + gl), tf.minimum(mem, 4.0),
                                      tf.minimum(mem + gm, 4.0), prev, inflow, tf.math.log1p(gl),
                                      tf.minimum(gm, 4.0)], -1)], -1)
        key = x @ w.key_w + w.key_b                                                       # [..., D, A]
        return tf.reduce_sum(tf.tanh(q[..., None, :] + key) * w.out_v, -1)

    # ------------------------------------------------------------------ sampling
    def _decode(self, enc, memory, c0, h0, eps, gumbel, uniform_a, explore, noise_scale):
        with tf.device(POLICY_DEVICE):
            w = self.w
            G, D, H, A = self.num_groups, self.num_devices, self.hidden_size, self.attn_size
            k = tf.shape(gumbel)[1]
            enc_w = enc @ w.dec_we + w.dec_b
            table = self.dev_in @ w.dec_in                                  # [D+1, 4H], row D = "go"
            w_h = tf.concat([w.dec_wh, w.attn_w2, w.out_q[:H]], -1)
            out_ctx = w.out_q[H:]
            c = tf.tile(c0, [k, 1])
            rec = tf.tile(h0, [k, 1]) @ w.dec_wh
            prev = tf.fill([k], D)
            load = tf.zeros([k, D])
            mem = tf.zeros([k, D])
            inacc = tf.zeros([k, G, D])                 # bytes each group receives from groups already on d

            def step(t, c, rec, prev, load, mem, inacc, actions):
                c, h = _lstm_gates(tf.gather(table, prev) + rec + enc_w[t][None], c)
                hw = h @ w_h
                rec, q, qh = hw[:, :4 * H], hw[:, 4 * H:4 * H + A], hw[:, 4 * H + A:]
                score = tf.reduce_sum(tf.tanh(q[:, None, :] + memory[None]) * w.attn_v, -1)
                ctx = tf.nn.softmax(score) @ memory
                prev_oh = tf.one_hot(prev, D)                           # row D ("go") → all zeros
                inflow = inacc[:, t, :] * self.adj_in[t]
                logits = self._clip(self._logits(qh + ctx @ out_ctx, load, mem, prev_oh, inflow, self.gload[t],
                                                 self.gmem[t]))
                logits += noise_scale * self._noise_std(logits, None) * eps[t] + self.not_allowed[t]
                a = tf.cast(tf.argmax(logits + gumbel[t], -1), tf.int32)
                a = tf.where(explore[t], uniform_a[t], a)
                oh = tf.one_hot(a, D)
                return (t + 1, c, rec, a, load + oh * self.gload[t], mem + oh * self.gmem[t],
                        inacc + self.adj[t][None, :, None] * oh[:, None, :], actions.write(t, a))

            return _loop(G, step, c, rec, prev, load, mem, inacc)

    # ------------------------------------------------------------------ scoring (teacher forcing)
    def _log_softmax(self, hist, noise, noise_scale):
        """Teacher-forced log-softmax over the devices [K, G, D], the decoder reading `hist` as the earlier
        groups' devices (the same features `_decode` computes step by step)."""
        with tf.device(POLICY_DEVICE):
            w = self.w
            k = tf.shape(hist)[0]
            D = self.num_devices
            enc, memory, c0, h0 = self._encode()
            prev = tf.concat([tf.fill([1, k], D), tf.transpose(hist[:, :-1])], 0)             # [G, K]
            xw = tf.gather(self.dev_in @ w.dec_in, prev) + (enc @ w.dec_we + w.dec_b)[:, None, :]
            hs = _lstm_seq(xw, tf.tile(c0, [k, 1]), tf.tile(h0, [k, 1]), tf.convert_to_tensor(w.dec_wh))
            hs = tf.transpose(hs, [1, 0, 2])                                                     # [K, G, H]
            q = hs @ w.attn_w2
            score = tf.map_fn(lambda qk: tf.tensordot(tf.tanh(qk[:, None, :] + memory[None]), w.attn_v, 1), q)
            ctx = tf.nn.softmax(score) @ memory
            query = tf.concat([hs, ctx], -1) @ w.out_q                                            # [K, G, A]
            oh = tf.one_hot(hist, D)                                                              # [K, G, D]
            load = tf.math.cumsum(oh * self.gload[None], axis=1, exclusive=True)
            mem = tf.math.cumsum(oh * self.gmem[None], axis=1, exclusive=True)
            prev_oh = tf.concat([tf.zeros([k, 1, D]), oh[:, :-1]], 1)
            inflow = tf.einsum("jt,kjd->ktd", self.adj, oh) * self.adj_in[None, :, None]
            logits = self._clip(self._logits(query, load, mem, prev_oh, inflow, self.gload[None], self.gmem[None]))
            logits += noise_scale * self._noise_std(logits, [0, 2]) * noise
            logits = tf.where(self.allowed[None], logits, _NEG)
            return tf.nn.log_softmax(logits)


def default_policy_dir() -> Path:
    """The pretrained policy shipped in the package (`placer/data/policy`)."""
    return Path(__file__).resolve().parent.parent / "data" / "policy"


def resolve_policy(spec: str | os.PathLike) -> Path:
    """`default` → the shipped policy; otherwise the directory given."""
    if str(spec) == "default":
        d = default_policy_dir()
        if not (d / "policy.json").exists():
            raise SearchError(f"this installation has no shipped policy ({d}): train one with placer pretrain")
        return d
    return Path(spec)
