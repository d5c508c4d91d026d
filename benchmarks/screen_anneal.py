"""Annealing at N evaluations whose moves are screened by a second simulator.

    PYTHONPATH=. .venv/bin/python benchmarks/screen_anneal.py MODEL CLUSTER N SEEDS [FIRST_SEED] [CONFIGS]
    python benchmarks/screen_anneal.py --table          # the records as a Markdown table, against no screen
    PYTHONPATH=. .venv/bin/python benchmarks/screen_anneal.py --fidelity MODEL CLUSTER   # how well each noisy
                                                        # screen ranks moves: Spearman rho against the true one

CONFIGS: a JSON list of [sigma, screen] or [sigma, screen, level] (level "op", the default, or "group": see
`noisy_problem`; default list: sigma 0, 0.3, 0.6 with screen 2 and 4, and [0, 1], the annealer unscreened).

Each batch draws `screen` x the batch's moves, simulates them all with a screening simulator whose per-op costs
are the true ones times lognormal noise (sigma 0: the true simulator itself, a perfect screen), and evaluates only
the batch best by the screen (`AnnealConfig.screen`, `anneal(screen_by=...)`): an emulation of a measured
search's moves screened by an imperfect simulator, where here the "measurement" is the simulator. Appends one JSON line per (sigma, screen) to benchmarks/results/screen_anneal.jsonl: the mean
and each seed's best step time (simulated) at N evaluations (the screen's simulations not counted).
"""
import json
import sys
from pathlib import Path

import numpy as np


def noisy_problem(graph, cluster, problem, sigma: float, seed: int = 123, level: str = "op"):
    """`problem` again (same graph, cluster and grouping, no baselines) with every per-op cost times lognormal
    noise of `sigma` (0: the same costs): a simulator that ranks placements as an imperfect model of the machine
    would, to screen moves with (its `.simulator`). `level` "op": one factor per op and device (errors that
    average out over a group's ops); "group": one per group and device, shared by the group's ops (a layer
    mis-costed on a device as a whole: errors that do not average out)."""
    from placer.problem import build_problem

    rng = np.random.default_rng(seed)
    if level == "group":
        factor = np.exp(rng.normal(0, sigma, (problem.grouping.num_groups, problem.cost.shape[1])))
        factor = factor[problem.grouping.op_group]
    else:
        factor = np.exp(rng.normal(0, sigma, problem.cost.shape))
    noisy = problem.cost * factor if sigma else problem.cost
    return build_problem(graph, cluster, costs=np.ascontiguousarray(noisy), grouping=problem.grouping,
                         baselines=False, seed=0)


RECORDS = Path(__file__).resolve().parent / "results" / "screen_anneal.jsonl"


def table() -> None:
    """One row per cell and setting: mean (range) over the seeds recorded (a later record of a seed replaces an
    earlier one; records without "seeds" are seeds 0-5, the script's first version), the change against the
    unscreened annealer's mean, and on how many seeds the setting did better than the unscreened run of that seed."""
    import statistics as st

    cells: dict = {}
    for line in RECORDS.read_text().splitlines():
        r = json.loads(line)
        key = (r["sigma"], r["screen"], r.get("level", "op"))
        by_seed = cells.setdefault((r["model"], r["cluster"], r["evals"]), {}).setdefault(key, {})
        by_seed.update(zip(r.get("seeds", range(6)), r["each"]))
    print("| model | cluster | evaluations | screen noise sigma (level) | screen | seeds | mean (range) (s) "
          "| vs no screen | better on seeds |")
    print("|---|---|---:|---|---:|---:|---|---:|---:|")
    for (model, cluster, n), c in cells.items():
        base = c.get((0.0, 1, "op"), {})
        bm = st.mean(base.values()) if base else float("nan")
        for (sigma, screen, level), v in sorted(c.items(), key=lambda kv: (kv[0][1] != 1, kv[0][2] != "op", kv[0])):
            m = st.mean(v.values())
            both = [s for s in v if s in base]
            plain = screen == 1
            cmp = "-" if plain else f"{100 * (m / bm - 1):+.1f}%"
            wins = "-" if plain else f"{sum(v[s] < base[s] for s in both)}/{len(both)}"
            print(f"| {model} | {cluster} | {n:,} | {sigma:g} ({level}) | {screen} | {len(v)} | {m:.4f} "
                  f"({min(v.values()):.3f}-{max(v.values()):.3f}) | {cmp} | {wins} |")


