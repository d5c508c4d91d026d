"""Built-in benchmark models: `build_model(name, size="full", batch_size=None) -> OpGraph`.

    from placer.graphs.models import build_model, MODELS
    g = build_model("nmt4")                 # full size (the paper's benchmark), cached after the first build
    t = build_model("rnnlm", size="tiny")   # a few seconds: tests and demos
    s = build_model("nmt", size="small")    # a step of ~0.1-0.5 s on one CPU core: real measurements

Models (sizes and their sources: benchmarks/README.md)
-------------------------------------------------------
* ``inception_v3``: Keras 3 ``keras.applications.InceptionV3(weights=None)``, batch 32, 299x299x3, 1000 classes,
  categorical cross-entropy, RMSProp; the imported graph is the whole training step (forward, loss, gradients,
  optimizer update). ``tiny``: a 2-block Inception-style Keras net on 32x32x3, batch 4, same loss/optimizer;
  ``small``: 3 wider blocks on 96x96x3, 100 classes, batch 20.
* ``nmt`` / ``nmt4``: GNMT-style encoder-decoder, 2 / 4 LSTM layers each side, hidden 1024, vocab 32,000 both
  sides, batch 64, 40 source and 40 target steps, additive (Bahdanau) attention with input feeding, softmax,
  Adam; built directly as a TF1 graph, LSTMs UNROLLED (every time step is separate ops).
  ``tiny``: hidden 64, vocab 1000, seq 6, batch 8; ``small``: hidden 384, vocab 8000, seq 8, batch 32.
* ``rnnlm``: 2-layer unrolled LSTM language model, hidden 2048, vocab 32,000, batch 64, 40 steps, SGD.
  ``tiny``: hidden 64, vocab 1000, seq 6, batch 8; ``small``: hidden 640, vocab 8000, seq 10, batch 32.

``small`` sits between: its training step takes roughly 0.1-0.5 s on ONE CPU core (intra/inter-op threads 1),
so a real 2-task TF cluster (a core per task) can time it, and it has a few thousand ops at most.

* ``clip`` / ``gpt``: Keras transformers (issue 14), see :mod:`placer.graphs.models.transformer`;
  ``layers`` scales gpt's depth (``--layers L``).

``precision`` (``fp32`` default, ``fp16``, ``bf16``): Keras mixed-precision policy for the Keras models
(inception_v3, clip, gpt), loss scaling for fp16; the TF1 LSTM models are fp32 only (a one-line error).

Op naming convention of the LSTM models (the expert baseline parses it)
------------------------------------------------------------------------
Every op name starts with its LAYER, one of:

    nmt/nmt4:  encoder/embedding   encoder/layer_<i>   decoder/embedding   decoder/layer_<i>
               decoder/attention   softmax   loss
    rnnlm:     embedding   layer_<i>   softmax   loss

* forward ops:  ``<layer>/...``; recurrent layers per time step ``<layer>/step_<t>/...`` (e.g.
  ``encoder/layer_1/step_3/MatMul``); the layer's variables are ``<layer>/<var>`` (``encoder/layer_0/kernel``,
  ``encoder/layer_0/bias``, ``encoder/embedding/embedding_matrix``, ``softmax/weights`` ...); variable reads
  sit under the reading op (``.../step_3/MatMul/ReadVariableOp``). Inputs: ``encoder/embedding/source_ids``,
  ``decoder/embedding/target_ids``, ``loss/labels`` (rnnlm: ``embedding/input_ids``, ``loss/labels``).
* gradient ops (``tf.compat.v1.gradients``): ``gradients/<forward op name>_grad/...``; the sums that
  aggregate several gradients of one tensor (TF names them ``gradients/AddN_<k>``) are renamed
  ``gradients/<consumer's forward op>_grad/sum_<k>``, and a variable's summed gradient (one term per time step)
  ``gradients/<variable name>_grad/sum_<k>``. Strip the leading ``gradients/`` to find the layer; only
  ``gradients/Shape`` and ``gradients/grad_ys_0`` (the seed of backprop) carry no layer: they belong to ``loss``.
* optimizer ops: Adam (nmt) ``Adam/update_<variable name>/...`` (e.g.
  ``Adam/update_decoder/layer_0/kernel/ResourceApplyAdam``), slots ``<variable name>/Adam`` and
  ``<variable name>/Adam_1``; shared ``beta1_power``/``beta2_power`` and ``Adam/...`` (no layer);
  SGD (rnnlm) ``GradientDescent/update_<variable name>/...``; the train op is ``train_op`` (a NoOp).
  So a layer owns every op whose name, after removing a leading ``gradients/``, ``Adam/update_`` or
  ``GradientDescent/update_`` prefix, starts with ``<layer>/``.

Keras (inception_v3) ops are named by Keras (``<model>/<layer name>/...``, variables by their Keras path).
"""
from __future__ import annotations

