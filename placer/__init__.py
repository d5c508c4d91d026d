"""placer: learned device placement for TensorFlow training graphs.

    import placer
    result = placer.place(model_or_graph, cluster="4xK80", budget_seconds=60)
    result.placement.save("placement.json")

TensorFlow is imported lazily, so `import placer` and `placer --help` start fast.
"""
__version__ = "0.1.0"

__all__ = ["place", "Placement", "SearchResult", "__version__"]


def __getattr__(name):  # lazy exports keep `import placer` light
    if name in ("place", "Placement", "SearchResult"):
        from placer import api

        return getattr(api, name)
    raise AttributeError(f"module 'placer' has no attribute {name!r}")
