"""Measured rewards on real devices: `LocalRunner` (this machine, a TF child process) and `RemotePool` (gRPC
`placer worker` processes). Both are `placer.sim.evaluator.Evaluator` s. Nothing here imports TensorFlow at
import time.

    from placer.runtime import make_evaluator
    with make_evaluator(graph, "cpu:2") as ev:                        # or workers="h1:50051,h2:50051"
        outcomes = ev.evaluate(placements)
"""
from __future__ import annotations


def make_evaluator(graph, devices, *, workers=None, token_file: str | None = None, token: str | None = None,
                   tls_ca: str | None = None, warmup: int = 2, runs: int = 5, timeout: float = 600.0):
    """A measuring Evaluator: a RemotePool over `workers` (comma string or list) when given, else a LocalRunner.
    `devices`: `cpu:N` or TF device names (index-aligned with placement values)."""
    if workers:
        from placer.runtime.commands import _read_token
        from placer.runtime.remote import RemotePool

        return RemotePool(graph, workers, devices, token=token or _read_token(token_file), tls_ca=tls_ca,
                          warmup=warmup, runs=runs, timeout=timeout)
    from placer.runtime.local import LocalRunner

    return LocalRunner(graph, devices, warmup=warmup, runs=runs, timeout=timeout)


__all__ = ["make_evaluator"]
