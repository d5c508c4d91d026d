"""Measured reward on TF distributed-runtime tasks: `TFClusterRunner` (a tasks file of `placer cluster up`, or tasks
you started by hand on other hosts and listed in one).

    from placer.runtime.tfcluster import TFClusterRunner
    with TFClusterRunner(graph, "c.json", warmup=2, runs=5) as runner:     # devices: every task's, task by task
        [out] = runner.evaluate([placement])       # out.step_time, out.runs, out.on_assigned_device

It is a LocalRunner whose measurement child holds a client session on task 0's master (`grpc://ADDRESS` of task
0): the same protocol (the graph imported once; per placement, ops re-placed, a fresh session with Grappler and
constant folding off, initialisation, W warm-up steps with FULL_TRACE on the last, N timed steps, the median), the
same placement check (`on_assigned_device`: the fraction of placed ops the step stats show on their assigned
task's device, full TF names), the same failure handling. What differs:
- sessions are isolated (`isolate_session_state`: a placement's variables live and die with its session) and TF
  cuts every call after 0.9 x `timeout` s itself (`operation_timeout_in_ms`), so that a step stuck on a task is
  cancelled on the tasks too and the child lives on; the child is still killed if it does not answer in time;
- the tasks are probed (process, if local, and port) when the runner is made (dead ports: MeasurementError naming
  the file and task), before each measurement and after each failure, and their processes (local tasks) every
  0.5 s during one: a dead or stopped task makes a failed Outcome whose reason names it (`task 1
  (127.0.0.1:PORT, pid N) is down: its process is gone`), the child being cut at once if need be. Tasks from
  `placer cluster up` run with GRPC_FAIL_FAST=true, so a step that needs a dead task fails at once in TF too;
- the child runs at nice 10 with TF's default pools: it mostly waits on gRPC and must not take the tasks' cores.
"""
from __future__ import annotations

import threading
from typing import Sequence

from placer.errors import MeasurementError
from placer.runtime.local import LocalRunner
from placer.sim.evaluator import Outcome
from placer.tasks import TasksFile, down_task_list, down_tasks, full_device_name, load_tasks


