"""Measured on a real 2-task cluster: does the learned placement run faster on real parallel hardware? (issue 12,
item 4).

    .venv/bin/python benchmarks/measured.py                        # inception_v3, nmt, rnnlm at --size small
    .venv/bin/python benchmarks/measured.py --models nmt --budget 600 --sim-budget 120 --runs 10

For each model, on `placer cluster up --tasks 2` (two `tf.distribute.Server` tasks on 127.0.0.1, one core each):
1. `placer calibrate` the simulator to the cluster (the calibration fidelity.py uses);
2. `placer search --reward measure --budget B`: every evaluation a real measurement on the two tasks (baselines
   and groups from the calibrated cluster and costs);
3. `placer search --reward sim` on the calibrated cluster (`--sim-budget` seconds);
4. one interleaved run measuring, `--runs` timed runs each per round over `--rounds` rounds: one task alone
   (everything on task 0), every baseline, the sim-reward placement and the measure-reward placement. Reported:
   the median of all runs of each.
Writes results/measured.json (one object per model: model, one_task_s, best_baseline, best_baseline_s,
learned_sim_s, learned_measure_s, lower_bound_s; the lower bound is the calibrated simulator's, so simulated;
the rest measured medians) and the section "Measured on a real 2-task cluster" of RESULTS.md.
Keep the machine otherwise idle while it runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _cluster import PLACER, RESULTS, calibrate, machine, now, run, tf_cluster, write_json, write_section  # noqa: E402
from fidelity import measure_interleaved  # noqa: E402

SANITY = ("random", "round_robin")     # sanity checks, not baselines of the papers


def search(model: str, size: str, out: Path, extra: list[str], budget: float, seed: int) -> dict:
    if not (out / "summary.json").exists():
        run(PLACER + ["search", "--model", model, "--size", size, "--budget", str(budget), "--seed", str(seed),
                      "--out", str(out), "--no-progress", "--json"] + extra, timeout=int(budget * 3 + 1800))
    return json.loads((out / "summary.json").read_text())


def run_model(model: str, size: str, tasks: Path, workdir: Path, budget: float, sim_budget: float, rounds: int,
              runs: int, seed: int) -> dict:
    from placer.graphs.models import build_model
    from placer.grouped import first_copies
    from placer.placement import Placement
    from placer.problem import build_problem
    from placer.runtime import make_evaluator

    t0 = time.perf_counter()
    graph = build_model(model, size)
    cluster_json, costs_json = calibrate(model, size, tasks, workdir / f"calib_{model}_{size}")
    calib = ["--cluster", str(cluster_json), "--costs", str(costs_json)]
    meas = search(model, size, workdir / f"search_measure_{model}",
                  calib + ["--devices", str(tasks), "--reward", "measure", "--warmup", "1", "--runs", "3"], budget, seed)
    sims = search(model, size, workdir / f"search_sim_{model}", calib + ["--reward", "sim"], sim_budget, seed)
    problem = build_problem(graph, str(cluster_json), costs=str(costs_json), seed=seed)
    names = problem.device_names
    cands: dict[str, np.ndarray] = {"one_task": problem.grouping.expand(np.zeros(problem.grouping.num_groups, int), 0)}
    cands.update({f"baseline:{k}": v for k, v in problem.baselines.items()})
    cands["learned_sim"] = Placement.load(workdir / f"search_sim_{model}" / "placement.json").to_indices(graph, names)
    cands["learned_measure"] = Placement.load(workdir / f"search_measure_{model}" / "placement.json").to_indices(
        graph, names)
    keys = list(cands)
    # the same placement under several names (the learned one is often one task's or a baseline's) is measured
    # once and reported under each: separate copies would differ by noise alone
    same_as = {k: keys[j] for k, j in zip(keys, first_copies([cands[k] for k in keys]))}
    uniq = [k for k in keys if same_as[k] == k]
    with make_evaluator(graph, str(tasks), warmup=1, runs=runs) as ev:
        got_u = dict(zip(uniq, measure_interleaved(ev, [cands[k] for k in uniq], rounds, runs)))
    got = [got_u[same_as[k]] for k in keys]
    simulated = problem.simulator.evaluate([cands[k] for k in keys])
    problem.close()
    med = {k: (float(np.median(g)) if g else None) for k, g in zip(keys, got)}
    spread = {k: (float(np.percentile(g, 75) - np.percentile(g, 25)) if g else None) for k, g in zip(keys, got)}
    base = {k.split(":", 1)[1]: v for k, v in med.items() if k.startswith("baseline:")}
    ok = {k: v for k, v in base.items() if v is not None and k not in SANITY}
    bname = min(ok, key=ok.get) if ok else None
    rec = {"model": model, "size": size, "ops": int(graph.num_ops),
           "one_task_s": med["one_task"], "best_baseline": bname, "best_baseline_s": ok.get(bname),
           "learned_sim_s": med["learned_sim"], "learned_measure_s": med["learned_measure"],
           "lower_bound_s": float(problem.lower_bound),
           # extras
           "baselines_s": base, "iqr_s": spread, "runs": {k: len(g) for k, g in zip(keys, got)},
           "same_as": {k: v for k, v in same_as.items() if v != k},
           "simulated_s": {k: (None if o.failed else float(o.step_time)) for k, o in zip(keys, simulated)},
           "search_measure": {k: meas.get(k) for k in ("step_time_s", "search_best_s", "evaluations", "wall_s",
                                                        "updates", "source", "stop_reason")},
           "search_sim": {k: sims.get(k) for k in ("step_time_s", "search_best_s", "evaluations", "wall_s",
                                                    "updates", "source")},
           "budget_s": budget, "sim_budget_s": sim_budget, "wall_s": time.perf_counter() - t0}
    print(json.dumps({k: rec[k] for k in ("model", "one_task_s", "best_baseline", "best_baseline_s",
                                          "learned_sim_s", "learned_measure_s", "lower_bound_s")}), flush=True)
    return rec


def _ms(x) -> str:
    return "–" if x is None else f"{x * 1e3:.1f}"


def section(records: list[dict], command: str, started: str, mach: str) -> str:
    rows = ["| model | ops | one task (ms) | best baseline (ms) | learned, sim reward (ms) | learned, measured reward "
            "(ms) | lower bound (ms, simulated) | best learned vs best baseline | vs one task |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    faster_base = faster_13 = not_slower = 0
    for r in records:
        learned = [v for v in (r["learned_sim_s"], r["learned_measure_s"]) if v is not None]
        best = min(learned) if learned else None
        b, one = r["best_baseline_s"], r["one_task_s"]
        iqr_b = (r["iqr_s"].get(f"baseline:{r['best_baseline']}") or 0.0) if r["best_baseline"] else 0.0
        if best is not None and b is not None:
            not_slower += best <= b + iqr_b
            faster_base += best < b - iqr_b
        if best is not None and one:
            faster_13 += one / best >= 1.3
        same = r.get("same_as", {})

        def learned(key: str) -> str:
            twin = same.get(key) or next((k for k, v in same.items() if v == key), None)
            return _ms(r[f"{key}_s"]) + (f" (= {twin.replace('baseline:', '').replace('_', ' ')})" if twin else "")

        rows.append(f"| {r['model']} | {r['ops']:,} | {_ms(one)} | {r['best_baseline']} {_ms(b)} | "
                    f"{learned('learned_sim')} | {learned('learned_measure')} | {_ms(r['lower_bound_s'])} | "
                    + (f"{(b / best - 1):+.1%} |" if best and b else "– |")
                    + (f" {one / best:.2f}× |" if best and one else " – |"))
    n = len(records)
    return "\n".join([
        "## Measured on a real 2-task cluster",
        "",
        f"Written by `benchmarks/measured.py` ({started}; {mach}). Command: `{command}`.",
        "Two `tf.distribute.Server` tasks on 127.0.0.1, one core each (`placer cluster up --tasks 2`); every time "
        "in this table except the lower bound is a measured median of all runs of one interleaved run (the "
        "placements measured in turn, round after round). \"Learned, measured reward\" is `placer search --reward "
        "measure` on the cluster; \"learned, sim reward\" is `placer search --reward sim` on the cluster as "
        "`placer calibrate` modelled it; both re-measured here. Best baseline: the fastest measured of every "
        "baseline (random and round_robin excluded). The lower bound is the calibrated simulator's (simulated). "
        "A placement that is the same as another (\"= one task\", \"= single cpu\") was measured once and is "
        "reported under both names.",
        "",
        *rows,
        "",
        f"Targets: the learned placement (the better of the two) no slower than the best baseline within the runs' "
        f"spread (interquartile range) on every model: {not_slower} of {n} — "
        f"{'met' if not_slower == n else 'MISSED'}; strictly faster on at least two: {faster_base} — "
        f"{'met' if faster_base >= 2 else 'MISSED'}; ≥ 1.3× faster than one task on at least two: {faster_13} — "
        f"{'met' if faster_13 >= 2 else 'MISSED'}. Every figure: `results/measured.json`.",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="inception_v3,nmt,rnnlm")
    ap.add_argument("--size", default="small")
    ap.add_argument("--budget", type=float, default=600.0, help="measured-reward search seconds per model")
    ap.add_argument("--sim-budget", type=float, default=120.0, help="sim-reward search seconds per model")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="/tmp/placer-measured")
    a = ap.parse_args(argv)
    started, mach = now(), machine()
    command = "python benchmarks/measured.py " + " ".join(argv if argv is not None else sys.argv[1:])
    records = []
    with tf_cluster(Path(a.workdir)) as tasks:
        for m in [x.strip() for x in a.models.split(",") if x.strip()]:
            records.append(run_model(m, a.size, tasks, Path(a.workdir), a.budget, a.sim_budget, a.rounds, a.runs,
                                     a.seed))
    write_json(RESULTS / "measured.json", records)
    write_section("measured", section(records, command.strip(), started, mach))
    print(f"wrote {RESULTS / 'measured.json'} and RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
