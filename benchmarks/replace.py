"""Re-placement after device loss (issue 15), simulated: how good, and how fast, is `placer replace`?

    .venv/bin/python benchmarks/replace.py      # nmt4, inception_v3 on 4xK80 minus /GPU:3; gpt fp16 on DGX1 minus 1, 2
    .venv/bin/python benchmarks/replace.py --cells nmt4:4xK80:/GPU:3 --run-budget 300 --budget 60 --fresh-budget 300

For each cell (model[@precision] : cluster : lost devices): a search on the whole cluster (`--run-budget`, the run that then
loses devices), then on the survivors: `placer.replace` (quick answer, then `--budget` seconds from the run's
policy), a fresh search of `--fresh-budget` seconds and a cold search of `--budget` seconds. Writes
results/replace.json (one object per cell: model, cluster, excluded, quick_s, quick_wall_s, replace_s, fresh_s,
cold_s, plus the curves of step time against wall time) and the section "Re-placement after device loss" of
RESULTS.md. Every step time is simulated (preset cluster, analytical costs) and is the placement each returned.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _cluster import RESULTS, machine, now, write_json, write_section  # noqa: E402


def curve(res) -> list[list[float]]:
    """(wall seconds, best step time so far) of a search's history."""
    return [[round(float(r["wall_s"]), 2), float(r["best_s"])] for r in res.history]


def run_cell(model: str, cluster: str, excluded: list[str], a, workdir: Path, precision: str = "fp32") -> dict:
    from placer.graphs.models import build_model
    from placer.problem import build_problem, cluster_without
    from placer.search import replace, search

    graph = build_model(model, a.size, precision=precision)
    tag = f"{model}{'' if precision == 'fp32' else '_' + precision}_{cluster}"
    run_dir = workdir / tag      # one run per model and cluster: every cell losing devices of it starts from it
    if not (run_dir / "summary.json").exists():
        p = build_problem(graph, cluster, seed=a.seed)
        search(p, budget_seconds=a.run_budget, seed=a.seed, out_dir=run_dir, model_name=model)
        p.close()
    t0 = time.perf_counter()
    rep = replace(run_dir, excluded, budget_seconds=a.budget,
                  out_dir=workdir / f"{tag}_replace_{len(excluded)}", seed=a.seed)
    rep_wall = time.perf_counter() - t0
    survivors, _ = cluster_without(build_problem(graph, cluster, baselines=False).cluster, excluded)
    out = {}
    for name, budget in (("fresh", a.fresh_budget), ("cold", a.budget)):
        t0 = time.perf_counter()
        p = build_problem(graph, survivors, seed=a.seed)
        res = search(p, budget_seconds=budget, seed=a.seed)
        out[name] = (res, time.perf_counter() - t0)
        p.close()
    rec = {"model": model, "cluster": cluster, "precision": precision, "excluded": excluded,
           "quick_s": rep.extra["quick_s"],
           "quick_wall_s": rep.extra["quick_wall_s"], "replace_s": rep.step_time, "fresh_s": out["fresh"][0].step_time,
           "cold_s": out["cold"][0].step_time,
           # extras
           "quick_source": rep.extra["quick_source"], "restored": rep.extra["restored"],
           "replace_policy_s": rep.search_best, "fresh_policy_s": out["fresh"][0].search_best,
           "cold_policy_s": out["cold"][0].search_best, "replace_wall_s": rep_wall,
           "fresh_wall_s": out["fresh"][1], "cold_wall_s": out["cold"][1],
           "budget_s": a.budget, "fresh_budget_s": a.fresh_budget, "run_budget_s": a.run_budget,
           "curves": {"replace": curve(rep), "fresh": curve(out["fresh"][0]), "cold": curve(out["cold"][0])}}
    print({k: rec[k] for k in ("model", "cluster", "excluded", "quick_s", "quick_wall_s", "replace_s", "fresh_s",
                                "cold_s")}, flush=True)
    return rec


def section(records: list[dict], command: str, started: str, mach: str) -> str:
    rows = ["| model | cluster | lost | quick answer (s) | quick wall (s) | 60 s re-placement (s) | 300 s fresh (s) "
            "| 60 s cold (s) | re-placement vs fresh | beats quick | beats cold |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in records:
        prec = "" if r.get("precision", "fp32") == "fp32" else f" ({r['precision']})"
        rows.append(f"| {r['model']}{prec} | {r['cluster']} | {', '.join(r['excluded'])} | {r['quick_s']:.4g} | "
                    f"{r['quick_wall_s']:.1f} | {r['replace_s']:.4g} | {r['fresh_s']:.4g} | {r['cold_s']:.4g} | "
                    f"{r['replace_s'] / r['fresh_s'] - 1:+.1%} | {'yes' if r['replace_s'] < r['quick_s'] else 'no'} | "
                    f"{'yes' if r['replace_s'] < r['cold_s'] else 'no'} |")
    return "\n".join([
        "## Re-placement after device loss",
        "",
        f"Written by `benchmarks/replace.py` ({started}; {mach}). Command: `{command}`. Simulated step times (preset "
        "clusters, analytical costs) of the placement each method returned. Targets: quick answer ≤ 10 s; the 60 s "
        "re-placement within 5% of a fresh 300 s search on the survivors and better than the quick answer; better "
        "than a 60 s cold search in most cells. Curves (best step time against wall time): `results/replace.json`.",
        "",
        *rows,
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="nmt4:4xK80:/GPU:3,inception_v3:4xK80:/GPU:3,gpt@fp16:DGX1:/GPU:7,"
                                       "gpt@fp16:DGX1:/GPU:6+/GPU:7",
                    help="comma list of MODEL[@PRECISION]:CLUSTER:DEV[+DEV...]")
    ap.add_argument("--size", default="full")
    ap.add_argument("--run-budget", type=float, default=300.0)
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--fresh-budget", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="/tmp/placer-replace")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    started, mach = now(), machine()
    command = "python benchmarks/replace.py " + " ".join(argv if argv is not None else sys.argv[1:])
    records = []
    for cell in [c for c in a.cells.split(",") if c.strip()]:
        model, cluster, lost = cell.split(":", 2)
        model, _, precision = model.partition("@")
        records.append(run_cell(model, cluster, lost.split("+"), a, Path(a.workdir), precision or "fp32"))
    if not a.no_write:
        write_json(RESULTS / "replace.json", records)
        write_section("replace", section(records, command.strip(), started, mach))
    return 0


if __name__ == "__main__":
    sys.exit(main())
