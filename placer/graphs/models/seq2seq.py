"""Unrolled LSTM benchmark models built as TF1 graphs: GNMT-style NMT (2 / 4 layers) and an RNN language model.

Naming convention: see the docstring of :mod:`placer.graphs.models`. Sizes: benchmarks/README.md.
"""
from __future__ import annotations

from dataclasses import dataclass

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


def _lstm_vars(tf, scope: str, in_dim: int, hidden: int):
    kernel = _var(tf, f"{scope}/kernel", [in_dim + hidden, 4 * hidden])
    bias = _var(tf, f"{scope}/bias", [4 * hidden], tf.compat.v1.zeros_initializer())
    return kernel, bias


def _finish(tf, g, loss, optimizer, name: str) -> OpGraph:
    from placer.graphs.load import _convert

    with g.as_default():
        params = tf.compat.v1.trainable_variables()
        grads = tf.compat.v1.gradients(loss, params)
        train = optimizer.apply_gradients(list(zip(grads, params)), name=type(optimizer).__name__.replace("Optimizer", ""))
        with tf.control_dependencies([train]):
            train_op = tf.no_op(name="train_op")
    return _convert(g.as_graph_def(), ["train_op", loss.name], batch_size=None, name=name, where=f"model {name!r}")


def build_nmt(size: str, batch_size: int | None, *, num_layers: int = 2, name: str = "nmt") -> OpGraph:
    """GNMT-style NMT training step: unrolled LSTM encoder/decoder, additive attention, softmax, Adam."""
    import tensorflow as tf

    p = dict(NMT_FULL if size == "full" else TINY)
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
            kernel, bias = _lstm_vars(tf, f"encoder/layer_{layer}", H, H)
            with tf.name_scope(f"encoder/layer_{layer}/"):
                h = c = tf.zeros([B, H], name="zeros")
            outs = []
            for t in range(T):
                h, c = _lstm_step(tf, xs[t], h, c, kernel, bias, f"encoder/layer_{layer}/step_{t}/")
                outs.append(h)
            enc_states.append((h, c))
            xs = outs
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
        with tf.name_scope("softmax/"):
            w_soft = _var(tf, "softmax/weights", [H, V])
            b_soft = _var(tf, "softmax/bias", [V], tf.compat.v1.zeros_initializer())
        with tf.name_scope("loss/"):
            labels = tf.compat.v1.placeholder(tf.int32, [B, T], name="labels")
            label_steps = tf.unstack(labels, axis=1, name="unstack")
        with tf.name_scope("decoder/attention/"):
            att = tf.zeros([B, H], name="initial_attention")
        states = list(enc_states)
        losses = []
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
            with tf.name_scope(f"softmax/step_{t}/"):
                logits = tf.nn.bias_add(tf.matmul(att, w_soft), b_soft, name="logits")
            with tf.name_scope(f"loss/step_{t}/"):
                xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label_steps[t], logits=logits)
                losses.append(tf.reduce_mean(xent, name="mean"))
        with tf.name_scope("loss/"):
            loss = tf.math.divide(tf.add_n(losses), float(T), name="total")
        opt = tf.compat.v1.train.AdamOptimizer(1e-3)
    return _finish(tf, g, loss, opt, name)


def build_rnnlm(size: str, batch_size: int | None) -> OpGraph:
    """2-layer unrolled LSTM language model training step (embedding, LSTMs, per-step softmax, SGD)."""
    import tensorflow as tf

    p = dict(RNNLM_FULL if size == "full" else TINY)
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
            kernel, bias = _lstm_vars(tf, f"layer_{layer}", H, H)
            with tf.name_scope(f"layer_{layer}/"):
                h = c = tf.zeros([B, H], name="zeros")
            outs = []
            for t in range(T):
                h, c = _lstm_step(tf, xs[t], h, c, kernel, bias, f"layer_{layer}/step_{t}/")
                outs.append(h)
            xs = outs
        with tf.name_scope("softmax/"):
            w_soft = _var(tf, "softmax/weights", [H, V])
            b_soft = _var(tf, "softmax/bias", [V], tf.compat.v1.zeros_initializer())
        with tf.name_scope("loss/"):
            labels = tf.compat.v1.placeholder(tf.int32, [B, T], name="labels")
            label_steps = tf.unstack(labels, axis=1, name="unstack")
        losses = []
        for t in range(T):
            with tf.name_scope(f"softmax/step_{t}/"):
                logits = tf.nn.bias_add(tf.matmul(xs[t], w_soft), b_soft, name="logits")
            with tf.name_scope(f"loss/step_{t}/"):
                xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label_steps[t], logits=logits)
                losses.append(tf.reduce_mean(xent, name="mean"))
        with tf.name_scope("loss/"):
            loss = tf.math.divide(tf.add_n(losses), float(T), name="total")
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    return _finish(tf, g, loss, opt, "rnnlm")
