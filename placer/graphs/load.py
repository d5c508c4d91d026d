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
   ``opfacts.HANDLE_BYTES``; an unknown dimension counts as ``opfacts.UNKNOWN_DIM_FALLBACK`` = 1, a lower bound, and a
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
  ``dtype`` attr.
* ``placer_feed_limits`` (int64 list aligned with ``placer_feeds``, present when any is known): for an integer
  feed, the exclusive upper bound of the values the graph accepts (the vocabulary of the embedding it indexes,
  the class count of the labels it gives); 0 = unknown. :func:`~placer.graphs.runnable.runtime_spec` reads the
  collections, :func:`~placer.graphs.runnable.synthetic_feeds` makes valid seeded random inputs from them.

Ops in ``meta_graph`` but not in the OpGraph are initialiser-only (run once; place them anywhere, TF's
``_class`` colocation puts the assigns with their variable)::

    tf.compat.v1.reset_default_graph(); mg = graph.meta_graph_def()
    tf.compat.v1.train.import_meta_graph(mg)
    spec = runtime_spec(mg)
    with tf.compat.v1.Session() as s:
        s.run(spec.init_op); s.run(list(spec.fetches), feed_dict=synthetic_feeds(spec))

Caching: imported graphs are saved under ``$PLACER_CACHE_DIR`` (default ``~/.cache/placer``) keyed by a hash of
the source (file bytes / serialized graph / Keras model config), the fetches, the batch size, the TensorFlow
version and :data:`~placer.graphs.cache.CACHE_FORMAT`; ``cache=False`` disables it.

Where the work is done (each module imports only those above it in this list)
------------------------------------------------------------------------------
* :mod:`placer.graphs.opgraph` -- the OpGraph itself; :mod:`placer.graphs.runnable` -- reading the runnable
  MetaGraphDef, synthetic feeds; :mod:`placer.graphs.opfacts` -- bytes, FLOPs, kernels, co-location, feed limits;
* :mod:`placer.graphs.cache` -- the cache; :mod:`placer.graphs.files` -- file formats and protos;
* :mod:`placer.graphs.cleanup` -- inlining, pruning, checks, initialisers, the runnable MetaGraphDef;
* :mod:`placer.graphs.trace` -- Keras models and tf.functions;
* :mod:`placer.graphs.models` -- the built-in benchmark models; this module -- dispatch by source kind.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Sequence

from placer.errors import GraphImportError
from placer.graphs.cache import cache_dir, cached
from placer.graphs.cleanup import convert_graph_def, inline_functions
from placer.graphs.files import (hash_files, meta_graph_fetches, parse_graph_file, read_file, read_saved_model,
                                 saved_model_graph)
from placer.graphs.opgraph import OpGraph
from placer.graphs.runnable import RuntimeSpec, check_batch_size, runtime_spec, synthetic_feeds
from placer.graphs.trace import (check_compiled, convert_concrete, convert_keras, function_name, keras_key,
                                 load_keras_file)

__all__ = ["RuntimeSpec", "cache_dir", "load", "runtime_spec", "synthetic_feeds"]


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
    check_batch_size(batch_size)
    if isinstance(fetches, str):    # one name, not its characters
        fetches = [fetches]
    fetches = list(fetches) if fetches else None
    if isinstance(source, (str, os.PathLike)):
        return _load_path(Path(source), fetches=fetches, batch_size=batch_size, name=name, cache=cache)
    kind = _source_kind(source)
    if kind == "keras":
        _no_keras_fetches(fetches, f"Keras model {source.name!r}")
        return _load_keras(source, batch_size=batch_size, name=name, cache=cache)
    if kind == "concrete":
        gd = source.graph.as_graph_def()
        key = ("concrete", _proto_hash(gd), fetches, batch_size)
        return cached(key, lambda: convert_concrete(source, fetches=fetches, batch_size=batch_size,
                                                    name=name or function_name(source)), cache)
    if kind == "graph":
        if fetches is None:
            fetches = [_graph_element_name(x) for x in source.get_collection("train_op")]
            if not fetches:
                raise GraphImportError("the tf.Graph has no `train_op` collection: pass fetches=[...] (train op / loss names)")
        return _load_graph_def(source.as_graph_def(), fetches, batch_size=batch_size, name=name or "graph",
                               cache=cache, where="tf.Graph")
    if kind == "graph_def":
        if not fetches:
            raise GraphImportError("a GraphDef needs fetch names (train op / loss): pass fetches=[...] or --fetch NAME")
        return _load_graph_def(source, fetches, batch_size=batch_size, name=name or "graph", cache=cache, where="GraphDef")
    if kind == "meta_graph_def":
        fetches = meta_graph_fetches(source, fetches, "MetaGraphDef")
        return _load_graph_def(source.graph_def, fetches, batch_size=batch_size, name=name or "graph", cache=cache,
                               where="MetaGraphDef")
    raise GraphImportError(
        f"cannot import a {type(source).__name__}: expected a tf.Graph, GraphDef, MetaGraphDef, file path, "
        "tf.function ConcreteFunction or compiled Keras model")


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


