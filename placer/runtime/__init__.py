"""Measured rewards on real devices: `LocalRunner` (this machine, a TF child process), `TFClusterRunner` (TF
distributed-runtime tasks of a tasks file, `placer cluster up`) and `RemotePool` (gRPC `placer worker`
processes). All are `placer.sim.evaluator.Evaluator` s. Nothing here imports TensorFlow at import time.

    from placer.runtime import make_evaluator
    with make_evaluator(graph, "cpu:2") as ev:          # or "tasks.json", or workers="h1:50051,h2:50051"
        outcomes = ev.evaluate(placements)
"""
from __future__ import annotations

from placer.errors import MeasurementError


def read_token(path: str | None) -> str | None:
    """The shared token of the measurement workers, from the file `path` (None: no token); MeasurementError
    naming the file when it cannot be read or holds no usable token (`check_token`)."""
    from placer.errors import os_reason
    from placer.runtime.worker import check_token

    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            tok = f.read()
    except OSError as e:
        raise MeasurementError(f"cannot read token file {path}: {os_reason(e)}") from None
    except UnicodeDecodeError as e:
        raise MeasurementError(f"token file {path} is not text (byte {e.start} is not UTF-8): "
                               "a token is printable ASCII") from None
    return check_token(tok, f"token file {path}")


def no_auth_without_workers(workers, *, token_file=None, token=None, tls_ca=None) -> None:
    """A token or a TLS certificate authenticates to remote workers only: given without `workers` it would be
    silently unused and the placements measured here instead (MeasurementError naming it and the fix).

    >>> no_auth_without_workers(None, token_file="token")
    Traceback (most recent call last):
    placer.errors.MeasurementError: a token file (token) is for remote workers: give them (--workers HOST:PORT,... \
/ workers=[...]) or drop it
    """
    if workers:
        return
    for what, v in (("token file", token_file), ("token", token and "given"), ("TLS certificate", tls_ca)):
        if v:
            raise MeasurementError(f"a {what} ({v}) is for remote workers: give them (--workers HOST:PORT,... / "
                                   "workers=[...]) or drop it")


def make_evaluator(graph, devices, *, workers=None, token_file: str | None = None, token: str | None = None,
                   tls_ca: str | None = None, warmup: int = 2, runs: int = 5, timeout: float = 600.0,
                   check: bool = True):
    """A measuring Evaluator: a TFClusterRunner when `devices` is a tasks file (`*.json`), a RemotePool over
    `workers` (comma string or list) when given, else a LocalRunner. `devices`: a tasks file, `cpu:N` or TF device
    names (index-aligned with placement values). `check`: connect now and refuse (one-line MeasurementError naming
    the worker / machine / task, the missing devices and the fix) when a device is missing."""
    from placer.tasks import looks_like_tasks_file

    no_auth_without_workers(workers, token_file=token_file, token=token, tls_ca=tls_ca)
    if looks_like_tasks_file(devices):
        if workers:
            from placer.errors import MeasurementError

            raise MeasurementError(f"--devices {devices} measures on the TF cluster that tasks file lists: "
                                   "it does not combine with --workers")
        from placer.runtime.tfcluster import TFClusterRunner

        ev = TFClusterRunner(graph, devices, warmup=warmup, runs=runs, timeout=timeout)
    elif workers:
        from placer.runtime.remote import RemotePool

        ev = RemotePool(graph, workers, devices, token=token or read_token(token_file), tls_ca=tls_ca,
                        warmup=warmup, runs=runs, timeout=timeout)
    else:
        from placer.runtime.local import LocalRunner

        ev = LocalRunner(graph, devices, warmup=warmup, runs=runs, timeout=timeout)
    if check:
        # refuse before any work when a device is missing (a worker's, this machine's, the TF cluster's)
        try:
            ev.check_devices()
        except BaseException:
            ev.close()
            raise
    return ev


__all__ = ["make_evaluator", "measured_cluster", "no_auth_without_workers", "read_token", "workers_problem_target"]


def workers_problem_target(graph, cluster, devices, *, workers=None, token_file: str | None = None,
                           tls_ca: str | None = None):
    """`(cluster, devices)` for `build_problem`: when the devices are the workers' (`workers` and `devices`
    given, no `cluster`), the cluster the workers report and no local devices (a client without GPUs places over
    the workers' GPUs: never this machine's TensorFlow); else `(cluster, devices)` as given. `placer.place` and
    `placer search` both."""
    if workers and devices and not cluster:
        return measured_cluster(graph, devices, workers=workers, token_file=token_file, tls_ca=tls_ca), None
    return cluster, devices


def measured_cluster(graph, devices, *, workers=None, token_file: str | None = None, token: str | None = None,
                     tls_ca: str | None = None):
    """The simulated cluster of the devices a measuring Evaluator runs on: a tasks file's tasks
    (`cluster_from_tasks`), the devices `workers` report (`RemotePool.cluster`: never this machine's TensorFlow, so
    a client without GPUs can search over the workers' GPUs), else this machine's devices (`cluster_from_devices`).
    Use it instead of `cluster_from_devices(devices)` wherever `--workers` may be given."""
    from placer.sim.cluster import cluster_from_devices
    from placer.tasks import looks_like_tasks_file

    no_auth_without_workers(workers, token_file=token_file, token=token, tls_ca=tls_ca)
    if workers and not looks_like_tasks_file(devices):
        from placer.runtime.remote import RemotePool

        with RemotePool(graph, workers, devices, token=token or read_token(token_file), tls_ca=tls_ca) as pool:
            return pool.cluster()
    return cluster_from_devices(devices)
