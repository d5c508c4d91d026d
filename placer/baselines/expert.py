"""The human experts' placements from the papers, and a generic layer-wise rule for other graphs.

Every op is first mapped to its *forward* op: gradient ops (`gradients[_k]/<forward name>_grad/...`) and
optimizer updates (`<Optimizer>/update_<variable>/...`) follow the forward op / variable they belong to, so
the backward pass of a layer runs where its forward pass runs (and variables stay with their updates:
co-location is kept because a co-location group goes where its variable — else its first op — goes).

Rules (N = number of GPUs):
- **Layered sequence models** (`nmt`, `nmt4`, `rnnlm`; Sutskever et al. 2014, GNMT 2016, as used by
  Mirhoseini et al. 2017): encoder layer i and decoder layer i go to GPU ⌊i·N/L⌋ for L layers per stack
  (RNNLM's single stack likewise); embeddings go with the first layer of their stack (encoder embedding with
  encoder layer 0, decoder embedding with decoder layer 0); attention goes with the first decoder layer;
  the softmax / output projection and the loss go to the last GPU. Recognised from name scopes
  (`encoder/…/layer_<i>/`, `decoder/…/layer_<i>/`, `…/layer_<i>/` for RNNLM, `…embedding…`, `…attention…`,
  `softmax`, `loss`; see `placer.graphs.models`).
- **Transformers** (`gpt`, `clip`; GPipe, Huang et al. 2019, and Megatron-LM pipelines' even split): the L
  layers in N equal contiguous stages, one per GPU, layer i on GPU ⌊i·N/L⌋; the embedding on the first stage,
  the head (final LayerNorm, projection / vocabulary head) and the loss on the last. CLIP splits each tower
  (`image_layer_<i>`, `text_layer_<i>`) so over the N GPUs, the two embeddings on the first, the two heads and
  the contrastive loss on the last. Recognised from the layer names of `placer.graphs.models.transformer` in
  any op name (forward `clip_1/image_layer_3_1/...`, gradients `gradient_tape/...`, variables
  `image_layer_3/kernel`, optimizer slots `adam/image_layer_3_kernel_momentum`).
- **Inception-V3** (and any graph named `inception*`): the experts of both papers used one GPU: every op on
  the first GPU.
- **Other graphs**: contiguous layers by name scope, balanced by compute: forward ops are grouped into
  blocks by their name scope (the shallowest scope depth at which no block holds more than 1/(2N) of the
  compute; optimizer scopes are not blocks), blocks are ordered by the median topological position of
  their computing ops, and each block goes to GPU ⌊(compute before its middle)·N / total⌋, i.e. N
  contiguous stretches of about equal compute (forward + backward seconds).
- Ops no rule recognises (global step, input pipeline, summaries) take the device of the predecessor they
  read the most bytes from (else their heaviest successor; else the first GPU).
- CPU-only ops go to the CPU. The rule does not check memory (the humans' placements fit on the papers'
  GPUs); the simulator reports OOM if one does not.
"""
from __future__ import annotations

import re

import numpy as np

from placer.baselines._common import _BACKWARD, Problem, forward_name, group_fixed_device, prepare
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster

_LAYER = re.compile(r"(?:^|/)layer_?(\d+)(?:/|$)")
LAYERED_MODELS = ("nmt", "nmt4", "rnnlm")
# top-level scopes of optimizer ops: not layers (they follow their variables / neighbours)
_OPTIMIZER_SCOPES = frozenset({"adam", "rm_sprop", "rmsprop", "sgd", "gradientdescent", "momentum", "adagrad",
                               "adadelta", "adamax", "nadam", "ftrl", "training", "optimizer", "train"})


_SCOPED = re.compile(r"^(?:(encoder|decoder)/)?(layer_(\d+)|embedding|attention)(?:/|$)")


def layer_role(fwd: str) -> tuple[str, int] | None:
    """The role of a forward name in a layered sequence model: (stack, layer) with stack in
    {"enc", "dec", "last"}, or None when not recognised. The models' convention (`placer.graphs.models`) is
    matched first (`encoder/layer_<i>/`, `decoder/embedding/`, `decoder/attention/`, `layer_<i>/`,
    `softmax/`, `loss/`); other graphs fall back to looser matching anywhere in the name.

    >>> layer_role("encoder/layer_2/step_3/MatMul"), layer_role("decoder/attention/Softmax")
    (('enc', 2), ('dec', 0))
    >>> layer_role("loss/Mean"), layer_role("decoder/embedding/lookup"), layer_role("layer_1/step_0/h")
    (('last', 0), ('dec', 0), ('enc', 1))
    """
    low = fwd.lower()
    top = low.split("/", 1)[0]
    m = _SCOPED.match(low)
    if m:
        stack = "dec" if m.group(1) == "decoder" else "enc"
        if m.group(3) is not None:
            return (stack, int(m.group(3)))
        return ("dec", 0) if m.group(2) == "attention" else (stack, 0)
    if top in ("softmax", "loss", "logits", "output_projection", "projection", "output"):
        return ("last", 0)
    stack = "dec" if "decoder" in low else "enc"
    m = _LAYER.search(low)
    if m:
        return (stack, int(m.group(1)))
    if "attention" in low:
        return ("dec", 0)
    if "embedding" in low:
        return (stack, 0)
    if any(k in low for k in ("softmax", "/loss", "logits", "output_projection")):
        return ("last", 0)
    return None


