"""Import a TensorFlow training step into an :class:`~placer.graphs.opgraph.OpGraph`.

    from placer.graphs import load
    g = load("model.meta")                          # MetaGraphDef file with a `train_op` collection
    g = load(graph_def, fetches=["train_op"])       # GraphDef + fetch names
    g = load(keras_model, batch_size=32)            # compiled Keras 3 model: its training step
    g.num_ops, g.fetches, g.meta_graph_def()

Accepted sources
----------------
* ``tf.Graph`` (TF1 style): ``fetches`` = op or tensor names (default: the graph's ``train_op`` collection).
* ``GraphDef`` (``fetches`` required) and ``MetaGraphDef`` (its ``train_op`` collection, else ``fetches``).
* a path: ``.pb`` (binary GraphDef, MetaGraphDef or SavedModel proto), ``.pbtxt`` (text GraphDef or
  MetaGraphDef), ``.meta`` (MetaGraphDef), a SavedModel directory (its ``train_op`` collection, else a
  signature called ``train``/``train_step``, else ``fetches``), a ``.keras`` file (loaded, then as a Keras model).
* a ``tf.function`` ConcreteFunction (TF2): fetches = its outputs + its stateful "control outputs".
* a compiled Keras 3 model: its TRAINING STEP (forward, loss, gradients, optimizer update) is traced as a
  ``tf.function`` on synthetic inputs of the model's input shapes; an unknown batch dimension needs
  ``batch_size`` (else a GraphImportError asks for ``--batch-size``).

What the import does
--------------------
1. Function calls (``PartitionedCall``/``StatefulPartitionedCall``, in any source graph) are inlined with
   Grappler's function optimizer. TF2 functions: captured variables (resource placeholders) become real ``VarHandleOp`` s (their shape,
   dtype, ``shared_name`` = the op name) named after the variable (``v.name``), other captured eager tensors
   become ``Const`` s.
2. Prune to what the fetches need (data + control inputs, transitively).
3. Refuse TF1 loops (``Enter``/``Exit``/``NextIteration``) and functional loops (``While``/``StatelessWhile``)
   with a clear error: a loop's trip count is unknown statically and the placer needs each iteration as
   separate ops (unroll it, e.g. ``keras.layers.LSTM(..., unroll=True)``). A functional ``If``/``Case`` or a
   call that could not be inlined is kept as ONE op carrying its body's cost (flops of its largest branch).
4. Placeholders with an unknown batch (first) dimension get ``batch_size``; any other unknown placeholder
   dimension is an error (synthetic feeds need static shapes).
5. Per op: output bytes (dtype size x elements of the shapes TF infers; resource/variant/string elements count
   ``HANDLE_BYTES``; an unknown dimension counts as ``UNKNOWN_DIM_FALLBACK`` = 1, a lower bound, and a
   warning names the first few such ops), data/control edges, persistent bytes (a variable's full size on its
   variable op: weights and optimizer slots alike), flops (``ops.get_stats_for_node_def(..., "flops")`` where
   TF registers it, else 0), co-location (every op consuming a resource- or ref-typed tensor shares a group with
   that tensor's producer, so a variable sits with all its readers/updaters; plus ``_class`` ``loc:@`` attrs),
   and cpu_only (the op type has no GPU kernel in TF's kernel registry; host-memory args do not count).

The runnable graph (``OpGraph.meta_graph``) -- how a runtime uses it
--------------------------------------------------------------------
``meta_graph`` is a serialized MetaGraphDef holding the pruned training step plus the variable
initialisers (existing ones found in the source graph -- any Assign/AssignVariableOp on a kept variable that the
step itself does not need -- and synthesized ones, under ``placer_init/<var>/...``, for variables without one,
e.g. captured TF2 variables: filled with the variable's value when it is constant, else uniform in the
value's [min, max]; zeros for TF1 variables without an initializer). Device fields are cleared; ``_class``
attrs are kept. Collections (each a ``node_list``):

* ``placer_fetches`` (also ``train_op``): what to run each step -- names with ``:k`` are tensors, names
  without are ops (exactly ``OpGraph.fetches``); ``sess.run(list_of_names)`` accepts them as is.
* ``placer_init_op``: one name, a ``NoOp`` (``placer_init``) that initialises every variable; run it once.
* ``placer_feeds``: the placeholder op names to feed every step; each has a fully static ``shape`` attr and a
  ``dtype`` attr; feed zeros (valid token ids / labels / images) -- see :func:`runtime_spec` and
  :func:`synthetic_feeds`.

Ops in ``meta_graph`` but not in the OpGraph are initialiser-only (run once; place them anywhere, TF's
``_class`` colocation puts the assigns with their variable)::

    tf.compat.v1.reset_default_graph(); mg = graph.meta_graph_def()
    tf.compat.v1.train.import_meta_graph(mg)
    spec = runtime_spec(mg)
    with tf.compat.v1.Session() as s:
        s.run(spec.init_op); s.run(list(spec.fetches), feed_dict=synthetic_feeds(spec))

Caching: imported graphs are saved under ``$PLACER_CACHE_DIR`` (default ``~/.cache/placer``) keyed by a hash of
the source (file bytes / serialized graph / Keras model config), the fetches, the batch size, the TensorFlow
version and :data:`CACHE_FORMAT`; ``cache=False`` disables it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from placer.errors import GraphImportError
from placer.graphs.opgraph import OpGraph

log = logging.getLogger(__name__)

FETCHES_COLLECTION = "placer_fetches"
INIT_COLLECTION = "placer_init_op"
FEEDS_COLLECTION = "placer_feeds"
INIT_OP_NAME = "placer_init"
UNKNOWN_DIM_FALLBACK = 1
HANDLE_BYTES = 8
CACHE_FORMAT = 2

VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
ASSIGN_OPS = frozenset({"Assign", "AssignVariableOp"})
TF1_LOOP_OPS = frozenset({"Enter", "Exit", "NextIteration", "LoopCond", "RefEnter", "RefExit", "RefNextIteration"})
LOOP_OPS = frozenset({"While", "StatelessWhile", "_While"})
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "Case", "StatelessCase"})


def _node_flops(graph, node_def) -> float:
    """TF's registered FLOP statistic for one node (raises when none is registered). TF's flops registry calls a
    deprecated shape helper that logs an "Instructions for updating" warning: silenced here."""
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.util import deprecation

    with deprecation.silence():
        return float(tf_ops.get_stats_for_node_def(graph, node_def, "flops").value or 0)


# --------------------------------------------------------------------------------------------- runtime helpers
@dataclass(frozen=True)
class RuntimeSpec:
    """What a runtime needs to run an imported step: fetch names, init op name, feeds (name -> dtype, shape)."""

    fetches: tuple[str, ...]
    init_op: str
    feeds: dict[str, tuple[str, tuple[int, ...]]]


def runtime_spec(meta_graph_def) -> RuntimeSpec:
    """Read the placer collections of a MetaGraphDef produced by :func:`load`.

    >>> spec = runtime_spec(load(graph).meta_graph_def())   # doctest: +SKIP
    """
    from tensorflow.python.framework import dtypes

    col = meta_graph_def.collection_def

    def names(key: str) -> list[str]:
        return [str(x) for x in col[key].node_list.value] if key in col else []

    fetches = names(FETCHES_COLLECTION) or names("train_op")
    init = names(INIT_COLLECTION)
    nodes = {n.name: n for n in meta_graph_def.graph_def.node}
    feeds = {}
    for f in names(FEEDS_COLLECTION):
        nd = nodes[f]
        dt = dtypes.as_dtype(nd.attr["dtype"].type).name
        shape = tuple(int(d.size) for d in nd.attr["shape"].shape.dim)
        feeds[f] = (dt, shape)
    return RuntimeSpec(tuple(fetches), init[0] if init else "", feeds)


def synthetic_feeds(spec: RuntimeSpec) -> dict[str, np.ndarray]:
    """Zeros of each feed's dtype and shape, keyed by tensor name (``name:0``) for ``Session.run``.

    Zeros are valid token ids, labels and images; strings are empty.
    """
    import tensorflow as tf

    return {f"{n}:0": (np.full(shape, b"", dtype=object) if dt == "string"
                       else np.zeros(shape, dtype=tf.as_dtype(dt).as_numpy_dtype)) for n, (dt, shape) in spec.feeds.items()}


# --------------------------------------------------------------------------------------------- public entry
def load(
    source: Any,
    *,
    fetches: Sequence[str] | None = None,
    batch_size: int | None = None,
    name: str | None = None,
    cache: bool = True,
) -> OpGraph:
    """Import a TensorFlow training step (see the module docstring for the accepted sources).

    >>> g = load("inception.meta")              # doctest: +SKIP
    >>> g.num_ops, g.fetches                    # doctest: +SKIP
    (11042, ('train_op',))
    """
    if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or batch_size <= 0):
        raise GraphImportError(f"batch size must be a positive integer, got {batch_size!r}")
    fetches = list(fetches) if fetches else None
    if isinstance(source, (str, os.PathLike)):
        return _load_path(Path(source), fetches=fetches, batch_size=batch_size, name=name, cache=cache)
    kind = _source_kind(source)
    if kind == "keras":
        return _load_keras(source, batch_size=batch_size, name=name, cache=cache)
    if kind == "concrete":
        return _load_concrete(source, fetches=fetches, batch_size=batch_size, name=name, cache=cache)
    if kind == "graph":
        gd = source.as_graph_def()
        if fetches is None:
            fetches = [_graph_element_name(x) for x in source.get_collection("train_op")]
            if not fetches:
                raise GraphImportError("the tf.Graph has no `train_op` collection: pass fetches=[...] (train op / loss names)")
        return _load_graph_def(gd, fetches, batch_size=batch_size, name=name or "graph", cache=cache, where="tf.Graph")
    if kind == "graph_def":
        if not fetches:
            raise GraphImportError("a GraphDef needs fetch names (train op / loss): pass fetches=[...] or --fetch NAME")
        return _load_graph_def(source, fetches, batch_size=batch_size, name=name or "graph", cache=cache, where="GraphDef")
    if kind == "meta_graph_def":
        return _load_meta_graph_def(source, fetches=fetches, batch_size=batch_size, name=name or "graph", cache=cache,
                                    where="MetaGraphDef")
    raise GraphImportError(
        f"cannot import a {type(source).__name__}: expected a tf.Graph, GraphDef, MetaGraphDef, file path, "
        "tf.function ConcreteFunction or compiled Keras model")


def load_from_args(args) -> OpGraph:
    """The CLI's graph selection: positional GRAPH or ``--model NAME [--size] [--batch-size] [--fetch]``."""
    path = getattr(args, "graph", None)
    model = getattr(args, "model", None)
    if path and model:
        raise GraphImportError(f"give either a graph file ({path}) or --model {model}, not both")
    if not path and not model:
        raise GraphImportError("no graph given: pass a graph file (.pb, .pbtxt, .meta, SavedModel dir, .keras) or --model NAME")
    bs = getattr(args, "batch_size", None)
    if model:
        from placer.graphs.models import build_model

        return build_model(model, size=getattr(args, "size", None) or "full", batch_size=bs)
    return load(path, fetches=getattr(args, "fetch", None) or None, batch_size=bs)


