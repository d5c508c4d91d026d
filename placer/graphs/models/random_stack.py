"""Random Keras models for the pretraining corpus (issue 13): stacks of conv, dense, LSTM and attention blocks,
built with Keras and traced like a user's model (`convert_keras`: the whole training step, Adam).

    from placer.graphs.models.random_stack import build_random_stack
    g = build_random_stack(3)        # the same seed gives the same graph (cached)

A seed draws the input kind (images 32x32x3 or token sequences of 16), the depth (3-8 blocks), the widths
(64-512) and the block kinds: images take conv blocks (conv-BN-ReLU, some with a parallel 1x1 branch
concatenated, as in Inception) and end in dense blocks; sequences take LSTM (unrolled, so each time step is
separate ops as in the LSTM benchmarks), self-attention (multi-head attention, residual, layer norm,
feed-forward) and per-position dense blocks. Sizes are kept to a few hundred to a few thousand ops, so the
corpus builds in minutes.
"""
from __future__ import annotations

import numpy as np

from placer.graphs.cache import cached
from placer.graphs.opgraph import OpGraph

RANDOM_VERSION = 1


def describe(seed: int) -> dict:
    """The architecture a seed draws (what `build_random_stack` builds)."""
    rng = np.random.default_rng(int(seed))
    kind = "image" if rng.random() < 0.4 else "sequence"
    depth = int(rng.integers(3, 9))
    widths = [int(w) for w in rng.choice([64, 128, 256, 512], size=depth)]
    if kind == "image":
        n_conv = max(1, depth - int(rng.integers(1, 3)))
        blocks = [("conv_branch" if rng.random() < 0.4 else "conv") for _ in range(n_conv)] + ["dense"] * (depth - n_conv)
    else:
        blocks = [str(rng.choice(["lstm", "attention", "dense"], p=[0.35, 0.4, 0.25])) for _ in range(depth)]
    batch = int(rng.choice([8, 16, 32, 64]))
    return {"kind": kind, "blocks": blocks, "widths": widths, "batch": batch,
            "classes": int(rng.choice([10, 100, 1000])), "vocab": int(rng.choice([1000, 8000, 32000]))}


def build_random_stack(seed: int, batch_size: int | None = None, *, cache: bool = True) -> OpGraph:
    arch = describe(seed)
    key = ("random_stack", int(seed), batch_size, RANDOM_VERSION)
    return cached(key, lambda: _build(arch, batch_size or arch["batch"], f"random_{int(seed)}"), cache)


def _build(arch: dict, batch: int, name: str) -> OpGraph:
    import keras

    from placer.graphs.trace import convert_keras

    keras.backend.clear_session()
    L = keras.layers
    if arch["kind"] == "image":
        inp = keras.Input((32, 32, 3), batch_size=batch, name="images")
        x = inp
        for i, (b, w) in enumerate(zip(arch["blocks"], arch["widths"])):
            if b in ("conv", "conv_branch"):
                y = L.Conv2D(min(w, 256), 3, padding="same", use_bias=False, name=f"block_{i}_conv")(x)
                y = L.BatchNormalization(name=f"block_{i}_bn")(y)
                y = L.ReLU(name=f"block_{i}_relu")(y)
                if b == "conv_branch":
                    z = L.Conv2D(min(w, 256) // 2, 1, activation="relu", name=f"block_{i}_branch")(x)
                    y = L.Concatenate(name=f"block_{i}_concat")([y, z])
                if i % 2 == 1:
                    y = L.MaxPooling2D(2, name=f"block_{i}_pool")(y)
                x = y
            else:
                if len(x.shape) == 4:
                    x = L.GlobalAveragePooling2D(name=f"block_{i}_gap")(x)
                x = L.Dense(w, activation="relu", name=f"block_{i}_dense")(x)
        if len(x.shape) == 4:
            x = L.GlobalAveragePooling2D(name="gap")(x)
    else:
        inp = keras.Input((16,), batch_size=batch, dtype="int32", name="tokens")
        x = L.Embedding(arch["vocab"], arch["widths"][0], name="embedding")(inp)
        for i, (b, w) in enumerate(zip(arch["blocks"], arch["widths"])):
            if b == "lstm":
                x = L.LSTM(w, return_sequences=True, unroll=True, name=f"block_{i}_lstm")(x)
            elif b == "attention":
                d = int(x.shape[-1])
                heads = max(1, min(8, d // 32))
                a = L.MultiHeadAttention(heads, d // heads, name=f"block_{i}_attn")(x, x)
                x = L.LayerNormalization(name=f"block_{i}_ln1")(L.Add(name=f"block_{i}_res1")([x, a]))
                f = L.Dense(2 * d, activation="relu", name=f"block_{i}_ff1")(x)
                f = L.Dense(d, name=f"block_{i}_ff2")(f)
                x = L.LayerNormalization(name=f"block_{i}_ln2")(L.Add(name=f"block_{i}_res2")([x, f]))
            else:
                x = L.Dense(w, activation="relu", name=f"block_{i}_dense")(x)
        x = L.GlobalAveragePooling1D(name="pool")(x)
    out = L.Dense(arch["classes"], name="head")(x)
    model = keras.Model(inp, out, name=name)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    g = convert_keras(model, batch_size=batch, name=name)
    keras.backend.clear_session()
    return g
