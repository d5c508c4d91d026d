"""Scale: a ~100k-op graph (issue 14, item 5): import, group, simulate and search it, on this 2-core machine.

    .venv/bin/python benchmarks/scale.py                                # gpt --layers 127 (~100k ops), DGX1, fp16, 600 s
    .venv/bin/python benchmarks/scale.py --layers 8 --budget 60 --no-write   # a quick look

Targets: simulate <= 100 ms per step on one core, search within a 10-minute budget, peak memory < 8 GB.

Every phase runs in a fresh process, so nothing is paid twice or hidden by a warm cache:
1. cold: `build_model("gpt", "full", layers=L, precision=P)` with an empty cache (trace + convert + save);
2. cached: the same call in a new process (the cache the user gets on every later run), then grouping
   (`placer.graphs.group.group`, G groups), building the problem (cluster, costs, baselines once), one-core
   simulation of the expert placement (`Simulator.simulate`, median of 5) and a search of `--budget` seconds.
Peak RSS is that process's maximum resident set (`resource.getrusage`), the figure that must stay under 8 GB.
Writes results/scale.json (ops, import_cached_s, group_s, simulate_ms, search_budget_s, search_wall_s,
peak_rss_bytes, and the rest printed) and the RESULTS.md section "Scale: a 100k-op graph". Simulated step times
(the DGX1 preset, analytical costs); wall times measured on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cluster import RESULTS, machine, now, write_json, write_section  # noqa: E402

COLD = r"""
import json, sys, time
layers, precision = int(sys.argv[1]), sys.argv[2]
t0 = time.perf_counter()
from placer.graphs.models import build_model
g = build_model("gpt", "full", layers=layers, precision=precision)
print(json.dumps({"ops": g.num_ops, "import_cold_s": time.perf_counter() - t0}))
"""

CACHED = r"""
import json, resource, sys, time
import numpy as np
layers, precision, cluster, groups, budget = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
out = {}
t0 = time.perf_counter()
from placer.graphs.models import build_model
g = build_model("gpt", "full", layers=layers, precision=precision)
out["import_cached_s"] = time.perf_counter() - t0
out["ops"], out["edges"] = g.num_ops, g.num_edges
from placer.problem import build_problem
t0 = time.perf_counter()
problem = build_problem(g, cluster, max_groups=groups or None, seed=0)
out["build_problem_s"] = time.perf_counter() - t0
out["groups"] = problem.grouping.num_groups
from placer.graphs.group import group                 # the grouping build_problem did, timed alone
gpu = [i for i, d in enumerate(problem.cluster.devices) if not d.is_cpu][0]
t0 = time.perf_counter()
group(g, max_groups=out["groups"], op_costs=np.where(np.isfinite(problem.cost[:, gpu]), problem.cost[:, gpu], 0.0))
out["group_s"] = time.perf_counter() - t0
sim = problem.simulator.sim
name = "expert" if "expert" in problem.baselines else sorted(problem.baselines)[0]
p = problem.baselines[name]
sim.simulate(p)                                  # numba compiled (and cached) before timing
ts = []
for _ in range(5):
    t0 = time.perf_counter()
    r = sim.simulate(p)
    ts.append(time.perf_counter() - t0)
