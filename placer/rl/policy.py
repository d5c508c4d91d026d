"""The placement policy: a seq2seq network over the groups (Mirhoseini et al. 2017, §3; TF's
`tensorflow/python/grappler/hierarchical_controller.py`, whose `encode`/`decode` this follows).

    encoder: a bidirectional LSTM reads the group feature vectors in order (topological order of the groups)
    decoder: an LSTM that, for group t, takes the embedding of the device chosen for group t-1 (a learned
             "go" embedding for t = 0) together with group t's own encoder state (input and output sequences
             are aligned one to one; without it the decoder must learn the alignment through attention
             alone, which REINFORCE did not manage on our toy tasks), attends over the encoder states with
             additive (Bahdanau) attention, and emits logits over the devices:
                 logits = C · tanh((W [h_t; context_t]) / T)   (tanh clipping C, temperature T)
                 logits += noise_scale · avg|logits| · N(0, 1)  (logit noise early in training)
                 logits[~allowed] = -inf                        (masked devices get probability 0)
             and, with `explore` = ε > 0, samples from the mixture (1 - ε)·softmax(logits) + ε·uniform(allowed):
             each group is placed uniformly at random with probability ε (single-group moves the softmax may
             have ruled out); log-probabilities are those of the mixture, so the gradient stays unbiased

Everything is batched over K samples: `sample(K)` draws K placements in one call (a `tf.while_loop` over the
groups), and `log_probs(actions, noise)` re-scores them in one call with teacher forcing (one `tf.scan` for the
decoder LSTM, then the attention for every step at once). The logit noise drawn while sampling is returned and
fed back to `log_probs`, so the log-probabilities used for the gradient are exactly those of the distribution
the samples came from.

Example:
    >>> import numpy as np
    >>> pol = PlacementPolicy(np.random.rand(6, 5).astype("float32"), np.ones((6, 3), bool), hidden_size=16)
    >>> actions, noise = pol.sample(4, noise_scale=0.5)
    >>> actions.shape, noise.shape
    ((4, 6), (4, 6, 3))

TensorFlow is imported at module import: import this module lazily from CLI paths.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from placer._tf import hide_gpus

_NEG = -1e9  # logit given to masked devices (exp underflows to exactly 0 in float32)
# The policy's variables and ops live on the host CPU: its ops are small and latency-bound, and on a GPU machine
# TensorFlow would otherwise put them on /GPU:0, whose allocator then takes most of that GPU's memory away
# from the placed graphs being measured there.
POLICY_DEVICE = "/CPU:0"


def _glorot(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Glorot-uniform init (the hierarchical controller's `glorot_uniform_initializer`)."""
    fan_in, fan_out = shape[0], shape[-1]
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(np.float32)


def _lstm_bias(units: int, forget_bias: float) -> np.ndarray:
    """Gate order i, f, o, g (as in the controller's `lstm`); forget gate starts at `forget_bias`."""
    b = np.zeros(4 * units, np.float32)
    b[units:2 * units] = forget_bias
    return b


