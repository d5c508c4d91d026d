"""Measured reward on this machine's devices: `LocalRunner` runs placed graphs in a child process.

    from placer.runtime.local import LocalRunner
    with LocalRunner(graph, ["/CPU:0", "/CPU:1"], warmup=2, runs=5) as runner:
        [out] = runner.evaluate([placement])        # placement: op -> device index array
        out.step_time, out.runs, out.on_assigned_device

How a measurement runs: the graph's runnable MetaGraphDef is imported once into a long-lived child process
(TensorFlow takes seconds to start); for each placement every op's device is set from the index array
(`graph.names[i]` -> `devices[placement[i]]`), a `tf.compat.v1.Session` is made with soft placement OFF and
Grappler OFF (`disable_meta_optimizer`, classic optimizer at L0: no folding, no CSE, no inlining, and TF's
small-constant replication off — the graph measured is the graph placed: only Send/Recv nodes are added),
variables are initialised, placeholders get synthetic inputs of their shapes and dtypes, W warm-up steps run,
then N timed steps (wall clock around `Session.run`). The Outcome has the median, every run, and
`on_assigned_device`: the fraction of executed placed ops that ran on their assigned device, read from the step
stats of the last warm-up step, run with FULL_TRACE (an extra step when warmup=0). Peak memory per device is the
largest allocator peak seen in that trace.

Failures never reach the caller as exceptions: a TF error (bad device, colocation conflict, OOM) is a failed
Outcome with TF's first message lines; a hang is cut at `timeout` seconds (the child is killed); a crash or a
kill by the kernel's OOM killer is a failed Outcome too. A dead child is replaced on the next evaluation.

Devices are whatever TensorFlow sees (`/GPU:n`, `/CPU:0`): on a machine with GPUs, GPU placements are measured
with no change. `/CPU:k` for k >= 1 (`--devices cpu:N`) splits the CPU into N logical devices (the session's
`device_count`). LOGICAL CPUs HONOUR PLACEMENT BUT GIVE NO SPEEDUP SIGNAL: they share one thread pool and one
memory, so a measured step time on them says nothing about how the placement would do on separate devices;
use them to test the machinery, not to judge placements. A placement naming a device TF does not have (e.g.
`/GPU:0` on a CPU-only machine) is a failed Outcome naming the device and the devices that do exist.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Sequence

import numpy as np

from placer.errors import MeasurementError
from placer.runtime.devices import canonical_device, cpu_split, parse_devices
from placer.sim.evaluator import Evaluator, Outcome

log = logging.getLogger(__name__)

START_TIMEOUT = 180.0   # seconds (at least) for the child to import TensorFlow + list devices, and to import a graph


class ChildDied(Exception):
    """The child process died or hung; carries the reason."""

    def __init__(self, reason: str, *, oom: bool = False, timeout: bool = False):
        super().__init__(reason)
        self.reason, self.oom, self.timeout = reason, oom, timeout


class ChildError(Exception):
    """The child answered with an error (a TF exception): carries its short reason."""

    def __init__(self, reason: str, oom: bool = False, kind: str = ""):
        super().__init__(reason)
        self.reason, self.oom, self.kind = reason, oom, kind


class GraphRefused(MeasurementError):
    """The graph holds ops outside the safe allowlist (runners built with `check_safe=True`, i.e. workers)."""


class Child:
    """One measurement child process (`python -m placer.runtime._child`) and its two pipes."""

    def __init__(self, cpus: int = 1, *, intra_op: int | None = None, inter_op: int | None = None,
                 start_timeout: float = START_TIMEOUT, env: dict | None = None, init: dict | None = None):
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        self._err = tempfile.TemporaryFile()
        e = dict(os.environ)
        e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        e.update(env or {})
        self.t_start = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "placer.runtime._child", str(p2c_r), str(c2p_w)],
                pass_fds=(p2c_r, c2p_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._err,
                env=e, close_fds=True)
        finally:
            os.close(p2c_r)
            os.close(c2p_w)
        self._tx = Connection(p2c_w, readable=False)
        self._rx = Connection(c2p_r, writable=False)
        try:
            info = self.call("init", {"cpus": cpus, "intra_op": intra_op, "inter_op": inter_op, **(init or {})},
                             start_timeout)
        except BaseException:
            self.kill()
            self.close()
            raise
        self.devices: list[str] = list(info["devices"])
        self.tf_version: str = info["tf_version"]
        self.start_s = time.perf_counter() - self.t_start

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, n: int = 600) -> str:
        try:
            self._err.seek(0, os.SEEK_END)
            size = self._err.tell()
            self._err.seek(max(0, size - 4000))
            lines = [x for x in self._err.read().decode(errors="replace").splitlines() if x.strip()]
            tail = " | ".join(lines[-3:])
            return tail[-n:]
        except (OSError, ValueError):
            return ""

    def call(self, kind: str, req, timeout: float):
        """Send one request and wait up to `timeout` s for the reply. Raises ChildDied / ChildError."""
        if not self.alive:
            raise ChildDied(self._death_reason())
        try:
            self._tx.send((kind, req))
            ready = self._rx.poll(timeout)
        except (OSError, EOFError, BrokenPipeError):
            raise ChildDied(self._death_reason()) from None
        if not ready:
            self.kill()
            raise ChildDied(f"timed out after {timeout:g} s (measurement child killed)", timeout=True)
        try:
            status, payload = self._rx.recv()
        except (EOFError, OSError):
            raise ChildDied(self._death_reason()) from None
        if status == "error":
            raise ChildError(payload["reason"], oom=bool(payload.get("oom")), kind=payload.get("kind", ""))
        return payload

    def _death_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        tail = self.stderr_tail()
        if code is not None and code < 0:
            sig = -code
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            why = f"measurement child killed by {name}"
            if sig == signal.SIGKILL:
                why += " (possibly the kernel's out-of-memory killer)"
        else:
            why = f"measurement child exited with code {code}"
        return why + (f": {tail}" if tail else "")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._tx.send(("exit", None))
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        for c in (self._tx, self._rx):
            try:
                c.close()
            except OSError:
                pass
        try:
            self._err.close()
        except OSError:
            pass


_DTYPE_BYTES = {"float": 4, "float32": 4, "int32": 4, "uint32": 4, "double": 8, "float64": 8, "int64": 8,
                "uint64": 8, "half": 2, "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1,
                "bool": 1, "complex64": 8, "complex128": 16}


def oom_detail(reason: str) -> str:
    """TF's OOM message with the device and the bytes the failed allocation needed put first:
    'out of memory on /CPU:0: needs 4.0 TiB for one tensor (ResourceExhaustedError: OOM when allocating ...)'.

    >>> oom_detail("ResourceExhaustedError: OOM when allocating tensor with shape[1024,1024] and type float on "
    ...            "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu")[:56]
    'out of memory on /CPU:0: needs 4.0 MiB for one tensor (R'
    """
    import re

    from placer.errors import fmt_bytes

    m = re.search(r"shape\[([\d, ]*)\] and type (\w+) on (\S+)", reason)
    if not m:
        return reason
    dims = [int(x) for x in m.group(1).replace(" ", "").split(",") if x]
    need = int(np.prod(dims, dtype=np.float64)) * _DTYPE_BYTES.get(m.group(2), 4)
    dev = m.group(3).rsplit("/device:", 1)[-1]
    return f"out of memory on /{dev}: needs {fmt_bytes(need)} for one tensor ({reason})"


def check_measure_settings(warmup: int, runs: int, timeout: float) -> None:
    """MeasurementError naming the flag when --warmup, --runs or --timeout cannot measure anything (a timeout of 0
    or less cut every measurement, each then reported as a failed placement rather than as the bad flag)."""
    if runs < 1 or warmup < 0:
        raise MeasurementError(f"need runs >= 1 and warmup >= 0 (got runs={runs}, warmup={warmup})")
    check_timeout(timeout)


def check_timeout(timeout: float) -> None:
    """MeasurementError naming --timeout when it is not positive seconds (the runners', the worker's)."""
    if not timeout > 0:
        raise MeasurementError(f"--timeout must be positive seconds, got {timeout}")


class LocalRunner(Evaluator):
    """Measures placements on this machine's TensorFlow devices (see the module docstring).

    graph: an OpGraph with a runnable `meta_graph` (or any object with `names`, `fetches`, `fingerprint`,
    `meta_graph` bytes). devices: TF device names (index-aligned with placement values) or a spec `"cpu:N"`.
    warmup/runs: steps before / inside the timing. timeout: seconds one measurement (placing, session,
    initialisation, warm-up and runs) may take before it is cut and reported as failed (TF start-up and the
    graph import get at least START_TIMEOUT). check_safe: refuse graphs with ops
    outside `placer.runtime.allowlist` (GraphRefused) before anything is imported or run (workers set it).

    >>> # runner = LocalRunner(graph, "cpu:2"); runner.evaluate([np.zeros(graph.num_ops, int)])[0].step_time
    """

    def __init__(self, graph, devices: Sequence[str] | str, *, warmup: int = 2, runs: int = 5,
                 timeout: float = 600.0, intra_op: int | None = None, inter_op: int | None = None,
                 child_env: dict | None = None, check_safe: bool = False):
        if getattr(graph, "meta_graph", None) is None:
            raise MeasurementError(f"graph {getattr(graph, 'name', '?')!r} carries no runnable TensorFlow graph "
                                   "(built by hand?): it cannot be measured")
        self.graph = graph
        self.devices = parse_devices(devices)
        check_measure_settings(warmup, runs, timeout)
        self.warmup, self.runs, self.timeout = int(warmup), int(runs), float(timeout)
        self._cpus = cpu_split(self.devices)
        self._intra, self._inter = intra_op, inter_op
        self._child_env = child_env
        self._child_init: dict = {}      # more fields of the child's init request (TFClusterRunner: the target)
        self.check_safe = bool(check_safe)
        self._child: Child | None = None
        self._lock = threading.Lock()
        self.available: list[str] | None = None   # devices TF sees in the child
        self.tf_version: str | None = None
        self.load_warnings: list[str] = []
        self.stats = {"children_started": 0, "child_start_s": [], "load_s": [], "measurements": 0}

    # ---- child management -----------------------------------------------------------------------------
    def _ensure_child(self) -> Child:
        if self._child is not None and self._child.alive:
            return self._child
        if self._child is not None:
            self._child.close()
            self._child = None
        try:
            child = Child(self._cpus, intra_op=self._intra, inter_op=self._inter, env=self._child_env,
                          start_timeout=max(START_TIMEOUT, self.timeout), init=self._child_init)
        except ChildDied as e:
            raise MeasurementError(f"could not start the TensorFlow measurement process: {e.reason}") from None
        except ChildError as e:
            raise MeasurementError(f"TensorFlow failed to start in the measurement process: {e.reason}") from None
        self.stats["children_started"] += 1
        self.stats["child_start_s"].append(child.start_s)
        self.available, self.tf_version = child.devices, child.tf_version
        try:
            t = time.perf_counter()
            info = child.call("load", {"meta_graph": self.graph.meta_graph, "names": list(self.graph.names),
                                       "fetches": list(self.graph.fetches),
                                       "fingerprint": getattr(self.graph, "fingerprint", ""),
                                       "check_safe": self.check_safe}, max(self.timeout, START_TIMEOUT))
            self.stats["load_s"].append(time.perf_counter() - t)
        except ChildDied as e:
            child.close()
            raise MeasurementError(f"loading graph {getattr(self.graph, 'name', '?')!r} into TensorFlow "
                                   f"failed: {e.reason}") from None
        except ChildError as e:
            child.close()
            if e.kind == "UnsafeGraphError":
                raise GraphRefused(e.reason.split(": ", 1)[-1]) from None
            raise MeasurementError(f"graph {getattr(self.graph, 'name', '?')!r} cannot be run by TensorFlow: "
                                   f"{e.reason}") from None
        self.load_warnings = list(info.get("warnings", []))
        for w in self.load_warnings:
            log.warning("%s: %s", getattr(self.graph, "name", "graph"), w)
        self._child = child
        return child

    def start(self) -> "LocalRunner":
        """Start the child and load the graph now (otherwise the first evaluate does). Raises
        MeasurementError when TensorFlow cannot start or cannot import the graph at all."""
        with self._lock:
            self._ensure_child()
        return self

    def check_devices(self) -> "LocalRunner":
        """Start TensorFlow now and refuse (MeasurementError, one line: the missing devices and the fix) when it
        does not have every device of `devices`, before any measurement."""
        from placer.runtime.devices import missing_devices_message

        with self._lock:
            child = self._ensure_child()
            bad = missing_devices_message(self._where(), self.devices, child.devices)
        if bad:
            raise MeasurementError(bad)
        return self

    def _where(self) -> str:
        return "this machine's TensorFlow"

    def close(self) -> None:
        with self._lock:
            if self._child is not None:
                self._child.close()
                self._child = None

    def __del__(self):  # best effort: never leave a TF process behind
        try:
            if self._child is not None:
                self._child.kill()
        except Exception:  # noqa: BLE001
            pass

    # ---- measuring --------------------------------------------------------------------------------------
    def evaluate(self, placements: Sequence[np.ndarray]) -> list[Outcome]:
        """One Outcome per placement, in order; never raises for a bad placement (raises MeasurementError only
        when TensorFlow cannot start or the graph cannot be imported at all)."""
        return [self.measure(p) for p in placements]

    def measure(self, placement, *, warmup: int | None = None, runs: int | None = None,
                profile_runs: int = 0) -> Outcome:
        """Measure one placement (an op -> device index array, or a list of device names per op)."""
        names, bad = self._device_names(placement)
        if bad:
            return Outcome.failure(bad)
        with self._lock:
            child = self._ensure_child()
            missing = sorted({d for d in names if d not in child.devices})
            if missing:
                return Outcome.failure(f"device {missing[0]} does not exist here (TensorFlow sees: "
                                       f"{', '.join(child.devices)})")
            req = {"placement": names, "warmup": self.warmup if warmup is None else warmup,
                   "runs": self.runs if runs is None else runs, "trace": True, "profile_runs": profile_runs}
            self.stats["measurements"] += 1
            try:
                res = child.call("measure", req, self.timeout)
            except ChildError as e:
                return Outcome.failure(oom_detail(e.reason) if e.oom else e.reason, oom=e.oom)
            except ChildDied as e:
                child.close()
                self._child = None
                return Outcome.failure(e.reason, oom=e.oom)
        runs_s = tuple(float(x) for x in res["runs"])
        peak = np.asarray([int(res["peak_memory"].get(d, 0)) for d in self.devices], np.int64)
        out = Outcome(step_time=float(np.median(runs_s)), peak_memory=peak, runs=runs_s,
                      on_assigned_device=res.get("on_assigned_device"))
        out.peak_by_device = dict(res["peak_memory"])  # type: ignore[attr-defined]
        out.executed = int(res.get("executed", 0))  # type: ignore[attr-defined]  # placed ops seen in the trace
        # seconds spent re-placing ops, making the session + initialising, and in total before the timed runs
        out.timing = {k: float(res.get(k, 0.0)) for k in ("place_s", "init_s", "setup_s")}  # type: ignore[attr-defined]
        if profile_runs:
            out.op_times = res.get("op_times", {})  # type: ignore[attr-defined]
        return out

    def _device_names(self, placement) -> tuple[list[str], str | None]:
        n = len(self.graph.names)
        arr = np.asarray(placement)
        if arr.ndim != 1 or len(arr) != n:
            return [], f"placement has shape {arr.shape}, the graph has {n} ops"
        if arr.dtype.kind in "iu":
            if n and (arr.min() < 0 or arr.max() >= len(self.devices)):
                i = int(np.argmax((arr < 0) | (arr >= len(self.devices))))
                return [], (f"op {self.graph.names[i]!r} is placed on device index {int(arr[i])}, "
                            f"but there are {len(self.devices)} devices {self.devices}")
            return [self.devices[int(k)] for k in arr], None
        try:
            return [canonical_device(str(d)) for d in arr], None
        except Exception as e:  # noqa: BLE001
            return [], str(e)

    def debug_sleep(self, seconds: float) -> Outcome:
        """Test hook: make the child sleep (a stand-in for a hang inside TF) under the runner's timeout."""
        with self._lock:
            child = self._ensure_child()
            try:
                child.call("sleep", seconds, self.timeout)
                return Outcome(step_time=float(seconds))
            except ChildDied as e:
                child.close()
                self._child = None
                return Outcome.failure(e.reason)
