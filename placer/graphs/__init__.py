"""Graph import (`load`), the OpGraph data structure and built-in benchmark models.

TensorFlow is imported lazily inside the functions, so importing this package stays fast.
Note: the name `placer.graphs.load` is the FUNCTION (it shadows the submodule of the same name). The modules:
`load` (dispatch by source kind), `files`, `trace`, `cleanup`, `opfacts`, `cache`, `runnable` (reading the
runnable MetaGraphDef: `runtime_spec`, `synthetic_feeds`), `opgraph`, `group`, `models`.
"""
from placer.graphs.load import load
from placer.graphs.opgraph import OpGraph
from placer.graphs.runnable import RuntimeSpec, runtime_spec, synthetic_feeds

__all__ = ["OpGraph", "RuntimeSpec", "load", "runtime_spec", "synthetic_feeds"]