def _is_layered(graph: OpGraph, fwd: list[str]) -> bool:
    base = graph.name.lower().split(":")[0]
    if any(base == m or base.startswith(m + "_") or base.startswith(m + "-") for m in LAYERED_MODELS):
        return True
    return sum(1 for f in fwd if _LAYER.search(f.lower())) > 0.2 * max(len(fwd), 1)


def _propagate(p: Problem, dev: np.ndarray, default: int) -> np.ndarray:
    """Fill -1 entries from the heaviest already-assigned predecessor, then successor, else `default`."""
    for i in range(p.n):
        if dev[i] >= 0:
            continue
        s, e = p.pred_ptr[i], p.pred_ptr[i + 1]
        cand = [(p.pred_bytes[k], dev[p.pred_idx[k]]) for k in range(s, e) if dev[p.pred_idx[k]] >= 0]
        if cand:
            dev[i] = max(cand, key=lambda t: t[0])[1]
    for i in range(p.n - 1, -1, -1):
        if dev[i] >= 0:
            continue
        s, e = p.succ_ptr[i], p.succ_ptr[i + 1]
        cand = [(p.succ_bytes[k], dev[p.succ_idx[k]]) for k in range(s, e) if dev[p.succ_idx[k]] >= 0]
        dev[i] = max(cand, key=lambda t: t[0])[1] if cand else default
    return dev


