"""`placer simulate`: simulate one training step of a placement (CLI.md).

JSON: {"step_time_s", "lower_bound_s", "oom", "peak_memory_bytes": {device: int}, "ops", "simulate_ms"} plus
extra keys (busy_s, transfer_bytes, transfers, oom_devices, cost_source, cluster, placement, order).
`simulate_ms` is the median wall time of repeated simulations of the placement (after a warm-up call).
"""
from __future__ import annotations

import statistics
import time


def run_simulate(args) -> int:
    from placer.cli import print_json
    from placer.cli import load_from_args, out_file
    from placer.problem import build_problem
    from placer.sim.cluster import cluster_from_args
    from placer.sim.simulator import Simulator
    from placer.sim.trace import write_trace

    if getattr(args, "trace", None):
        from placer.sim.trace import is_chrome_trace

        out_file(args.trace, "--trace", ("Chrome trace", is_chrome_trace), "simulate")
    graph = load_from_args(args)
    cluster = cluster_from_args(args)
    # the problem without its baselines: only the one asked for is built, by resolve()
    problem = build_problem(graph, cluster, costs=getattr(args, "costs", None), seed=getattr(args, "seed", 0) or 0,
                            baselines=False, check_memory=False)
    problem.close()
    placement = problem.resolve(args.placement)
    order = getattr(args, "order", "ready") or "ready"
    sim = problem.simulator.sim if order == problem.simulator.sim.order else Simulator(graph, cluster, problem.cost,
                                                                                      order=order)
    res = sim.simulate(placement, trace=bool(getattr(args, "trace", None)))
    p = sim.check(placement)
    walls = []
    deadline = time.perf_counter() + 2.0
    while len(walls) < 5 or (len(walls) < 50 and time.perf_counter() < deadline):
        t0 = time.perf_counter()
        sim._run(p)
        walls.append(time.perf_counter() - t0)
    if getattr(args, "trace", None):
        write_trace(args.trace, graph, cluster, res)
    out = {
        "step_time_s": float(res.step_time),
        "lower_bound_s": float(sim.lower_bound()),
        "oom": bool(res.oom),
        "peak_memory_bytes": {nm: int(b) for nm, b in zip(cluster.device_names, res.peak_memory)},
        "ops": int(graph.num_ops),
        "simulate_ms": float(statistics.median(walls) * 1e3),
        "busy_s": {nm: float(b) for nm, b in zip(cluster.device_names, res.busy)},
        "oom_devices": list(res.oom_devices),
        "transfer_bytes": int(res.transfer_bytes),
        "transfers": int(res.transfers),
        "cost_source": problem.cost_source,
        "cluster": cluster.name,
        "placement": str(args.placement),
        "order": sim.order,
    }
    if getattr(args, "json", False):
        print_json(out)
        return 0
    print(f"graph {graph.name}: {graph.num_ops:,} ops on {cluster.name} ({args.placement}, order {sim.order}, "
          f"costs {problem.cost_source})")
    print(f"  step time    {out['step_time_s'] * 1e3:10.3f} ms" + ("   OUT OF MEMORY on " +
                                                                   ", ".join(res.oom_devices) if res.oom else ""))
    print(f"  lower bound  {out['lower_bound_s'] * 1e3:10.3f} ms")
    print(f"  transfers    {res.transfers:10,d}  ({res.transfer_bytes / 2**20:,.1f} MiB)")
    for d, nm in enumerate(cluster.device_names):
        cap = cluster.devices[d].capacity_bytes
        print(f"  {nm:<10} busy {res.busy[d] * 1e3:10.3f} ms   peak {res.peak_memory[d] / 2**30:8.3f} GiB"
              f" / {cap / 2**30:.1f} GiB")
    print(f"  simulate     {out['simulate_ms']:10.3f} ms per step (median of {len(walls)})")
    if getattr(args, "trace", None):
        print(f"  trace written to {args.trace}")
    return 0
