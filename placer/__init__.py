"""placer: learned device placement for TensorFlow training graphs.

    import placer
    result = placer.place(model_or_graph, cluster="4xK80", budget_seconds=60)
    result.placement.save("placement.json")

TensorFlow is imported lazily, so `import placer` and `placer --help` start fast.
"""
import os as _os

from placer._version import __version__  # noqa: F401

# oneDNN kernels make the policy's update 1.5x faster on CPU (benchmarks/RESULTS.md, "Update time"). TensorFlow
# turns them on by itself only on CPUs with AVX-512 VNNI/BF16/AMX; it reads this variable once, when it is first
# imported, so this has no effect if TensorFlow was imported before placer, and a value you set wins.
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

__all__ = ["place", "replace", "Placement", "SearchResult", "__version__"]


# the lower-level pieces the README names (`placer.graphs.load`, `placer.problem.build_problem`,
# `placer.sim.cluster.parse_cluster`...), imported on first use so that `import placer` alone reaches them
_SUBMODULES = {"baselines": "", "errors": "", "graphs": "", "placement": "", "problem": "", "runtime": "",
               "search": "", "sim": ".cluster"}


def __getattr__(name):  # lazy exports keep `import placer` light
    if name in ("place", "replace", "Placement", "SearchResult"):
        from placer import api

        return getattr(api, name)
    if name in _SUBMODULES:
        import importlib

        importlib.import_module(f"placer.{name}{_SUBMODULES[name]}")
        return importlib.import_module(f"placer.{name}")
    raise AttributeError(f"module 'placer' has no attribute {name!r}")
