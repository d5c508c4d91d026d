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

`build_random_towers(seed)` draws a multi-input model instead: two or three towers side by side (a conv tower on
images, or an LSTM / self-attention / dense tower on its own token sequence), each 2-5 blocks deep, their pooled
features concatenated into a dense head (as in visual question answering or recommendation models). Its towers
are independent until the head, so splitting them across devices pays, which no stack shows. `precision`
(fp16 / bf16) builds either under a Keras mixed-precision policy, as the built-in Keras models are.
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


def describe_towers(seed: int) -> dict:
    """The multi-input architecture a seed draws (what `build_random_towers` builds): a list of towers, each an
    `describe`-like dict (kind, blocks, widths), and the head."""
    rng = np.random.default_rng([int(seed), 7])     # a stream of its own: `describe`'s draws are unchanged
    towers = []
    for _ in range(int(rng.integers(2, 4))):
        kind = "image" if rng.random() < 0.4 else "sequence"
        depth = int(rng.integers(2, 6))
        widths = [int(w) for w in rng.choice([64, 128, 256, 512], size=depth)]
        if kind == "image":
            blocks = [("conv_branch" if rng.random() < 0.4 else "conv") for _ in range(depth)]
        else:
            blocks = [str(rng.choice(["lstm", "attention", "dense"], p=[0.3, 0.5, 0.2])) for _ in range(depth)]
        towers.append({"kind": kind, "blocks": blocks, "widths": widths})
    return {"towers": towers, "head": int(rng.choice([256, 512, 1024])), "batch": int(rng.choice([8, 16, 32, 64])),
            "classes": int(rng.choice([10, 100, 1000])), "vocab": int(rng.choice([1000, 8000, 32000]))}


def build_random_stack(seed: int, batch_size: int | None = None, *, precision: str = "fp32",
                       cache: bool = True) -> OpGraph:
    arch = describe(seed)
    key = ("random_stack", int(seed), batch_size, RANDOM_VERSION) + (() if precision == "fp32" else (precision,))
    return cached(key, lambda: _keras(arch, batch_size or arch["batch"], f"random_{int(seed)}", precision), cache)


def build_random_towers(seed: int, batch_size: int | None = None, *, precision: str = "fp32",
                        cache: bool = True) -> OpGraph:
    arch = describe_towers(seed)
    key = ("random_towers", int(seed), batch_size, precision, RANDOM_VERSION)
    return cached(key, lambda: _keras(arch, batch_size or arch["batch"], f"towers_{int(seed)}", precision), cache)


def _tower(keras, arch: dict, x, prefix: str):
    """One stack of blocks on input `x` (images or embedded tokens), pooled to a vector."""
    L = keras.layers
    if arch["kind"] == "image":
        for i, (b, w) in enumerate(zip(arch["blocks"], arch["widths"])):
            if b in ("conv", "conv_branch"):
                y = L.Conv2D(min(w, 256), 3, padding="same", use_bias=False, name=f"{prefix}block_{i}_conv")(x)
                y = L.BatchNormalization(name=f"{prefix}block_{i}_bn")(y)
                y = L.ReLU(name=f"{prefix}block_{i}_relu")(y)
                if b == "conv_branch":
                    z = L.Conv2D(min(w, 256) // 2, 1, activation="relu", name=f"{prefix}block_{i}_branch")(x)
                    y = L.Concatenate(name=f"{prefix}block_{i}_concat")([y, z])
                if i % 2 == 1:
                    y = L.MaxPooling2D(2, name=f"{prefix}block_{i}_pool")(y)
                x = y
            else:
                if len(x.shape) == 4:
                    x = L.GlobalAveragePooling2D(name=f"{prefix}block_{i}_gap")(x)
                x = L.Dense(w, activation="relu", name=f"{prefix}block_{i}_dense")(x)
        if len(x.shape) == 4:
            x = L.GlobalAveragePooling2D(name=f"{prefix}gap")(x)
        return x
    for i, (b, w) in enumerate(zip(arch["blocks"], arch["widths"])):
        if b == "lstm":
            x = L.LSTM(w, return_sequences=True, unroll=True, name=f"{prefix}block_{i}_lstm")(x)
        elif b == "attention":
            d = int(x.shape[-1])
            heads = max(1, min(8, d // 32))
            a = L.MultiHeadAttention(heads, d // heads, name=f"{prefix}block_{i}_attn")(x, x)
            x = L.LayerNormalization(name=f"{prefix}block_{i}_ln1")(L.Add(name=f"{prefix}block_{i}_res1")([x, a]))
            f = L.Dense(2 * d, activation="relu", name=f"{prefix}block_{i}_ff1")(x)
            f = L.Dense(d, name=f"{prefix}block_{i}_ff2")(f)
            x = L.LayerNormalization(name=f"{prefix}block_{i}_ln2")(L.Add(name=f"{prefix}block_{i}_res2")([x, f]))
        else:
            x = L.Dense(w, activation="relu", name=f"{prefix}block_{i}_dense")(x)
    return L.GlobalAveragePooling1D(name=f"{prefix}pool")(x)


def _input(keras, arch: dict, vocab: int, batch: int, prefix: str):
    """(the Keras input, the tower's first tensor) of an image or token tower."""
    if arch["kind"] == "image":
        inp = keras.Input((32, 32, 3), batch_size=batch, name=f"{prefix}images")
        return inp, inp
    inp = keras.Input((16,), batch_size=batch, dtype="int32", name=f"{prefix}tokens")
    return inp, keras.layers.Embedding(vocab, arch["widths"][0], name=f"{prefix}embedding")(inp)


def _keras(arch: dict, batch: int, name: str, precision: str = "fp32") -> OpGraph:
    """Build a stack (`describe`) or towers (`describe_towers`) under `precision`'s Keras policy and trace it."""
    from placer.graphs.models.transformer import _compile, _with_policy
    from placer.graphs.trace import convert_keras

    def build(keras):
        L = keras.layers
        if "towers" in arch:
            inputs, feats = [], []
            for t, tower in enumerate(arch["towers"]):
                inp, x = _input(keras, tower, arch["vocab"], batch, f"tower_{t}_")
                inputs.append(inp)
                feats.append(_tower(keras, tower, x, f"tower_{t}_"))
            x = L.Concatenate(name="merge")(feats)
            x = L.Dense(arch["head"], activation="relu", name="head_dense")(x)
        else:
            inp, x = _input(keras, arch, arch["vocab"], batch, "")
            inputs = inp
            x = _tower(keras, arch, x, "")
        out = L.Dense(arch["classes"], name="head")(x)
        if precision != "fp32":
            out = L.Activation("linear", dtype="float32", name="head_fp32")(out)
        model = keras.Model(inputs, out, name=name)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if precision == "fp32":
            model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
        else:                       # Adam with static loss scaling for fp16, as the built-in Keras models
            _compile(keras, model, precision, loss)
        return convert_keras(model, batch_size=batch, name=name)

    g = _with_policy(precision, build)
    object.__setattr__(g, "precision", precision)
    return g