class TFClusterRunner(LocalRunner):
    """Measures placements on the tasks of `tasks` (a tasks file path or a TasksFile; see the module docstring).

    devices: the device names placement indices refer to (full TF names, each in the tasks file); default every
    task's devices in task order. warmup/runs/timeout as in LocalRunner. nice: the client child's niceness.
    probe_timeout: seconds a task's port may take to accept a connection before it counts as down.
    """

    def __init__(self, graph, tasks: "str | TasksFile", *, devices: Sequence[str] | str | None = None,
                 warmup: int = 2, runs: int = 5, timeout: float = 600.0, nice: int = 10,
                 probe_timeout: float = 2.0):
        self.tasks = tasks if isinstance(tasks, TasksFile) else load_tasks(tasks)
        names = self.tasks.devices
        if devices is not None:
            items = devices.split(",") if isinstance(devices, str) else list(devices)
            names = [full_device_name(d) for d in items if str(d).strip()]
            for d in names:
                self.tasks.task_of(d)           # TasksFileError naming the device and the file
        super().__init__(graph, names, warmup=warmup, runs=runs, timeout=timeout)
        self.probe_timeout = float(probe_timeout)
        self.watch_interval = 0.5        # seconds between looks at the tasks' processes during a measurement
        # TF cuts a call a little before the child would be killed: the step is cancelled on the tasks too, and
        # the child (TensorFlow, the imported graph) lives on for the next measurement
        self._child_init = {"target": self.tasks.target, "op_timeout_ms": max(1, int(self.timeout * 900)),
                            "nice": int(nice), **({"device_filters": self.tasks.device_filters}
                                                  if self.tasks.device_filters else {})}
        self._nice, self._warmup, self._runs = int(nice), int(warmup), int(runs)
        self.check_tasks()

    def without(self, lost: Sequence[int]) -> "TFClusterRunner":
        """A runner over the devices left when the devices at indices `lost` (their tasks) are gone: the session
        moves to the first surviving task and sees only the survivors. Placements index its own `devices`."""
        gone = {self.devices[i] for i in lost}
        tasks = self.tasks.without(gone)
        keep = [d for d in self.devices if d not in gone and any(d in t.devices for t in tasks.tasks)]
        return TFClusterRunner(self.graph, tasks, devices=keep, warmup=self._warmup, runs=self._runs,
                               timeout=self.timeout, nice=self._nice, probe_timeout=self.probe_timeout)

    def _lost(self, down) -> tuple[int, ...]:
        dead = {d for t, _ in down for d in t.devices}
        return tuple(i for i, d in enumerate(self.devices) if d in dead)

    def check_tasks(self) -> None:
        """MeasurementError naming the tasks file and every task that is down."""
        live_tasks(self.tasks, self.probe_timeout)

    def _ensure_child(self):
        if self._child is None or not self._child.alive:
            self.check_tasks()
        try:
            child = super()._ensure_child()
        except MeasurementError as e:
            # a task that died while the child connected: name it (TF says only that a connection failed)
            down = down_tasks(self.tasks, self.probe_timeout)
            if down:
                raise MeasurementError(f"tasks file {self.tasks.path}: {'; '.join(down)} ({e})") from None
            raise
        missing = [d for d in self.devices if d not in child.devices]
        if missing:
            raise MeasurementError(f"tasks file {self.tasks.path}: task 0's master ({self.tasks.target}) does not "
                                   f"see device {', '.join(missing)} (it sees: {', '.join(child.devices)}): list only devices of the "
                                   "tasks file in --devices, or restart the cluster (`placer cluster up`)")
        return child

    def measure(self, placement, **kw) -> Outcome:
        down = down_task_list(self.tasks, self.probe_timeout)
        if down:
            return self._down(down)
        stop, seen = threading.Event(), []

        def watch() -> None:       # a task that dies or stops mid-measurement: cut the child at once
            while not stop.wait(self.watch_interval):
                d = down_task_list(self.tasks, self.probe_timeout, connect=False)
                if d:
                    seen.extend(d)
                    child = self._child
                    if child is not None:
                        child.kill()
                    return

        watcher = threading.Thread(target=watch, daemon=True, name="tfcluster-watch")
        watcher.start()
        try:
            out = super().measure(placement, **kw)
        finally:
            stop.set()
            watcher.join()
        if seen:
            return self._down(seen, " (measurement stopped)")
        if out.failed and not out.oom:
            down = down_task_list(self.tasks, self.probe_timeout)
            if down:
                return self._down(down, f" ({out.reason})")
            elif (out.reason or "").startswith("DeadlineExceededError"):
                out.reason = f"timed out after {0.9 * self.timeout:g} s on the TF cluster ({out.reason})"
        return out

    def _down(self, down, suffix: str = "") -> Outcome:
        o = Outcome.failure("; ".join(f"{t.label} is down: {why}" for t, why in down) + suffix)
        o.lost_devices = self._lost(down)
        return o

    def links(self, sizes: Sequence[int], *, pairs=None, warmup: int = 2, runs: int = 5) -> dict:
        """Ping-pong times of one transfer per ordered device pair and size (see `_child._State.links`)."""
        return links_in_child(self, sizes, pairs=pairs, warmup=warmup, runs=runs)


def live_tasks(tasks: "str | TasksFile", timeout: float = 2.0) -> TasksFile:
    """The tasks file (a path or a TasksFile) when every task answers; else MeasurementError naming the file and
    each task that is down."""
    tf_ = tasks if isinstance(tasks, TasksFile) else load_tasks(tasks)
    down = down_tasks(tf_, timeout)
    if down:
        raise MeasurementError(f"tasks file {tf_.path}: {'; '.join(down)}")
    return tf_


def links_in_child(runner: LocalRunner, sizes: Sequence[int], *, pairs=None, warmup: int = 2, runs: int = 5) -> dict:
    """Run the tensor ping-pong in `runner`'s measurement child over `runner.devices` (a LocalRunner or a
    TFClusterRunner). Returns {"sizes": [bytes], "times": {"i,j": [seconds per size]}}."""
    from placer.runtime.local import ChildDied, ChildError

    with runner._lock:  # noqa: SLF001 - one request at a time in the child
        child = runner._ensure_child()  # noqa: SLF001
        req = {"devices": list(runner.devices), "sizes": [int(s) for s in sizes], "warmup": warmup, "runs": runs,
               "pairs": [list(p) for p in pairs] if pairs is not None else None}
        try:
            return child.call("links", req, runner.timeout)
        except ChildError as e:
            raise MeasurementError(f"link ping-pong over {runner.devices} failed: {e.reason}") from None
        except ChildDied as e:
            child.close()
            runner._child = None  # noqa: SLF001
            raise MeasurementError(f"link ping-pong over {runner.devices} failed: {e.reason}") from None
