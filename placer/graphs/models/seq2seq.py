"""Unrolled LSTM benchmark models built as TF1 graphs: GNMT-style NMT (2 / 4 layers) and an RNN language model.

Naming convention: see the docstring of :mod:`placer.graphs.models`. Sizes: benchmarks/README.md.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from placer.graphs.cleanup import convert_graph_def, op_name, rename_inputs
from placer.graphs.opgraph import OpGraph


@dataclass(frozen=True)
class LSTMConfig:
    hidden: int      # LSTM units (= embedding size = attention size)
    vocab: int       # vocabulary (source and target)
    seq_len: int     # unrolled time steps (source = target)
    batch: int
    num_layers: int


# Mirhoseini et al. 2017 (ICML) / 2018 (ICLR) benchmark sizes; see benchmarks/README.md
NMT_FULL = dict(hidden=1024, vocab=32000, seq_len=40, batch=64)
RNNLM_FULL = dict(hidden=2048, vocab=32000, seq_len=40, batch=64)
TINY = dict(hidden=64, vocab=1000, seq_len=6, batch=8)
# between the two: a training step of roughly 0.1-0.5 s on one CPU core, a few thousand ops (measured sizes:
# benchmarks/README.md)
NMT_SMALL = dict(hidden=384, vocab=8000, seq_len=8, batch=32)
RNNLM_SMALL = dict(hidden=640, vocab=8000, seq_len=10, batch=32)
NMT_SIZES = {"tiny": TINY, "small": NMT_SMALL, "full": NMT_FULL}
RNNLM_SIZES = {"tiny": TINY, "small": RNNLM_SMALL, "full": RNNLM_FULL}


def _lstm_step(tf, x, h, c, kernel, bias, scope: str):
    """One LSTM cell step (gates i, j, f, o; forget bias 1) with every op under `scope`."""
    with tf.name_scope(scope):
        xh = tf.concat([x, h], 1, name="concat")
        gates = tf.nn.bias_add(tf.matmul(xh, kernel), bias)
        i, j, f, o = tf.split(gates, 4, axis=1)
        new_c = tf.add(c * tf.sigmoid(f + 1.0), tf.sigmoid(i) * tf.tanh(j), name="c")
        new_h = tf.multiply(tf.tanh(new_c), tf.sigmoid(o), name="h")
    return new_h, new_c


def _var(tf, name: str, shape, init=None):
    return tf.compat.v1.get_variable(name, shape, dtype=tf.float32, use_resource=True,
                                     initializer=init or tf.compat.v1.random_uniform_initializer(-0.05, 0.05))


def _lstm_layer(tf, scope: str, xs, batch: int, hidden: int):
    """One unrolled LSTM layer over the inputs `xs` (one tensor per step), ops under `<scope>/step_<t>/`.
    Returns (outputs per step, last h, last c)."""
    kernel, bias = _lstm_vars(tf, scope, hidden, hidden)
    with tf.name_scope(f"{scope}/"):
        h = c = tf.zeros([batch, hidden], name="zeros")
    outs = []
    for t, x in enumerate(xs):
        h, c = _lstm_step(tf, x, h, c, kernel, bias, f"{scope}/step_{t}/")
        outs.append(h)
    return outs, h, c


def _lstm_vars(tf, scope: str, in_dim: int, hidden: int):
    kernel = _var(tf, f"{scope}/kernel", [in_dim + hidden, 4 * hidden])
    bias = _var(tf, f"{scope}/bias", [4 * hidden], tf.compat.v1.zeros_initializer())
    return kernel, bias


class _SoftmaxLoss:
    """Per-step softmax projection (``softmax/step_<t>/``) and cross-entropy (``loss/step_<t>/``), mean over steps."""

    def __init__(self, tf, H: int, V: int, B: int, T: int):
        self.tf, self.T, self.losses = tf, T, []
        with tf.name_scope("softmax/"):
            self.w = _var(tf, "softmax/weights", [H, V])
            self.b = _var(tf, "softmax/bias", [V], tf.compat.v1.zeros_initializer())
        with tf.name_scope("loss/"):
            labels = tf.compat.v1.placeholder(tf.int32, [B, T], name="labels")
            self.labels = tf.unstack(labels, axis=1, name="unstack")

    def step(self, x, t: int) -> None:
        tf = self.tf
        with tf.name_scope(f"softmax/step_{t}/"):
            logits = tf.nn.bias_add(tf.matmul(x, self.w), self.b, name="logits")
        with tf.name_scope(f"loss/step_{t}/"):
            xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=self.labels[t], logits=logits)
            self.losses.append(tf.reduce_mean(xent, name="mean"))

    def total(self):
        with self.tf.name_scope("loss/"):
            return self.tf.math.divide(self.tf.add_n(self.losses), float(self.T), name="total")


def _finish(tf, g, loss, optimizer, name: str) -> OpGraph:
    with g.as_default():
        params = tf.compat.v1.trainable_variables()
        grads = tf.compat.v1.gradients(loss, params)
        train = optimizer.apply_gradients(list(zip(grads, params)), name=type(optimizer).__name__.replace("Optimizer", ""))
        with tf.control_dependencies([train]):
            train_op = tf.no_op(name="train_op")
    gd = _name_gradient_sums(g.as_graph_def())
    return convert_graph_def(gd, ["train_op", loss.name], batch_size=None, name=name, where=f"model {name!r}",
                    unknown_level=logging.INFO)


def _name_gradient_sums(gd):
    """Rename tf.gradients' layer-less sums `gradients/AddN_<k>` to `gradients/<forward op>_grad/sum_<k>`.

    A sum aggregates the gradients of one forward tensor and feeds that tensor's producer's gradient, so it is
    renamed after its first consumer's `gradients/<forward op>_grad/` scope (keeps the naming convention total).
    """
    consumers: dict[str, list[str]] = {}
    for n in gd.node:
        for i in n.input:
            consumers.setdefault(op_name(i), []).append(n.name)
    names = {n.name for n in gd.node}
    rename: dict[str, str] = {}
    for n in gd.node:
        m = re.fullmatch(r"gradients/AddN(_\d+)?", n.name)
        if not m:
            continue
        scopes = []
        for c in consumers.get(n.name, []):
            x = re.match(r"(gradients/.+?_grad)/", c)
            y = re.match(r"(?:Adam|GradientDescent)/update_(.+?)/(?:ResourceApply|Resource|mul|sub|add)", c)
            if x:
                scopes.append(x.group(1))
            elif y:  # the summed gradient of a variable (one term per time step)
                scopes.append(f"gradients/{y.group(1)}_grad")
        if scopes:
            new = f"{scopes[0]}/sum{m.group(1) or ''}"
            if new not in names:
                rename[n.name] = new
                names.add(new)
    for n in gd.node:
        if n.name in rename:
            n.name = rename[n.name]
    rename_inputs(gd, rename)
    return gd


def build_nmt(size: str, batch_size: int | None, *, num_layers: int = 2, name: str = "nmt") -> OpGraph:
    """GNMT-style NMT training step: unrolled LSTM encoder/decoder, additive attention, softmax, Adam."""
    import tensorflow as tf

    p = dict(NMT_SIZES[size])
    if batch_size:
        p["batch"] = batch_size
    H, V, T, B, L = p["hidden"], p["vocab"], p["seq_len"], p["batch"], num_layers
    g = tf.Graph()
    with g.as_default():
        # ---- encoder
        with tf.name_scope("encoder/embedding/"):
            src = tf.compat.v1.placeholder(tf.int32, [B, T], name="source_ids")
            emb_src = _var(tf, "encoder/embedding/embedding_matrix", [V, H])
            x = tf.nn.embedding_lookup(emb_src, src, name="lookup")              # [B, T, H]
            xs = tf.unstack(x, axis=1, name="unstack")
        enc_states = []
        for layer in range(L):
            xs, h, c = _lstm_layer(tf, f"encoder/layer_{layer}", xs, B, H)
            enc_states.append((h, c))
        # ---- attention memory (keys precomputed once)
        with tf.name_scope("decoder/attention/"):
            w_mem = _var(tf, "decoder/attention/memory_kernel", [H, H])
            w_query = _var(tf, "decoder/attention/query_kernel", [H, H])
            v_att = _var(tf, "decoder/attention/v", [H])
            w_out = _var(tf, "decoder/attention/output_kernel", [2 * H, H])
            memory = tf.stack(xs, axis=1, name="memory")                          # [B, T, H]
            keys = tf.reshape(tf.matmul(tf.reshape(memory, [B * T, H]), w_mem), [B, T, H], name="keys")
        # ---- decoder
        with tf.name_scope("decoder/embedding/"):
            tgt = tf.compat.v1.placeholder(tf.int32, [B, T], name="target_ids")
            emb_tgt = _var(tf, "decoder/embedding/embedding_matrix", [V, H])
            ys = tf.unstack(tf.nn.embedding_lookup(emb_tgt, tgt, name="lookup"), axis=1, name="unstack")
        dec_vars = [_lstm_vars(tf, f"decoder/layer_{layer}", 2 * H if layer == 0 else H, H) for layer in range(L)]
        softmax_loss = _SoftmaxLoss(tf, H, V, B, T)
        with tf.name_scope("decoder/attention/"):
            att = tf.zeros([B, H], name="initial_attention")
        states = list(enc_states)
        for t in range(T):
            inp = None
            with tf.name_scope(f"decoder/layer_0/step_{t}/"):
                inp = tf.concat([ys[t], att], 1, name="input_feeding")
            for layer in range(L):
                h, c = states[layer]
                h, c = _lstm_step(tf, inp, h, c, *dec_vars[layer], f"decoder/layer_{layer}/step_{t}/")
                states[layer] = (h, c)
                inp = h
            with tf.name_scope(f"decoder/attention/step_{t}/"):
                q = tf.expand_dims(tf.matmul(inp, w_query), 1, name="query")             # [B, 1, H]
                score = tf.reduce_sum(v_att * tf.tanh(keys + q), axis=2, name="score")    # [B, T]
                alpha = tf.nn.softmax(score, name="alignments")
                ctx = tf.reduce_sum(tf.expand_dims(alpha, 2) * memory, axis=1, name="context")
                att = tf.tanh(tf.matmul(tf.concat([inp, ctx], 1), w_out), name="attention")
            softmax_loss.step(att, t)
        loss = softmax_loss.total()
        opt = tf.compat.v1.train.AdamOptimizer(1e-3)
    return _finish(tf, g, loss, opt, name)


def build_rnnlm(size: str, batch_size: int | None) -> OpGraph:
    """2-layer unrolled LSTM language model training step (embedding, LSTMs, per-step softmax, SGD)."""
    import tensorflow as tf

    p = dict(RNNLM_SIZES[size])
    if batch_size:
        p["batch"] = batch_size
    H, V, T, B, L = p["hidden"], p["vocab"], p["seq_len"], p["batch"], 2
    g = tf.Graph()
    with g.as_default():
        with tf.name_scope("embedding/"):
            ids = tf.compat.v1.placeholder(tf.int32, [B, T], name="input_ids")
            emb = _var(tf, "embedding/embedding_matrix", [V, H])
            xs = tf.unstack(tf.nn.embedding_lookup(emb, ids, name="lookup"), axis=1, name="unstack")
        for layer in range(L):
            xs, _, _ = _lstm_layer(tf, f"layer_{layer}", xs, B, H)
        softmax_loss = _SoftmaxLoss(tf, H, V, B, T)
        for t in range(T):
            softmax_loss.step(xs[t], t)
        loss = softmax_loss.total()
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    return _finish(tf, g, loss, opt, "rnnlm")
