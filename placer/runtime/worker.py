"""`placer worker`: a gRPC measurement service (service `Measurer` in placer.proto) around a LocalRunner.

    placer worker --listen 127.0.0.1:50051                    # loopback: no token needed
    placer worker --listen 0.0.0.0:50051 --token-file tok     # any other address: token required
                  [--tls-cert cert.pem --tls-key key.pem] [--devices cpu:4] [--allow-unsafe-ops]

A client (`placer.runtime.remote.RemotePool`) sends a graph once (`LoadGraph`, cached by fingerprint: the sha256
of the graph fields, checked here), then placements (`Measure`); each reply is an Outcome. Measurements on one
worker run one at a time (they would disturb each other's timings). See SECURITY.md beside this file for the
threat model: token in the `x-placer-token` metadata (constant-time compare), op allowlist checked in the
measurement child before the graph is imported, request size capped (`max_message_bytes`, 256 MiB default).
"""
from __future__ import annotations

import collections
import errno
import hashlib
import hmac
import ipaddress
import logging
import signal
import threading
from concurrent import futures
from dataclasses import dataclass

import numpy as np

from placer.errors import MeasurementError

log = logging.getLogger(__name__)

TOKEN_KEY = "x-placer-token"
MAX_MESSAGE_BYTES = 256 * 1024 * 1024   # graphs are several MB; full-size models tens of MB
MAX_RUNS, MAX_WARMUP = 1000, 100        # per request, whatever a client asks


def check_token(tok: str, where: str = "the token") -> str:
    """`tok` stripped, when gRPC can carry it as the `x-placer-token` metadata value (printable ASCII, no line
    break); else MeasurementError naming `where` (gRPC itself would fail every call with "INTERNAL: Invalid
    metadata", blamed on the worker).

    >>> check_token("s3cret\\n")
    's3cret'
    >>> check_token("a\\nb", "token file tok")
    Traceback (most recent call last):
    placer.errors.MeasurementError: token file tok: the token may hold only printable ASCII characters on one \
line (found '\\n' at position 1)
    """
    tok = tok.strip()
    if not tok:
        raise MeasurementError(f"{where} is empty")
    bad = next(((i, c) for i, c in enumerate(tok) if not " " <= c <= "~"), None)
    if bad is not None:
        raise MeasurementError(f"{where}: the token may hold only printable ASCII characters on one line "
                               f"(found {bad[1]!r} at position {bad[0]})")
    return tok


def grpc_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", int(max_message_bytes)),
            ("grpc.max_send_message_length", int(max_message_bytes))]


@dataclass(frozen=True)
class GraphBlob:
    """What a worker needs of an OpGraph to measure it (duck-types OpGraph for LocalRunner)."""

    meta_graph: bytes
    names: tuple[str, ...]
    fetches: tuple[str, ...]
    name: str = "graph"
    fingerprint: str = ""


def blob_fingerprint(meta_graph: bytes, names, fetches) -> str:
    """sha256 over the graph fields of a LoadGraph request (the cache key, verified by the worker)."""
    h = hashlib.sha256()
    h.update(meta_graph)
    h.update(b"\0names\0" + "\0".join(names).encode())
    h.update(b"\0fetches\0" + "\0".join(fetches).encode())
    return h.hexdigest()


