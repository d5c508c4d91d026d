"""What to run in a runnable MetaGraphDef: kept for older imports; the one reader is
:func:`placer.graphs.runnable.runtime_spec` (its module docstring states the rules and fallbacks), and the one
maker of inputs :func:`placer.graphs.runnable.synthetic_feeds`."""
from __future__ import annotations

from dataclasses import dataclass, field

from placer.graphs.runnable import runtime_spec


@dataclass
class RunnableParts:
    fetches: list[str]
    init_ops: list[str]
    feeds: list[tuple[str, tuple[int, ...], int]]   # (placeholder name, shape, DataType enum)
    warnings: list[str] = field(default_factory=list)


def runnable_parts(mg, fetches: list[str] | None = None) -> RunnableParts:
    """:func:`placer.graphs.runnable.runtime_spec` in the older list form."""
    from tensorflow.python.framework import dtypes

    spec = runtime_spec(mg, fetches)
    feeds = [(n, shape, dtypes.as_dtype(dt).as_datatype_enum) for n, (dt, shape) in spec.feeds.items()]
    return RunnableParts(list(spec.fetches), list(spec.init_ops), feeds, list(spec.warnings))