def _no_keras_fetches(fetches, what: str) -> None:
    """A Keras model's step is its train_step (loss, gradients, update): fetches would be silently unused."""
    if fetches:
        raise GraphImportError(f"{what}: fetches ({fetches[0]!r}) apply to graphs, not to a Keras model, whose "
                               "training step is imported whole")


def _graph_element_name(x: Any) -> str:
    if isinstance(x, (str, bytes)):
        return x.decode() if isinstance(x, bytes) else x
    return x.name


def _proto_hash(p) -> str:
    return hashlib.sha256(p.SerializeToString(deterministic=True)).hexdigest()


# --------------------------------------------------------------------------------------------- per kind
def _load_graph_def(gd, fetches, *, batch_size, name, cache, where) -> OpGraph:
    key = ("graph_def", _proto_hash(gd), list(fetches), batch_size)
    return cached(key, lambda: convert_graph_def(gd, list(fetches), batch_size=batch_size, name=name, where=where),
                  cache)


def _from_saved_model(sm, fetches, batch_size, name, where) -> OpGraph:
    gd, fetches = saved_model_graph(sm, fetches, where)
    if len(gd.library.function):
        gd = inline_functions(gd, fetches, where=where)
    return convert_graph_def(gd, fetches, batch_size=batch_size, name=name, where=where)


def _load_keras(model, *, batch_size, name, cache) -> OpGraph:
    check_compiled(model)
    try:
        known = [t for t in model.inputs if t.shape and t.shape[0] is not None]
    except (AttributeError, ValueError, TypeError):   # unbuilt: keras_step_function says so
        known = []
    if batch_size is not None and known and len(known) == len(model.inputs):     # it would be silently unused
        raise GraphImportError(f"Keras model {model.name!r}: batch size {batch_size} is unused: its inputs have a "
                               f"batch dimension ({known[0].name!r} is {tuple(known[0].shape)}); drop --batch-size / "
                               "batch_size=")
    key = keras_key(model)
    build = lambda: convert_keras(model, batch_size=batch_size, name=name or model.name)  # noqa: E731
    if key is None:
        return build()
    return cached(("keras", key, batch_size), build, cache)


def _load_path(path: Path, *, fetches, batch_size, name, cache) -> OpGraph:
    if not path.exists():
        raise GraphImportError(f"graph file not found: {path}")
    nm = name or path.stem
    if path.is_dir():
        if not (path / "saved_model.pb").exists() and not (path / "saved_model.pbtxt").exists():
            raise GraphImportError(f"{path} is a directory but not a SavedModel (no saved_model.pb)")
        key = ("savedmodel", hash_files(path), fetches, batch_size)
        return cached(key, lambda: _from_saved_model(read_saved_model(path), fetches, batch_size, nm, str(path)), cache)
    if path.suffix.lower() == ".keras":
        _no_keras_fetches(fetches, f"Keras model {path}")
        key = ("keras_file", hashlib.sha256(read_file(path)).hexdigest(), batch_size)
        return cached(key, lambda: _load_keras(load_keras_file(path), batch_size=batch_size, name=nm, cache=False),
                      cache)
    data = read_file(path)
    if not data:
        raise GraphImportError(f"{path} is empty (not a TensorFlow graph)")
    key = ("file", hashlib.sha256(data).hexdigest(), fetches, batch_size)

    def build() -> OpGraph:
        proto = parse_graph_file(path, data)
        kind = type(proto).__name__
        if kind == "SavedModel":
            return _from_saved_model(proto, fetches, batch_size, nm, str(path))
        if kind == "MetaGraphDef":
            fl = meta_graph_fetches(proto, fetches, str(path))
            return convert_graph_def(proto.graph_def, fl, batch_size=batch_size, name=nm, where=str(path))
        if not fetches:
            raise GraphImportError(f"{path} is a GraphDef, which names no train op: pass fetches / --fetch NAME")
        return convert_graph_def(proto, list(fetches), batch_size=batch_size, name=nm, where=str(path))

    return cached(key, build, cache)