# --------------------------------------------------------------------------------------------- source kinds
def _source_kind(source: Any) -> str:
    mod = type(source).__module__ or ""
    cls = type(source).__name__
    if hasattr(source, "train_step") and hasattr(source, "compile") and hasattr(source, "trainable_variables"):
        return "keras"
    if cls in ("ConcreteFunction", "AtomicFunction") or (hasattr(source, "graph") and hasattr(source, "structured_outputs")):
        return "concrete"
    if cls == "Function" and hasattr(source, "get_concrete_function"):
        raise GraphImportError("a tf.function needs its input signature: pass fn.get_concrete_function(...) instead")
    if cls in ("Graph", "FuncGraph") and "tensorflow" in mod:
        return "graph"
    if cls == "GraphDef":
        return "graph_def"
    if cls == "MetaGraphDef":
        return "meta_graph_def"
    return "unknown"


def _graph_element_name(x: Any) -> str:
    if isinstance(x, (str, bytes)):
        return x.decode() if isinstance(x, bytes) else x
    return x.name


# --------------------------------------------------------------------------------------------- caching
def cache_dir() -> Path:
    return Path(os.environ.get("PLACER_CACHE_DIR") or Path.home() / ".cache" / "placer") / "graphs"


def _tf_version() -> str:
    """TensorFlow's version without importing it (a cache hit must not pay TF's import time)."""
    import sys

    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"].__version__
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    import tensorflow as tf

    return tf.__version__


