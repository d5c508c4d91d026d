"""`placer measure`, `placer profile`, `placer worker` (flags and JSON keys: ../shared/CLI.md)."""
from __future__ import annotations

import logging
import math
import os
import sys

from placer.errors import MeasurementError

log = logging.getLogger(__name__)


def _read_token(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            tok = f.read().strip()
    except OSError as e:
        raise MeasurementError(f"cannot read token file {path}: {e}") from None
    if not tok:
        raise MeasurementError(f"token file {path} is empty")
    return tok


def _cluster(spec: str, devices: list[str], remote: bool):
    """The cluster used to resolve `--placement` names (single, random, baselines...). Devices this machine does
    not have (remote workers', or a wrong name) get nominal entries: the measurement then says what is wrong."""
    from placer.errors import ClusterError
    from placer.sim.cluster import cluster_from_devices, make_cluster, make_device

    if not remote:
        try:
            return cluster_from_devices(spec)
        except ClusterError as e:
            log.info("nominal cluster for --devices %s: %s", spec, e)
    return make_cluster([make_device(d, "cpu" if "CPU" in d.upper() else "V100") for d in devices],
                        name=",".join(devices))


def measurement_json(out) -> dict:
    """The `placer measure --json` object of an Outcome."""
    ok = not out.failed and math.isfinite(out.step_time)
    return {"step_time_s": float(out.step_time) if ok else None, "runs_s": [float(x) for x in out.runs],
            "oom": bool(out.oom), "error": None if not out.failed else (out.reason or "failed"),
            "on_assigned_device": float(out.on_assigned_device) if out.on_assigned_device is not None else 0.0}


def run_measure(args) -> int:
    """Measure one placement locally (`--devices`) or on workers (`--workers`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from placer.api import resolve_placement
    from placer.cli import print_json
    from placer.graphs import load_from_args
    from placer.runtime.devices import parse_devices

    graph = load_from_args(args)
    devices = parse_devices(args.devices)
    cluster = _cluster(args.devices, devices, remote=bool(args.workers))
    placement = resolve_placement(args.placement, graph, cluster, seed=args.seed)
    if list(cluster.device_names) != devices:     # re-index onto the --devices order
        import numpy as np

        pos = {d: i for i, d in enumerate(devices)}
        placement = np.asarray([pos[cluster.device_names[k]] for k in placement], np.int64)
    if args.workers:
        from placer.runtime.remote import RemotePool

        ev = RemotePool(graph, args.workers, devices, token=_read_token(args.token_file), timeout=args.timeout,
                        warmup=args.warmup, runs=args.runs, tls_ca=getattr(args, "tls_ca", None))
    else:
        from placer.runtime.local import LocalRunner

        ev = LocalRunner(graph, devices, warmup=args.warmup, runs=args.runs, timeout=args.timeout)
    with ev:
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
    from placer.graphs import load_from_args
    from placer.runtime.profile import profile

    graph = load_from_args(args)
    table = profile(graph, args.devices, runs=args.runs, timeout=getattr(args, "timeout", 600.0) or 600.0)
    table.save(args.out)
    kinds = ", ".join(f"{k}: {float(v.sum()) * 1e3:.2f} ms summed" for k, v in table.seconds.items())
    print(f"wrote {args.out}: {graph.num_ops} ops of {graph.name!r} ({kinds})")
    return 0


def run_worker(args) -> int:
    """Serve measurements over gRPC until SIGINT/SIGTERM."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from placer.runtime.worker import serve

    token = _read_token(args.token_file)
    serve(args.listen, token=token, tls_cert=args.tls_cert, tls_key=args.tls_key,
          allow_unsafe_ops=args.allow_unsafe_ops, devices=args.devices, block=True,
          timeout=getattr(args, "timeout", 600.0) or 600.0)
    sys.stdout.flush()
    return 0
