"""`placer measure`, `placer profile`, `placer worker`, `placer cluster up|down`, `placer calibrate` (flags and JSON
keys: ../shared/CLI.md)."""
from __future__ import annotations

import logging
import math
import os
import sys

from placer import devnames
from placer.errors import MeasurementError
from placer.runtime import no_auth_without_workers, read_token

log = logging.getLogger(__name__)


def _local_cluster(spec: str, devices: list[str]):
    """The cluster used to resolve `--placement` names (single, random, baselines...) over local devices. Devices
    this machine does not have (a wrong name) get nominal entries: the measurement then says what is wrong."""
    from placer.errors import ClusterError
    from placer.sim.cluster import cluster_from_devices, make_cluster, make_device

    try:
        return cluster_from_devices(spec)
    except ClusterError as e:
        log.info("nominal cluster for --devices %s: %s", spec, e)
    return make_cluster([make_device(d, "cpu" if devnames.kind(d) == "CPU" else "V100") for d in devices],
                        name=",".join(devices))


def _measurer(args):
    """(graph, evaluator, cluster) of `placer measure`'s flags: a TFClusterRunner over a tasks file (checked before
    the graph loads), a RemotePool over --workers (the cluster from the devices they report), else a LocalRunner."""
    from placer.cli import load_from_args
    from placer.runtime.devices import parse_devices
    from placer.tasks import looks_like_tasks_file

    no_auth_without_workers(args.workers, token_file=args.token_file, tls_ca=getattr(args, "tls_ca", None))
    if looks_like_tasks_file(args.devices):
        if args.workers:
            raise MeasurementError(f"--devices {args.devices} is a tasks file (a TF cluster): drop --workers")
        from placer.runtime.tfcluster import TFClusterRunner, live_tasks
        from placer.sim.cluster import cluster_from_tasks

        tasks = live_tasks(args.devices)
        graph = load_from_args(args)
        ev = TFClusterRunner(graph, tasks, warmup=args.warmup, runs=args.runs, timeout=args.timeout)
        return graph, ev, cluster_from_tasks(tasks)
    graph = load_from_args(args)
    devices = parse_devices(args.devices)
    if args.workers:
        from placer.runtime.remote import RemotePool

        ev = RemotePool(graph, args.workers, devices, token=read_token(args.token_file), timeout=args.timeout,
                        warmup=args.warmup, runs=args.runs, tls_ca=getattr(args, "tls_ca", None))
        try:
            return graph, ev, ev.cluster()
        except BaseException:
            ev.close()
            raise
    from placer.runtime.local import LocalRunner

    ev = LocalRunner(graph, devices, warmup=args.warmup, runs=args.runs, timeout=args.timeout)
    return graph, ev, _local_cluster(args.devices, devices)


def measurement_json(out) -> dict:
    """The `placer measure --json` object of an Outcome."""
    ok = not out.failed and math.isfinite(out.step_time)
    return {"step_time_s": float(out.step_time) if ok else None, "runs_s": [float(x) for x in out.runs],
            "oom": bool(out.oom), "error": None if not out.failed else (out.reason or "failed"),
            "on_assigned_device": float(out.on_assigned_device) if out.on_assigned_device is not None else 0.0}


