"""The learned policy against the annealing reference at equal evaluations (issue 13, item 1).

    .venv/bin/python benchmarks/bench_anneal.py                                  # nmt4 on 4xK80, full size
    .venv/bin/python benchmarks/bench_anneal.py --model inception_v3 --evals 1000,5000 --anneal-seeds 5
    .venv/bin/python benchmarks/bench_anneal.py --evals 1000 --policy-seeds 3 \
        --policy-config '{"elite_steps": 50, "num_samples": 8, "learning_rate": 1e-3}'   # the policy, other settings
    .venv/bin/python benchmarks/bench_anneal.py --evals 1000 --policy default          # from the pretrained policy
    .venv/bin/python benchmarks/bench_anneal.py --tune '[{}, {"batch": 16}, {"block_prob": 0}]' --evals 1000 \
        --anneal-seeds 8                                                        # annealing settings only
    .venv/bin/python benchmarks/bench_anneal.py --tune-table 2026-12-04 --evals 1000   # those records as a table

One problem (`placer.problem.build_problem`, simulated), then:
  * the policy's search (`placer.search.search`, default `ReinforceConfig` or --policy-config's overrides, seeds
    --seed.. for --policy-seeds runs) until it has used the largest count of --evals evaluations
    (`max_evaluations`); its best within
    N evaluations is read from its history (`placer.bench.policy_curve`). Its local moves cool over that largest
    count, so at a smaller N they are still hot: for a fair point at N, give --evals N alone;
  * the annealer (`placer.baselines.anneal`, default config) run once per N with N evaluations as its budget
    (its temperature schedule cools over the budget it is given), for --anneal-seeds seeds (seed --seed first).
Both count every evaluation alike: the op-level baselines, their grouped versions (the shared start), then their
own samples or moves; "best within N" is `placer.bench.best_within` for both (the grouped start counts, the
op-level baselines do not). Step times are simulated.

Prints one JSON line per N and appends them to benchmarks/results/bench_anneal.jsonl. With --tune (a JSON list of
`AnnealConfig` overrides) only the annealer runs, once per setting, count and seed, one line per setting and
count, appended to benchmarks/results/bench_anneal_tune.jsonl. --tune-table DATE prints the records of those
runs made on days starting with DATE at the first --evals count as a Markdown table: one row per cell, one column
per setting (each as its full `anneal_config`'s changes from the current default), the mean over the seeds and
their range; records of one setting and cell with other seeds (--first-anneal-seed) add to it, a seed run twice
shows its latest value.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
RESULTS = Path(__file__).resolve().parent / "results"


def _emit(rec: dict, name: str = "bench_anneal.jsonl") -> None:
    rec = dict(rec, date=time.strftime("%Y-%m-%d %H:%M:%S"), cores=os.cpu_count(),
               load=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    line = json.dumps(rec)
    print(line, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / name, "a") as f:
        f.write(line + "\n")


def run(model: str, cluster: str, size: str, evals: list[int], seed: int, anneal_seeds: int,
        policy_budget: float, policy_config: dict | None = None, policy_seeds: int = 1,
        policy: str | None = None, first_policy_seed: int | None = None, precision: str = "fp32",
        screen_sigma: float | None = None, anneal_screen: int = 4) -> list[dict]:
    from placer.baselines.anneal import anneal
    from placer.bench import best_baseline, best_within, policy_curve
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import load_policy, search

    from placer.baselines.anneal import AnnealConfig

    t0 = time.perf_counter()
    graph = build_model(model, size, precision=precision)
    problem = build_problem(graph, cluster, seed=seed)
    build_s = time.perf_counter() - t0
    screen = None       # --screen-sigma: both methods' moves screened by a noisy simulator (screen_anneal.py)
    if screen_sigma is not None:
        from screen_anneal import noisy_problem

        screen = noisy_problem(graph, cluster, problem, screen_sigma)
    acfg = AnnealConfig(screen=anneal_screen if screen is not None else 1)
    try:
        over = dict(policy_config or {})
        runs_p = []
        p0 = seed if first_policy_seed is None else first_policy_seed
        for ps in range(p0, p0 + max(1, policy_seeds)):
            cfg = ReinforceConfig(**{**over, "seed": ps})
            t0 = time.perf_counter()
            r = search(problem, budget_seconds=policy_budget, seed=ps, config=cfg, remeasure=False,
                       max_evaluations=max(evals),
                       policy=load_policy(policy) if policy else None,
                       screen=screen.simulator if screen is not None else None)
            runs_p.append((r, policy_curve(r, len(problem.baselines)), time.perf_counter() - t0))
        res, curve, policy_wall = runs_p[0]
        ann = {n: [anneal(problem, max_evaluations=n, seed=seed + i, config=acfg,
                          screen_by=screen.simulator if screen is not None else None)
                   for i in range(anneal_seeds)] for n in evals}
    finally:
        problem.close()
        if screen is not None:
            screen.close()
    bname, bval = best_baseline(res.baselines)
    recs = []
    for n in evals:
        runs = ann[n]
        vals = [best_within(r.history, n) for r in runs]
        ok = [v for v in vals if v is not None]
        reached = [r for r in res.history if r["evaluations"] <= n]
        pvals = [best_within(c, n) for _, c, _ in runs_p]
        pok = [v for v in pvals if v is not None]
        rec = {"bench": "anneal_vs_policy", "model": model, "cluster": cluster, "size": size, "evaluations": n,
               "policy_s": pvals[0], "anneal_s": vals[0],
               "policy_s_seeds": pvals, "policy_mean_s": statistics.mean(pok) if pok else None,
               "policy_seeds": [p0 + i for i in range(len(runs_p))], "policy_config": over,
               "pretrained": policy, "reuse_evaluations": cfg.reuse_evaluations,
               "policy_drawn": sum(int(h.get("drawn", 0)) for h in res.history),
               "anneal_s_seeds": vals, "anneal_mean_s": statistics.mean(ok) if ok else None,
               "start": runs[0].start, "start_s": runs[0].start_s, "start_evaluations": curve[0]["evaluations"],
               "best_baseline": bname, "best_baseline_s": bval, "lower_bound_s": res.lower_bound,
               "policy_wall_s_at_n": reached[-1]["wall_s"] if reached else None,
               "anneal_wall_s": statistics.mean(r.wall_s for r in runs),
               "policy_evaluations": res.evaluations, "policy_wall_s": policy_wall, "policy_seed": p0,
               "anneal_seeds": [seed + i for i in range(anneal_seeds)], "problem_build_s": build_s,
               "anneal_config": runs[0].config, "simulated": True,
               "policy_wall_s_seeds": [w for _, _, w in runs_p],
               "policy_local_moves_seeds": [r.extra.get("local_moves") for r, _, _ in runs_p],
               **({"screen_sigma": screen_sigma, "anneal_screen": anneal_screen} if screen is not None else {}),
               **({"precision": precision} if precision != "fp32" else {})}
        _emit(rec)
        recs.append(rec)
    return recs


def tune(model: str, cluster: str, size: str, evals: list[int], seed: int, seeds: int, grid: list[dict],
         precision: str = "fp32", first_seed: int | None = None) -> None:
    """The annealer alone, per setting of `grid` (AnnealConfig overrides), count and seed (`seeds` of them from
    `first_seed`, default `seed`, which also seeds the problem's baselines); the model built in `precision`
    (recorded when not fp32)."""
    from placer.baselines.anneal import AnnealConfig, anneal
    from placer.graphs.models import build_model
    from placer.problem import build_problem

    problem = build_problem(build_model(model, size, precision=precision), cluster, seed=seed)
    s0 = seed if first_seed is None else first_seed
    try:
        for over in grid:
            cfg = AnnealConfig(**over)
            for n in evals:
                runs = [anneal(problem, max_evaluations=n, seed=s0 + i, config=cfg) for i in range(seeds)]
                vals = [r.step_time for r in runs]
                _emit({"bench": "anneal_tune", "model": model, "cluster": cluster, "size": size, "evaluations": n,
                       "settings": over, "mean_s": statistics.mean(vals),
                       "stdev_s": statistics.stdev(vals) if len(vals) > 1 else 0.0, "values_s": vals,
                       "start": runs[0].start, "start_s": runs[0].start_s,
                       "wall_s": statistics.mean(r.wall_s for r in runs), "config": runs[0].config,
                       "seeds": [s0 + i for i in range(seeds)], "problem_seed": seed, "simulated": True,
                       **({"precision": precision} if precision != "fp32" else {})}, "bench_anneal_tune.jsonl")
    finally:
        problem.close()


def tune_table(date: str, evals: int) -> None:
    from placer.baselines.anneal import AnnealConfig

    from placer.grouped import auto_shares
    from placer.sim.cluster import parse_cluster

    recs = [json.loads(x) for x in (RESULTS / "bench_anneal_tune.jsonl").read_text().splitlines() if x.strip()]
    recs = [r for r in recs if r.get("date", "").startswith(date) and r["evaluations"] == evals]
    # today's default per cluster: merges' and cluster moves' shares follow its accelerators (records hold the
    # shares they used)
    refs = {name: auto_shares(AnnealConfig(), c.num_devices, c.cpu_index).to_dict()
            for name, c in ((n, parse_cluster(n)) for n in {r["cluster"] for r in recs})}

    def setting(r):   # what differs from today's default (records before `block` existed made "run" blocks,
        # before `attract_prob`, `merge_prob` and `cluster_prob` none of those moves)
        cfg = {"block": "run", "attract_prob": 0.0, "merge_prob": 0.0, "cluster_prob": 0.0, **r["config"]}
        return json.dumps({k: v for k, v in cfg.items() if refs[r["cluster"]].get(k) != v}, sort_keys=True)

    def cell(r):      # a precision other than fp32 is part of the cluster column
        return r["model"], r["cluster"] + (f":{r['precision']}" if r.get("precision", "fp32") != "fp32" else "")

    cells = {cell(r): {} for r in recs}
    for r in recs:       # one value per seed: a later record of the same setting, cell and seed replaces it
        by_seed = cells[cell(r)].setdefault(setting(r), {})
        by_seed.update(zip(r.get("seeds") or range(len(r["values_s"])), r["values_s"]))
    cols = sorted({k for c in cells.values() for k in c}, key=lambda k: (len(k), k))
    print("| model | cluster | seeds | " + " | ".join(f"{c if c != '{}' else 'default'}: mean (range) (s)"
                                                    for c in cols) + " |")
    print("|---|---|---:|" + "---:|" * len(cols))
    for (model, cluster), c in cells.items():
        n = {len(v) for v in c.values()}
        vals = [f"{statistics.mean(c[k].values()):.4f} ({min(c[k].values()):.3f}-{max(c[k].values()):.3f})"
                if k in c else "n/a" for k in cols]
        print(f"| {model} | {cluster} | {'/'.join(map(str, sorted(n)))} | " + " | ".join(vals) + " |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="nmt4")
    ap.add_argument("--cluster", default="4xK80")
    ap.add_argument("--size", default="full")
    ap.add_argument("--evals", default="1000,5000", help="evaluation counts to compare at (comma list)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--anneal-seeds", type=int, default=5, help="annealing runs per count (seeds seed, seed+1...)")
    ap.add_argument("--policy-budget", type=float, default=3600.0,
                    help="wall seconds the policy may take to reach the largest count")
    ap.add_argument("--policy-config", metavar="JSON", default="{}",
                    help="ReinforceConfig overrides for the policy's runs (a JSON object)")
    ap.add_argument("--policy-seeds", type=int, default=1, help="policy runs (seeds seed, seed+1...)")
    ap.add_argument("--first-policy-seed", type=int,
                    help="the policy runs' first seed (default --seed, which also seeds the problem's baselines): "
                         "more policy seeds on the same problem")
    ap.add_argument("--tune", metavar="JSON", help="a list of AnnealConfig overrides: run only the annealer")
    ap.add_argument("--first-anneal-seed", type=int,
                    help="with --tune: the annealer's first seed (default --seed, which also seeds the problem's "
                         "baselines): more seeds on the same problem")
    ap.add_argument("--tune-table", metavar="DATE", help="print the --tune records of days starting with DATE")
    ap.add_argument("--screen-sigma", type=float, metavar="S",
                    help="screen both methods' moves by a simulator whose per-op costs carry lognormal noise S "
                         "(an emulated measured search; the policy's share via --policy-config local_screen)")
    ap.add_argument("--anneal-screen", type=int, default=4, help="with --screen-sigma: annealing's screen factor")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"),
                    help="build the model in this precision (e.g. clip --cluster DGX1 --precision fp16; "
                         "recorded when not fp32)")
    ap.add_argument("--policy", help="start the policy's search from a pretrained policy ('default' or a "
                                     "`placer pretrain` directory), as `placer search --policy` does")
    a = ap.parse_args(argv)
    evals = sorted(int(x) for x in a.evals.split(",") if x.strip())
    if a.tune_table:
        tune_table(a.tune_table, evals[0])
        return 0
    if a.tune:
        tune(a.model, a.cluster, a.size, evals, a.seed, max(1, a.anneal_seeds), json.loads(a.tune), a.precision,
             a.first_anneal_seed)
        return 0
    run(a.model, a.cluster, a.size, evals, a.seed, max(1, a.anneal_seeds), a.policy_budget,
        json.loads(a.policy_config), max(1, a.policy_seeds), a.policy, a.first_policy_seed, a.precision,
        a.screen_sigma, a.anneal_screen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