def _layered(p: Problem, fwd: list[str]) -> np.ndarray:
    gpus = np.asarray(p.gpus)
    N = len(gpus)
    roles = [layer_role(f) for f in fwd]
    L = {s: 1 + max([r[1] for r in roles if r and r[0] == s], default=0) for s in ("enc", "dec")}
    dev = np.full(p.n, -1, np.int64)
    for i, r in enumerate(roles):
        if r is None:
            continue
        if r[0] == "last":
            dev[i] = gpus[-1]
        else:
            dev[i] = gpus[min(N - 1, (r[1] * N) // L[r[0]])]
    return dev


TRANSFORMER_MODELS = ("gpt", "clip")
_T_LAYER = re.compile(r"(?:^|[/_])((?:image|text)_)?layer_(\d+)(?:[/_]|$)")
_T_FIRST = re.compile(r"(?:^|[/_])(?:image_|text_)?embedding(?:[/_]|$)")
_T_LAST = re.compile(r"(?:^|[/_])(?:(?:image_|text_)?head|contrastive|compile_loss|loss)(?:[/_]|$)")


def transformer_role(name: str) -> tuple[str, int] | None:
    """("image" | "text" | "", layer), ("first", 0), ("last", 0) or None for an op name of a transformer model.

    >>> transformer_role("gradient_tape/clip_1/image_layer_3_1/qkv_1/MatMul"), transformer_role("layer_2/kernel")
    (('image', 3), ('', 2))
    >>> transformer_role("adam/text_embedding_position_momentum"), transformer_role("gpt_1/head_1/BiasAdd")
    (('first', 0), ('last', 0))
    """
    m = _T_LAYER.search(name)
    if m:
        return ((m.group(1) or "").rstrip("_"), int(m.group(2)))
    if _T_FIRST.search(name):
        return ("first", 0)
    if _T_LAST.search(name):
        return ("last", 0)
    return None


def _transformer(p: Problem) -> np.ndarray:
    gpus = np.asarray(p.gpus)
    N = len(gpus)
    roles = [transformer_role(nm) for nm in p.graph.names]
    L: dict[str, int] = {}
    for r in roles:
        if r and r[0] not in ("first", "last"):
            L[r[0]] = max(L.get(r[0], 0), r[1] + 1)
    dev = np.full(p.n, -1, np.int64)
    for i, r in enumerate(roles):
        if r is None:
            continue
        if r[0] == "first":
            dev[i] = gpus[0]
        elif r[0] == "last":
            dev[i] = gpus[-1]
        else:
            dev[i] = gpus[min(N - 1, (r[1] * N) // L[r[0]])]
    return dev


def _generic(p: Problem, fwd: list[str]) -> np.ndarray:
    gpus = np.asarray(p.gpus)
    N = len(gpus)
    scopes = [f.split("/")[:-1] for f in fwd]
    scopes = [s if not s or s[0].lower() not in _OPTIMIZER_SCOPES else [] for s in scopes]
    w = p.mean_gpu_cost()
    has = np.array([bool(s) for s in scopes])
    total_w = float(w[has].sum()) or 1.0
    depth_max = max((len(s) for s in scopes), default=0)
    # the shallowest scope depth whose largest block holds at most 1/(2N) of the compute (else the most even)
    best_depth, best_share = 1, np.inf
    for depth in range(1, depth_max + 1):
        keys = ["/".join(s[:depth]) for s in scopes if s]
        _, inv = np.unique(keys, return_inverse=True)
        share = float(np.bincount(inv, weights=w[has]).max()) / total_w if len(keys) else 1.0
        if share < best_share - 1e-12:
            best_depth, best_share = depth, share
        if share <= 1.0 / (2 * N):
            break
    keys = ["/".join(s[:best_depth]) if s else "" for s in scopes]
    names = sorted({k for k in keys if k})
    if not names:
        return np.full(p.n, -1, np.int64)
    pos = {k: j for j, k in enumerate(names)}
    b = np.array([pos.get(k, -1) for k in keys])
    # blocks in the topological order of their forward computing ops (median index of forward ops that have
    # inputs; variable reads and constants sit at the start of the order whatever layer they feed)
    computing = (np.diff(p.pred_ptr) > 0) & ~np.fromiter((bool(_BACKWARD.match(nm)) for nm in p.graph.names),
                                                         bool, p.n)
    med = np.array([np.median(np.flatnonzero((b == j) & computing)) if ((b == j) & computing).any()
                    else np.median(np.flatnonzero(b == j)) for j in range(len(names))])
    rank = np.empty(len(names), np.int64)
    rank[np.argsort(med, kind="stable")] = np.arange(len(names))
    b = np.where(b >= 0, rank[np.maximum(b, 0)], -1)
    comp = np.bincount(b[b >= 0], weights=w[b >= 0], minlength=len(names))
    total = comp.sum()
    if total <= 0:
        comp = np.ones_like(comp)
        total = comp.sum()
    mid = np.cumsum(comp) - comp / 2.0
    block_dev = gpus[np.minimum(N - 1, (mid * N / total).astype(np.int64))]
    return np.where(b >= 0, block_dev[np.maximum(b, 0)], -1)


def expert(graph: OpGraph, cluster: Cluster, costs=None) -> np.ndarray:
    """The papers' expert placement (see the module docstring for each rule): op→device index array.

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> names = ["encoder/layer_0/m", "encoder/layer_1/m", "decoder/layer_0/m", "decoder/layer_1/m", "loss/m"]
    >>> g = OpGraph.build([(n, "X", 4, 0, 1e9) for n in names], list(zip(names, names[1:])), name="nmt")
    >>> devs = tuple(Device(f"/GPU:{i}", "X", 2**30) for i in range(2))
    >>> expert(g, Cluster(devs, np.full((2, 2), 1e9), np.zeros((2, 2)))).tolist()
    [0, 1, 0, 1, 1]
    """
    p = prepare(graph, cluster, costs)
    gpus = np.asarray(p.gpus)
    fixed = group_fixed_device(p)
    fwd = [forward_name(nm) for nm in graph.names]
    base = graph.name.lower()
    if base.startswith("inception"):
        dev = np.full(p.n, gpus[0], np.int64)
    elif any(base == m or base.startswith(m + "_") or base.startswith(m + "-") for m in TRANSFORMER_MODELS):
        dev = _transformer(p)
    elif _is_layered(graph, fwd):
        dev = _layered(p, fwd)
    else:
        dev = _generic(p, fwd)
    dev = _propagate(p, dev, int(gpus[0]))
    # a co-location group goes where its variable (largest persistent bytes), else its first op, goes
    anchor = np.asarray(p.group_first).copy()
    pers = np.asarray(graph.persistent_bytes)
    best = np.full(p.num_groups, -1, np.int64)
    np.maximum.at(best, p.group, pers)
    has_var = best > 0
    for i in np.flatnonzero(pers > 0):
        g = p.group[i]
        if has_var[g] and pers[i] == best[g] and anchor[g] == p.group_first[g] and pers[anchor[g]] < best[g]:
            anchor[g] = i
    gd = dev[anchor]
    gd = np.where(fixed >= 0, fixed, gd)
    bad = ~p.group_allowed[np.arange(p.num_groups), gd]
    gd[bad] = np.argmax(p.group_allowed[bad], axis=1)
    return gd[p.group]