def run_measure(args) -> int:
    """Measure one placement locally (`--devices`), on a TF cluster (`--devices TASKS.json`) or on workers."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from placer.problem import resolve_placement
    from placer.cli import print_json

    graph, ev, cluster = _measurer(args)
    with ev:
        placement = resolve_placement(args.placement, graph, cluster, seed=args.seed)
        if list(cluster.device_names) != list(ev.devices):     # re-index onto the --devices order
            import numpy as np

            pos = {d: i for i, d in enumerate(ev.devices)}
            placement = np.asarray([pos[cluster.device_names[k]] for k in placement], np.int64)
        [out] = ev.evaluate([placement])
    obj = measurement_json(out)
    if args.json:
        print_json(obj)
    elif out.failed:
        print(f"{graph.name}: measurement failed{' (out of memory)' if out.oom else ''}: {out.reason}")
    else:
        runs = ", ".join(f"{r * 1e3:.2f}" for r in out.runs)
        print(f"{graph.name}: step time {out.step_time * 1e3:.3f} ms (median of {len(out.runs)} runs: {runs} ms); "
              f"on assigned device: {obj['on_assigned_device']:.0%}")
    return 0 if not out.failed else 1


def run_profile(args) -> int:
    """Record per-op times on real devices into a cost table (`--out FILE`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from placer.cli import load_from_args, out_file
    from placer.runtime.profile import profile
    from placer.sim.costs import is_cost_table

    out_file(args.out, "--out", ("cost table", is_cost_table), "profile")
    graph = load_from_args(args)
    table = profile(graph, args.devices, runs=args.runs, timeout=getattr(args, "timeout", 600.0) or 600.0)
    table.save(args.out)
    kinds = ", ".join(f"{k}: {float(v.sum()) * 1e3:.2f} ms summed" for k, v in table.seconds.items())
    print(f"wrote {args.out}: {graph.num_ops} ops of {graph.name!r} ({kinds})")
    return 0


def run_worker(args) -> int:
    """Serve measurements over gRPC until SIGINT/SIGTERM."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from placer.cli import flag_or
    from placer.runtime.worker import serve

    token = read_token(args.token_file)
    serve(args.listen, token=token, tls_cert=args.tls_cert, tls_key=args.tls_key,
          allow_unsafe_ops=args.allow_unsafe_ops, devices=args.devices, block=True,
          timeout=flag_or(args, "timeout", 600.0))
    sys.stdout.flush()
    return 0


def run_cluster(args) -> int:
    """`placer cluster up --tasks N [--cores-per-task K] [--port P] --out tasks.json` / `placer cluster down FILE`."""
    from placer.runtime.servers import cluster_down, cluster_up

    if args.action == "up":
        from placer.cli import out_file

        out_file(args.out, "--out")
        tasks = cluster_up(args.tasks, args.out, cores_per_task=args.cores_per_task, port=args.port,
                           share_cores=args.share_cores, any_interface=args.any_interface, timeout=args.timeout)
        for t in tasks.tasks:
            print(f"{t.label} serving on cores {','.join(map(str, t.cores))}: {', '.join(t.devices)}")
        print(f"wrote {args.out} (logs beside it; stop with `placer cluster down {args.out}`)")
        return 0
    for line in cluster_down(args.tasks_file):
        print(line)
    return 0


def run_calibrate(args) -> int:
    """Profile per-op costs and measure links of `--devices`; write DIR/costs.json and DIR/cluster.json."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from placer.cli import print_json
    from placer.cli import load_from_args, out_dir
    from placer.runtime.calibrate import DEFAULT_SIZES, calibrate
    from placer.tasks import looks_like_tasks_file

    out_dir(args.out)

    if looks_like_tasks_file(args.devices):
        from placer.runtime.tfcluster import live_tasks

        live_tasks(args.devices)
    graph = load_from_args(args)
    sizes = DEFAULT_SIZES
    if args.sizes:
        try:
            sizes = tuple(int(float(x)) for x in args.sizes.split(",") if x.strip())
        except ValueError:
            raise MeasurementError(f"--sizes {args.sizes!r}: expected a comma list of byte counts") from None
        if len(sizes) < 2 or min(sizes) < 4:
            raise MeasurementError(f"--sizes {args.sizes!r}: need at least two sizes of >= 4 bytes")
    say = None if args.json else (lambda msg: print(msg, flush=True))
    summary = calibrate(graph, args.devices, args.out, sizes=sizes, link_runs=args.link_runs,
                        profile_runs=args.runs, timeout=args.timeout, progress=say,
                        fit_placements=int(getattr(args, "fit_placements", 0) or 0))
    if args.json:
        print_json(summary)
        return 0
    for ln in summary["links"]:
        print(f"link {ln['src']} -> {ln['dst']}: latency {ln['latency_s'] * 1e6:.0f} us, bandwidth "
              f"{ln['bandwidth_Bps'] / 1e9:.3f} GB/s (fit residual {ln['rel_rms']:.0%} rms)")
    if summary.get("machine_fit"):
        m = summary["machine_fit"]
        print(f"fitted to {len(m['placements'])} measured placements: shared speed {m['shared_speed']:.2f}, "
              f"copy work {m['cpu_copy']:.2f} of each transfer (median |log error| {m['median_abs_log_err']:.3f})")
    print(f"wrote {summary['cluster']} (--cluster) and {summary['costs']} (--costs)")
    return 0
