"""What to run in a runnable MetaGraphDef: fetches, initialisers and the placeholders to feed.

Convention (shared with `placer.graphs.load`, see its module docstring):
- fetches: the OpGraph's `fetches` (op names, or tensor names `op:k`); when empty, the MetaGraphDef collection
  `placer_fetches`, else `train_op`, else every op nobody consumes.
- init: the collection `placer_init_op`, else `init_op`, else the initializers of every variable in the
  `variables`/`local_variables` collections plus `table_initializer`, else an op called `init`.
- feeds: the placeholders of the `placer_feeds` collection when the graph has one (graphs from
  `placer.graphs.load`), else every top-level `Placeholder` node; its `shape` attr gives the shape (unknown dimensions -> 1, with a
  warning; unknown rank -> scalar), its `dtype` attr the dtype. `PlaceholderWithDefault` is not fed.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunnableParts:
    fetches: list[str]
    init_ops: list[str]
    feeds: list[tuple[str, tuple[int, ...], int]]   # (placeholder name, shape, DataType enum)
    warnings: list[str] = field(default_factory=list)


def _node_list(mg, key: str) -> list[str]:
    if key not in mg.collection_def:
        return []
    return [str(x).split(":")[0].lstrip("^") for x in mg.collection_def[key].node_list.value]


def _raw_list(mg, key: str) -> list[str]:
    if key not in mg.collection_def:
        return []
    return [str(x) for x in mg.collection_def[key].node_list.value]


def runnable_parts(mg, fetches: list[str] | None = None) -> RunnableParts:
    """Fetches, init ops and feeds of a MetaGraphDef (see the module docstring for the rules)."""
    from tensorflow.core.framework import variable_pb2

    gd = mg.graph_def
    names = {n.name for n in gd.node}
    warnings: list[str] = []
    fl = [f for f in (fetches or []) if f]
    if not fl:
        fl = _raw_list(mg, "placer_fetches") or _raw_list(mg, "train_op")
    if not fl:
        consumed = set()
        for n in gd.node:
            for i in n.input:
                consumed.add(i.lstrip("^").split(":")[0])
        fl = [n.name for n in gd.node if n.name not in consumed and n.op not in ("NoOp", "Placeholder", "Const")]
        warnings.append(f"no fetches given and no train_op collection: fetching {len(fl)} unconsumed ops")
    missing = [f for f in fl if f.split(":")[0] not in names]
    if missing:
        from placer.errors import GraphImportError

        raise GraphImportError(f"fetch {missing[0]!r} is not an op of the graph")

    init = _node_list(mg, "placer_init_op") or _node_list(mg, "init_op")
    if not init:
        for key in ("variables", "local_variables"):
            if key in mg.collection_def:
                for raw in mg.collection_def[key].bytes_list.value:
                    v = variable_pb2.VariableDef()
                    v.ParseFromString(raw)
                    if v.initializer_name:
                        nm = v.initializer_name.split(":")[0]
                        if nm in names and nm not in init:
                            init.append(nm)
        init += [x for x in _node_list(mg, "table_initializer") if x in names]
    if not init and "init" in names:
        init = ["init"]
    init = [x for x in init if x in names]

    feeds = []
    listed = set(_node_list(mg, "placer_feeds"))
    for n in gd.node:
        if n.op != "Placeholder" or (listed and n.name not in listed):
            continue
        dtype = n.attr["dtype"].type
        sh = n.attr["shape"].shape if "shape" in n.attr else None
        if sh is None or sh.unknown_rank:
            shape: tuple[int, ...] = ()
            warnings.append(f"placeholder {n.name!r} has an unknown rank: fed a scalar")
        else:
            dims = [d.size for d in sh.dim]
            if any(d < 0 for d in dims):
                warnings.append(f"placeholder {n.name!r} has unknown dimensions {dims}: fed 1 for each")
            shape = tuple(d if d >= 0 else 1 for d in dims)
        feeds.append((n.name, shape, int(dtype)))
    return RunnableParts(fetches=fl, init_ops=init, feeds=feeds, warnings=warnings)
