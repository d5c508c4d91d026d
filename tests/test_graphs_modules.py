"""The graph loader's modules: who imports whom (no cycles, lower modules never import higher ones, the built-in
models use only public functions), read from the source with `ast` (every import, module-level or lazy)."""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import placer

PKG = Path(placer.__file__).parent
GRAPHS = PKG / "graphs"


def _module(p: Path) -> str:
    parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in PKG.rglob("*.py")}


def _imports(p: Path, mods: dict[str, Path]) -> list[tuple[str, str]]:
    """(imported module, imported name or "") for every `placer` import in file p."""
    out = []
    for node in ast.walk(ast.parse(p.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("placer"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub, "") if sub in mods else (node.module, a.name))
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.startswith("placer")]
    return out


def test_no_import_cycle_among_graph_modules():
    mods = _modules()
    deps = {m: {t for t, _ in _imports(p, mods) if t.startswith("placer.graphs")}
            for m, p in mods.items() if m.startswith("placer.graphs")}
    assert len(deps) >= 10
    list(graphlib.TopologicalSorter(deps).static_order())   # raises CycleError on a cycle
    # the low modules never reach (import, even transitively) the importers that dispatch to them; a topological
    # order alone does not say so (unrelated modules, e.g. models and load, come in any order)

    def reach(m, seen=None):
        seen = set() if seen is None else seen
        for d in deps.get(m, ()):
            if d not in seen:
                seen.add(d)
                reach(d, seen)
        return seen

    chain = ["opgraph", "cleanup", "trace", "models", "load"]
    for i, low in enumerate(chain):
        for high in chain[i + 1:]:
            assert f"placer.graphs.{high}" not in reach(f"placer.graphs.{low}"), (low, high)


def test_graphs_import_nothing_above_them():
    mods = _modules()
    # _npz: a leaf (numpy only), reads user files; _version: a leaf holding one string (the graph cache's key)
    allowed = ("placer.graphs", "placer.errors", "placer._npz", "placer._version")
    for m, p in mods.items():
        if m.startswith("placer.graphs"):
            bad = [t for t, _ in _imports(p, mods) if not t.startswith(allowed)]
            assert bad == [], f"{m} imports {bad}"


def test_models_use_only_public_functions():
    mods = _modules()
    for p in (GRAPHS / "models").glob("*.py"):
        for target, name in _imports(p, mods):
            if target.startswith("placer.graphs") and not target.startswith("placer.graphs.models"):
                assert not name.startswith("_"), f"{p.name} imports private {target}.{name}"
                assert target != "placer.graphs.load", f"{p.name} imports the loader that dispatches to it"
