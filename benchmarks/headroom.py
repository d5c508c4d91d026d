"""How much better than annealing at 1,000 evaluations any method has been in each K80 cell (issue 13).

    .venv/bin/python benchmarks/headroom.py            # prints a Markdown table

Reads only recorded runs (all simulated):
  * annealing at 1,000 evaluations, seeds 0-4: `anneal_s_seeds` of the `anneal_vs_policy` records in
    results/bench_anneal.jsonl (the annealer is deterministic per seed, so every record of a cell agrees);
  * annealing at 20,000 evaluations, seeds 0-2: the `anneal_tune` records of results/bench_anneal_tune.jsonl with
    default settings, from `bench_anneal.py --model M --cluster C --evals 20000 --anneal-seeds 3 --tune '[{}]'`;
  * the policy's 300 s searches of the K80 table: `search_best_s` in results/results.json;
  * every policy run at 1,000 evaluations in results/bench_anneal.jsonl (`policy_s_seeds`).
"Best known" is the fastest placement any of these found. If it is within x% of annealing's mean at 1,000
evaluations, no method can beat that mean by more than x% in the cell (on what is known): the ceiling.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CELLS = [("rnnlm", 2), ("rnnlm", 4), ("nmt", 2), ("nmt", 4), ("nmt4", 2), ("nmt4", 4), ("inception_v3", 2),
         ("inception_v3", 4)]


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def table() -> list[dict]:
    runs = _lines(RESULTS / "bench_anneal.jsonl")
    tune = _lines(RESULTS / "bench_anneal_tune.jsonl")
    bench = json.loads((RESULTS / "results.json").read_text()) if (RESULTS / "results.json").exists() else []
    rows = []
    for model, gpus in CELLS:
        cluster = f"{gpus}xK80"
        cell = [r for r in runs if r.get("bench") == "anneal_vs_policy" and r["model"] == model
                and r["cluster"] == cluster and r["evaluations"] == 1000 and r.get("size", "full") == "full"]
        ann = next((r["anneal_s_seeds"] for r in reversed(cell) if len(r.get("anneal_s_seeds", [])) >= 5), None)
        long = [v for r in tune if r["model"] == model and r["cluster"] == cluster and r["evaluations"] == 20000
                and not r.get("settings") for v in r["values_s"]]
        b300 = [r["search_best_s"] for r in bench if r["model"] == model and r["gpus"] == gpus
                and r["kind"] == "K80" and r.get("search_best_s") is not None]
        pol = [v for r in cell if not r.get("pretrained") for v in r.get("policy_s_seeds", []) if v is not None]
        if ann is None:
            continue
        found = [v for v in [*ann, *long, *b300, *pol] if v is not None]
        best = min(found)
        mean = statistics.mean(ann)
        rows.append({"model": model, "gpus": gpus, "anneal_1000_mean_s": mean, "anneal_20000_s": long,
                     "policy_300s_s": b300[-1] if b300 else None, "best_known_s": best,
                     "ceiling_pct": 100.0 * (1.0 - best / mean)})
    return rows


def main() -> int:
    rows = table()
    print("| model | K80s | anneal at 1,000: mean of seeds 0-4 (s) | anneal at 20,000: seeds 0-2 (s) | "
          "policy, 300 s search (s) | best known (s) | ceiling: best known vs anneal's 1,000 mean |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for r in rows:
        long = ", ".join(f"{v:.3f}" for v in r["anneal_20000_s"]) or "n/a"
        p300 = f"{r['policy_300s_s']:.3f}" if r["policy_300s_s"] is not None else "n/a"
        print(f"| {r['model']} | {r['gpus']} | {r['anneal_1000_mean_s']:.3f} | {long} | {p300} | "
              f"{r['best_known_s']:.3f} | {r['ceiling_pct']:.1f}% |")
    n5 = sum(r["ceiling_pct"] >= 5.0 for r in rows)
    print(f"\ncells where a placement >= 5% faster than annealing's 1,000-evaluation mean is known: {n5} of {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