def is_loopback(host: str) -> bool:
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def split_address(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise MeasurementError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:50051")
    if int(port) > 65535:
        raise MeasurementError(f"--listen {listen!r}: the port must be 1-65535 (or 0: a free port), got {port}")
    return host, int(port)


class MeasurerServicer:
    """The service. `devices`: what this worker measures on (spec or names; default: the CPU and whatever
    GPUs TensorFlow finds — placements may name any device TF sees in the child)."""

    def __init__(self, devices=None, *, allow_unsafe_ops: bool = False, timeout: float = 600.0,
                 max_graphs: int = 2, label: str = "worker"):
        from placer.runtime.devices import parse_devices

        self.devices = parse_devices(devices) if devices else ["/CPU:0"]
        self.allow_unsafe_ops = bool(allow_unsafe_ops)
        self.timeout = float(timeout)
        self.max_graphs = max(1, int(max_graphs))
        self.label = label
        self._runners: "collections.OrderedDict[str, object]" = collections.OrderedDict()
        self._lock = threading.Lock()          # one measurement (or graph load) at a time
        self._busy = False

    # ---- RPCs ---------------------------------------------------------------------------------------------
    def LoadGraph(self, request, context):  # noqa: N802 - gRPC method names
        import grpc

        from placer.runtime import placer_pb2
        from placer.runtime.local import GraphRefused, LocalRunner

        fp = blob_fingerprint(request.meta_graph, request.op_names, request.fetches)
        if request.fingerprint and request.fingerprint != fp:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"fingerprint {request.fingerprint[:16]} does not match the graph sent ({fp[:16]})")
        with self._lock:
            runner = self._runners.get(fp)
            if runner is not None:
                self._runners.move_to_end(fp)
                return placer_pb2.LoadGraphReply(fingerprint=fp, cached=True, devices=runner.available or [])
            blob = GraphBlob(meta_graph=request.meta_graph, names=tuple(request.op_names),
                             fetches=tuple(request.fetches), name=request.name or "graph", fingerprint=fp)
            runner = LocalRunner(blob, self.devices, timeout=self.timeout, check_safe=not self.allow_unsafe_ops)
            self._busy = True
            try:
                runner.start()
            except GraphRefused as e:
                runner.close()
                log.warning("refused graph %r: %s", blob.name, e)
                context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
            except MeasurementError as e:
                runner.close()
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            finally:
                self._busy = False
            self._runners[fp] = runner
            while len(self._runners) > self.max_graphs:
                _, old = self._runners.popitem(last=False)
                old.close()
            return placer_pb2.LoadGraphReply(fingerprint=fp, cached=False, devices=runner.available or [],
                                              warnings=runner.load_warnings)

    def Measure(self, request, context):  # noqa: N802
        import grpc

        from placer.runtime import placer_pb2
        from placer.runtime.devices import device_of_trace

        runner = self._runners.get(request.fingerprint)
        if runner is None:
            self._not_loaded(context, request.fingerprint)
        n = len(runner.graph.names)
        if request.placement_names:
            names = [device_of_trace(d) or d for d in request.placement_names]
        else:
            idx = np.asarray(request.placement, dtype=np.int64)
            devs = [device_of_trace(d) or d for d in request.devices]
            if len(idx) != n or (n and (idx.min() < 0 or idx.max() >= len(devs))):
                return placer_pb2.MeasureReply(
                    failed=True, step_time=float("inf"), worker=self.label,
                    reason=f"placement has {len(idx)} entries for {n} ops and {len(devs)} devices")
            names = [devs[i] for i in idx]
        warmup = min(request.warmup, MAX_WARMUP) if request.warmup > 0 else runner.warmup
        runs = min(request.runs, MAX_RUNS) if request.runs > 0 else runner.runs
        with self._lock:
            if self._runners.get(request.fingerprint) is not runner:    # evicted meanwhile
                self._not_loaded(context, request.fingerprint)
            self._busy = True
            try:
                # a client may ask for a shorter timeout, never a longer one than the worker's
                runner.timeout = min(request.timeout_s, self.timeout) if request.timeout_s > 0 else self.timeout
                out = runner.measure(names, warmup=warmup, runs=runs, profile_runs=max(0, request.profile_runs))
            except MeasurementError as e:   # the child could not be restarted: this worker is unwell
                context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            finally:
                self._busy = False
        reply = placer_pb2.MeasureReply(
            step_time=out.step_time, runs=list(out.runs), oom=out.oom, failed=out.failed, reason=out.reason or "",
            has_on_assigned_device=out.on_assigned_device is not None,
            on_assigned_device=out.on_assigned_device or 0.0, worker=self.label)
        # peak memory per request device (a device's peak is read off the trace by its local name)
        if out.ok:
            per = getattr(out, "peak_by_device", {})
            reply.peak_memory.extend(int(per.get(device_of_trace(d) or d, 0)) for d in request.devices)
        for op, (dev, secs) in (getattr(out, "op_times", None) or {}).items():
            reply.op_times.add(op=op, device=dev or "", seconds=list(secs))
        return reply

    @staticmethod
    def _not_loaded(context, fp: str):
        import grpc

        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      f"graph {fp[:16]} is not loaded on this worker (send LoadGraph first)")

    def Health(self, request, context):  # noqa: N802
        from placer._version import __version__
        from placer.runtime import placer_pb2

        seen = next((r.available for r in self._runners.values() if r.available), None)
        return placer_pb2.HealthReply(ok=True, version=__version__, graphs=list(self._runners),
                                      devices=seen or self.devices, busy=self._busy,
                                      allow_unsafe_ops=self.allow_unsafe_ops)

    def close(self) -> None:
        for r in list(self._runners.values()):
            r.close()
        self._runners.clear()


