"""The reward interface shared by the simulator and the real measurement runners.

`Evaluator.evaluate(placements) -> list[Outcome]`: each placement is an op→device *index* array
(int, length = number of ops, indices into `evaluator.devices`). Names never travel through here.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass
class Outcome:
    """What one evaluated placement did.

    step_time      seconds (simulated: the simulated time even when OOM; measured: median of the timed runs;
                   `inf` when a measured run failed and no time exists)
    peak_memory    bytes per device (index-aligned with the evaluator's devices); empty when unknown
    oom            a device ran out of memory
    failed         the placement cannot be used (OOM, error, timeout); `reason` says why
    runs           every timed run (measured evaluators), seconds
    on_assigned_device  fraction of executed ops that ran on their assigned device (measured), else None
    lost_devices   indices of the evaluator's devices found dead while measuring (a TF cluster task that is
                   down): the failure is theirs, not the placement's
    """

    step_time: float
    peak_memory: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    oom: bool = False
    failed: bool = False
    reason: str | None = None
    runs: tuple[float, ...] = ()
    on_assigned_device: float | None = None
    lost_devices: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failed

    @staticmethod
    def failure(reason: str, *, oom: bool = False, step_time: float = float("inf"),
                peak_memory: np.ndarray | None = None) -> "Outcome":
        return Outcome(step_time=step_time, oom=oom, failed=True, reason=reason,
                       peak_memory=np.zeros(0, np.int64) if peak_memory is None else peak_memory)


class Evaluator(abc.ABC):
    """Scores placements. Implementations: sim.Simulator-backed `SimEvaluator`, runtime.LocalRunner,
    runtime.RemotePool. `devices` are TF device names, index-aligned with placement values."""

    devices: Sequence[str]

    @abc.abstractmethod
    def evaluate(self, placements: Sequence[np.ndarray]) -> list[Outcome]:
        """Evaluate a batch of op→device index arrays; one Outcome each, in order. Never raises for a
        bad placement: a failing placement is a failed Outcome."""

    def close(self) -> None:
        """Release workers/child processes (no-op by default)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
