"""Simulator speed vs Grappler, side by side in one run (issue 3 "Must show").

    .venv/bin/python benchmarks/bench_sim.py                  # Inception-V3 (batch 32) on 4xK80
    .venv/bin/python benchmarks/bench_sim.py --model nmt --json

Prints: the median wall time of one simulated training step (placer's compiled event simulator; a random
4-way placement and the single-GPU placement), the median wall time of Grappler's `MeasureCosts` on the same
graph and the same device properties (item built once, outside the timing), their ratio, the batch
throughput of SimEvaluator on both cores, and the agreement of the two step-time estimates on the single-GPU
placement. The process is pinned to one core for the per-simulation figures (targets: <= 10 ms per
simulation, >= 300x faster than Grappler).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def _median_wall(fn, repeats: int, min_seconds: float = 0.0) -> tuple[float, int, float]:
    """(median wall seconds, calls, median CPU seconds of this process) of fn()."""
    walls, cpus = [], []
    t_end = time.perf_counter() + min_seconds
    while len(walls) < repeats or time.perf_counter() < t_end:
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), len(walls), statistics.median(cpus)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="inception_v3")
    ap.add_argument("--size", default="full", choices=["tiny", "full"])
    ap.add_argument("--cluster", default="4xK80")
    ap.add_argument("--grappler-runs", type=int, default=3)
    ap.add_argument("--sim-runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from placer.placement import random_placement, single_placement
    from placer.graphs.models import build_model
    from placer.sim.cluster import parse_cluster
    from placer.sim.costs import analytical_costs, device_properties, grappler_item, grappler_measure
    from placer.sim.simulator import SimEvaluator, Simulator

    t0 = time.perf_counter()
    graph = build_model(args.model, size=args.size)
    t_build = time.perf_counter() - t0
    cluster = parse_cluster(args.cluster)
    t0 = time.perf_counter()
    table = analytical_costs(graph, cluster)
    t_costs = time.perf_counter() - t0
    single = single_placement(graph, cluster)
    rand = random_placement(graph, cluster, seed=args.seed)

    # Grappler: same graph, same device properties as the simulator's cluster, single-GPU placement
    full = {d.name: "/job:localhost/replica:0/task:0/device:" + d.name.strip("/") for d in cluster.devices}
    devs = {nm: full[cluster.device_names[int(p)]] for nm, p in zip(graph.names, single)}
    item = grappler_item(graph, devices=devs)
    named = [(full[d.name], device_properties(d)) for d in cluster.devices]

    try:  # one core for the per-simulation figures (the simulator is single-threaded per step anyway)
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        pinned = True
    except (AttributeError, OSError):
        pinned = False

    g_times, g_cpu, g_run = [], [], None
    for _ in range(args.grappler_runs):
        c0 = time.process_time()
        t0 = time.perf_counter()
        g_run, _ = grappler_measure(item, named)
        g_times.append(time.perf_counter() - t0)
        g_cpu.append(time.process_time() - c0)
    g_wall = statistics.median(g_times)

    sim = Simulator(graph, cluster, table)
    sim.simulate(rand)  # compile / load the numba cache outside the timing
    r_single = sim.simulate(single)
    r_rand = sim.simulate(rand)
    w_rand, n_rand, c_rand = _median_wall(lambda: sim._run(sim.check(rand)), args.sim_runs, 1.0)
    w_single, n_single, c_single = _median_wall(lambda: sim._run(sim.check(single)), args.sim_runs, 1.0)
    crit = Simulator(graph, cluster, table, order="critical")
    w_crit, _, _ = _median_wall(lambda: crit._run(crit.check(rand)), args.sim_runs // 2, 0.5)
    t0 = time.perf_counter()
    lb = sim.lower_bound()
    t_lb = time.perf_counter() - t0

    if pinned:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    rng = np.random.default_rng(args.seed)
    batch = [random_placement(graph, cluster, seed=int(s)) for s in rng.integers(0, 2**31, 64)]
    thr = {}
    for workers in (1, 2):
        with SimEvaluator(graph, cluster, table, workers=workers) as ev:
            ev.evaluate(batch[:4])
            t0 = time.perf_counter()
            ev.evaluate(batch)
            thr[workers] = len(batch) / (time.perf_counter() - t0)

    out = {
        "model": args.model, "size": args.size, "cluster": cluster.name, "ops": graph.num_ops,
        "sim_ms_random": w_rand * 1e3, "sim_ms_single": w_single * 1e3, "sim_ms_critical_order": w_crit * 1e3,
        "sim_cpu_ms_random": c_rand * 1e3, "sim_cpu_ms_single": c_single * 1e3,
        "sim_runs": n_rand, "grappler_measure_costs_ms": g_wall * 1e3, "grappler_runs": len(g_times),
        "grappler_cpu_ms": statistics.median(g_cpu) * 1e3, "load_average_1min": os.getloadavg()[0],
        "speedup_vs_grappler": g_wall / w_rand,
        "placements_per_s_1_worker": thr[1], "placements_per_s_2_workers": thr[2],
        "single_gpu_step_s_sim": r_single.step_time, "single_gpu_step_s_grappler": g_run,
        "agreement_pct": 100.0 * abs(r_single.step_time - g_run) / g_run,
        "random_step_s_sim": r_rand.step_time, "random_transfer_bytes": r_rand.transfer_bytes,
        "lower_bound_s": lb, "lower_bound_ms_to_compute": t_lb * 1e3, "pinned_one_core": pinned,
        "build_s": t_build, "cost_table_s": t_costs, "cost_source": table.source,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{args.model} ({args.size}, {graph.num_ops:,} ops) on {cluster.name}"
          f"{' (pinned to one core)' if pinned else ''}")
    print(f"  {'':34}{'placer sim':>14}{'Grappler':>14}{'ratio':>10}")
    print(f"  {'wall per step estimate (median)':34}{w_rand * 1e3:11.2f} ms{g_wall * 1e3:11.0f} ms"
          f"{g_wall / w_rand:9.0f}x")
    print(f"  {'single-GPU step time':34}{r_single.step_time * 1e3:11.3f} ms{g_run * 1e3:11.3f} ms"
          f"   diff {out['agreement_pct']:.3f}%")
    print(f"  {'CPU time per estimate (median)':34}{c_rand * 1e3:11.2f} ms{out['grappler_cpu_ms']:11.0f} ms"
          f"{out['grappler_cpu_ms'] / 1e3 / c_rand:9.0f}x")
    print(f"  sim wall: random {w_rand * 1e3:.2f} ms, single {w_single * 1e3:.2f} ms, critical order "
          f"{w_crit * 1e3:.2f} ms (median of {n_rand}); load average {out['load_average_1min']:.1f}")
    print(f"  random 4-way step {r_rand.step_time * 1e3:.3f} ms ({r_rand.transfer_bytes / 2**30:.2f} GiB moved) vs "
          f"single {r_single.step_time * 1e3:.3f} ms; lower bound {lb * 1e3:.3f} ms ({t_lb:.1f} s to compute)")
    print(f"  SimEvaluator: {thr[1]:.0f} placements/s on 1 worker, {thr[2]:.0f} on 2")
    print(f"  targets: <= 10 ms/sim: {'OK' if w_rand <= 0.010 else 'MISSED'}; >= 300x Grappler: "
          f"{'OK' if g_wall / w_rand >= 300 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
