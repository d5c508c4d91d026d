"""The house's rules, checked: rl/ sees no api, baselines or sim; no import cycle among placer's modules; no
pickle on files a user hands back."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx

PKG = Path(__file__).resolve().parent.parent / "placer"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Every placer module → the placer modules it imports, at module level or inside functions (a lazy import
    is still a dependency). `from a.b import c` depends on `a.b.c` when that is a module, else on `a.b`."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    g = nx.DiGraph()
    for mod, path in files.items():
        g.add_node(mod)
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # `from pkg import submodule` depends on the submodule; `from mod import name` on mod
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
                targets = subs if len(subs) == len(node.names) else [base] + subs
            for t in targets:
                if t in files and t != mod:
                    g.add_edge(mod, t)
    return g


def test_no_import_cycle_among_placer_modules():
    g = import_graph()
    assert g.number_of_nodes() > 30 and g.number_of_edges() > 50      # the walk found the house
    cycles = list(nx.simple_cycles(g))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:5])


def test_rooms_point_one_way():
    """rl/ imports none of api, baselines, sim, search, problem, cli; lower rooms never import higher ones;
    placer.grouped (shared by rl/ and baselines/) imports no room."""
    g = import_graph()
    high = {"graphs": ("placer.sim", "placer.baselines", "placer.rl", "placer.runtime", "placer.problem",
                       "placer.search", "placer.api", "placer.cli", "placer.placement", "placer.bench"),
            "sim": ("placer.baselines", "placer.rl", "placer.runtime", "placer.problem", "placer.search",
                    "placer.api", "placer.cli", "placer.bench"),
            "baselines": ("placer.rl", "placer.runtime", "placer.problem", "placer.search", "placer.api",
                          "placer.cli", "placer.bench"),
            "rl": ("placer.api", "placer.baselines", "placer.sim", "placer.search", "placer.problem", "placer.cli",
                   "placer.runtime", "placer.graphs", "placer.bench"),
            "runtime": ("placer.api", "placer.search", "placer.cli", "placer.bench", "placer.rl"),
            "problem": ("placer.search", "placer.api", "placer.cli", "placer.runtime", "placer.rl", "placer.bench"),
            "search": ("placer.api", "placer.cli", "placer.bench"),
            # the one device-name parser: below every room, it imports only placer.errors
            "devnames": ("placer.graphs", "placer.sim", "placer.baselines", "placer.rl", "placer.runtime",
                         "placer.problem", "placer.search", "placer.api", "placer.cli", "placer.placement",
                         "placer.bench", "placer.tasks", "placer._tf"),
            # the grouped-baseline helpers both rl/ and baselines/ import: pure numpy, below every room
            "grouped": ("placer.graphs", "placer.sim", "placer.baselines", "placer.rl", "placer.runtime",
                        "placer.problem", "placer.search", "placer.api", "placer.cli", "placer.placement",
                        "placer.bench")}
    bad = []
    for room, banned in high.items():
        for mod in g.nodes:
            if mod == f"placer.{room}" or mod.startswith(f"placer.{room}."):
                bad += [f"{mod} -> {t}" for t in g.successors(mod) if t.startswith(banned)]
    assert not bad, bad


def test_rl_imports_nothing_from_api_baselines_or_sim():
    """The check anyone can run: `python -c "import placer.rl.search, placer.rl.policy"`, then sys.modules."""
    code = ("import sys, placer.rl.search, placer.rl.policy, placer.rl.reinforce; "
            "print(sorted(m for m in sys.modules if m.startswith('placer')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    loaded = eval(out.stdout.strip().splitlines()[-1])          # a list literal printed by the child
    assert "placer.rl.search" in loaded and "placer.rl.policy" in loaded
    bad = [m for m in loaded if re.match(r"placer\.(api|baselines|sim|search|problem|cli)(\.|$)", m)]
    assert not bad, bad


def test_no_pickle_on_files_a_user_hands_back():
    """Only the local runner's pipe to its own child process may pickle (the bytes never touch a file)."""
    allowed = {"runtime/_child.py", "runtime/local.py"}
    hits = []
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG).as_posix()
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(r"^\s*(import|from) (pickle|dill|joblib|shelve)\b|\b(pickle|dill|joblib)\.(loads?|Unpickler)\b"
                             r"|allow_pickle\s*=\s*True|marshal\.loads?\(|shelve\.open", line):
                if rel not in allowed:
                    hits.append(f"{rel}:{i}: {line.strip()}")
    assert not hits, hits


def test_device_names_are_parsed_in_one_place():
    """TF device names are parsed by placer.devnames only: no other module spells the device-name regex."""
    pat = re.compile(r"\(\?:device:\)\?|device:\(|/task:\(|split\(\":\"\)\s*$")
    offenders = [str(p.relative_to(PKG.parent)) for p in PKG.rglob("*.py")
                 if p.name != "devnames.py" and pat.search(p.read_text())]
    assert not offenders, offenders


def test_devnames_spellings():
    from placer import devnames
    from placer.errors import ClusterError

    assert devnames.canonical("/device:gpu:1") == devnames.canonical("GPU:1") == "/GPU:1"
    assert devnames.canonical("/job:localhost/replica:0/task:0/device:CPU:0") == "/CPU:0"
    assert devnames.canonical("/job:worker/task:1/cpu:0") == "/job:worker/replica:0/task:1/device:CPU:0"
    assert devnames.find("/job:worker/replica:0/task:2/device:GPU:3 stream:all").canonical == \
        "/job:worker/replica:0/task:2/device:GPU:3"
    assert devnames.find("/device:GPU:0/stream:12").short == "/GPU:0"
    assert devnames.find("no device here") is None
    assert devnames.kind("/job:worker/replica:0/task:1/device:CPU:0") == "CPU"
    for bad in ("/job:worker/replica:0", "GPU", "/GPU:x", "/GPU:0 extra"):
        try:
            devnames.canonical(bad)
        except ClusterError as e:
            assert repr(bad) in str(e)
        else:
            raise AssertionError(f"{bad!r} parsed")


def test_every_benchmark_script_parses():
    """The scripts that produce RESULTS.md's figures are not imported by any test run: a syntax error in one (as
    headroom.py had for a day, 2026-12-05) would otherwise ship unnoticed."""
    scripts = sorted((PKG.parent / "benchmarks").glob("*.py"))
    assert scripts
    bad = []
    for p in scripts:
        try:
            compile(p.read_text(), str(p), "exec")
        except SyntaxError as e:
            bad.append(f"{p.name}:{e.lineno}: {e.msg}")
    assert not bad, bad
