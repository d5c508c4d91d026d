"""Keras models and tf.functions: trace the training step, then hand its graph to :mod:`placer.graphs.cleanup`.

    g = convert_keras(model, batch_size=32, name="mine")    # a compiled Keras 3 model's train_step
    g = convert_concrete(fn.get_concrete_function(spec), fetches=None, batch_size=None, name="step")

A Keras model's TRAINING STEP (forward, loss, gradients, optimizer update) is traced as a ``tf.function`` on
synthetic inputs of the model's input shapes; an unknown batch dimension needs ``batch_size``. A
ConcreteFunction's captured variables (resource placeholders) become real ``VarHandleOp`` s (their shape, dtype,
``shared_name`` = the op name) named after the variable (``v.name``); other captured eager tensors become
``Const`` s. Fetches default to the function's outputs plus its stateful "control outputs" (grouped under one
``train_op`` NoOp).
"""
from __future__ import annotations

import contextlib
import hashlib
import re
from pathlib import Path

import numpy as np

from placer.errors import GraphImportError
from placer.graphs.cleanup import (convert_graph_def, first_line, group_control_fetches, inline_functions,
                                   rename_inputs, renamed_input, unique_name)
from placer.graphs.opgraph import OpGraph


def load_keras_file(path: Path):
    """The Keras model saved in `path` (a ``.keras`` file); one clear error when it cannot be loaded."""
    import zipfile

    import keras

    try:        # a .keras file is a zip archive; Keras calls any other file "File not found"
        zipfile.ZipFile(path).close()
    except (OSError, zipfile.BadZipFile) as e:
        raise GraphImportError(f"cannot load Keras model {path}: not a readable Keras file (a .keras zip "
                               f"archive): {getattr(e, 'strerror', None) or e}") from None
    try:
        return keras.models.load_model(path)
    except Exception as e:  # noqa: BLE001 - any load failure is one clear error
        raise GraphImportError(f"cannot load Keras model {path}: {first_line(e)}") from None


def check_compiled(model) -> None:
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise GraphImportError(
            f"Keras model {model.name!r} is not compiled: call model.compile(optimizer=..., loss=...) so its "
            "training step (loss, gradients, optimizer update) can be imported")


def keras_key(model) -> str | None:
    """A hash of the model's config, optimizer and loss (a cache key), or None when they do not serialise."""
    try:
        cfg = model.to_json()
        opt = model.optimizer.get_config() if model.optimizer is not None else None
        return hashlib.sha256(repr((cfg, repr(opt), repr(getattr(model, "loss", None)))).encode()).hexdigest()
    except Exception:  # noqa: BLE001 - custom layers may not serialise; then we just don't cache
        return None


def _output_shapes(model, x_arg, shapes):
    """The outputs' shapes for inputs of the fixed shapes `x_arg`, where an output dimension is known only from
    them (a CLIP-style similarity matrix is (batch, batch)); `shapes` as they are when Keras cannot tell."""
    import keras
    import tensorflow as tf

    try:
        spec = model.compute_output_spec(tf.nest.map_structure(lambda s: keras.KerasTensor(s.shape, s.dtype), x_arg))
        out = [t.shape for t in keras.tree.flatten(spec)]
    except Exception:  # noqa: BLE001 - then the unknown dimension is reported as it is
        return shapes
    return out if len(out) == len(shapes) else shapes


