"""Transformer benchmark models (issue 14), Keras 3, traced like Inception-V3: `clip` and `gpt`.

* ``gpt``: decoder-only (pre-LN) transformer in the DALL·E mould: token + position embedding, L blocks
  (causal multi-head self-attention, 4x GELU MLP), final LayerNorm, head over the vocabulary, sparse
  cross-entropy, Adam. ``full``: 24 layers, width 2048, 16 heads, sequence 256, vocab 16,384, batch 8
  (1,276,252,160 parameters); ``--layers L`` scales the depth.
* ``clip``: a ViT-B/32 image tower (224x224x3, patch 32, 12 layers, width 768, 12 heads) and a text
  transformer (12 layers, width 512, 8 heads, context 77, vocab 49,408, causal), each projected to a shared
  512-d space; the step is the symmetric contrastive (InfoNCE) loss over the batch's image x text similarity
  matrix (Radford et al. 2021, Fig. 3), Adam; batch 256.

Layer names (the transformer expert rule parses them; op names are ``<model>/<layer>/...``):
    gpt:   embedding, layer_<i>, head (final LayerNorm + vocabulary projection)
    clip:  image_embedding, image_layer_<i>, image_head (LN + projection); text_embedding, text_layer_<i>,
           text_head; contrastive (logit scale, similarity, loss)
Precision: ``fp16`` / ``bf16`` build under the Keras ``mixed_float16`` / ``mixed_bfloat16`` policy (variables,
so master weights and Adam slots, stay fp32; activations and matmuls in 16 bits); ``fp16`` scales the loss
(static, ``FP16_LOSS_SCALE``; see there why not the dynamic ``LossScaleOptimizer``).
"""
from __future__ import annotations

import contextlib

from placer.graphs.opgraph import OpGraph

# Radford et al. 2021 (CLIP), Table 19/20: ViT-B/32 image encoder; text encoder 12 x 512, 8 heads, ctx 77,
# BPE vocab 49,408; embedding dim 512. Batch 256 (issue 14 default; the paper used 32,768 over 256 GPUs).
CLIP_FULL = dict(batch=256, image=224, patch=32, v_layers=12, v_width=768, v_heads=12,
                 t_layers=12, t_width=512, t_heads=8, context=77, vocab=49408, embed=512)
CLIP_TINY = dict(batch=4, image=32, patch=16, v_layers=2, v_width=32, v_heads=2,
                 t_layers=2, t_width=32, t_heads=2, context=8, vocab=100, embed=16)
# issue 14: "DALL·E mould", about 1.3B parameters: 24 layers, width 2048, 16 heads, sequence 256, vocab 16,384.
GPT_FULL = dict(batch=8, layers=24, width=2048, heads=16, seq=256, vocab=16384)
GPT_TINY = dict(batch=2, layers=2, width=32, heads=2, seq=8, vocab=64)
PRECISIONS = ("fp32", "fp16", "bf16")
_POLICY = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}


def gpt_params(layers: int, width: int, seq: int, vocab: int, **_) -> int:
    """Trainable parameters of the gpt builder (untied head), e.g. the full size:

    >>> gpt_params(**GPT_FULL)
    1276252160
    """
    block = 2 * 2 * width + (4 * width * width + 4 * width) + (8 * width * width + 5 * width)
    return vocab * width + seq * width + layers * block + 2 * width + width * vocab + vocab


