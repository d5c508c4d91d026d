"""The README / RESULTS.md summary of a `placer bench` run: per cell, the policy's own best against the best
baseline and the expert, as time saved (1 - policy / baseline: "x% faster" means x% less time per step).

    .venv/bin/python benchmarks/summary_table.py [benchmarks/results/results.json]   (best baseline as in
                                                                                  `placer bench`)

Prints a markdown table and the tallies the issues ask for (cells where the policy's own best beats the best
baseline; NMT / NMT-4 on 4 GPUs against the expert).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from placer.bench import best_baseline

PAPER = {("nmt", 4): "Mirhoseini 2017: ~20% faster than expert",
         ("nmt4", 4): "Hierarchical 2018: 53.7% faster than expert",
         ("inception_v3", 4): "Hierarchical 2018: 16.3% faster than expert"}
ORDER = ["rnnlm", "nmt", "nmt4", "inception_v3", "gpt", "clip"]


def _saved(policy: float | None, ref: float | None) -> str:
    if policy is None or ref is None:
        return "n/a"
    x = 1.0 - policy / ref
    return f"{abs(x) * 100:.1f}% {'faster' if x >= 0 else 'slower'}"


def table(cells: list[dict]) -> tuple[str, list[str]]:
    rows = ["| model | GPUs | best baseline (s) | expert (s) | policy's own best (s) | vs best baseline | vs expert "
            "| returned (s) | lower bound (s) | returned / LB | search wall (s) | paper |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    wins, notes = 0, []
    cells = sorted(cells, key=lambda c: (ORDER.index(c["model"]) if c["model"] in ORDER else 99, c["gpus"],
                                         c.get("cluster") or ""))
    for c in cells:
        name, best = best_baseline(c["baselines"])
        pol, exp = c.get("search_best_s"), c["baselines"].get("expert")
        if pol is not None and best is not None and pol < best:
            wins += 1
        f = lambda x: "OOM" if x is None else f"{x:.3f}"  # noqa: E731
        model = c["model"] + (f" ({c['precision']})" if c.get("precision", "fp32") != "fp32" else "")
        gpus = f"{c['cluster']} ({c['gpus']})" if c.get("cluster") else c["gpus"]
        rows.append(f"| {model} | {gpus} | {name + ' ' + f(best) if name else 'none'} | {f(exp)} | "
                    f"{'n/a' if pol is None else f'{pol:.3f}'} | {_saved(pol, best)} | {_saved(pol, exp)} | "
                    f"{c['rl_s']:.3f} | {c['lower_bound_s']:.3f} | {c['rl_s'] / c['lower_bound_s']:.2f} | "
                    f"{c['search_wall_s']:.0f} | {PAPER.get((c['model'], c['gpus']), '')} |")
        if c["model"] in ("nmt", "nmt4") and c["gpus"] == 4:
            notes.append(f"{c['model']} on 4 GPUs: policy {_saved(pol, exp)} than expert (target >= 20% faster)")
    notes.insert(0, f"policy's own best strictly better than the best baseline in {wins} of {len(cells)} cells")
    return "\n".join(rows), notes


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default=str(Path(__file__).resolve().parent / "results" / "results.json"),
                    help="a `placer bench` results.json (default benchmarks/results/results.json)")
    path = Path(ap.parse_args(argv).results)
    try:
        cells = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        ap.error(f"cannot read {path}: {e}")
    md, notes = table(cells)
    print(md)
    print()
    for n in notes:
        print("- " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
