"""Reading a runnable MetaGraphDef: what to fetch, what to run once, what to feed, and the feeds themselves.

One reader serves every runtime: the measurement child process, the TF-cluster runner and the tests that run an
imported step in a Session. :func:`placer.graphs.cleanup.build_meta_graph` writes the collections read here.

    spec = runtime_spec(graph.meta_graph_def())
    with tf.compat.v1.Session() as s:
        s.run(list(spec.init_ops)); s.run(list(spec.fetches), feed_dict=synthetic_feeds(spec))

Rules (graphs from :func:`placer.graphs.load` always have the first choice of each; other MetaGraphDefs, e.g.
a user's ``.meta`` run as is, fall back in this order):

- fetches: the ``fetches`` argument (op names, or tensor names ``op:k``); when empty, the collection
  ``placer_fetches``, else ``train_op``, else every op nobody consumes (with a warning).
- init: the collection ``placer_init_op``, else ``init_op``, else the initializers of every variable in the
  ``variables``/``local_variables`` collections plus ``table_initializer``, else an op called ``init``.
- feeds: the placeholders of the ``placer_feeds`` collection when the graph has one, else every top-level
  ``Placeholder`` node; its ``shape`` attr gives the shape (unknown dimensions -> 1, with a warning; unknown
  rank -> scalar), its ``dtype`` attr the dtype. ``PlaceholderWithDefault`` is not fed.
- feed limits: ``placer_feed_limits`` (int64 list aligned with ``placer_feeds``): for an integer feed, the
  exclusive upper bound of the values the graph accepts (a vocabulary or class count); 0 = unknown.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from placer.errors import GraphImportError

FETCHES_COLLECTION = "placer_fetches"
INIT_COLLECTION = "placer_init_op"
FEEDS_COLLECTION = "placer_feeds"
FEED_LIMITS_COLLECTION = "placer_feed_limits"
FEED_SEED = 0
MAX_BATCH_SIZE = 2**31 - 1      # TensorFlow's shape arithmetic (Fill, Reshape of a batch) is int32 in most graphs


def check_batch_size(batch_size) -> None:
    """Refuse a batch size that is not a positive integer TensorFlow can hold (one line, before any import)."""
    if batch_size is None:
        return
    if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size <= 0:
        raise GraphImportError(f"batch size must be a positive integer, got {batch_size!r}")
    if batch_size > MAX_BATCH_SIZE:
        raise GraphImportError(f"batch size {batch_size} is too large: at most {MAX_BATCH_SIZE} (int32)")


@dataclass(frozen=True)
class RuntimeSpec:
    """What a runtime needs to run a step: fetch names, init op names, feeds (name -> (dtype name, shape))."""

    fetches: tuple[str, ...]
    init_ops: tuple[str, ...]
    feeds: dict[str, tuple[str, tuple[int, ...]]]
    feed_limits: dict[str, int] = field(default_factory=dict)   # integer feeds: values in [0, limit)
    warnings: tuple[str, ...] = ()

    @property
    def init_op(self) -> str:
        """The one init op of a graph from :func:`placer.graphs.load` ("" when the graph has none)."""
        return self.init_ops[0] if self.init_ops else ""


def _collection(mg, key: str) -> list[str]:
    if key not in mg.collection_def:
        return []
    return [str(x) for x in mg.collection_def[key].node_list.value]


def _op_names(mg, key: str) -> list[str]:
    return [x.split(":")[0].lstrip("^") for x in _collection(mg, key)]


def _fetches(mg, fetches, names: set[str], warnings: list[str]) -> list[str]:
    fl = [f for f in (fetches or []) if f]
    if not fl:
        fl = _collection(mg, FETCHES_COLLECTION) or _collection(mg, "train_op")
    if not fl:
        consumed = {i.lstrip("^").split(":")[0] for n in mg.graph_def.node for i in n.input}
        fl = [n.name for n in mg.graph_def.node
              if n.name not in consumed and n.op not in ("NoOp", "Placeholder", "Const")]
        warnings.append(f"no fetches given and no train_op collection: fetching {len(fl)} unconsumed ops")
    missing = [f for f in fl if f.split(":")[0] not in names]
    if missing:
        raise GraphImportError(f"fetch {missing[0]!r} is not an op of the graph")
    return fl


def _init_ops(mg, names: set[str]) -> list[str]:
    init = _op_names(mg, INIT_COLLECTION) or _op_names(mg, "init_op")
    if not init:
        from tensorflow.core.framework import variable_pb2

        for key in ("variables", "local_variables"):
            if key in mg.collection_def:
                for raw in mg.collection_def[key].bytes_list.value:
                    v = variable_pb2.VariableDef()
                    v.ParseFromString(raw)
                    nm = v.initializer_name.split(":")[0]
                    if nm and nm in names and nm not in init:
                        init.append(nm)
        init += [x for x in _op_names(mg, "table_initializer") if x in names]
    if not init and "init" in names:
        init = ["init"]
    return [x for x in init if x in names]


def _feeds(mg, warnings: list[str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    from tensorflow.python.framework import dtypes

    listed = set(_op_names(mg, FEEDS_COLLECTION))
    feeds = {}
    for n in mg.graph_def.node:
        if n.op != "Placeholder" or (listed and n.name not in listed):
            continue
        sh = n.attr["shape"].shape if "shape" in n.attr else None
        if sh is None or sh.unknown_rank:
            shape: tuple[int, ...] = ()
            warnings.append(f"placeholder {n.name!r} has an unknown rank: fed a scalar")
        else:
            dims = [int(d.size) for d in sh.dim]
            if any(d < 0 for d in dims):
                warnings.append(f"placeholder {n.name!r} has unknown dimensions {dims}: fed 1 for each")
            shape = tuple(d if d >= 0 else 1 for d in dims)
        feeds[n.name] = (dtypes.as_dtype(n.attr["dtype"].type).name, shape)
    return feeds


def runtime_spec(meta_graph_def, fetches: list[str] | None = None) -> RuntimeSpec:
    """Fetches, init ops and feeds of a MetaGraphDef (see the module docstring for the rules).

    >>> spec = runtime_spec(load(graph).meta_graph_def())   # doctest: +SKIP
    >>> spec.fetches, spec.init_op                           # doctest: +SKIP
    (('train_op', 'loss/total:0'), 'placer_init')
    """
    mg = meta_graph_def
    names = {n.name for n in mg.graph_def.node}
    warnings: list[str] = []
    fl = _fetches(mg, fetches, names, warnings)
    init = _init_ops(mg, names)
    feeds = _feeds(mg, warnings)
    limits = {}
    if FEED_LIMITS_COLLECTION in mg.collection_def:
        vals = mg.collection_def[FEED_LIMITS_COLLECTION].int64_list.value
        limits = {n: int(v) for n, v in zip(_op_names(mg, FEEDS_COLLECTION), vals) if n in feeds and v > 0}
    return RuntimeSpec(tuple(fl), tuple(init), feeds, limits, tuple(warnings))


def synthetic_feeds(spec: RuntimeSpec, seed: int = FEED_SEED) -> dict[str, np.ndarray]:
    """One step's inputs, keyed by tensor name (``name:0``) for ``Session.run``; the same for a given seed.

    Floats: normal with std 0.1 (images, features, one-hot-ish labels stay finite); integers: uniform in
    ``[0, limit)`` when the graph says what it accepts (token ids below the vocabulary, labels below the class
    count), else 0, valid for any index; booleans False; strings empty.

    >>> synthetic_feeds(RuntimeSpec((), (), {"ids": ("int32", (2,))}, {"ids": 5}))   # doctest: +SKIP
    {'ids:0': array([4, 3], dtype=int32)}
    """
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    out = {}
    for name, (dt, shape) in spec.feeds.items():
        dtype = tf.as_dtype(dt)
        if dtype == tf.string:
            val = np.full(shape, b"", dtype=object)
        elif dtype.is_floating:
            val = (rng.standard_normal(shape) * 0.1).astype(dtype.as_numpy_dtype)
        elif dtype.is_integer and spec.feed_limits.get(name, 0) > 0:
            val = rng.integers(0, spec.feed_limits[name], size=shape).astype(dtype.as_numpy_dtype)
        else:   # bool, complex, integers of unknown range: zeros
            val = np.zeros(shape, dtype=dtype.as_numpy_dtype)
        out[f"{name}:0"] = val
    return out


__all__ = ["FEEDS_COLLECTION", "FEED_LIMITS_COLLECTION", "FETCHES_COLLECTION", "INIT_COLLECTION", "RuntimeSpec",
           "runtime_spec", "synthetic_feeds"]
