"""Graph import (`load`), the OpGraph data structure and built-in benchmark models.

TensorFlow is imported lazily inside the functions, so importing this package stays fast.
Note: the name `placer.graphs.load` is the FUNCTION (it shadows the submodule of the same name);
reach the module's other helpers with `from placer.graphs.load import runtime_spec, synthetic_feeds`.
"""
from placer.graphs.load import load, load_from_args, runtime_spec, synthetic_feeds
from placer.graphs.opgraph import OpGraph

__all__ = ["OpGraph", "load", "load_from_args", "runtime_spec", "synthetic_feeds"]
