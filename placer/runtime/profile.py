"""`placer profile`: per-op times measured on real devices, written as a cost table the simulator loads.

    from placer.runtime.profile import profile
    table = profile(graph, "cpu:1", runs=5)        # or ["/GPU:0", "/CPU:0"]
    table.save("costs.npz")                         # placer simulate ... --costs costs.npz

For each device KIND among `devices` (e.g. `cpu`, `V100`), the whole graph is placed on the first device of that
kind (CPU-only ops on `/CPU:0`; with a tasks file of `placer cluster up` as `devices`, on task 0's CPU) and run with FULL_TRACE `runs` times after a warm-up; op i's time on that kind
is the median over the runs of its step-stats duration (`all_end_rel_micros`, i.e. op start to end; on a GPU
the stream's kernel time when the trace has one). Ops that did not show up in the trace get 0 when they are
placeholders (fed, free) and the roofline estimate of `placer.sim.costs` otherwise; `meta["estimated_ops"]`
counts them. Logical CPU devices (`cpu:N`) all share one kind and one thread pool: one profile of `/CPU:0`
describes them all.

Note that times measured inside a step include waiting for shared threads when ops run concurrently; this is
what the simulator's per-op cost should be on a real device (the paper profiled the same way).
"""
from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np

from placer import devnames
from placer.errors import MeasurementError
from placer.runtime.devices import parse_devices

log = logging.getLogger(__name__)


def _cluster_for(devices: list[str]):
    from placer.errors import ClusterError
    from placer.sim.cluster import cluster_from_devices, make_cluster, make_device

    try:
        return cluster_from_devices(devices)
    except ClusterError:
        # devices TF does not show here: still build a nominal cluster; the runner reports the missing device
        return make_cluster([make_device(d, "cpu" if devnames.kind(d) == "CPU" else "V100") for d in devices], name="nominal")


def profile(graph, devices: Sequence[str] | str, runs: int = 5, *, warmup: int = 2, timeout: float = 600.0,
            runner=None):
    """Profile `graph` on each device kind of `devices`; returns a `placer.sim.costs.CostTable` (source
    "profiled"). `runner`: an existing LocalRunner over the same devices (+ /CPU:0) to reuse."""
    from placer.runtime.local import LocalRunner
    from placer.sim.costs import CostTable, roofline_seconds

    from placer.tasks import looks_like_tasks_file

    if runs < 1:
        raise MeasurementError(f"profile needs runs >= 1 (got {runs})")
    own = runner is None
    if looks_like_tasks_file(devices):        # a TF cluster: every CPU kind is profiled on task 0
        from placer.runtime.tfcluster import TFClusterRunner
        from placer.sim.cluster import cluster_from_tasks

        cluster = cluster_from_tasks(devices)
        devs = run_devs = cluster.device_names
        cpu = cluster.cpu_index if cluster.cpu_index is not None else 0
        runner = runner or TFClusterRunner(graph, devices, warmup=warmup, runs=1, timeout=timeout)
    else:
        devs = parse_devices(devices)
        cluster = _cluster_for(devs)
        run_devs = list(devs) + ([] if "/CPU:0" in devs else ["/CPU:0"])
        cpu = run_devs.index("/CPU:0")
        runner = runner or LocalRunner(graph, run_devs, warmup=warmup, runs=1, timeout=timeout)
    n = graph.num_ops
    pos = {nm: i for i, nm in enumerate(graph.names)}
    is_feed = np.asarray([t in ("Placeholder", "PlaceholderV2") for t in graph.types])
    seconds: dict[str, np.ndarray] = {}
    meta: dict = {"devices": devs, "runs": int(runs), "warmup": int(warmup), "estimated_ops": {}, "profile_s": {}}
    try:
        kinds_done = set()
        for dev in cluster.devices:
            if dev.kind in kinds_done:
                continue
            kinds_done.add(dev.kind)
            target = run_devs.index(dev.name)
            placement = np.full(n, target, np.int64)
            if not dev.is_cpu:
                placement[np.asarray(graph.cpu_only, bool)] = cpu
            t0 = time.perf_counter()
            out = runner.measure(placement, warmup=warmup, runs=1, profile_runs=runs)
            if out.failed:
                raise MeasurementError(f"profiling {graph.name!r} on {dev.name} ({dev.kind}) failed: {out.reason}")
            col = np.full(n, np.nan)
            for op, (_dev, secs) in getattr(out, "op_times", {}).items():
                i = pos.get(op)
                if i is not None and secs:
                    col[i] = float(np.median(secs))
            missing = np.isnan(col)
            if missing.any():
                est = roofline_seconds(graph, dev)
                col[missing & is_feed] = 0.0
                rest = missing & ~is_feed
                col[rest] = est[rest]
                if rest.any():
                    log.info("%s on %s: %d ops not in the trace, estimated by the roofline", graph.name, dev.kind,
                             int(rest.sum()))
            seconds[dev.kind] = col
            meta["estimated_ops"][dev.kind] = int((missing & ~is_feed).sum())
            meta["profile_s"][dev.kind] = time.perf_counter() - t0
    finally:
        if own:
            runner.close()
    meta["tensorflow_version"] = runner.tf_version
    return CostTable(fingerprint=graph.fingerprint, names=tuple(graph.names),
                     cpu_only=np.asarray(graph.cpu_only, bool), seconds=seconds, source="profiled", meta=meta)
