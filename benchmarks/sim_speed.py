"""The simulator's kernel against an earlier revision's, on the same placements, side by side in one run.

    .venv/bin/python benchmarks/sim_speed.py [--rev efa474b] [--graphs clip@DGX1:fp16,...] [--placements 16]
        [--rounds 10] [--json]

For each graph (`model[/size]@cluster[:precision]`, as benchmarks/transfer.py names them): the problem's grouping,
`--placements` random group placements over each group's allowed devices (expanded to ops, as a search evaluates
them) and the single-device one. The kernel of `placer/sim/simulator.py` at `--rev` (read with `git show`,
compiled without numba's cache) and today's simulate every placement; every figure they return (step time,
transfers, bytes, busy time and peak memory per device) must be identical, else the script fails. Then, in
`--rounds` interleaved rounds, each kernel simulates every placement once on one thread: prints the mean
milliseconds per simulation of each, per op, and the ratio. Measured wall times on this machine; keep it otherwise
idle.

`--baselines`: the same for the list schedulers' kernel (`placer/baselines/_schedule.py`: m_etf and m_sct on each
graph's op-level problem): the revision's and today's must return the same placement; prints the wall of each.
"""
from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DEFAULT_GRAPHS = "clip@DGX1:fp16,gpt@DGX1:fp16,inception_v3@4xK80,nmt@4xK80"


def load_revision(rev: str, path_in_repo: str = "placer/sim/simulator.py"):
    """A module of placer as it was at `rev`, as a module of its own (numba's cache off, so nothing is written
    beside the working tree's cache)."""
    src = subprocess.run(["git", "-C", str(HERE.parent), "show", f"{rev}:{path_in_repo}"],
                         capture_output=True, text=True)
    if src.returncode:
        raise SystemExit(f"sim_speed: cannot read {path_in_repo} at {rev!r}: {src.stderr.strip()}")
    d = Path(tempfile.mkdtemp(prefix="placer_sim_rev_"))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    name = "rev_" + Path(path_in_repo).stem.lstrip("_")
    path = d / f"{name}.py"
    path.write_text(src.stdout.replace("cache=True, ", ""))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="efa474b", help="git revision whose kernel to compare with (default efa474b)")
    ap.add_argument("--graphs", default=DEFAULT_GRAPHS)
    ap.add_argument("--placements", type=int, default=16, help="random group placements per graph")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--order", default="ready", choices=["ready", "critical"], help="the simulators' op order")
    ap.add_argument("--json", action="store_true", help="print one JSON object per graph")
    ap.add_argument("--baselines", action="store_true", help="time m_etf and m_sct (their kernel) instead")
    a = ap.parse_args(argv)
    if a.placements < 1 or a.rounds < 1:
        ap.error("--placements and --rounds must be at least 1")

    import numpy as np

    from placer._tf import hide_gpus

    hide_gpus()
    if a.baselines:
        return baselines(a)
    from transfer import parse_graph

    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.sim.simulator import Simulator

    old_mod = load_revision(a.rev)
    for spec in [x for x in a.graphs.split(",") if x]:
        model, size, cluster, precision = parse_graph(spec)
        g = build_model(model, size, precision=precision)
        p = build_problem(g, cluster, seed=a.seed, baselines=False)
        try:
            rng = np.random.default_rng(a.seed)
            choices = [np.flatnonzero(row) for row in p.allowed]
            groups = [np.array([rng.choice(c) for c in choices]) for _ in range(a.placements)]
            one = next(d for d in range(p.allowed.shape[1]) if p.allowed[:, d].all())
            groups.append(np.full(len(choices), one))
            placements = [p.grouping.expand(x, p.cluster.cpu_index) for x in groups]
            new = p.simulator.sim
            new = Simulator(g, p.cluster, new.cost, order=a.order) if a.order != new.order else new
            old = old_mod.Simulator(g, p.cluster, new.cost, order=a.order)
            checked = [new.check(q) for q in placements]
            for i, q in enumerate(checked):
                r0, r1 = old._run(q), new._run(q)
                same = (r0.step_time == r1.step_time and r0.transfers == r1.transfers
                        and r0.transfer_bytes == r1.transfer_bytes and np.array_equal(r0.busy, r1.busy)
                        and np.array_equal(r0.peak_memory, r1.peak_memory))
                if not same:
                    print(f"sim_speed: {spec}: placement {i}: the kernels differ ({a.rev}: {r0.step_time!r} s, "
                          f"{r0.transfers} transfers; today: {r1.step_time!r} s, {r1.transfers})", file=sys.stderr)
                    return 1
            t = {"old": 0.0, "new": 0.0}
            for _ in range(a.rounds):
                for name, sim in (("old", old), ("new", new)):
                    t0 = time.perf_counter()
                    for q in checked:
                        sim._run(q)
                    t[name] += time.perf_counter() - t0
            calls = a.rounds * len(checked)
            rec = {"graph": spec, "ops": g.num_ops, "groups": len(choices), "placements": len(checked),
                   "rounds": a.rounds, "rev": a.rev, "order": a.order, "identical": True,
                   "old_ms": 1e3 * t["old"] / calls, "new_ms": 1e3 * t["new"] / calls}
            rec["speedup"] = rec["old_ms"] / rec["new_ms"]
            if a.json:
                print(json.dumps(rec), flush=True)
            else:
                print(f"{spec} ({g.num_ops:,} ops, order {a.order}, {len(checked)} placements x {a.rounds} rounds, identical "
                      f"results): {a.rev} {rec['old_ms']:.3f} ms per simulation ({1e9 * t['old'] / calls / g.num_ops:.0f} "
                      f"ns/op), today {rec['new_ms']:.3f} ms ({1e9 * t['new'] / calls / g.num_ops:.0f} ns/op): "
                      f"{rec['speedup']:.2f}x", flush=True)
        finally:
            p.close()
    return 0


