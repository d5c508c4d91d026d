"""The learned search against the annealing reference at equal wall time, over several seeds (issue 13, item 1).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_wall.py --model nmt --cluster 4xK80 --seconds 120 --seeds 3 \
        --configs '{"default": {}, "local256": {"local_moves": 256}}'

One problem (`placer.problem.build_problem`, simulated, seeded by --seed), then for each seed s in
--first-seed..: the annealer (`placer.baselines.anneal`, default config, seed s, `budget_seconds` = --seconds) and
the search (`placer.search.search`, `ReinforceConfig` with each --configs entry's overrides, seed s, the same
seconds). The methods of one seed run one after the other in a rotated order (seed 0: anneal first; seed 1: the
first config first...), so that load drift does not favour one method. What each method reports is its own
best (`search_best`: the policy's samples and its local moves; annealing's best move or start), never the baseline
floor. Step times are simulated. `placer bench` makes the same comparison once per cell, with the defaults.

Prints and appends one JSON line per (seed, method) to benchmarks/results/bench_wall.jsonl, then a summary line
per method (mean and range over the seeds, evaluations, and the mean gap to annealing with its 95% confidence
interval over the seeds, `gap_ci95`). `--table TAG` prints the
markdown table of the records with that tag (RESULTS.md, "At equal wall time"; several tags comma-separated,
`--methods` to keep some).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
RESULTS = Path(__file__).resolve().parent / "results"


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _emit(rec: dict) -> None:
    rec = dict(rec, commit=_commit(), date=time.strftime("%Y-%m-%d %H:%M:%S"), cores=os.cpu_count(),
               load=os.getloadavg()[0] if hasattr(os, "getloadavg") else None, simulated=True)
    line = json.dumps(rec)
    print(line, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / "bench_wall.jsonl", "a") as f:
        f.write(line + "\n")


def run(model: str, cluster: str, size: str, seconds: float, seed: int, first_seed: int, seeds: int,
        configs: dict[str, dict], tag: str = "", with_anneal: bool = True, precision: str = "fp32") -> list[dict]:
    from placer.baselines.anneal import anneal
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import search

    problem = build_problem(build_model(model, size, precision=precision), cluster, seed=seed)
    methods = (["anneal"] if with_anneal else []) + list(configs)
    base = {"bench": "wall", "model": model, "cluster": cluster, "size": size, "seconds": seconds,
            "problem_seed": seed, "tag": tag, **({"precision": precision} if precision != "fp32" else {})}
    recs: list[dict] = []
    try:
        for s in range(first_seed, first_seed + max(1, seeds)):
            k = (s - first_seed) % len(methods)
            for m in methods[k:] + methods[:k]:
                t0 = time.perf_counter()
                if m == "anneal":
                    r = anneal(problem, budget_seconds=seconds, seed=s)
                    rec = dict(base, method=m, seed=s, best_s=r.step_time, evaluations=r.evaluations,
                               wall_s=time.perf_counter() - t0, config=r.config)
                else:
                    cfg = ReinforceConfig(**{**configs[m], "seed": s})
                    r = search(problem, budget_seconds=seconds, seed=s, config=cfg, remeasure=False)
                    rec = dict(base, method=m, seed=s, best_s=r.search_best, evaluations=r.evaluations,
                               updates=len(r.history), wall_s=time.perf_counter() - t0, overrides=configs[m],
                               local_moves=r.extra.get("local_moves"),
                               local_merge_prob=r.extra.get("config", {}).get("local_merge_prob"),
                               local_cluster_prob=r.extra.get("config", {}).get("local_cluster_prob"))
                _emit(rec)
                recs.append(rec)
    finally:
        problem.close()
    ann = {r["seed"]: r["best_s"] for r in recs if r["method"] == "anneal"}
    for m in methods:
        rows = [r for r in recs if r["method"] == m]
        vals = [r["best_s"] for r in rows]
        pairs = [(r["best_s"], ann[r["seed"]]) for r in rows if m != "anneal" and r["seed"] in ann]
        gaps = [b / a - 1 for b, a in pairs]
        pg = paired_gap(pairs)
        print(json.dumps({"summary": m, "model": model, "cluster": cluster, "seconds": seconds,
                          "seeds": [r["seed"] for r in rows], "mean_s": statistics.mean(vals),
                          "min_s": min(vals), "max_s": max(vals),
                          "evaluations_mean": statistics.mean(r["evaluations"] for r in rows),
                          "mean_gap_to_anneal": statistics.mean(gaps) if gaps else None,
                          "gap_ci95": list(pg[1:]) if pg else None}), flush=True)
    return recs


def paired_gap(pairs: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """The mean per-seed gap of a method to annealing, (method / anneal - 1) over the seeds both ran, with its
    95% confidence interval (Student's t over the seeds: each seed's pair is one sample). None with fewer than 2
    pairs. A target such as "never worse than annealing by more than 1%" is resolved only when the interval's
    upper end is under 1% (met) or its lower end over 1% (missed)."""
    if len(pairs) < 2:
        return None
    from scipy import stats

    g = [m / a - 1.0 for m, a in pairs]
    mean, sd = statistics.mean(g), statistics.stdev(g)
    half = float(stats.t.ppf(0.975, len(g) - 1)) * sd / len(g) ** 0.5
    return mean, mean - half, mean + half


def _fmt_gap(pg: tuple[float, float, float] | None) -> str:
    return "-" if pg is None else f"{pg[0] * 100:+.1f}% ({pg[1] * 100:+.1f}% to {pg[2] * 100:+.1f}%)"


def table(tag: str, path: Path | None = None, methods: list[str] | None = None,
          cells: list[str] | None = None, pool: str | None = None) -> str:
    """The markdown table of the records tagged `tag` (several: comma-separated, e.g. a table and the seeds
    added to it later): per cell and method, the mean (range) over the seeds, the mean's gap to annealing's mean
    (over the seeds both ran), the mean evaluations, and per method the mean per-seed gap with its 95% confidence
    interval (`paired_gap`; + is slower than annealing). `methods`: only these (default: all); `cells`: only
    these "model:cluster" cells (a precision other than fp32 may be named: "clip:DGX1:fp16"). `pool`: every
    method other than annealing counts as one of this name (e.g. the seeds of several tags, each with its own
    config, against their interleaved annealing runs: one gap and interval over all of them)."""
    tags = set(tag.split(","))
    recs = [json.loads(x) for x in open(path or RESULTS / "bench_wall.jsonl") if x.strip()]
    recs = [r for r in recs if r.get("tag") in tags and (methods is None or r["method"] in methods + ["anneal"])
            and (cells is None or f"{r['model']}:{r['cluster']}" in cells
                 or f"{r['model']}:{r['cluster']}:{r.get('precision')}" in cells)]
    for r in recs:         # a precision other than fp32 is part of the cluster column
        if pool and r["method"] != "anneal":
            r["method"] = pool
        r["cluster"] += f":{r['precision']}" if r.get("precision", "fp32") != "fp32" else ""
    cells = list(dict.fromkeys((r["model"], r["cluster"]) for r in recs))
    methods = [m for m in dict.fromkeys(r["method"] for r in recs) if m != "anneal"]
    head = "| model | cluster | seeds | anneal (s) | " + " | ".join(f"{m} (s) | {m} vs anneal" for m in methods) + \
        " | evaluations: anneal / " + " / ".join(methods) + " | " + \
        " | ".join(f"{m}: per-seed gap (95% CI)" for m in methods) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for model, cluster in cells:
        rows = {m: sorted((r for r in recs if (r["model"], r["cluster"]) == (model, cluster) and r["method"] == m),
                          key=lambda r: r["seed"]) for m in ["anneal"] + methods}
        ann = {r["seed"]: r["best_s"] for r in rows["anneal"]}

        def fmt(rs):
            v = [r["best_s"] for r in rs]
            return f"{statistics.mean(v):.4f} ({min(v):.3f}-{max(v):.3f})" if v else "-"
        cols = [model, cluster, ",".join(str(r["seed"]) for r in rows["anneal"]), fmt(rows["anneal"])]
        for m in methods:
            both = [r for r in rows[m] if r["seed"] in ann]       # the seeds both methods ran
            gap = "-"
            if both:
                g = statistics.mean(r["best_s"] for r in both) / statistics.mean(ann[r["seed"]] for r in both) - 1
                gap = "equal" if abs(g) < 5e-4 else f"{abs(g) * 100:.1f}% {'slower' if g > 0 else 'faster'}"
            cols += [fmt(rows[m]), gap]
        cols.append(" / ".join(f"{statistics.mean(r['evaluations'] for r in rows[m]):,.0f}" if rows[m] else "-"
                               for m in ["anneal"] + methods))
        cols += [_fmt_gap(paired_gap([(r["best_s"], ann[r["seed"]]) for r in rows[m] if r["seed"] in ann]))
                 for m in methods]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="nmt4")
    ap.add_argument("--cluster", default="4xK80")
    ap.add_argument("--size", default="full")
    ap.add_argument("--seconds", type=float, default=120.0, help="wall seconds per method and seed (default 120)")
    ap.add_argument("--seed", type=int, default=0, help="the problem's seed (its baselines)")
    ap.add_argument("--first-seed", type=int, default=0, help="the methods' first seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--configs", metavar="JSON", default='{"default": {}}',
                    help="name → ReinforceConfig overrides, one search per entry and seed (a JSON object)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"),
                    help="build the model in this precision (e.g. clip --cluster DGX1 --precision fp16)")
    ap.add_argument("--tag", default="", help="a label copied into every record")
    ap.add_argument("--no-anneal", action="store_true",
                    help="only the --configs searches (more methods for a tag whose annealing runs are recorded)")
    ap.add_argument("--table", metavar="TAG[,TAG...]",
                    help="print the markdown table of the records with these tags and exit")
    ap.add_argument("--methods", metavar="M[,M...]", help="with --table: only these methods (and annealing)")
    ap.add_argument("--cells", metavar="MODEL:CLUSTER[,...]", help="with --table: only these cells")
    ap.add_argument("--pool", metavar="NAME",
                    help="with --table: count every method other than annealing as one method NAME (seeds pooled)")
    a = ap.parse_args(argv)
    if a.table:
        print(table(a.table, methods=a.methods.split(",") if a.methods else None,
                    cells=a.cells.split(",") if a.cells else None, pool=a.pool))
        return 0
    run(a.model, a.cluster, a.size, a.seconds, a.seed, a.first_seed, a.seeds, json.loads(a.configs), a.tag,
        with_anneal=not a.no_anneal, precision=a.precision)
    return 0


if __name__ == "__main__":
    sys.exit(main())