from typing import Callable

from placer.errors import GraphImportError
from placer.graphs.cache import cached
from placer.graphs.opgraph import OpGraph
from placer.graphs.runnable import check_batch_size

MODELS_VERSION = 8  # bump when a builder changes (invalidates cached builds)
MODELS: tuple[str, ...] = ("inception_v3", "nmt", "nmt4", "rnnlm", "clip", "gpt")
SIZES = ("tiny", "small", "full")
PRECISIONS = ("fp32", "fp16", "bf16")
KERAS_MODELS = ("inception_v3", "clip", "gpt")   # the ones --precision fp16/bf16 applies to (Keras policies)


def _builder(name: str, layers: int | None = None, precision: str = "fp32") -> Callable[[str, int | None], OpGraph]:
    if name == "inception_v3":
        from placer.graphs.models.inception import build_inception_v3

        return lambda size, batch: build_inception_v3(size, batch, precision=precision)
    if name == "gpt":
        from placer.graphs.models.transformer import build_gpt

        return lambda size, batch: build_gpt(size, batch, layers=layers, precision=precision)
    if name == "clip":
        from placer.graphs.models.transformer import build_clip

        return lambda size, batch: build_clip(size, batch, precision=precision)
    if name in ("nmt", "nmt4"):
        from placer.graphs.models.seq2seq import build_nmt

        layers = 2 if name == "nmt" else 4
        return lambda size, batch: build_nmt(size, batch, num_layers=layers, name=name)
    if name == "rnnlm":
        from placer.graphs.models.seq2seq import build_rnnlm

        return build_rnnlm
    raise GraphImportError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")


MAX_LAYERS = 256        # gpt's --layers: ~860 ops a layer, so ~220k ops, twice the 100k-op scale the search is sized for


def build_model(name: str, size: str = "full", batch_size: int | None = None, *, cache: bool = True,
                layers: int | None = None, precision: str = "fp32") -> OpGraph:
    """Build (or load from the cache) the training-step OpGraph of a built-in model.

    >>> g = build_model("rnnlm", size="tiny")        # doctest: +SKIP
    >>> g.num_ops > 100, g.fetches                   # doctest: +SKIP
    (True, ('train_op', 'loss/total:0'))
    """
    if name not in MODELS:
        raise GraphImportError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")
    if size not in SIZES:
        raise GraphImportError(f"unknown size {size!r} for model {name!r}; valid sizes: {', '.join(SIZES)}")
    check_batch_size(batch_size)
    if precision not in PRECISIONS:
        raise GraphImportError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if precision != "fp32" and name not in KERAS_MODELS:
        raise GraphImportError(f"--precision {precision} is not available for model {name!r} (a TF1 graph); "
                               f"mixed precision applies to {', '.join(KERAS_MODELS)}")
    if layers is not None:
        if name != "gpt":
            raise GraphImportError(f"--layers applies to model 'gpt' only, not {name!r}")
        if not isinstance(layers, int) or layers <= 0:
            raise GraphImportError(f"--layers must be a positive integer, got {layers!r}")
        if layers > MAX_LAYERS:
            raise GraphImportError(f"--layers {layers}: at most {MAX_LAYERS} (about {MAX_LAYERS * 860:,} ops; "
                                   f"24 layers make 20,603)")
    if size == "small" and name in ("clip", "gpt"):
        raise GraphImportError(f"model {name!r} has sizes tiny and full (no 'small')")
    build = _builder(name, layers, precision)
    key = ("model", name, size, batch_size, MODELS_VERSION) + ((layers, precision) if (layers or precision != "fp32")
                                                               else ())
    return cached(key, lambda: _tagged(build(size, batch_size), precision), cache)


def _tagged(g: OpGraph, precision: str) -> OpGraph:
    object.__setattr__(g, "precision", precision)
    return g


__all__ = ["MODELS", "PRECISIONS", "SIZES", "build_model"]