def baselines(a) -> int:
    """m_etf and m_sct with the revision's list-scheduling kernel and with today's, alternately, `--rounds` times
    each (at most 3) after one untimed call each (one call builds the op-level problem and schedules it)."""
    import numpy as np

    m_etf_mod = importlib.import_module("placer.baselines.m_etf")    # (the package's names are the functions)
    m_sct_mod = importlib.import_module("placer.baselines.m_sct")
    from placer.graphs.models import build_model
    from placer.sim.cluster import parse_cluster
    from transfer import parse_graph

    old_etf = load_revision(a.rev, "placer/baselines/_schedule.py").etf
    new_etf = m_etf_mod.etf
    rounds = min(a.rounds, 3)
    for spec in [x for x in a.graphs.split(",") if x]:
        model, size, cluster, precision = parse_graph(spec)
        g = build_model(model, size, precision=precision)
        cl = parse_cluster(cluster)
        for fn, mod in ((m_etf_mod.m_etf, m_etf_mod), (m_sct_mod.m_sct, m_sct_mod)):
            t, out = {"old": 0.0, "new": 0.0}, {}
            try:
                for etf in (old_etf, new_etf):      # compile (or load) each kernel before timing
                    mod.etf = etf
                    fn(g, cl)
                for _ in range(rounds):
                    for name, etf in (("old", old_etf), ("new", new_etf)):
                        mod.etf = etf
                        t0 = time.perf_counter()
                        out[name] = np.asarray(fn(g, cl))
                        t[name] += time.perf_counter() - t0
            finally:
                mod.etf = new_etf
            if not np.array_equal(out["old"], out["new"]):
                print(f"sim_speed: {spec}: {fn.__name__}: the kernels place differently", file=sys.stderr)
                return 1
            rec = {"graph": spec, "baseline": fn.__name__, "rev": a.rev, "rounds": rounds, "identical": True,
                   "old_s": t["old"] / rounds, "new_s": t["new"] / rounds}
            if a.json:
                print(json.dumps(rec), flush=True)
            else:
                print(f"{spec} {fn.__name__} (same placement): {a.rev} {rec['old_s']:.3f} s, today "
                      f"{rec['new_s']:.3f} s: {rec['old_s'] / rec['new_s']:.2f}x (mean of {rounds})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
