"""Inception-V3 training step from Keras 3 (`keras.applications.InceptionV3`), and smaller look-alikes."""
from __future__ import annotations

from placer.graphs.models.transformer import loss_scaled
from placer.graphs.opgraph import OpGraph
from placer.graphs.trace import convert_keras

FULL = dict(batch=32, image=299, classes=1000)   # Mirhoseini et al. 2017: Inception-V3, batch 32, ImageNet
# look-alikes: `blocks` Inception blocks whose branches have `width` (1x1) and 1.5 x `width` (3x3) filters
TINY = dict(batch=4, image=32, classes=10, blocks=2, width=8, stem=16, name="tiny_inception")
SMALL = dict(batch=20, image=96, classes=100, blocks=3, width=16, stem=32, name="small_inception")


def _inception_like(keras, image: int, classes: int, blocks: int, width: int, stem: int, name: str):
    """Stem + Inception blocks (1x1 / 1x1-3x3 / 1x1-3x3-3x3 / pool-1x1 branches, BN + ReLU) + GAP + softmax."""
    layers = keras.layers

    def conv_bn(x, filters, k, name, strides=1):
        x = layers.Conv2D(filters, k, strides=strides, padding="same", use_bias=False, name=f"{name}_conv")(x)
        x = layers.BatchNormalization(scale=False, name=f"{name}_bn")(x)
        return layers.Activation("relu", name=f"{name}_relu")(x)

    inp = keras.Input((image, image, 3), name="images")
    w, w3 = width, width * 3 // 2
    x = conv_bn(inp, stem, 3, "stem", strides=2)
    for b in range(blocks):
        p = f"mixed{b}"
        b1 = conv_bn(x, w, 1, f"{p}_b1x1")
        b3 = conv_bn(conv_bn(x, w, 1, f"{p}_b3x3_reduce"), w3, 3, f"{p}_b3x3")
        bd = conv_bn(conv_bn(conv_bn(x, w, 1, f"{p}_bdbl_reduce"), w3, 3, f"{p}_bdbl_1"), w3, 3, f"{p}_bdbl_2")
        bp = layers.AveragePooling2D(3, strides=1, padding="same", name=f"{p}_pool")(x)
        bp = conv_bn(bp, w, 1, f"{p}_bpool")
        x = layers.Concatenate(name=p)([b1, b3, bd, bp])
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    out = layers.Dense(classes, activation="softmax", name="predictions")(x)
    return keras.Model(inp, out, name=name)


def build_inception_v3(size: str, batch_size: int | None, *, precision: str = "fp32") -> OpGraph:
    """Keras InceptionV3 (weights=None) training step: forward, categorical cross-entropy, gradients, RMSProp.
    `precision` fp16 / bf16: Keras mixed policy (fp16 with static loss scaling)."""
    import keras

    if precision != "fp32":
        old = keras.mixed_precision.global_policy().name
        try:
            return _build_inception(keras, size, batch_size, precision)
        finally:
            keras.mixed_precision.set_global_policy(old)
    return _build_inception(keras, size, batch_size, precision)


def _build_inception(keras, size: str, batch_size: int | None, precision: str) -> OpGraph:

    p = dict({"tiny": TINY, "small": SMALL, "full": FULL}[size])
    batch = batch_size or p["batch"]
    keras.backend.clear_session()  # stable layer names (and so a stable fingerprint) within one process
    if precision != "fp32":        # after clear_session, which resets the global policy
        keras.mixed_precision.set_global_policy(f"mixed_{'float16' if precision == 'fp16' else 'bfloat16'}")
    if size == "full":
        model = keras.applications.InceptionV3(weights=None, input_shape=(p["image"], p["image"], 3),
                                               classes=p["classes"])
    else:
        model = _inception_like(keras, **{k: v for k, v in p.items() if k != "batch"})
    # fp16: static loss scaling, as for clip/gpt (see transformer.FP16_LOSS_SCALE: no op joins every gradient)
    cls = loss_scaled(keras, keras.optimizers.RMSprop) if precision == "fp16" else keras.optimizers.RMSprop
    opt = cls(learning_rate=0.045, rho=0.9, epsilon=1.0)
    model.compile(optimizer=opt, loss="categorical_crossentropy", auto_scale_loss=False)
    g = convert_keras(model, batch_size=batch, name="inception_v3")
    keras.backend.clear_session()
    return g