out["simulate_ms"] = 1e3 * float(np.median(ts))
out["simulated_placement"], out["simulated_step_s"] = name, r.step_time
from placer.bench import evaluate_baselines
times, errors = evaluate_baselines(problem)
out["baselines"] = times
out["baseline_errors"] = {k: v.splitlines()[0][:300] for k, v in errors.items()}
from placer.search import search
t0 = time.perf_counter()
res = search(problem, budget_seconds=budget, seed=0)
out["search_budget_s"] = budget
out["search_wall_s"] = time.perf_counter() - t0
out["search_best_s"] = res.search_best if np.isfinite(res.search_best) else None
out["returned_s"] = res.step_time
out["updates"] = res.extra.get("updates")
out["evaluations"] = res.evaluations
out["lower_bound_s"] = problem.lower_bound
out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
problem.close()
print(json.dumps(out))
"""


def child(code: str, args: list[str], cache: str) -> dict:
    env = dict(os.environ, PLACER_CACHE_DIR=cache, TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=6 * 3600)
    if r.returncode:
        raise SystemExit(f"scale: child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def section(rec: dict, command: str) -> str:
    ok = lambda b: "met" if b else "MISSED"  # noqa: E731
    bl = {k: v for k, v in rec["baselines"].items() if v is not None}
    best = min(bl, key=bl.get) if bl else None
    return "\n".join([
        "## Scale: a 100k-op graph (issue 14)",
        "",
        f"Written by `benchmarks/scale.py` ({rec['date']}; {rec['machine']}). Command: `{command}`. "
        f"gpt --layers {rec['layers']} ({rec['precision']}) on {rec['cluster']}: {rec['ops']:,} ops, "
        f"{rec['edges']:,} edges, {rec['groups']} groups. Wall times measured on this machine; step times simulated "
        "(preset, analytical costs).",
        "",
        "| phase | figure | target |",
        "|---|---:|---|",
        f"| import, cold (trace, convert, cache) | {rec['import_cold_s']:.1f} s | |",
        f"| import, cached | {rec['import_cached_s']:.1f} s | |",
        f"| problem (cluster, costs, grouping, baselines once) | {rec['build_problem_s']:.1f} s | |",
        f"| of which grouping | {rec['group_s']:.1f} s | |",
        f"| simulate one step, one core ({rec['simulated_placement']}) | {rec['simulate_ms']:.1f} ms | ≤ 100 ms: "
        f"{ok(rec['simulate_ms'] <= 100)} |",
        f"| search | {rec['search_wall_s']:.0f} s for a {rec['search_budget_s']:.0f} s budget, {rec['updates']} updates, "
        f"{rec['evaluations']:,} evaluations | within 10 min: {ok(rec['search_wall_s'] <= 600 + 60)} |",
        f"| peak memory (RSS) | {rec['peak_rss_bytes'] / 2 ** 30:.2f} GiB | < 8 GB: "
        f"{ok(rec['peak_rss_bytes'] < 8e9)} |",
        "",
        "Simulated step times: policy's own best "
        + (f"{rec['search_best_s']:.4f} s" if rec["search_best_s"] is not None else "none that fits")
        + f", returned {rec['returned_s']:.4f} s, expert "
        + (f"{rec['baselines'].get('expert'):.4f} s" if rec["baselines"].get("expert") is not None else "n/a")
        + (f", best baseline {best} {bl[best]:.4f} s" if best else "")
        + f", lower bound {rec['lower_bound_s']:.4f} s."
        + (f" {len(rec['baseline_errors'])} of {len(rec['baselines'])} baselines find no placement that fits "
           f"({', '.join(sorted(rec['baseline_errors']))}); the first reason of each:" if rec.get("baseline_errors") else ""),
        *([""] + [f"- {k}: {v.split(': ', 1)[-1].split('; ')[0][:140]}" for k, v in sorted(rec["baseline_errors"].items())]
          if rec.get("baseline_errors") else []),
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=127, help="gpt depth (default 127: ~787 ops per layer, ~100k ops)")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--cluster", default="DGX1")
    ap.add_argument("--groups", type=int, default=0, help="max groups (default: the product's, min(256, 20 x GPUs))")
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--rewrite", action="store_true", help="only rewrite the RESULTS.md section from results/scale.json")
    a = ap.parse_args(argv)
    if a.rewrite:
        rec = json.loads((RESULTS / "scale.json").read_text())
        write_section("scale", section(rec, rec.get("command", "python benchmarks/scale.py")))
        return 0
    command = "python benchmarks/scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = now()
    with tempfile.TemporaryDirectory(prefix="placer-scale-") as cache:
        cold = child(COLD, [str(a.layers), a.precision], cache)
        print(f"cold import: {cold['ops']:,} ops in {cold['import_cold_s']:.1f} s", flush=True)
        rec = child(CACHED, [str(a.layers), a.precision, a.cluster, str(a.groups), str(a.budget)], cache)
    rec.update({"command": command.strip(), "layers": a.layers, "precision": a.precision, "cluster": a.cluster,
                "import_cold_s": cold["import_cold_s"], "date": started, "machine": machine()})
    print(json.dumps({k: v for k, v in rec.items() if k not in ("baselines", "baseline_errors")}, indent=1))
    if not a.no_write:
        write_json(RESULTS / "scale.json", rec)
        write_section("scale", section(rec, command.strip()))
        print(f"wrote {RESULTS / 'scale.json'} and the RESULTS.md section")
    return 0


if __name__ == "__main__":
    sys.exit(main())
