"""Benchmark of the learned placer (issue 4).

    .venv/bin/python benchmarks/bench_search.py update              # one REINFORCE update, K=16, G=256, D=4+1
    .venv/bin/python benchmarks/bench_search.py evals               # evaluations/s end to end (simulator, nmt4)
    .venv/bin/python benchmarks/bench_search.py models --budget 600 # nmt4 and inception_v3 on 4xK80
    .venv/bin/python benchmarks/bench_search.py all

Prints one JSON line per measurement and appends them to benchmarks/results/bench_search.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
OUT = Path(__file__).resolve().parent / "results" / "bench_search.jsonl"


def _emit(rec: dict) -> None:
    rec = dict(rec, date=time.strftime("%Y-%m-%d %H:%M:%S"), cores=os.cpu_count(),
               load=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    line = json.dumps(rec)
    print(line, flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "a") as f:
        f.write(line + "\n")


def bench_update(groups: int = 256, devices: int = 5, features: int = 40, k: int = 16, reps: int = 10) -> dict:
    """Wall time of one REINFORCE update (sample K + teacher-forced log-probs + gradient + Adam), default config."""
    from placer.rl.reinforce import Reinforce, ReinforceConfig, toy_step_times

    rng = np.random.default_rng(0)
    allowed = np.ones((groups, devices), bool)
    allowed[::16] = False
    allowed[::16, devices - 1] = True       # some CPU-only groups
    cfg = ReinforceConfig(num_samples=k)
    agent = Reinforce(rng.random((groups, features), dtype=np.float32), allowed, cfg)
    target = rng.integers(0, devices - 1, groups)
    samp, learn, elite = [], [], []
    best, best_t = None, np.inf
    for i in range(reps + 2):
        t0 = time.perf_counter()
        a, n = agent.sample()
        t1 = time.perf_counter()
        times = toy_step_times(a, target)
        agent.learn(a, n, agent.rewards(times, np.zeros(k, bool), 100.0))
        t2 = time.perf_counter()
        if times.min() < best_t:
            best, best_t = a[int(np.argmin(times))], float(times.min())
        agent.imitate(best, max_steps=cfg.elite_steps)      # the search loop's elite step (worst case: all steps)
        t3 = time.perf_counter()
        if i >= 2:  # the first two calls trace the tf.functions
            samp.append(t1 - t0)
            learn.append(t2 - t1)
            elite.append(t3 - t2)
    tot = [s + l for s, l in zip(samp, learn)]
    rec = {"bench": "update", "K": k, "G": groups, "D": devices, "F": features, "hidden": cfg.hidden_size,
           "attn": cfg.attn_size, "update_s_median": statistics.median(tot), "update_s_min": min(tot),
           "sample_s_median": statistics.median(samp), "learn_s_median": statistics.median(learn),
           "elite_s_median": statistics.median(elite), "elite_steps_max": cfg.elite_steps,
           "update_with_elite_s_median": statistics.median([t + e for t, e in zip(tot, elite)])}
    _emit(rec)
    return rec


def bench_evals(model: str = "nmt4", cluster: str = "4xK80", updates: int = 40) -> dict:
    """Evaluations per second of the whole search loop with the simulator (no baselines, no warm start)."""
    from placer.graphs.group import default_max_groups, group
    from placer.graphs.models import build_model
    from placer.problem import group_allowed
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import run_loop
    from placer.sim.cluster import parse_cluster
    from placer.sim.costs import load_or_analytical
    from placer.sim.simulator import SimEvaluator

    g = build_model(model)
    cl = parse_cluster(cluster)
    ev = SimEvaluator(g, cl, load_or_analytical(g, cl))
    c0 = ev.sim.cost[:, cl.gpu_indices[0]]
    out = {}
    for G in (default_max_groups(len(cl.gpu_indices)), 256):
        gr = group(g, G, op_costs=np.where(np.isfinite(c0), c0, 0.0))
        t0 = time.perf_counter()
        res = run_loop(gr, ev, budget_seconds=600, max_updates=updates, cpu_index=cl.cpu_index,
                         allowed=group_allowed(gr, ev.sim.cost, cl.cpu_index), progress=False,
                         config=ReinforceConfig(imitation_steps=0),
                         device_capacity=[d.capacity_bytes for d in cl.devices])
        wall = time.perf_counter() - t0
        h = res.history[2:]  # skip tracing
        per = {k: statistics.median([r[k] for r in h]) for k in ("sample_s", "evaluate_s", "learn_s")}
        out = {"bench": "evals", "model": model, "cluster": cluster, "ops": g.num_ops, "G": gr.num_groups,
               "updates": res.updates, "evaluations": res.evaluations, "wall_s": wall,
               "evals_per_s": res.evaluations / wall,
               "evals_per_s_steady": 16 / sum(per.values()), **{f"{k}_median": v for k, v in per.items()}}
        _emit(out)
    ev.close()
    return out


def bench_models(models=("nmt4", "inception_v3"), cluster: str = "4xK80", budget: float = 600.0,
                 seed: int = 0, out_root: str = "/tmp/placer_bench_search") -> list[dict]:
    """A full search per model (problem with its baselines, warm start, REINFORCE) within `budget` seconds."""
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.search import search

    recs = []
    for m in models:
        g = build_model(m)
        t0 = time.perf_counter()
        problem = build_problem(g, cluster, seed=seed)
        res = search(problem, budget_seconds=budget, seed=seed, out_dir=f"{out_root}/{m}", progress=False,
                     model_name=m)
        problem.close()
        wall = time.perf_counter() - t0
        ok = {k: v for k, v in res.baselines.items() if v is not None and k not in ("random", "round_robin")}
        bname = min(ok, key=ok.get) if ok else None
        rec = {"bench": "model", "model": m, "cluster": cluster, "budget_s": budget, "ops": g.num_ops,
               "groups": res.extra["groups"], "returned_s": res.step_time, "returned_from": res.extra["source"],
               "search_best_s": res.search_best, "best_baseline": bname, "best_baseline_s": ok.get(bname),
               "expert_s": res.baselines.get("expert"), "lower_bound_s": res.lower_bound,
               "ratio_returned_to_lb": res.step_time / res.lower_bound,
               "ratio_policy_to_best_baseline": (res.search_best / ok[bname]) if bname else None,
               "updates": res.extra["updates"], "evaluations": res.evaluations, "search_wall_s": res.wall_s,
               "total_wall_s": wall, "baselines": res.baselines}
        _emit(rec)
        recs.append(rec)
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["update", "evals", "models", "all"])
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--models", default="nmt4,inception_v3")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.what in ("update", "all"):
        bench_update()
    if a.what in ("evals", "all"):
        bench_evals()
    if a.what in ("models", "all"):
        bench_models(tuple(a.models.split(",")), budget=a.budget, seed=a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
