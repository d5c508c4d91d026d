"""`RemotePool`: measured reward from `placer worker` processes (gRPC), a batch spread over them concurrently.

    from placer.runtime.remote import RemotePool
    with RemotePool(graph, ["gpu-host-1:50051", "gpu-host-2:50051"], devices=["/GPU:0", "/GPU:1", "/CPU:0"],
                    token=open("token").read().strip()) as pool:
        outcomes = pool.evaluate(placements)     # one Outcome per placement, in order

Each worker gets the graph once (`LoadGraph`, cached there by fingerprint; re-sent if the worker restarted).
`evaluate` runs one thread per live worker pulling placements from a shared queue, so a batch takes about
(batch / workers) measurements. A worker that dies, times out, refuses or errors is marked dead and the
placement it held goes back to the queue for another worker. Dead workers are health-checked again (every
`health_interval` s, in the background from the start of a batch: a batch never waits on a worker that stays
down) and rejoin when they answer, after their devices and graph fingerprint are checked again (LoadGraph). The pool goes on while at least one worker lives; when none does, `evaluate` raises
MeasurementError naming every worker and why it is out. Per-placement failures (OOM, a TF error, a timeout of
the measurement on the worker) are failed Outcomes from the worker, with the worker's reason, not worker failures;
a worker that lacks a device of `devices` is out (with the missing devices and the fix as its reason).

`devices` are the device names placement indices refer to, as each worker's TensorFlow spells them
(`/GPU:0`, `/CPU:0`); every worker must have them: `check_devices()` (called by `make_evaluator` and `cluster()`)
refuses a worker that lacks one before any work (DeviceMismatch: the worker, the missing devices, the fix), and a
worker that rejoins after a restart is re-checked (devices and graph fingerprint) before it measures again.
`pool.cluster()` builds the cluster of those devices from what the workers report (a ClusterError names a worker
that lacks one), never from this machine's TensorFlow: the client needs no GPU to search over the workers' GPUs.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from placer.errors import ClusterError, MeasurementError
from placer.runtime.devices import parse_devices
from placer.runtime.devices import devices_flag, missing_devices_message  # noqa: F401
from placer.runtime.worker import MAX_MESSAGE_BYTES, TOKEN_KEY, blob_fingerprint, check_token, grpc_options
from placer.sim.evaluator import Evaluator, Outcome

log = logging.getLogger(__name__)


@dataclass
class _Worker:
    address: str
    channel: object
    stub: object
    alive: bool = True
    loaded: bool = False
    reason: str = ""
    last_check: float = 0.0
    measured: int = 0
    probing: bool = False              # a background health probe is running
    devices: list | None = None        # what TF sees on the worker (from its LoadGraph reply)
    lock: threading.Lock = field(default_factory=threading.Lock)


class WorkerFailed(Exception):
    pass


class DeviceMismatch(MeasurementError, ClusterError):
    """A worker lacks devices the measurements need (refused when the pool connects, and when a worker rejoins)."""


class RemotePool(Evaluator):
    """Evaluator over remote measurement workers (see the module docstring).

    graph: OpGraph with a runnable meta_graph. addresses: HOST:PORT list. devices: spec or names (default: the
    CPU). token: shared secret (sent as `x-placer-token`). tls_ca: PEM file of the CA/certificate to trust
    (enables TLS). timeout: seconds one measurement may take on a worker (the RPC deadline adds `rpc_slack` for
    TF start-up and graph import). warmup/runs as in LocalRunner. heartbeat/heartbeat_misses: during a
    measurement the worker's health is asked every `heartbeat` s; after `heartbeat_misses` unanswered probes in a
    row (a hung or stopped worker) the call is cancelled and the worker is out, its placement going to another.
    """

    def __init__(self, graph, addresses: Sequence[str] | str, devices: Sequence[str] | str = "cpu:1", *,
                 token: str | None = None, tls_ca: str | None = None, timeout: float = 600.0, warmup: int = 2,
                 runs: int = 5, rpc_slack: float = 240.0, health_interval: float = 5.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, heartbeat: float = 5.0, heartbeat_misses: int = 3):
        import grpc

        from placer.runtime import placer_pb2_grpc

        if getattr(graph, "meta_graph", None) is None:
            raise MeasurementError(f"graph {getattr(graph, 'name', '?')!r} carries no runnable TensorFlow graph")
        if isinstance(addresses, str):
            addresses = [a for a in (x.strip() for x in addresses.split(",")) if a]
        if not addresses:
            raise MeasurementError("no worker addresses given")
        from placer.tasks import is_host_port

        if (bad := next((a for a in addresses if not is_host_port(a)), None)) is not None:
            raise MeasurementError(f"worker address {bad!r} is not HOST:PORT (e.g. 127.0.0.1:50051)")
        if len(set(addresses)) != len(addresses):   # two threads on one worker: measurements queued, not parallel
            twice = next(a for a in addresses if addresses.count(a) > 1)
            raise MeasurementError(f"worker address {twice} is listed twice")
        self.graph = graph
        self.devices = parse_devices(devices)
        from placer.runtime.local import check_measure_settings

        check_measure_settings(warmup, runs, timeout)
        self.timeout, self.warmup, self.runs = float(timeout), int(warmup), int(runs)
        self.rpc_slack, self.health_interval = float(rpc_slack), float(health_interval)
        self.heartbeat, self.heartbeat_misses = float(heartbeat), max(1, int(heartbeat_misses))
        if token is not None:
            token = check_token(token)
        self._md = ((TOKEN_KEY, token),) if token else ()
        self._fp = blob_fingerprint(graph.meta_graph, graph.names, graph.fetches)
        creds = None
        if tls_ca:
            try:
                with open(tls_ca, "rb") as f:
                    creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            except OSError as e:
                raise MeasurementError(f"cannot read TLS CA file {tls_ca}: {e}") from None
        # a restarted worker should be found again quickly (gRPC's default reconnect backoff grows to 120 s)
        opts = grpc_options(max_message_bytes) + [("grpc.initial_reconnect_backoff_ms", 500),
                                                  ("grpc.min_reconnect_backoff_ms", 500),
                                                  ("grpc.max_reconnect_backoff_ms", 5000)]
        self.workers: list[_Worker] = []
        # every worker that went out or came back, for the search's summary ("workers_out")
        self.events: list[dict] = []
        self._t0 = time.monotonic()
        for a in addresses:
            ch = grpc.secure_channel(a, creds, options=opts) if creds else grpc.insecure_channel(a, options=opts)
            self.workers.append(_Worker(a, ch, placer_pb2_grpc.MeasurerStub(ch)))
        self._grpc = grpc

    # ---- worker calls --------------------------------------------------------------------------------------
    def _fail(self, w: _Worker, why: str, *, quiet: bool = False) -> None:
        if w.alive and not quiet:
            log.warning("measurement worker %s is out: %s", w.address, why)
        if w.alive:
            self.events.append({"worker": w.address, "event": "out", "reason": why,
                                "at_s": round(time.monotonic() - self._t0, 3)})
        w.alive, w.loaded, w.reason, w.last_check = False, False, why, time.monotonic()

    def _rpc_error(self, e) -> str:
        code = e.code() if hasattr(e, "code") else None
        det = e.details() if hasattr(e, "details") else str(e)
        return f"{code.name if code else 'error'}: {det}"

    def health(self, w: _Worker, timeout: float = 3.0) -> bool:
        """Ask one worker if it is up (waiting up to `timeout` s for the channel to reconnect); updates its state."""
        from placer.runtime import placer_pb2

        try:
            w.stub.Health(placer_pb2.HealthRequest(), timeout=timeout, metadata=self._md, wait_for_ready=True)
        except self._grpc.RpcError as e:
            self._fail(w, self._connect_error(w) or self._rpc_error(e))
            return False
        if not w.alive:
            log.warning("measurement worker %s answers again: re-checking its devices and graph before it rejoins",
                        w.address)
            self.events.append({"worker": w.address, "event": "rejoined", "reason": "",
                                "at_s": round(time.monotonic() - self._t0, 3)})
        w.alive, w.reason, w.last_check = True, "", time.monotonic()
        return True

    def _connect_error(self, w: _Worker) -> str | None:
        """Why the channel to `w` cannot connect (refused, a host that does not resolve...), or None. A call that
        waits for the channel to be ready only says DEADLINE_EXCEEDED when it never is; a call that does not wait
        fails at once with the channel's last connection error."""
        from placer.runtime import placer_pb2

        try:
            w.stub.Health(placer_pb2.HealthRequest(), timeout=1.0, metadata=self._md)
        except self._grpc.RpcError as e:
            if e.code() == self._grpc.StatusCode.UNAVAILABLE:
                return self._rpc_error(e)
        return None

    def check_workers(self, force: bool = False, wait: bool = True) -> list[str]:
        """Re-probe dead workers due for it (all workers when `force`); returns the live addresses. With
        `wait=False` the probes of dead workers run in the background (a batch does not wait seconds on a worker
        that stays down): one that answers is alive for the next batch."""
        now = time.monotonic()
        probes = [w for w in self.workers if not w.probing and
                  (force or (not w.alive and now - w.last_check >= self.health_interval))]
        ts = []
        for w in probes:
            w.probing = True
            ts.append(threading.Thread(target=self._probe, args=(w,), daemon=True, name=f"probe-{w.address}"))
        for t in ts:
            t.start()
        if wait or force:
            for t in ts:
                t.join()
        return [w.address for w in self.workers if w.alive]

    def _probe(self, w: _Worker) -> None:
        try:
            self.health(w)
        finally:
            w.probing = False

    def _load(self, w: _Worker) -> None:
        from placer.runtime import placer_pb2

        g = self.graph
        req = placer_pb2.LoadGraphRequest(fingerprint=self._fp, meta_graph=g.meta_graph, op_names=list(g.names),
                                          fetches=list(g.fetches), name=getattr(g, "name", "graph"))
        try:
            reply = self._call_watched(w, w.stub.LoadGraph, req)
        except self._grpc.RpcError as e:
            raise WorkerFailed(self._rpc_error(e)) from None
        if reply.fingerprint and reply.fingerprint != self._fp:
            raise WorkerFailed(f"worker {w.address} loaded graph {reply.fingerprint[:16]}, not the one sent "
                               f"({self._fp[:16]})")
        w.devices = list(reply.devices)
        bad = missing_devices_message(f"worker {w.address}", self.devices, w.devices)
        if bad:
            raise DeviceMismatch(bad)
        w.loaded = True

    def reported_devices(self) -> dict[str, list[str]]:
        """The devices TensorFlow sees on each live worker, as the worker reports them when it loads the graph
        (loaded now if it was not: the measurements need it anyway). MeasurementError when no worker answers;
        DeviceMismatch (one line: the worker, the missing devices, the fix) when a worker lacks a device."""
        self.check_workers(force=True)
        out: dict[str, list[str]] = {}
        mismatched: list[str] = []
        for w in self.workers:
            if not w.alive:
                continue
            try:
                if not w.loaded or w.devices is None:
                    self._load(w)
                out[w.address] = list(w.devices or [])
            except DeviceMismatch as e:
                mismatched.append(str(e))
                self._fail(w, str(e), quiet=True)      # raised below: one line, not a warning too
            except WorkerFailed as e:
                self._fail(w, str(e))
        if mismatched:
            raise DeviceMismatch("; ".join(mismatched))
        if not out:
            raise self._none_alive()
        return out

    def check_devices(self) -> "RemotePool":
        """Connect now: every answering worker gets the graph and reports its devices; refuse (DeviceMismatch)
        before any measurement when one lacks a device of `devices`, MeasurementError when none answers."""
        self.reported_devices()
        return self

    def cluster(self):
        """The cluster of this pool's `devices` as the workers report them (`placer.sim.cluster.cluster_from_reported`):
        never this machine's TensorFlow device list, so a client without GPUs can search over workers' GPUs."""
        from placer.sim.cluster import cluster_from_reported

        return cluster_from_reported(self.devices, self.reported_devices())

    def _measure_on(self, w: _Worker, placement: np.ndarray, profile_runs: int = 0) -> Outcome:
        from placer.runtime import placer_pb2

        if not w.loaded:
            self._load(w)
        req = placer_pb2.MeasureRequest(fingerprint=self._fp, devices=self.devices,
                                        placement=placement.astype(np.int32).tolist(), warmup=self.warmup,
                                        runs=self.runs, timeout_s=self.timeout, profile_runs=profile_runs)
        for attempt in range(2):
            try:
                r = self._call_watched(w, w.stub.Measure, req)
                break
            except self._grpc.RpcError as e:
                if attempt == 0 and e.code() == self._grpc.StatusCode.FAILED_PRECONDITION:
                    self._load(w)       # the worker restarted or evicted the graph: send it again
                    continue
                raise WorkerFailed(self._rpc_error(e)) from None
        out = Outcome(step_time=r.step_time if not r.failed else float("inf"), oom=r.oom, failed=r.failed,
                      reason=(r.reason or f"failed on worker {w.address} without a reason") if r.failed else None, runs=tuple(r.runs),
                      on_assigned_device=r.on_assigned_device if r.has_on_assigned_device else None,
                      peak_memory=np.asarray(list(r.peak_memory), np.int64))
        out.worker = r.worker or w.address  # type: ignore[attr-defined]
        if r.op_times:
            out.op_times = {t.op: (t.device, list(t.seconds)) for t in r.op_times}  # type: ignore[attr-defined]
        w.measured += 1
        return out

    def _call_watched(self, w: _Worker, method, req):
        """One RPC (Measure, LoadGraph), with the worker's health asked every `heartbeat` s while it runs: a worker that stops
        answering (a hang, SIGSTOP, a host gone) for `heartbeat_misses` probes in a row has its call cancelled
        and is out, long before the RPC deadline (`timeout` + `rpc_slack`)."""
        from placer.runtime import placer_pb2

        fut = method.future(req, timeout=self.timeout + self.rpc_slack, metadata=self._md)
        misses = 0
        while True:
            try:
                return fut.result(timeout=self.heartbeat)
            except self._grpc.FutureTimeoutError:
                pass
            try:
                w.stub.Health(placer_pb2.HealthRequest(), timeout=self.heartbeat, metadata=self._md)
                misses = 0
            except self._grpc.RpcError as e:
                misses += 1
                if misses >= self.heartbeat_misses and not fut.done():
                    fut.cancel()
                    raise WorkerFailed(f"worker stopped answering mid-call (no health reply in "
                                       f"{misses} probes of {self.heartbeat:g} s: {self._rpc_error(e)})") from None

    # ---- Evaluator -----------------------------------------------------------------------------------------
    def evaluate(self, placements: Sequence[np.ndarray], *, profile_runs: int = 0) -> list[Outcome]:
        n_ops, n_dev = len(self.graph.names), len(self.devices)
        results: list[Outcome | None] = [None] * len(placements)
        arrays: list[np.ndarray | None] = []
        for i, p in enumerate(placements):
            a = np.asarray(p)
            if a.ndim != 1 or len(a) != n_ops or a.dtype.kind not in "iu":
                results[i] = Outcome.failure(f"placement has shape {a.shape} (dtype {a.dtype}); the graph has "
                                             f"{n_ops} ops")
            elif n_ops and (a.min() < 0 or a.max() >= n_dev):
                results[i] = Outcome.failure(f"placement uses device index {int(a.max())} but there are "
                                             f"{n_dev} devices {self.devices}")
            arrays.append(a)
        queue = collections.deque(i for i, r in enumerate(results) if r is None)
        if not queue:
            return results  # type: ignore[return-value]
        self.check_workers(wait=False)
        live = [w for w in self.workers if w.alive]
        if not live:                       # nothing to measure on: wait for the probes of the dead ones
            self.check_workers(wait=True)
            deadline = time.monotonic() + 10.0
            while any(w.probing for w in self.workers) and time.monotonic() < deadline:
                time.sleep(0.05)
            live = [w for w in self.workers if w.alive]
        if not live:
            raise self._none_alive()
        cond = threading.Condition()
        state = {"inflight": 0}

        def run(w: _Worker) -> None:
            while True:
                with cond:
                    while not queue and state["inflight"] > 0:
                        cond.wait()
                    if not queue:
                        return
                    i = queue.popleft()
                    state["inflight"] += 1
                try:
                    out = self._measure_on(w, arrays[i], profile_runs)
                    err = None
                except WorkerFailed as e:
                    out, err = None, str(e)
                except Exception as e:  # noqa: BLE001 - a broken worker must not take the batch down
                    out, err = None, f"{type(e).__name__}: {e}"
                with cond:
                    state["inflight"] -= 1
                    if err is None:
                        results[i] = out
                    else:
                        self._fail(w, err)          # the worker is out; its placement goes to another
                        queue.appendleft(i)
                    cond.notify_all()
                    if err is not None:
                        return

        threads = [threading.Thread(target=run, args=(w,), daemon=True, name=f"measure-{w.address}")
                   for w in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if any(r is None for r in results):
            raise self._none_alive(len([r for r in results if r is None]))
        return results  # type: ignore[return-value]

    def _none_alive(self, pending: int | None = None) -> MeasurementError:
        why = "; ".join(f"{w.address}: {w.reason or 'down'}" for w in self.workers)
        head = f"no measurement worker is alive ({pending} placements unmeasured)" if pending else \
            "no measurement worker is alive"
        return MeasurementError(f"{head}: {why}")

    def close(self) -> None:
        for w in self.workers:
            try:
                w.channel.close()
            except Exception:  # noqa: BLE001
                pass