def _cached(key_parts: Sequence[Any], build: Callable[[], OpGraph], cache: bool) -> OpGraph:
    """Return the cached OpGraph for key_parts, else build() and save it."""
    if not cache:
        return build()
    h = hashlib.sha256(repr((CACHE_FORMAT, _tf_version(), *key_parts)).encode()).hexdigest()[:24]
    path = cache_dir() / f"{h}.npz"
    if path.exists():
        try:
            return OpGraph.load(path)
        except GraphImportError as e:
            log.warning("ignoring unreadable cache entry: %s", e)
    g = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
        os.close(fd)
        g.save(tmp)
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache dir must not break the import
        log.warning("cannot write graph cache %s: %s", path, e)
    return g


# --------------------------------------------------------------------------------------------- files
def _load_path(path: Path, *, fetches, batch_size, name, cache) -> OpGraph:
    if not path.exists():
        raise GraphImportError(f"graph file not found: {path}")
    nm = name or path.stem
    if path.is_dir():
        pb = path / "saved_model.pb"
        pbtxt = path / "saved_model.pbtxt"
        if not pb.exists() and not pbtxt.exists():
            raise GraphImportError(f"{path} is a directory but not a SavedModel (no saved_model.pb)")
        key = ("savedmodel", _hash_files(path), fetches, batch_size)
        return _cached(key, lambda: _load_saved_model(path, fetches, batch_size, nm), cache)
    suffix = path.suffix.lower()
    if suffix == ".keras":
        return _load_keras_file(path, batch_size=batch_size, name=nm, cache=cache)
    data = path.read_bytes()
    if not data:
        raise GraphImportError(f"{path} is empty (not a TensorFlow graph)")
    key = ("file", hashlib.sha256(data).hexdigest(), fetches, batch_size)

    def build() -> OpGraph:
        proto = _parse_graph_file(path, data)
        if type(proto).__name__ == "SavedModel":
            return _from_saved_model_proto(proto, fetches, batch_size, nm, str(path))
        if type(proto).__name__ == "MetaGraphDef":
            return _load_meta_graph_def(proto, fetches=fetches, batch_size=batch_size, name=nm, cache=False,
                                        where=str(path))
        if not fetches:
            raise GraphImportError(f"{path} is a GraphDef, which names no train op: pass fetches / --fetch NAME")
        return _load_graph_def(proto, fetches, batch_size=batch_size, name=nm, cache=False, where=str(path))

    return _cached(key, build, cache)