def fidelity(model: str, cluster: str, sigmas=(0.3, 0.6), moves: int = 400, level: str = "op") -> None:
    """Spearman rho between the noisy screen and the true simulator over `moves` random moves (1-8 groups to a
    random allowed device) of annealing's placement at 1,000 evaluations (seed 0): what rank agreement a noise
    level means, to set beside the calibrated simulator's against measurements (RESULTS.md "Simulator vs real")."""
    from scipy.stats import spearmanr

    from placer.baselines.anneal import anneal
    from placer.graphs.models import build_model
    from placer.problem import build_problem

    g = build_model(model, "full")
    p = build_problem(g, cluster, seed=0)
    gr, cpu = p.grouping, p.cluster.cpu_index
    inc = anneal(p, max_evaluations=1000, seed=0).group_devices
    rng = np.random.default_rng(0)
    cands = []
    for _ in range(moves):
        gd = inc.copy()
        for gi in rng.choice(gr.num_groups, int(rng.integers(1, 9)), replace=False):
            gd[gi] = rng.choice(np.flatnonzero(p.allowed[gi]))
        cands.append(gr.expand(gd, cpu))
    true = np.array([o.step_time if o.ok else np.nan for o in p.simulator.evaluate(cands)])
    for sigma in sigmas:
        q = noisy_problem(g, cluster, p, sigma, level=level)
        est = np.array([o.step_time if o.ok else np.nan for o in q.simulator.evaluate(cands)])
        ok = np.isfinite(true) & np.isfinite(est)
        err = np.abs(est[ok] / true[ok] - 1)
        print(json.dumps({"model": model, "cluster": cluster, "sigma": sigma, "level": level, "moves": int(ok.sum()),
                          "spearman": round(float(spearmanr(true[ok], est[ok]).correlation), 3),
                          "median_abs_err": round(float(np.median(err)), 3)}))
        q.close()


def main() -> None:
    if sys.argv[1:] == ["--table"]:
        table()
        return
    if sys.argv[1:2] == ["--fidelity"]:
        fidelity(sys.argv[2], sys.argv[3], tuple(json.loads(sys.argv[4])) if len(sys.argv) > 4 else (0.3, 0.6),
                 level=sys.argv[5] if len(sys.argv) > 5 else "op")
        return
    from placer.baselines.anneal import AnnealConfig, anneal
    from placer.graphs.models import build_model
    from placer.problem import build_problem

    model, cl, evals = sys.argv[1], sys.argv[2], int(sys.argv[3])
    first = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    seeds = range(first, first + int(sys.argv[4]))
    configs = json.loads(sys.argv[6]) if len(sys.argv) > 6 else \
        [[0.0, 1], [0.0, 2], [0.0, 4], [0.3, 2], [0.3, 4], [0.6, 2], [0.6, 4]]
    g = build_model(model, "full")
    p = build_problem(g, cl, seed=0)
    configs = [(c[0], c[1], c[2] if len(c) > 2 else "op") for c in configs]     # [sigma, screen, level]
    for sigma, level in sorted({(c[0], c[2]) for c in configs}):
        q = noisy_problem(g, cl, p, sigma, level=level)
        for screen in sorted({c[1] for c in configs if (c[0], c[2]) == (sigma, level)}):
            r = [anneal(p, max_evaluations=evals, seed=s, config=AnnealConfig(screen=screen),
                        screen_by=q.simulator).step_time for s in seeds]
            rec = {"model": model, "cluster": cl, "evals": evals, "sigma": sigma, "screen": screen,
                   **({"level": level} if level != "op" else {}), "seeds": list(seeds), "mean": float(np.mean(r)), "each": [round(x, 4) for x in r]}
            print(json.dumps(rec), flush=True)
            with open(RECORDS, "a") as f:
                f.write(json.dumps(rec) + "\n")
        q.close()


if __name__ == "__main__":
    main()