def keras_step_function(model, batch_size: int | None):
    """Trace the Keras model's train_step on synthetic inputs; returns a ConcreteFunction."""
    import tensorflow as tf

    def fixed(shape, what):
        dims = list(shape)
        if not dims:
            return dims
        if dims[0] is None:
            if batch_size is None:
                raise GraphImportError(
                    f"Keras model {model.name!r}: the batch dimension of {what} is unknown: give a batch size "
                    "(--batch-size B / batch_size=B)")
            dims[0] = int(batch_size)
        if any(d is None for d in dims[1:]):
            raise GraphImportError(f"Keras model {model.name!r}: {what} has unknown dimensions {tuple(shape)}; "
                                   "build the model with static input shapes")
        return dims

    try:
        inputs = model.inputs
        outputs = model.outputs
    except (AttributeError, ValueError):
        inputs = outputs = None
    if not inputs or not outputs:
        raise GraphImportError(f"Keras model {model.name!r} has no static inputs/outputs: build it "
                               "(functional API, or call model.build(input_shape))")
    loss = getattr(model, "loss", None)
    loss_name = (loss if isinstance(loss, str) else type(loss).__name__ if loss is not None else "").lower()
    sparse = "sparse" in loss_name
    xs = [tf.TensorSpec(fixed(t.shape, f"input {t.name!r}"), t.dtype or "float32") for t in inputs]
    x_arg = xs[0] if len(xs) == 1 else tuple(xs)
    try:
        struct = model.input          # a functional model's inputs as it was built: a tensor, a list or a dict
    except (AttributeError, ValueError):
        struct = None
    if isinstance(struct, dict) and len(tf.nest.flatten(struct)) == len(xs):
        # in the model's own structure (model.inputs is it flattened, dict keys sorted, as tf.nest packs): a tuple
        # made Keras warn "The structure of `inputs` doesn't match the expected structure" on every import
        x_arg = tf.nest.pack_sequence_as(struct, xs)
    out_shapes = [t.shape for t in outputs]
    if any(d is None for shp in out_shapes for d in list(shp)[1:]):
        out_shapes = _output_shapes(model, x_arg, out_shapes)
    ys = []
    for t, shape in zip(outputs, out_shapes):
        shp = fixed(shape, f"output {t.name!r}")
        ys.append(tf.TensorSpec(shp[:-1], "int32") if sparse else tf.TensorSpec(shp, t.dtype or "float32"))
    y_arg = ys[0] if len(ys) == 1 else tuple(ys)
    zeros = lambda s: tf.zeros(s.shape, s.dtype)  # noqa: E731
    data = (tf.nest.map_structure(zeros, x_arg), tf.nest.map_structure(zeros, y_arg))
    try:
        if hasattr(model, "_symbolic_build"):
            model._symbolic_build(data_batch=data)  # builds optimizer slots + metric variables outside the trace
        else:
            model.optimizer.build(model.trainable_variables)

        @tf.function
        def train_step(x, y):
            return model.train_step((x, y))

        with _finite_step(model.optimizer):
            return train_step.get_concrete_function(x_arg, y_arg)
    except GraphImportError:
        raise
    except Exception as e:  # noqa: BLE001
        raise GraphImportError(f"cannot trace the training step of Keras model {model.name!r}: "
                               f"{first_line(e)}") from None


@contextlib.contextmanager
def _finite_step(optimizer):
    """Trace a Keras ``LossScaleOptimizer`` (what ``compile`` makes under the ``mixed_float16`` policy) as its step
    with finite gradients: unscale, the inner optimizer's per-variable update, the scale's counter.

    Its ``apply`` runs all that under ``cond(all gradients finite)``, which TensorFlow traces as ONE ``If`` op
    reading every variable: co-located with all of them, it would hold the whole model on one device and hide the
    optimizer's work in one op. Only the all-finite check (cheap reductions, false on the rare overflow step) is
    left out. Any other optimizer is traced as it is.
    """
    handle = getattr(optimizer, "_stateful_handle_finite_grads", None)
    if handle is None or not hasattr(optimizer, "inner_optimizer"):
        yield
        return

    def apply(grads, trainable_variables=None):
        handle(list(grads), trainable_variables)

    object.__setattr__(optimizer, "apply", apply)     # on the instance only, bypassing Keras' attribute tracking
    try:
        yield
    finally:
        object.__delattr__(optimizer, "apply")