def _hash_files(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(d)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


_OP_RE = re.compile(r"^[A-Za-z_>][A-Za-z0-9_>./\-]*$")


def _valid_graph_def(gd) -> bool:
    return len(gd.node) > 0 and all(n.name and n.op and _OP_RE.match(n.op) for n in gd.node)


def _parse_graph_file(path: Path, data: bytes):
    """Parse a .pb/.pbtxt/.meta file into a GraphDef, MetaGraphDef or SavedModel (clear error otherwise)."""
    from google.protobuf import message, text_format
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

    bad = f"{path} is not a TensorFlow graph (truncated, corrupt or another kind of file)"
    suffix = path.suffix.lower()
    if suffix in (".pbtxt", ".txt", ".prototxt"):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise GraphImportError(bad) from None
        for cls in (graph_pb2.GraphDef, meta_graph_pb2.MetaGraphDef, saved_model_pb2.SavedModel):
            p = cls()
            try:
                text_format.Parse(text, p)
            except (text_format.ParseError, message.DecodeError, ValueError):
                continue
            if _proto_ok(p):
                return p
        raise GraphImportError(bad)
    order = [meta_graph_pb2.MetaGraphDef, graph_pb2.GraphDef, saved_model_pb2.SavedModel]
    if suffix == ".pb":
        order = [graph_pb2.GraphDef, meta_graph_pb2.MetaGraphDef, saved_model_pb2.SavedModel]
    if path.name == "saved_model.pb":
        order = [saved_model_pb2.SavedModel] + order[:2]
    for cls in order:
        p = cls()
        try:
            p.ParseFromString(data)
        except (message.DecodeError, ValueError, RuntimeError):
            continue
        if _proto_ok(p):
            return p
    raise GraphImportError(bad)


def _proto_ok(p) -> bool:
    name = type(p).__name__
    if name == "GraphDef":
        return _valid_graph_def(p)
    if name == "MetaGraphDef":
        return _valid_graph_def(p.graph_def)
    if name == "SavedModel":
        return len(p.meta_graphs) > 0 and _valid_graph_def(p.meta_graphs[0].graph_def)
    return False


# --------------------------------------------------------------------------------------------- TF1 protos
def _load_graph_def(gd, fetches, *, batch_size, name, cache, where) -> OpGraph:
    key = ("graph_def", hashlib.sha256(gd.SerializeToString(deterministic=True)).hexdigest(), list(fetches), batch_size)
    return _cached(key, lambda: _convert(gd, list(fetches), batch_size=batch_size, name=name, where=where), cache)


def _load_meta_graph_def(mg, *, fetches, batch_size, name, cache, where) -> OpGraph:
    if not fetches:
        col = mg.collection_def
        for key in (FETCHES_COLLECTION, "train_op"):
            if key in col and col[key].node_list.value:
                fetches = [str(x) for x in col[key].node_list.value]
                break
    if not fetches:
        raise GraphImportError(f"{where} has no `train_op` collection: pass fetches / --fetch NAME (train op / loss)")
    return _load_graph_def(mg.graph_def, fetches, batch_size=batch_size, name=name, cache=cache, where=where)


def _load_saved_model(path: Path, fetches, batch_size, name) -> OpGraph:
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    sm = saved_model_pb2.SavedModel()
    try:
        if (path / "saved_model.pb").exists():
            sm.ParseFromString((path / "saved_model.pb").read_bytes())
        else:
            text_format.Parse((path / "saved_model.pbtxt").read_text(), sm)
    except (message.DecodeError, text_format.ParseError, ValueError, UnicodeDecodeError):
        raise GraphImportError(f"{path}/saved_model.pb is not a SavedModel (truncated or corrupt)") from None
    if not sm.meta_graphs:
        raise GraphImportError(f"SavedModel {path} holds no graph")
    return _from_saved_model_proto(sm, fetches, batch_size, name, str(path))


def _from_saved_model_proto(sm, fetches, batch_size, name, where) -> OpGraph:
    mg = sm.meta_graphs[0]
    col = mg.collection_def
    if not fetches and "train_op" in col and col["train_op"].node_list.value:
        fetches = [str(x) for x in col["train_op"].node_list.value]
    if not fetches:
        for sig_name in ("train", "train_step"):
            if sig_name in mg.signature_def:
                sig = mg.signature_def[sig_name]
                fetches = [t.name for _, t in sorted(sig.outputs.items())]
                break
    if not fetches:
        sigs = sorted(mg.signature_def)
        raise GraphImportError(
            f"SavedModel {where} has no `train_op` collection and no `train` signature (signatures: {sigs}): "
            "pass fetches / --fetch NAME")
    gd = mg.graph_def
    if len(gd.library.function):
        gd = _inline_functions(gd, list(fetches), where=where)
    return _convert(gd, list(fetches), batch_size=batch_size, name=name, where=where)


# --------------------------------------------------------------------------------------------- TF2
def _load_keras_file(path: Path, *, batch_size, name, cache) -> OpGraph:
    key = ("keras_file", hashlib.sha256(path.read_bytes()).hexdigest(), batch_size)

    def build() -> OpGraph:
        import keras

        try:
            model = keras.models.load_model(path)
        except Exception as e:  # noqa: BLE001 - any load failure is one clear error
            raise GraphImportError(f"cannot load Keras model {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        return _load_keras(model, batch_size=batch_size, name=name, cache=False)

    return _cached(key, build, cache)


def _keras_key(model) -> str | None:
    try:
        cfg = model.to_json()
        opt = model.optimizer.get_config() if model.optimizer is not None else None
        return hashlib.sha256(repr((cfg, repr(opt), repr(getattr(model, "loss", None)))).encode()).hexdigest()
    except Exception:  # noqa: BLE001 - custom layers may not serialise; then we just don't cache
        return None


def _load_keras(model, *, batch_size, name, cache) -> OpGraph:
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise GraphImportError(
            f"Keras model {model.name!r} is not compiled: call model.compile(optimizer=..., loss=...) so its "
            "training step (loss, gradients, optimizer update) can be imported")
    key = _keras_key(model)
    build = lambda: _convert_keras(model, batch_size=batch_size, name=name or model.name)  # noqa: E731
    if key is None:
        return build()
    return _cached(("keras", key, batch_size), build, cache)


def _keras_step_function(model, batch_size):
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
    ys = []
    for t in outputs:
        shp = fixed(t.shape, f"output {t.name!r}")
        ys.append(tf.TensorSpec(shp[:-1], "int32") if sparse else tf.TensorSpec(shp, t.dtype or "float32"))
    x_arg = xs[0] if len(xs) == 1 else tuple(xs)
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

        return train_step.get_concrete_function(x_arg, y_arg)
    except GraphImportError:
        raise
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()
        raise GraphImportError(f"cannot trace the training step of Keras model {model.name!r}: "
                               f"{msg[0] if msg else type(e).__name__}") from None


def _convert_keras(model, *, batch_size, name) -> OpGraph:
    cf = _keras_step_function(model, batch_size)
    return _convert_concrete(cf, fetches=None, batch_size=batch_size, name=name)


def _load_concrete(cf, *, fetches, batch_size, name, cache) -> OpGraph:
    gd = cf.graph.as_graph_def()
    key = ("concrete", hashlib.sha256(gd.SerializeToString(deterministic=True)).hexdigest(), fetches, batch_size)
    return _cached(key, lambda: _convert_concrete(cf, fetches=fetches, batch_size=batch_size,
                                                  name=name or _fn_name(cf)), cache)


def _fn_name(cf) -> str:
    n = getattr(cf, "name", "function")
    return n.decode() if isinstance(n, bytes) else str(n)


def _convert_concrete(cf, *, fetches, batch_size, name) -> OpGraph:
    """ConcreteFunction -> self-contained GraphDef (variables as VarHandleOps) -> OpGraph."""
    import tensorflow as tf
    from tensorflow.python.framework import tensor_util

    fg = cf.graph
    gd = fg.as_graph_def()
    if fetches is None:
        outs = [t.name for t in tf.nest.flatten(cf.outputs) if t is not None]
        ctrl = [op.name for op in getattr(fg, "control_outputs", [])]
        fetches = list(dict.fromkeys(outs + ctrl))
        if not fetches:
            raise GraphImportError(f"function {name!r} has no outputs and no stateful ops: nothing to import")
    if len(gd.library.function):
        gd = _inline_functions(gd, fetches, where=f"function {name!r}")
    fetches = _group_control_fetches(gd, fetches)
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
                    f"function {name!r} captures a resource that is not a variable ({pname!r}): only variables can be "
                    "turned into graph ops")
            vname = _unique(re.sub(r"[^A-Za-z0-9_./\-]", "_", v.name.split(":")[0]) or "variable", taken)
            taken.add(vname)
            node.op = "VarHandleOp"
            node.ClearField("input")
            node.attr.clear()
            node.attr["dtype"].type = v.dtype.as_datatype_enum
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(v.shape).as_proto())
            node.attr["shared_name"].s = vname.encode()
            node.attr["container"].s = b""
            node.name = vname
            rename[pname] = vname
            try:
                val = v.numpy()
                lo, hi = (float(val.min()), float(val.max())) if val.size else (0.0, 0.0)
                if not (np.isfinite(lo) and np.isfinite(hi)):
                    lo = hi = 0.0
            except Exception:  # noqa: BLE001
                lo = hi = 0.0
            var_values[vname] = (lo, hi)
        else:
            try:
                value = external.numpy()
            except Exception:  # noqa: BLE001
                raise GraphImportError(f"function {name!r} captures a symbolic tensor {pname!r} from another graph; "
                                       "only variables and constants can be captured") from None
            node.op = "Const"
            node.ClearField("input")
            node.attr.clear()
            node.attr["dtype"].type = external.dtype.as_datatype_enum
            node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value))
    if rename:
        _rename_inputs(gd, rename)
        fetches = [_renamed(f, rename) for f in fetches]
    return _convert(gd, fetches, batch_size=batch_size, name=name, where=f"function {name!r}", var_values=var_values)