def _layers_api(keras):
    layers, ops = keras.layers, keras.ops

    class Block(layers.Layer):
        """Pre-LN transformer block: x + MHA(LN(x)); x + MLP(LN(x)) (4x, GELU)."""

        def __init__(self, width: int, heads: int, causal: bool, **kw):
            super().__init__(**kw)
            self.width, self.heads, self.causal = width, heads, causal
            self.ln1 = layers.LayerNormalization(epsilon=1e-5, name="ln_1")
            self.qkv = layers.Dense(3 * width, name="qkv")
            self.proj = layers.Dense(width, name="attn_out")
            self.ln2 = layers.LayerNormalization(epsilon=1e-5, name="ln_2")
            self.fc = layers.Dense(4 * width, activation="gelu", name="mlp_fc")
            self.out = layers.Dense(width, name="mlp_out")

        def call(self, x):
            b, t = x.shape[0], x.shape[1]
            h, dh = self.heads, self.width // self.heads
            qkv = ops.reshape(self.qkv(self.ln1(x)), (-1, t, 3, h, dh))
            qkv = ops.transpose(qkv, (2, 0, 3, 1, 4))                 # 3, B, H, T, dh
            q, k, v = qkv[0], qkv[1], qkv[2]
            s = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * (1.0 / dh ** 0.5)
            if self.causal:
                mask = ops.triu(ops.ones((t, t), dtype="bool"), k=1)
                s = ops.where(mask, ops.cast(-1e4, s.dtype), s)
            a = ops.matmul(ops.softmax(s, axis=-1), v)                 # B, H, T, dh
            a = ops.reshape(ops.transpose(a, (0, 2, 1, 3)), (-1, t, self.width))
            x = x + self.proj(a)
            return x + self.out(self.fc(self.ln2(x)))

    class Embed(layers.Layer):
        """Token embedding + learned positions."""

        def __init__(self, vocab: int, seq: int, width: int, **kw):
            super().__init__(**kw)
            self.tok = layers.Embedding(vocab, width, name="token")
            self.seq, self.width = seq, width

        def build(self, shape):
            self.pos = self.add_weight(shape=(self.seq, self.width), name="position", initializer="random_normal")

        def call(self, ids):
            return self.tok(ids) + ops.cast(self.pos, self.compute_dtype)

    class Patches(layers.Layer):
        """ViT stem: patch convolution, class token, learned positions, pre-LN."""

        def __init__(self, patch: int, width: int, image: int, **kw):
            super().__init__(**kw)
            self.conv = layers.Conv2D(width, patch, strides=patch, use_bias=False, name="patch_conv")
            self.ln = layers.LayerNormalization(epsilon=1e-5, name="ln_pre")
            self.n = (image // patch) ** 2
            self.width = width

        def build(self, shape):
            self.cls = self.add_weight(shape=(self.width,), name="class_embedding", initializer="random_normal")
            self.pos = self.add_weight(shape=(self.n + 1, self.width), name="position", initializer="random_normal")

        def call(self, x):
            p = ops.reshape(self.conv(x), (-1, self.n, self.width))
            cls = ops.zeros_like(p[:, :1, :]) + ops.cast(self.cls, p.dtype)
            return self.ln(ops.concatenate([cls, p], axis=1) + ops.cast(self.pos, p.dtype))

    class Pool(layers.Layer):
        """Tower head: LN, pick one token (class token / last text token), linear projection to the joint space."""

        def __init__(self, embed: int, index: int, **kw):
            super().__init__(**kw)
            self.ln = layers.LayerNormalization(epsilon=1e-5, name="ln_post")
            self.proj = layers.Dense(embed, use_bias=False, name="projection")
            self.index = index

        def call(self, x):
            return self.proj(self.ln(x)[:, self.index, :])

    class Contrastive(layers.Layer):
        """L2-normalised embeddings, learned temperature, image x text logits (B x B)."""

        def build(self, shapes):
            self.scale = self.add_weight(shape=(), name="logit_scale", initializer=keras.initializers.Constant(2.659))

        def call(self, inputs):
            i, t = inputs
            i = i / ops.sqrt(ops.sum(ops.square(i), axis=-1, keepdims=True) + 1e-6)
            t = t / ops.sqrt(ops.sum(ops.square(t), axis=-1, keepdims=True) + 1e-6)
            logits = ops.matmul(i, ops.transpose(t)) * ops.cast(ops.exp(self.scale), i.dtype)
            return ops.cast(logits, "float32")

    return Block, Embed, Patches, Pool, Contrastive


@contextlib.contextmanager
def structure_only(min_elements: int = 1 << 16):
    """While active, Keras (TF backend) variables of at least `min_elements` elements are created UNINITIALISED
    (`UninitializedVariable`: a handle with shape and dtype, no buffer), so a model's training step traces
    without holding its weights and optimizer slots in memory. The traced graph is the same (same ops, shapes
    and fingerprint); only the variables' values (min/max, used to initialise them in a measurement) are
    unknown (0). Each initializer still runs once, one variable at a time (peak: the largest variable).
    Relies on Keras 3's private `keras.src.backend.tensorflow.core.Variable._initialize`."""
    import numpy as np
    import tensorflow as tf
    from keras.src.backend.tensorflow import core
    from tensorflow.python.ops import resource_variable_ops as rvo

    orig = core.Variable._initialize

    def _initialize(self, value):
        shape = getattr(value, "shape", None)
        shape = self._shape if shape is None else shape
        if isinstance(value, tf.Variable) or shape is None or int(np.prod(shape)) < min_elements:
            return orig(self, value)
        self._value = rvo.UninitializedVariable(shape=shape, dtype=tf.as_dtype(self._dtype),
                                                trainable=self.trainable, name=self.name)

    core.Variable._initialize = _initialize
    try:
        yield
    finally:
        core.Variable._initialize = orig


# fp16 loss scaling. Keras' dynamic `LossScaleOptimizer` applies the update under `cond(all gradients finite)`:
# TensorFlow traces that as ONE functional `If` op that reads every variable and gradient, so every variable is
# co-located with it and the model can no longer be split (full gpt fp16 on DGX1: 20.9 GB on one GPU). We use
# Keras' static loss scaling instead (`loss_scale_factor`: loss x S before the gradients, gradients / S before the
# update), as ops in the graph, splittable per variable. S = 2^15, LossScaleOptimizer's initial scale.
FP16_LOSS_SCALE = 2.0 ** 15


def loss_scaled(keras, optimizer_cls):
    """`optimizer_cls` with a static fp16 loss scale: loss x FP16_LOSS_SCALE, gradients / FP16_LOSS_SCALE before
    the update (embedding gradients stay IndexedSlices). Keras' own `loss_scale_factor` (and densifying the
    IndexedSlices) traces an IdentityN over every gradient, which would join the whole model in one op."""
    import tensorflow as tf

    class Scaled(optimizer_cls):
        def scale_loss(self, loss):
            return loss * FP16_LOSS_SCALE

        def apply(self, grads, trainable_variables=None):
            grads = [None if g is None else
                     tf.IndexedSlices(g.values / FP16_LOSS_SCALE, g.indices, g.dense_shape)
                     if isinstance(g, tf.IndexedSlices) else g / FP16_LOSS_SCALE for g in grads]
            return super().apply(grads, trainable_variables)

    Scaled.__name__ = f"Scaled{optimizer_cls.__name__}"
    return Scaled


def _compile(keras, model, precision: str, loss) -> None:
    cls = loss_scaled(keras, keras.optimizers.Adam) if precision == "fp16" else keras.optimizers.Adam
    opt = cls(learning_rate=1e-4)
    model.compile(optimizer=opt, loss=loss, auto_scale_loss=False)


def _with_policy(precision: str, build):
    import keras

    if precision not in PRECISIONS:
        from placer.errors import GraphImportError

        raise GraphImportError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    old = keras.mixed_precision.global_policy().name
    keras.backend.clear_session()   # stable layer names (and so a stable fingerprint) within one process
    keras.mixed_precision.set_global_policy(_POLICY[precision])
    try:
        return build(keras)
    finally:
        keras.mixed_precision.set_global_policy(old)
        keras.backend.clear_session()


def build_gpt(size: str, batch_size: int | None, *, layers: int | None = None, precision: str = "fp32",
              materialize: bool | None = None) -> OpGraph:
    """Decoder-only transformer training step (embedding, L causal blocks, head, sparse cross-entropy, Adam).
    The full size is built `structure_only` (1.28B parameters + 2 Adam slots would hold 15 GB); `materialize`
    overrides (True: real variables; False: structure only, whatever the size)."""
    from placer.graphs.trace import convert_keras

    p = dict(GPT_TINY if size == "tiny" else GPT_FULL)
    if layers:
        p["layers"] = int(layers)
    B = batch_size or p["batch"]

    def build(keras):
        Block, Embed, *_ = _layers_api(keras)
        ids = keras.Input((p["seq"],), batch_size=B, dtype="int32", name="tokens")
        x = Embed(p["vocab"], p["seq"], p["width"], name="embedding")(ids)
        for i in range(p["layers"]):
            x = Block(p["width"], p["heads"], True, name=f"layer_{i}")(x)
        x = keras.layers.LayerNormalization(epsilon=1e-5, name="head_ln")(x)
        logits = keras.layers.Dense(p["vocab"], name="head", dtype="float32" if precision == "fp32" else None)(x)
        logits = keras.layers.Activation("linear", dtype="float32", name="head_logits")(logits)
        model = keras.Model(ids, logits, name="gpt")
        _compile(keras, model, precision, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return convert_keras(model, batch_size=B, name="gpt")

    if materialize is None:
        materialize = size == "tiny"
    if materialize:
        return _with_policy(precision, build)
    with structure_only(1 if size == "tiny" else 1 << 16):
        return _with_policy(precision, build)


def build_clip(size: str, batch_size: int | None, *, precision: str = "fp32") -> OpGraph:
    """CLIP dual encoder training step: ViT image tower, text transformer, symmetric contrastive loss, Adam."""
    from placer.graphs.trace import convert_keras

    p = dict(CLIP_TINY if size == "tiny" else CLIP_FULL)
    B = batch_size or p["batch"]

    def build(keras):
        Block, Embed, Patches, Pool, Contrastive = _layers_api(keras)
        img = keras.Input((p["image"], p["image"], 3), batch_size=B, name="images")
        txt = keras.Input((p["context"],), batch_size=B, dtype="int32", name="texts")
        x = Patches(p["patch"], p["v_width"], p["image"], name="image_embedding")(img)
        for i in range(p["v_layers"]):
            x = Block(p["v_width"], p["v_heads"], False, name=f"image_layer_{i}")(x)
        x = Pool(p["embed"], 0, name="image_head")(x)
        t = Embed(p["vocab"], p["context"], p["t_width"], name="text_embedding")(txt)
        for i in range(p["t_layers"]):
            t = Block(p["t_width"], p["t_heads"], True, name=f"text_layer_{i}")(t)
        t = Pool(p["embed"], p["context"] - 1, name="text_head")(t)   # the end-of-text token (fixed length)
        logits = Contrastive(name="contrastive")([x, t])
        model = keras.Model([img, txt], logits, name="clip")

        def symmetric_ce(y_true, y_pred):
            """(CE(image->text) + CE(text->image)) / 2 with the diagonal as the labels (y_true is ignored)."""
            ops = keras.ops
            labels = ops.arange(B)
            a = keras.losses.sparse_categorical_crossentropy(labels, y_pred, from_logits=True)
            b = keras.losses.sparse_categorical_crossentropy(labels, ops.transpose(y_pred), from_logits=True)
            return (a + b) * 0.5 + 0.0 * ops.sum(y_true)

        _compile(keras, model, precision, symmetric_ce)
        return convert_keras(model, batch_size=B, name="clip")

    return _with_policy(precision, build)