def _lstm_gates(z: tf.Tensor, c: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    i, f, o, g = tf.split(z, 4, axis=-1)
    c = tf.sigmoid(i) * tf.tanh(g) + tf.sigmoid(f) * c
    h = tf.sigmoid(o) * tf.tanh(c)
    return c, h


def _loop(G: int, step, *state):
    """The decoders' loop over the groups: `step(t, *state, actions) -> (t + 1, *state, actions)` for t in
    0..G-1, an explicit `tf.while_loop` (so the tf.functions need no autograph); returns the actions written,
    int32[G, K]."""
    out = tf.while_loop(lambda t, *_: t < G, step, (tf.constant(0), *state, tf.TensorArray(tf.int32, size=G)),
                        maximum_iterations=G)
    return out[-1].stack()


@tf.custom_gradient
def _lstm_seq(xw: tf.Tensor, c0: tf.Tensor, h0: tf.Tensor, wh: tf.Tensor):
    """An LSTM over a whole sequence with a hand-written backward pass: hs float32[T, B, H] for inputs
    xw [T, B, 4H] (the input projection plus bias, gate order i, f, o, g), initial state c0, h0 [B, H] and
    recurrent weights wh [H, 4H]. Same values and gradients as a `tf.scan` of `_lstm_gates` (tested), but
    about twice as fast: autodiff of a scan keeps per-step accumulators and runs the weight-gradient matmul
    inside the backward loop, where here every term that does not depend on the recurrence (gate derivatives,
    dL/dwh) is one batched op outside it, leaving ~7 small ops per step."""
    H = wh.shape[0]

    def step(carry, xw_t):
        c, h = carry
        return _lstm_gates(xw_t + h @ wh, c)

    cs, hs = tf.scan(step, xw, initializer=(c0, h0))

    def grad(dhs):
        c_prev = tf.concat([c0[None], cs[:-1]], 0)
        h_prev = tf.concat([h0[None], hs[:-1]], 0)
        z = xw + tf.einsum("tbh,hj->tbj", h_prev, wh)           # the gate pre-activations again, batched
        s = tf.sigmoid(z[..., :3 * H])
        i, f, o = s[..., :H], s[..., H:2 * H], s[..., 2 * H:]
        g = tf.tanh(z[..., 3 * H:])
        tc = tf.tanh(cs)
        dc_dh = o * (1.0 - tc * tc)                                # dc_t/dh_t through h_t = o·tanh(c_t)
        # dz_t = [dc·i', dc·f', dh·o', dc·g'] with the gate derivatives below (all known before the loop)
        dgate = tf.concat([g * i * (1.0 - i), c_prev * f * (1.0 - f), tc * o * (1.0 - o), i * (1.0 - g * g)], -1)
        wh_t = tf.transpose(wh)

        def back(carry, inp):
            dh_next, dc_next, _ = carry
            dhs_t, dc_dh_t, dgate_t, f_t = inp
            dh = dhs_t + dh_next
            dc = dc_next + dh * dc_dh_t
            dz = tf.concat([dc, dc, dh, dc], -1) * dgate_t
            return dz @ wh_t, dc * f_t, dz

        zero = tf.zeros_like(h0)
        dh0, dc0, dz = tf.scan(back, (dhs, dc_dh, dgate, f), initializer=(zero, zero, tf.zeros_like(xw[0])),
                               reverse=True)
        return dz, dc0[0], dh0[0], tf.einsum("tbh,tbj->hj", h_prev, dz)

    return hs, grad


class PolicyCommon:
    """What every placement policy here shares (this one and `placer.rl.portable.PortablePolicy`): the encoder,
    logit clipping and noise, batched sampling around the subclass's `_decode`, teacher-forced scoring around its
    `_log_softmax`, and the checkpoint state. A subclass sets num_groups, num_devices, hidden_size, temperature,
    tanh_constant, explore, allowed, not_allowed, rng and the tf.functions, and implements `_encoder_inputs`,
    `_decode` and `_log_softmax`."""

    def _compile(self, jit: bool) -> None:
        """The tf.functions: the decoder loop (XLA-compiled with `jit`), sampling and teacher-forced scoring."""
        G, D = self.num_groups, self.num_devices
        self.jit = bool(jit)
        spec_f = tf.TensorSpec([], tf.float32)
        # autograph=False: the one loop is an explicit tf.while_loop (`_loop`), so nothing needs converting, and
        # converting took most of a new policy's first sample (the policy's code and Keras's optimizer, ~1-4 s)
        self._decode_fn = tf.function(self._decode, jit_compile=jit, reduce_retracing=True, autograph=False)
        self._sample_fn = tf.function(self._sample, input_signature=[tf.TensorSpec([], tf.int32), spec_f,
                                                                     tf.TensorSpec([], tf.bool)], autograph=False)
        self._log_probs_fn = tf.function(self._log_probs, input_signature=[
            tf.TensorSpec([None, G], tf.int32), tf.TensorSpec([None, G, D], tf.float32), spec_f], autograph=False)

    def _encode(self) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """Bi-LSTM over the groups (batch 1: the input is the same for every sample).
        Returns enc [G, H], attention memory W1·enc [G, A], and the final state (c, h) [1, H]."""
        x, fw_wx, fw_wh, fw_b, bw_wx, bw_wh, bw_b, attn_w1 = self._encoder_inputs()
        h2 = self.hidden_size // 2
        xw_fw = x @ fw_wx + fw_b               # [G, 4h2]
        xw_bw = tf.reverse(x, [0]) @ bw_wx + bw_b

        def step(carry, xw):
            c_f, h_f, c_b, h_b = carry
            c_f, h_f = _lstm_gates(xw[0][None] + h_f @ fw_wh, c_f)
            c_b, h_b = _lstm_gates(xw[1][None] + h_b @ bw_wh, c_b)
            return c_f, h_f, c_b, h_b

        z = tf.zeros([1, h2])
        c_f, h_f, c_b, h_b = tf.scan(step, tf.stack([xw_fw, xw_bw], axis=1), initializer=(z, z, z, z))
        enc = tf.concat([h_f[:, 0], tf.reverse(h_b[:, 0], [0])], axis=-1)  # [G, H], aligned per group
        last_c = tf.concat([c_f[-1], c_b[-1]], axis=-1)
        last_h = tf.concat([h_f[-1], h_b[-1]], axis=-1)
        return enc, enc @ attn_w1, last_c, last_h

    def _clip(self, raw: tf.Tensor) -> tf.Tensor:
        """C · tanh(raw / T) (the controller divides by the temperature, then clips with tanh)."""
        if self.tanh_constant <= 0:          # as in the controller: tanh_constant <= 0 turns clipping off
            return raw / self.temperature
        return self.tanh_constant * tf.tanh(raw / self.temperature)

    @staticmethod
    def _noise_std(logits: tf.Tensor, axes) -> tf.Tensor:
        """The controller's noise scale: RMS of the logits (no gradient through it)."""
        return tf.stop_gradient(tf.sqrt(tf.reduce_mean(tf.square(logits), axis=axes, keepdims=True)))

    # ---------------------------------------------------------------- sampling
    def _sample(self, k: tf.Tensor, noise_scale: tf.Tensor, greedy: tf.Tensor):
        with tf.device(POLICY_DEVICE):
            G, D = self.num_groups, self.num_devices
            enc, mem, c0, h0 = self._encode()
            # all randomness drawn up front (fewer ops per loop step): logit noise and Gumbel noise
            eps = self.rng.normal([G, k, D])
            gumbel = -tf.math.log(-tf.math.log(self.rng.uniform([G, k, D], 1e-20, 1.0)))
            gumbel = tf.where(greedy, tf.zeros_like(gumbel), gumbel)
            # ε-uniform exploration: which (group, sample) pairs are drawn uniformly, and that uniform draw
            uniform_a = tf.cast(tf.argmax(self.rng.uniform([G, k, D], 1e-20, 1.0) + self.not_allowed[:, None, :],
                                          -1), tf.int32)                                     # [G, K]
            explore = tf.logical_and(self.rng.uniform([G, k]) < self.explore, tf.logical_not(greedy))
            actions = self._decode_fn(enc, mem, c0, h0, eps, gumbel, uniform_a, explore, noise_scale)
            return tf.transpose(actions), tf.transpose(eps, [1, 0, 2])

    def sample(self, k: int, noise_scale: float = 0.0, greedy: bool = False):
        """Draw k placements: int32[k, G] device per group, and the standard-normal logit noise
        float32[k, G, D] used (pass it to `log_probs`). greedy=True takes the argmax instead of sampling."""
        with tf.device(POLICY_DEVICE):
            a, eps = self._sample_fn(tf.constant(int(k), tf.int32), tf.constant(float(noise_scale), tf.float32),
                                     tf.constant(bool(greedy)))
            return a.numpy(), eps.numpy()

    # ---------------------------------------------------------------- scoring (teacher forcing)
    def _log_probs(self, actions: tf.Tensor, noise: tf.Tensor, noise_scale: tf.Tensor, mixture=True,
                   history: tf.Tensor | None = None):
        """mixture=False (a bool or a boolean tensor) scores under the softmax alone (imitation fits π itself, not
        the exploration mix).
        history: int32[K, G] devices fed to the decoder as the previous groups' choices (default: `actions`,
        i.e. teacher forcing); imitation feeds perturbed histories so the policy keeps its choice for a group
        when an earlier group was placed elsewhere."""
        with tf.device(POLICY_DEVICE):
            logsm = self._log_softmax(actions if history is None else history, noise, noise_scale)
            p = tf.exp(logsm)
            logp = tf.reduce_sum(tf.gather(logsm, actions, batch_dims=2), axis=1)                  # [K]
            if mixture is not False and self.explore > 0:   # under the mixture (1-ε)·π + ε·uniform(allowed)
                allowed = tf.cast(self.allowed, tf.float32)
                uniform = allowed / tf.reduce_sum(allowed, -1, keepdims=True)                      # [G, D]
                mix = tf.math.log((1.0 - self.explore) * p + self.explore * uniform[None] + 1e-30)
                mixed = tf.reduce_sum(tf.gather(mix, actions, batch_dims=2), axis=1)
                # `mixture` may be a boolean tensor (one traced step for REINFORCE and imitation)
                logp = mixed if mixture is True else tf.where(mixture, mixed, logp)
            entropy = -tf.reduce_mean(tf.reduce_sum(tf.where(self.allowed[None], p * logsm, 0.0), -1), axis=1)
            return logp, entropy

    def group_log_probs(self, history) -> np.ndarray:
        """float32[K, G, D]: log π(device | group, the earlier groups placed as in `history`) (teacher forcing)."""
        with tf.device(POLICY_DEVICE):
            h = tf.convert_to_tensor(np.asarray(history, np.int32))
            return self._log_softmax(h, tf.zeros([h.shape[0], self.num_groups, self.num_devices]), 0.0).numpy()

    def log_probs(self, actions, noise=None, noise_scale: float = 0.0):
        """Teacher-forced log-probability of each placement (sum over groups) float32[K] and the mean
        per-group entropy float32[K]. Differentiable: call under a `tf.GradientTape`."""
        with tf.device(POLICY_DEVICE):
            actions = tf.convert_to_tensor(actions, tf.int32)
            if noise is None:
                noise = tf.zeros([actions.shape[0], self.num_groups, self.num_devices])
            return self._log_probs_fn(actions, tf.convert_to_tensor(noise, tf.float32),
                                      tf.constant(float(noise_scale), tf.float32))

    # ---------------------------------------------------------------- handing a traced policy on
    # A subclass keeps its graph inputs (features, masks...) in non-trainable variables named here, so that a
    # traced policy can take another's values (`placer.rl.reinforce._own_core`), and keys what its traces
    # depend on in `core_key()`.
    INPUTS: tuple[str, ...] = ()

    def reset_to(self, other) -> None:
        """Take `other`'s values (a policy with the same `core_key()`, e.g. just built for another seed and graph):
        its weights, RNG state and graph inputs. This policy's traced functions stay."""
        if other.core_key() != self.core_key():
            raise ValueError("reset_to needs a policy of the same shapes and traced settings")
        self.set_state(other.get_state())
        for name in self.INPUTS:
            getattr(self, name).assign(getattr(other, name))

    # ---------------------------------------------------------------- state (for checkpoints)
    def get_state(self) -> dict[str, np.ndarray]:
        """Every weight and the RNG state as numpy arrays (keyed by variable name)."""
        state = {v.name: v.numpy() for v in self.trainable_variables}
        state["__rng_state__"] = self.rng.state.numpy()
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        for v in self.trainable_variables:
            if v.name not in state or tuple(state[v.name].shape) != tuple(v.shape):
                raise KeyError(f"checkpoint has no weight {v.name} of shape {tuple(v.shape)}")
            v.assign(state[v.name])
        self.rng.state.assign(state["__rng_state__"])


class PlacementPolicy(PolicyCommon, tf.Module):
    """Seq2seq placement policy for one grouping (G groups, F features) and one device set (D devices).

    features: float32[G, F] group features (Grouping.features); allowed: bool[G, D] (every row needs at least
    one True). hidden_size: LSTM width (the encoder's two directions get hidden_size/2 each, as in the
    controller); attn_size: width of the additive attention. The policy's randomness comes from its own
    `tf.random.Generator` (`self.rng`), whose state is a variable and is checkpointed with the weights.
    jit: XLA-compile the sampling loop (`_decode`); False runs it as a plain `tf.function`.
    """
    INPUTS = ("features", "allowed", "not_allowed")

    def __init__(self, features: np.ndarray, allowed: np.ndarray, *, hidden_size: int = 256,
                 attn_size: int = 64, temperature: float = 1.0, tanh_constant: float = 5.0,
                 forget_bias: float = 1.0, group_embedding: int = 0, stay_bias: float = 0.0, seed: int = 0,
                 explore: float = 0.0, jit: bool = True, name: str = "placement_policy"):
        hide_gpus()      # before any variable exists: the runtime must not start on a GPU
        super().__init__(name=name)
        features = np.asarray(features, np.float32)
        allowed = np.asarray(allowed, bool)
        if features.ndim != 2 or allowed.ndim != 2 or allowed.shape[0] != features.shape[0]:
            raise ValueError(f"features {features.shape} and allowed {allowed.shape} must be [G, F] and [G, D]")
        if not allowed.any(axis=1).all():
            bad = int(np.flatnonzero(~allowed.any(axis=1))[0])
            raise ValueError(f"group {bad} has no allowed device")
        if hidden_size % 2:
            raise ValueError("hidden_size must be even (two encoder directions)")
        self.num_groups, self.num_features = features.shape
        self.num_devices = allowed.shape[1]
        self.hidden_size, self.attn_size = hidden_size, attn_size
        self.temperature, self.tanh_constant = float(temperature), float(tanh_constant)
        if not 0.0 <= explore < 1.0:
            raise ValueError(f"explore must be in [0, 1), got {explore}")
        self.explore = float(explore)
        G, D, H, A, h2 = self.num_groups, self.num_devices, hidden_size, attn_size, hidden_size // 2
        F = self.num_features + group_embedding
        rng = np.random.default_rng(seed)

        with tf.device(POLICY_DEVICE):
            with self.name_scope:
                # the graph's inputs are variables too (not trainable), so that a traced policy can be handed to
                # the next agent of the same shapes (`reset_to`; `placer.rl.reinforce._own_core`)
                self.features = tf.Variable(features, trainable=False, name="features")
                self.allowed = tf.Variable(allowed, trainable=False, name="allowed")
                self.not_allowed = tf.Variable(np.where(allowed, 0.0, _NEG).astype(np.float32), trainable=False,
                                               name="not_allowed")   # logit mask [G, D]
                v = lambda a, n: tf.Variable(a, name=n)  # noqa: E731
                # optional learned per-group embedding appended to the features (a position embedding)
                self.group_emb = v(0.1 * rng.standard_normal((G, group_embedding)).astype(np.float32),
                                   "group_embedding") if group_embedding else None
                # encoder (bidirectional LSTM, hidden/2 per direction): input and recurrent weights
                self.enc_fw_wx = v(_glorot(rng, (F, 4 * h2)), "enc_fw_wx")
                self.enc_fw_wh = v(_glorot(rng, (h2, 4 * h2)), "enc_fw_wh")
                self.enc_fw_b = v(_lstm_bias(h2, forget_bias), "enc_fw_b")
                self.enc_bw_wx = v(_glorot(rng, (F, 4 * h2)), "enc_bw_wx")
                self.enc_bw_wh = v(_glorot(rng, (h2, 4 * h2)), "enc_bw_wh")
                self.enc_bw_b = v(_lstm_bias(h2, forget_bias), "enc_bw_b")
                # decoder LSTM reading the previous group's device embedding
                self.device_emb = v(_glorot(rng, (D, H)), "device_embeddings")
                self.go_emb = v(_glorot(rng, (1, H)), "device_go_embedding")
                self.dec_wx = v(_glorot(rng, (H, 4 * H)), "dec_wx")
                self.dec_we = v(_glorot(rng, (H, 4 * H)), "dec_we")   # aligned encoder state of group t
                self.dec_wh = v(_glorot(rng, (H, 4 * H)), "dec_wh")
                self.dec_b = v(_lstm_bias(H, forget_bias), "dec_b")
                # additive attention: score(h, m_j) = v · tanh(W1 m_j + W2 h)
                self.attn_w1 = v(_glorot(rng, (H, A)), "attn_w1")
                self.attn_w2 = v(_glorot(rng, (H, A)), "attn_w2")
                self.attn_v = v(_glorot(rng, (A, 1))[:, 0], "attn_v")
                # device softmax over [h_t; context_t]
                self.out_w = v(_glorot(rng, (H + A, D)), "device_softmax")
                # device→device term added to the next group's raw logits (a learned "bigram"), initialised to
                # stay_bias·I: consecutive groups start out likely to share a device (contiguous runs, as good
                # placements of layered models are), instead of uniformly scattered
                self.transition = v(np.eye(D, dtype=np.float32) * stay_bias, "transition")
            self.rng = tf.random.Generator.from_seed(seed)
        self._compile(jit)

    def core_key(self) -> tuple:
        """What this policy's traced functions depend on besides variable values (`reset_to`)."""
        return ("placement", self.num_groups, self.num_devices, tuple(self.features.shape), self.hidden_size,
                self.attn_size, self.group_emb is not None and tuple(self.group_emb.shape), self.temperature,
                self.tanh_constant, self.explore, self.jit)

    # ---------------------------------------------------------------- shared pieces
    def _encoder_inputs(self):
        x = self.features if self.group_emb is None else tf.concat([self.features, self.group_emb], -1)
        return (x, self.enc_fw_wx, self.enc_fw_wh, self.enc_fw_b, self.enc_bw_wx, self.enc_bw_wh, self.enc_bw_b,
                self.attn_w1)

    def _input_table(self) -> tf.Tensor:
        """The decoder's input term for each previous device: embedding × dec_wx, [D+1, 4H] (row D = "go")."""
        return tf.concat([self.device_emb, self.go_emb], 0) @ self.dec_wx

    # ---------------------------------------------------------------- sampling
    def _decode(self, enc, mem, c0, h0, eps, gumbel, uniform_a, explore, noise_scale):
        """The autoregressive decoder loop (deterministic given the pre-drawn noise): int32[G, K] devices.
        XLA-compiled by default (`jit`): one fused program instead of ~25 small ops per group, 3x faster at
        G = 256. The attention score is a multiply-and-sum, not a dot with attn_v: XLA fuses such a dot with
        its tanh into a scalar loop (measured 0.16 s against 0.06 s for the whole loop)."""
        with tf.device(POLICY_DEVICE):
            G, D, H, A = self.num_groups, self.num_devices, self.hidden_size, self.attn_size
            k = tf.shape(gumbel)[1]
            enc_w = enc @ self.dec_we + self.dec_b                                        # [G, 4H], same for all k
            # the previous group's device → its decoder-input term and its transition row, one table (row D = "go")
            table = tf.concat([self._input_table(), tf.concat([self.transition, tf.zeros([1, D])], 0)],
                              -1)                                                          # [D+1, 4H + D]
            w_h = tf.concat([self.dec_wh, self.attn_w2, self.out_w[:H]], -1)    # h → [recurrent, query, logits]
            out_ctx = self.out_w[H:]
            c = tf.tile(c0, [k, 1])
            rec = tf.tile(h0, [k, 1]) @ self.dec_wh
            prev = tf.fill([k], D)

            def step(t, c, rec, prev, actions):
                row = tf.gather(table, prev)
                c, h = _lstm_gates(row[:, :4 * H] + rec + enc_w[t][None], c)
                hw = h @ w_h
                rec, q, logit_h = hw[:, :4 * H], hw[:, 4 * H:4 * H + A], hw[:, 4 * H + A:]
                score = tf.reduce_sum(tf.tanh(q[:, None, :] + mem[None]) * self.attn_v, -1)           # [K, G]
                ctx = tf.nn.softmax(score) @ mem                                                  # [K, A]
                logits = self._clip(logit_h + ctx @ out_ctx + row[:, 4 * H:])                    # [K, D]
                logits += noise_scale * self._noise_std(logits, None) * eps[t] + self.not_allowed[t]
                a = tf.cast(tf.argmax(logits + gumbel[t], -1), tf.int32)   # Gumbel-max = a categorical sample
                a = tf.where(explore[t], uniform_a[t], a)
                return t + 1, c, rec, a, actions.write(t, a)

            return _loop(G, step, c, rec, prev)

    # ---------------------------------------------------------------- scoring (teacher forcing)
    def _log_softmax(self, hist: tf.Tensor, noise: tf.Tensor, noise_scale) -> tf.Tensor:
        """Teacher-forced log-softmax over the devices [K, G, D], the decoder reading `hist` as the earlier
        groups' devices."""
        with tf.device(POLICY_DEVICE):
            k = tf.shape(hist)[0]
            enc, mem, c0, h0 = self._encode()
            # decoder inputs go, emb(a_0), ..., emb(a_{G-2}) times dec_wx
            prev = tf.concat([tf.fill([1, k], self.num_devices), tf.transpose(hist[:, :-1])], 0)      # [G, K]
            xw = tf.gather(self._input_table(), prev) + (enc @ self.dec_we + self.dec_b)[:, None, :]  # [G, K, 4H]
            hs = _lstm_seq(xw, tf.tile(c0, [k, 1]), tf.tile(h0, [k, 1]), tf.convert_to_tensor(self.dec_wh))
            hs = tf.transpose(hs, [1, 0, 2])                                                       # [K, G, H]
            q = hs @ self.attn_w2                                                                  # [K, G, A]
            # additive attention for every (sample, step, group): per sample, so the [G, G, A] temporaries
            # stay cache-sized (measured faster than one [K, G, G, A] tensor)
            score = tf.map_fn(lambda qk: tf.tensordot(tf.tanh(qk[:, None, :] + mem[None]), self.attn_v, 1), q)
            ctx = tf.nn.softmax(score) @ mem                                                       # [K, G, A]
            trans = tf.concat([tf.zeros([k, 1, self.num_devices]), tf.gather(self.transition, hist[:, :-1])], 1)
            logits = self._clip(tf.concat([hs, ctx], -1) @ self.out_w + trans)                    # [K, G, D]
            logits += noise_scale * self._noise_std(logits, [0, 2]) * noise
            logits = tf.where(self.allowed[None], logits, _NEG)
            return tf.nn.log_softmax(logits)
