"""Where a search starts: each baseline at op level against its group-level version (issue 13, issue 14).

    .venv/bin/python benchmarks/grouped_start.py                          # the default graphs
    .venv/bin/python benchmarks/grouped_start.py --graphs clip@DGX1:fp16 --no-write

A search from scratch and the annealing reference start from the best *grouped* baseline (each baseline's
group-level version: the majority device of each group's ops, `placer.grouped.grouped_baselines`), so a grouping
that cannot express a good op-level placement costs every method its head start. For each graph (one problem,
`placer.problem.build_problem`, default grouping), this prints and records every baseline's op-level and
group-level step time, the best of each, and the groups. A grouped baseline says where a search starts, not how far
the groups let it go; for that it also runs the annealing reference (`placer.baselines.anneal`, 1,000 evaluations,
seeds 0-2, from the best grouped baseline) and records each seed's best (`anneal_s`) and their mean. Simulated step
times (preset clusters, analytical costs). Appends one JSON line per graph to results/grouped_start.jsonl, with the
commit it ran from.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cluster import RESULTS, machine, now, placer_commit as commit  # noqa: E402

GRAPHS = ("clip@DGX1:fp16", "gpt@DGX1:fp16", "inception_v3@4xK80", "nmt4@4xK80", "nmt@4xK80", "rnnlm@2xK80")


def graph_record(spec: str, anneal_evals: int = 1000, anneal_seeds: int = 3) -> dict:
    from placer.baselines.anneal import anneal
    from placer.bench import evaluate_baselines
    from placer.graphs.models import build_model
    from placer.grouped import grouped_baselines
    from placer.problem import build_problem

    name, _, rest = spec.partition("@")
    cluster, _, precision = rest.partition(":")
    model, _, size = name.partition("/")
    g = build_model(model, size or "full", precision=precision or "fp32")
    p = build_problem(g, cluster, seed=0)
    try:
        times, _ = evaluate_baselines(p)
        ok = {k: v for k, v in times.items() if v is not None}
        names, targets = grouped_baselines(p.baselines, ok, p.grouping.op_group, p.grouping.num_groups, p.allowed)
        outs = p.simulator.evaluate([p.grouping.expand(t, p.cluster.cpu_index) for t in targets])
        grouped = {n: (float(o.step_time) if o.ok else None) for n, o in zip(names, outs)}
        fits = {n: t for n, t in grouped.items() if t is not None}
        best_op = min(ok, key=ok.get)
        best_grouped = min(fits, key=fits.get) if fits else None
        reach = {str(seed): anneal(p, max_evaluations=anneal_evals, seed=seed).step_time
                 for seed in range(anneal_seeds)}
        reach = {k: (float(v) if math.isfinite(v) else None) for k, v in reach.items()}
        worked = [v for v in reach.values() if v is not None]
        return {"anneal_evaluations": anneal_evals, "anneal_s": reach,
                "anneal_mean_s": sum(worked) / len(worked) if worked and len(worked) == len(reach) else None,
                "graph": spec, "ops": g.num_ops, "groups": int(p.grouping.num_groups), "op_level_s": ok,
                "grouped_s": grouped, "best_op_level": best_op, "best_op_level_s": ok[best_op],
                "best_grouped": best_grouped, "best_grouped_s": fits.get(best_grouped),
                "simulated": True}
    finally:
        p.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default=",".join(GRAPHS), help="comma list of model[/size]@cluster[:precision]")
    ap.add_argument("--anneal-evals", type=int, default=1000, help="the annealing reference's evaluations")
    ap.add_argument("--anneal-seeds", type=int, default=3, help="annealing runs (seeds 0..K-1); 0: none")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    stamp = {"date": now(), "commit": commit(), "machine": machine()}
    for spec in a.graphs.split(","):
        rec = {**graph_record(spec.strip(), a.anneal_evals, a.anneal_seeds), **stamp}
        gap = rec["best_grouped_s"] / rec["best_op_level_s"] - 1.0 if rec["best_grouped_s"] else float("nan")
        print(f"{rec['graph']} (placer {rec['commit']}): {rec['groups']} groups; best op-level "
              f"{rec['best_op_level']} {rec['best_op_level_s']:.4f} s; best grouped {rec['best_grouped']} "
              f"{rec['best_grouped_s'] or float('nan'):.4f} s ({gap:+.1%}); annealing at "
              f"{rec['anneal_evaluations']} evaluations, mean of {len(rec['anneal_s'])} seeds: "
              f"{rec['anneal_mean_s'] or float('nan'):.4f} s", flush=True)
        if not a.no_write:
            RESULTS.mkdir(exist_ok=True)
            with open(RESULTS / "grouped_start.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