def _token_interceptor(token: str):
    import grpc

    want = token.encode()

    def deny(request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token (x-placer-token)")

    denied = grpc.unary_unary_rpc_method_handler(deny)

    class TokenInterceptor(grpc.ServerInterceptor):
        def intercept_service(self, continuation, details):
            got = ""
            for k, v in details.invocation_metadata or ():
                if k == TOKEN_KEY:
                    got = v if isinstance(v, str) else v.decode(errors="replace")
            if hmac.compare_digest(got.encode(), want):
                return continuation(details)
            return denied

    return TokenInterceptor()


def _bind_failure(host: str, port: int) -> str:
    """Why gRPC could not bind HOST:PORT, in the OS's words (gRPC says only that it failed): the same bind done
    with a plain socket."""
    import socket

    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except OSError as e:
        return f"the host does not resolve ({e.strerror or e})"
    fam, _, _, _, addr = infos[0]
    try:
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.bind(addr)
    except OSError as e:
        return f"{e.strerror or e}" + (" (another process listens there)" if e.errno == errno.EADDRINUSE else "")
    return "address in use or not available here"


@dataclass
class Worker:
    """A running worker (returned by `serve(..., block=False)`): `.port`, `.stop()`."""

    server: object
    servicer: MeasurerServicer
    address: str
    port: int

    def stop(self, grace: float = 2.0) -> None:
        self.server.stop(grace).wait(grace + 5)
        self.servicer.close()


def serve(listen: str = "127.0.0.1:50051", token: str | None = None, tls_cert: str | None = None,
          tls_key: str | None = None, allow_unsafe_ops: bool = False, devices=None, *,
          max_message_bytes: int = MAX_MESSAGE_BYTES, timeout: float = 600.0, threads: int = 8,
          block: bool = True) -> Worker:
    """Start a measurement worker. Off loopback a token is required. `block=True` serves until SIGINT/SIGTERM.

    `listen` may use port 0 (a free port is picked: see the returned `Worker.port`).
    """
    import grpc

    from placer.runtime import placer_pb2_grpc

    host, port = split_address(listen)
    if token is not None:
        token = check_token(token)
    if not is_loopback(host) and not token:
        raise MeasurementError(f"refusing to listen on {listen} without a token: pass --token-file FILE "
                               "(and preferably --tls-cert/--tls-key); only loopback addresses may go without")
    if bool(tls_cert) != bool(tls_key):
        raise MeasurementError("TLS needs both --tls-cert and --tls-key")
    from placer.runtime.local import check_timeout

    check_timeout(timeout)
    servicer = MeasurerServicer(devices, allow_unsafe_ops=allow_unsafe_ops, timeout=timeout, label=listen)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads),
                         interceptors=[_token_interceptor(token)] if token else [],
                         # no SO_REUSEPORT (gRPC's default): a second worker on a port in use would share it
                         # with the first, each client landing on either; it must be refused instead
                         options=grpc_options(max_message_bytes) + [("grpc.so_reuseport", 0)],
                         maximum_concurrent_rpcs=64)
    placer_pb2_grpc.add_MeasurerServicer_to_server(servicer, server)
    if tls_cert:
        try:
            with open(tls_key, "rb") as f:
                key = f.read()
            with open(tls_cert, "rb") as f:
                cert = f.read()
        except OSError as e:
            raise MeasurementError(f"cannot read TLS key/certificate: {e}") from None
    try:        # a failed bind returns 0 in older gRPC releases, raises RuntimeError in newer ones
        if tls_cert:
            bound = server.add_secure_port(listen, grpc.ssl_server_credentials([(key, cert)]))
        else:
            bound = server.add_insecure_port(listen)
    except RuntimeError:
        bound = 0
    if not bound:
        raise MeasurementError(f"cannot listen on {listen}: {_bind_failure(host, port)}")
    server.start()
    w = Worker(server=server, servicer=servicer, address=f"{host}:{bound}", port=bound)
    servicer.label = w.address
    if not block:
        return w
    done = threading.Event()

    def _stop(*_):
        done.set()

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"placer worker listening on {w.address} (token: {'yes' if token else 'no'}, "
              f"tls: {'yes' if tls_cert else 'no'}, unsafe ops: {'allowed' if allow_unsafe_ops else 'refused'}, "
              f"devices: {','.join(servicer.devices)})", flush=True)
        done.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        w.stop()
    return w