def convert_keras(model, *, batch_size: int | None, name: str) -> OpGraph:
    """A compiled Keras model's training step as an OpGraph (no cache)."""
    check_compiled(model)
    cf = keras_step_function(model, batch_size)
    return convert_concrete(cf, fetches=None, batch_size=None, name=name,     # the trace fixed the batch
                            what="Keras model")


def function_name(cf) -> str:
    n = getattr(cf, "name", "function")
    return n.decode() if isinstance(n, bytes) else str(n)


def _variable_node(node, v, vname: str) -> tuple[float, float]:
    """Turn captured-resource placeholder `node` into variable `v`'s VarHandleOp; returns v's (min, max)."""
    import tensorflow as tf

    node.op = "VarHandleOp"
    node.ClearField("input")
    node.attr.clear()
    node.attr["dtype"].type = v.dtype.as_datatype_enum
    node.attr["shape"].shape.CopyFrom(tf.TensorShape(v.shape).as_proto())
    node.attr["shared_name"].s = vname.encode()
    node.attr["container"].s = b""
    node.name = vname
    try:
        val = v.numpy()
        lo, hi = (float(val.min()), float(val.max())) if val.size else (0.0, 0.0)
        if not (np.isfinite(lo) and np.isfinite(hi)):
            lo = hi = 0.0
    except Exception:  # noqa: BLE001
        lo = hi = 0.0
    return lo, hi


def convert_concrete(cf, *, fetches: list[str] | None, batch_size: int | None, name: str,
                     what: str = "function") -> OpGraph:
    """ConcreteFunction -> self-contained GraphDef (variables as VarHandleOps) -> OpGraph (no cache). `what` names
    the source in errors ("function", "Keras model")."""
    import tensorflow as tf
    from tensorflow.python.framework import tensor_util

    fg = cf.graph
    gd = fg.as_graph_def()
    if fetches is None:
        outs = [t.name for t in tf.nest.flatten(cf.outputs) if t is not None]
        ctrl = [op.name for op in getattr(fg, "control_outputs", [])]
        fetches = list(dict.fromkeys(outs + ctrl))
        if not fetches:
            raise GraphImportError(f"{what} {name!r} has no outputs and no stateful ops: nothing to import")
    if len(gd.library.function):
        gd = inline_functions(gd, fetches, where=f"{what} {name!r}")
    fetches = group_control_fetches(gd, fetches)
    variables = {}
    for v in getattr(fg, "variables", ()):
        try:
            variables[id(v.handle)] = v
        except (AttributeError, ValueError):
            pass
    nodes = {n.name: n for n in gd.node}
    rename: dict[str, str] = {}
    taken = set(nodes)
    var_values: dict[str, tuple[float, float]] = {}
    for external, internal in fg.captures:
        pname = internal.op.name
        node = nodes.get(pname)
        if node is None:
            continue  # pruned away by inlining
        if external.dtype == tf.resource:
            v = variables.get(id(external))
            if v is None:
                raise GraphImportError(
                    f"{what} {name!r} captures a resource that is not a variable ({pname!r}): only variables can be "
                    "turned into graph ops")
            vname = unique_name(re.sub(r"[^A-Za-z0-9_./\-]", "_", v.name.split(":")[0]) or "variable", taken)
            taken.add(vname)
            var_values[vname] = _variable_node(node, v, vname)
            rename[pname] = vname
        else:
            try:
                value = external.numpy()
            except Exception:  # noqa: BLE001
                raise GraphImportError(f"{what} {name!r} captures a symbolic tensor {pname!r} from another graph; "
                                       "only variables and constants can be captured") from None
            node.op = "Const"
            node.ClearField("input")
            node.attr.clear()
            node.attr["dtype"].type = external.dtype.as_datatype_enum
            node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value))
    if rename:
        rename_inputs(gd, rename)
        fetches = [renamed_input(f, rename) for f in fetches]
    return convert_graph_def(gd, fetches, batch_size=batch_size, name=name, where=f"{what} {name!r}",
                             var_values=var_values)