def _group_control_fetches(gd, fetches: list[str]) -> list[str]:
    """Replace the op (non-tensor) fetches by one NoOp `train_op` depending on them all (compact fetch list)."""
    ops_ = [f for f in fetches if ":" not in f]
    if len(ops_) <= 1:
        return fetches
    taken = {n.name for n in gd.node}
    node = gd.node.add()
    node.name = _unique("train_op", taken)
    node.op = "NoOp"
    node.input.extend("^" + f for f in sorted(ops_))
    return [f for f in fetches if ":" in f] + [node.name]


def _unique(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    i = 1
    while f"{base}_{i}" in taken:
        i += 1
    return f"{base}_{i}"


def _renamed(inp: str, rename: dict[str, str]) -> str:
    ctrl = inp.startswith("^")
    s = inp[1:] if ctrl else inp
    op, sep, idx = s.partition(":")
    if op in rename:
        s = rename[op] + sep + idx
    return ("^" + s) if ctrl else s


def _rename_inputs(gd, rename: dict[str, str]) -> None:
    for n in gd.node:
        if "_class" in n.attr:
            vals = [v.decode(errors="replace") for v in n.attr["_class"].list.s]
            if any(v[5:] in rename for v in vals):
                del n.attr["_class"].list.s[:]
                n.attr["_class"].list.s.extend(("loc:@" + rename.get(v[5:], v[5:])).encode() for v in vals)
        if any(_op_name(i) in rename for i in n.input):
            new = [_renamed(i, rename) for i in n.input]
            del n.input[:]
            n.input.extend(new)


def _inline_functions(gd, fetches: Sequence[str], where: str):
    """Inline PartitionedCall/StatefulPartitionedCall with Grappler's function optimizer (If/While are kept)."""
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
    from tensorflow.python.grappler import tf_optimizer

    gd2 = type(gd)()
    gd2.CopyFrom(gd)
    for n in gd2.node:  # keep functional control flow as single ops (no Switch/Merge lowering)
        if n.op in LOOP_OPS or n.op in ("If", "StatelessIf", "Case", "StatelessCase"):
            n.attr["_lower_using_switch_merge"].b = False
    for f in gd2.library.function:
        if "api_implements" in f.attr:
            del f.attr["api_implements"]
        for n in f.node_def:
            if n.op in LOOP_OPS or n.op in ("If", "StatelessIf", "Case", "StatelessCase"):
                n.attr["_lower_using_switch_merge"].b = False
    mg = meta_graph_pb2.MetaGraphDef()
    mg.graph_def.CopyFrom(gd2)
    nodes = {n.name for n in gd2.node}
    for f in fetches:
        if _op_name(f) not in nodes:
            raise _unknown_fetch(f, nodes, where)
        mg.collection_def["train_op"].node_list.value.append(f)
    config = config_pb2.ConfigProto()
    rw = config.graph_options.rewrite_options
    rw.min_graph_nodes = -1
    rw.optimizers.append("function")
    rw.function_optimization = rewriter_config_pb2.RewriterConfig.AGGRESSIVE
    rw.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    try:
        out = tf_optimizer.OptimizeGraph(config, mg)
    except Exception as e:  # noqa: BLE001
        log.warning("%s: function inlining failed (%s); calls are kept as single ops", where, str(e).splitlines()[0])
        return gd
    return out


# --------------------------------------------------------------------------------------------- the converter
def _op_name(inp: str) -> str:
    s = inp[1:] if inp.startswith("^") else inp
    return s.split(":")[0]


def _unknown_fetch(f: str, nodes: Iterable[str], where: str) -> GraphImportError:
    import difflib

    close = difflib.get_close_matches(_op_name(f), list(nodes), n=3)
    hint = f" (did you mean {close}?)" if close else ""
    return GraphImportError(f"{where}: fetch {f!r} names no op in the graph{hint}")


def _closure(roots: Iterable[str], nodes: dict) -> set[str]:
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        nd = nodes.get(n)
        if nd is None:
            continue
        for i in nd.input:
            m = _op_name(i)
            if m not in seen:
                stack.append(m)
    return seen


def _check_cycles(names: set[str], nodes: dict, where: str) -> None:
    indeg = {n: 0 for n in names}
    succ: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for i in nodes[n].input:
            m = _op_name(i)
            if m in names:
                indeg[n] += 1
                succ[m].append(n)
    stack = [n for n, d in indeg.items() if d == 0]
    done = 0
    while stack:
        n = stack.pop()
        done += 1
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                stack.append(m)
    if done != len(names):
        stuck = sorted(n for n, d in indeg.items() if d > 0)[:5]
        raise GraphImportError(f"{where}: the graph has a cycle through ops {stuck}")


def _convert(gd, fetches: list[str], *, batch_size: int | None, name: str, where: str,
             var_values: dict[str, tuple[float, float]] | None = None, unknown_level: int = logging.WARNING) -> OpGraph:
    """GraphDef + fetch names -> pruned, checked, runnable OpGraph."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    if not len(gd.node):
        raise GraphImportError(f"{where}: the graph is empty (no ops)")
    if not fetches:
        raise GraphImportError(f"{where}: no fetches given (train op / loss names)")
    if len(gd.library.function) and any(n.op in ("PartitionedCall", "StatefulPartitionedCall") for n in gd.node):
        gd = _inline_functions(gd, fetches, where)
    nodes = {n.name: n for n in gd.node}
    fetches = list(dict.fromkeys(f.decode() if isinstance(f, bytes) else str(f) for f in fetches))
    for f in fetches:
        if _op_name(f) not in nodes:
            raise _unknown_fetch(f, nodes, where)
    keep = _closure([_op_name(f) for f in fetches], nodes)
    missing = sorted(n for n in keep if n not in nodes)
    if missing:
        raise GraphImportError(f"{where}: ops {missing[:5]} are used as inputs but not defined in the graph")

    loops = sorted(n for n in keep if nodes[n].op in TF1_LOOP_OPS or nodes[n].op in LOOP_OPS)
    if loops:
        raise GraphImportError(
            f"{where}: the graph has a loop ({nodes[loops[0]].op} op {loops[0]!r}{' and others' if len(loops) > 1 else ''}); "
            "placer needs each iteration as separate ops: unroll the loop (e.g. keras.layers.LSTM(..., unroll=True), "
            "or a Python for-loop over time steps)")
    resource_ph = sorted(n for n in keep if nodes[n].op == "Placeholder"
                         and nodes[n].attr["dtype"].type == tf.resource.as_datatype_enum)
    if resource_ph:
        raise GraphImportError(f"{where}: resource placeholders {resource_ph[:3]} are not bound to variables; "
                               "import the tf.function / Keras model itself so its captured variables can be converted")

    # variables: existing initialisers = assigns on kept variables that the step itself does not need
    var_ops = {n for n in keep if nodes[n].op in VARIABLE_OPS}
    init_roots = []
    for n, nd in nodes.items():
        if n not in keep and nd.op in ASSIGN_OPS and nd.input and _op_name(nd.input[0]) in var_ops:
            init_roots.append(n)
    initialised = {_op_name(nodes[n].input[0]) for n in init_roots}
    init_set = _closure(init_roots, nodes)
    everything = keep | init_set
    _check_cycles(everything, nodes, where)

    # batch dimension of placeholders
    out_gd = graph_pb2.GraphDef()
    out_gd.versions.CopyFrom(gd.versions)
    feeds = []
    for nd in gd.node:
        if nd.name not in everything:
            continue
        nn = out_gd.node.add()
        nn.CopyFrom(nd)
        nn.device = ""
        ctrl = [i for i in nn.input if i.startswith("^")]
        if len(ctrl) > 1:  # TF2 auto control deps come in set order: sort them for a stable fingerprint
            data = [i for i in nn.input if not i.startswith("^")]
            del nn.input[:]
            nn.input.extend(data + sorted(set(ctrl)))
        if "_class" in nn.attr:  # drop colocation with ops that are not kept (TF refuses to import those)
            vals = [v for v in nn.attr["_class"].list.s if v.decode(errors="replace")[5:] in everything]
            if vals:
                del nn.attr["_class"].list.s[:]
                nn.attr["_class"].list.s.extend(vals)
            else:
                del nn.attr["_class"]
        if nd.op == "Placeholder" and nd.name in keep:
            feeds.append(nd.name)
            _fix_placeholder(nn, batch_size, where)
    used = _used_functions(out_gd.node, gd.library)
    if used:
        out_gd.library.function.extend(f for f in gd.library.function if f.signature.name in used)
        out_gd.library.gradient.extend(x for x in gd.library.gradient if x.function_name in used)
    fingerprint = hashlib.sha256(out_gd.SerializeToString(deterministic=True) + repr(fetches).encode()).hexdigest()[:16]

    g = tf.Graph()
    with g.as_default():
        try:
            tf.graph_util.import_graph_def(out_gd, name="")
        except Exception as e:  # noqa: BLE001 - TF's message, one line
            raise GraphImportError(f"{where}: TensorFlow cannot import the graph: {_first_line(e)}") from None
        init_name = _add_initializers(g, var_ops - initialised, var_values or {}, init_roots)
    run_gd = g.as_graph_def()

    ops_rec, edges, control, coloc = _records(g, keep, out_gd, where, unknown_level)
    mg = _meta_graph(run_gd, fetches, feeds, init_name)
    return OpGraph.build(ops_rec, edges, control, colocate=coloc, name=name, fetches=fetches,
                         meta_graph=mg.SerializeToString(), fingerprint=fingerprint)


def _used_functions(node_defs, library) -> set[str]:
    """Names of the library functions the given nodes call (directly, through attrs, or nested)."""
    lib = {f.signature.name: f for f in library.function}
    if not lib:
        return set()

    def called(nds) -> set[str]:
        out = set()
        for nd in nds:
            if nd.op in lib:
                out.add(nd.op)
            for a in nd.attr.values():
                if a.HasField("func"):
                    out.add(a.func.name)
                out.update(f.name for f in a.list.func)
        return out & set(lib)

    used: set[str] = set()
    todo = called(node_defs)
    while todo:
        f = todo.pop()
        if f in used:
            continue
        used.add(f)
        todo |= called(lib[f].node_def) - used
    return used


def _first_line(e: BaseException) -> str:
    s = str(getattr(e, "message", None) or e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def _fix_placeholder(nd, batch_size: int | None, where: str) -> None:
    shape = nd.attr["shape"].shape
    if "shape" not in nd.attr or shape.unknown_rank:
        raise GraphImportError(f"{where}: placeholder {nd.name!r} has no static shape; give it a shape "
                               "(synthetic feeds need one)")
    dims = [d.size for d in shape.dim]
    if dims and dims[0] < 0:
        if batch_size is None:
            raise GraphImportError(f"{where}: placeholder {nd.name!r} has an unknown batch dimension "
                                   f"{_fmt_shape(dims)}: give a batch size (--batch-size B / batch_size=B)")
        shape.dim[0].size = int(batch_size)
        dims[0] = int(batch_size)
    if any(d < 0 for d in dims):
        raise GraphImportError(f"{where}: placeholder {nd.name!r} has unknown dimensions {_fmt_shape(dims)}; only the "
                               "batch (first) dimension can be fixed with --batch-size")


def _fmt_shape(dims) -> str:
    return "[" + ",".join("?" if d < 0 else str(d) for d in dims) + "]"


def _add_initializers(g, uninit: set[str], var_values: dict[str, tuple[float, float]], init_roots: list[str]) -> str:
    """Synthesize initialisers for variables without one, then one NoOp `placer_init` running them all."""
    import tensorflow as tf

    assigns = [g.get_operation_by_name(n) for n in init_roots]
    for vname in sorted(uninit):
        var = g.get_operation_by_name(vname)
        dtype = tf.as_dtype(var.get_attr("dtype"))
        shape = tf.TensorShape(var.get_attr("shape"))
        lo, hi = var_values.get(vname, (0.0, 0.0))
        with g.colocate_with(var), g.name_scope(f"placer_init/{vname}/"):
            if lo == hi or not (dtype.is_floating):
                value = tf.fill(shape.as_list(), tf.constant(lo if dtype.is_floating else int(lo), dtype=dtype))
            else:
                value = tf.random.uniform(shape.as_list(), lo, hi, dtype=dtype)
            if var.type == "VarHandleOp":
                a = tf.raw_ops.AssignVariableOp(resource=var.outputs[0], value=value, name="assign")
            else:
                a = tf.compat.v1.assign(var.outputs[0], value, name="assign").op
        assigns.append(a)
    name = INIT_OP_NAME
    i = 0
    while True:
        try:
            g.get_operation_by_name(name)
        except KeyError:
            break
        i += 1
        name = f"{INIT_OP_NAME}_{i}"
    with g.control_dependencies(assigns):
        tf.no_op(name=name)
    return name


def _meta_graph(run_gd, fetches: list[str], feeds: list[str], init: str):
    from tensorflow.core.protobuf import meta_graph_pb2

    mg = meta_graph_pb2.MetaGraphDef()
    mg.graph_def.CopyFrom(run_gd)
    mg.meta_info_def.tensorflow_version = _tf_version()
    mg.meta_info_def.tags.append("train")
    for key in (FETCHES_COLLECTION, "train_op"):
        mg.collection_def[key].node_list.value.extend(fetches)
    mg.collection_def[INIT_COLLECTION].node_list.value.append(init)
    if feeds:
        mg.collection_def[FEEDS_COLLECTION].node_list.value.extend(feeds)
    return mg


_CPU_ONLY_CACHE: dict[str, bool] = {}


def _cpu_only(op_type: str, library_names: set[str]) -> bool:
    if op_type in library_names:
        return False
    r = _CPU_ONLY_CACHE.get(op_type)
    if r is None:
        from tensorflow.python.framework import kernels

        try:
            devs = {k.device_type for k in kernels.get_registered_kernels_for_op(op_type).kernel}
        except Exception:  # noqa: BLE001
            devs = set()
        # DEFAULT kernels (NoOp, VarHandleOp, ReadVariableOp...) run on any device, GPUs included;
        # an op with no kernels at all (e.g. a function name) is not pinned either
        r = bool(devs) and not (devs & {"GPU", "DEFAULT"})
        _CPU_ONLY_CACHE[op_type] = r
    return r


def _tensor_bytes(t, unknown: list) -> int:
    import tensorflow as tf

    dt = t.dtype.base_dtype
    size = HANDLE_BYTES if dt in (tf.resource, tf.variant, tf.string) else dt.size
    shape = t.shape
    if shape.rank is None:
        unknown.append(t.op.name)
        return size * UNKNOWN_DIM_FALLBACK
    n = 1
    bad = False
    for d in shape.as_list():
        if d is None:
            bad = True
            n *= UNKNOWN_DIM_FALLBACK
        else:
            n *= d
    if bad:
        unknown.append(t.op.name)
    return int(size * n)


def _records(g, keep: set[str], gd, where: str, unknown_level: int = logging.WARNING):
    import tensorflow as tf

    lib = {f.signature.name: f for f in gd.library.function}
    lib_names = set(lib)
    ops_rec, edges, control = [], [], []
    coloc: list[list[str]] = []
    class_groups: dict[str, list[str]] = {}
    unknown: list[str] = []
    for op in g.get_operations():
        if op.name not in keep:
            continue
        outs = [_tensor_bytes(t, unknown) for t in op.outputs]
        persistent = 0
        if op.type in VARIABLE_OPS:
            dt = tf.as_dtype(op.get_attr("dtype"))
            shp = tf.TensorShape(op.get_attr("shape"))
            if shp.is_fully_defined():
                persistent = int(dt.size * shp.num_elements())
            else:
                unknown.append(op.name)
        flops = 0.0
        try:
            flops = _node_flops(g, op.node_def)
        except Exception:  # noqa: BLE001 - no statistics registered for this op type
            flops = 0.0
        if op.type in CALL_OPS or op.type in lib_names:
            flops = _call_flops(op, lib, where)
        ops_rec.append((op.name, op.type, outs, persistent, flops, _cpu_only(op.type, lib_names)))
        for inp in op.inputs:
            edges.append((inp.op.name, op.name, inp.value_index))
            dt = inp.dtype
            if dt.base_dtype == tf.resource or dt._is_ref_dtype:  # noqa: SLF001
                coloc.append([inp.op.name, op.name])
        for c in op.control_inputs:
            control.append((c.name, op.name))
        try:
            groups = op.colocation_groups()
        except Exception:  # noqa: BLE001
            groups = []
        for grp in groups:
            target = grp.decode()[len("loc:@"):]
            if target != op.name:
                class_groups.setdefault(target, [target]).append(op.name)
    for target, members in class_groups.items():
        members = [m for m in members if m in keep]
        if len(members) > 1:
            coloc.append(members)
    if unknown:
        uniq = list(dict.fromkeys(unknown))
        log.log(unknown_level, "%s: %d ops have outputs of unknown shape (counted with unknown dims = %d): %s%s", where,
                    len(uniq), UNKNOWN_DIM_FALLBACK, uniq[:5], " ..." if len(uniq) > 5 else "")
    return ops_rec, edges, control, coloc


def _call_flops(op, lib: dict, where: str) -> float:
    """Cost of a kept functional op (If/Case/call): flops of its largest function body."""
    fnames = []
    for a in op.node_def.attr.values():
        if a.HasField("func"):
            fnames.append(a.func.name)
        fnames.extend(f.name for f in a.list.func)
    if op.type in lib:
        fnames.append(op.type)
    args = list(op.inputs)[1:] if op.type in ("If", "StatelessIf", "Case", "StatelessCase") else list(op.inputs)
    shapes = [t.shape for t in args]
    best = 0.0
    for fn in fnames:
        best = max(best, _function_flops(fn, lib, shapes))
    return best


def _function_flops(fname: str, lib: dict, shapes=None, depth: int = 0) -> float:
    if fname not in lib or depth > 5:
        return 0.0
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

    try:
        fdef = lib[fname]
        if shapes is not None and len(shapes) != len(fdef.signature.input_arg):
            shapes = None
        fg = function_def_to_graph(fdef, input_shapes=shapes)
    except Exception:  # noqa: BLE001
        return 0.0
    total = 0.0
    for op in fg.get_operations():
        try:
            total += _node_flops(fg, op.node_def)
        except Exception:  # noqa: BLE001
            pass
        for a in op.node_def.attr.values():
            if a.HasField("func"):
                total += _function_flops(a.func.name, lib, None, depth + 1)
    return total
