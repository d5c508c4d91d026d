"""Measurement workers on loopback (real `placer worker` subprocesses) and the RemotePool over them."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from placer.errors import MeasurementError
from placer.runtime.local import LocalRunner
from placer.runtime.remote import RemotePool
from placer.runtime.worker import serve
from runtime_util import mlp_graph, start_worker, stop_worker, write_file_graph


@pytest.fixture(scope="module")
def graph():
    # big enough that one measurement (runs=30) takes a noticeable fraction of a second
    return mlp_graph(width=384, batch=64, layers=3)


@pytest.fixture(scope="module")
def workers():
    procs = []
    try:
        for _ in range(2):
            procs.append(start_worker("--devices", "cpu:2"))
        yield procs
    finally:
        for p, _ in procs:
            stop_worker(p)


@pytest.fixture(scope="module")
def token_worker(tmp_path_factory):
    tok = tmp_path_factory.mktemp("tok") / "token"
    tok.write_text("s3cret-token\n")
    p, addr = start_worker("--devices", "cpu:1", "--token-file", str(tok))
    yield addr
    stop_worker(p)


def _placements(graph, k):
    split = (graph.colocation % 2).astype(np.int64)
    return [np.zeros(graph.num_ops, np.int64) if i % 2 == 0 else split for i in range(k)]


def test_two_workers_measure_like_local(graph, workers):
    addrs = [a for _, a in workers]
    with RemotePool(graph, addrs, "cpu:2", warmup=1, runs=3, timeout=120) as pool:
        outs = pool.evaluate(_placements(graph, 6))
    with LocalRunner(graph, "cpu:2", warmup=1, runs=3, timeout=120) as local:
        [ref] = local.evaluate(_placements(graph, 1))
    assert len(outs) == 6
    for o in outs:
        assert o.ok, o.reason
        assert type(o) is type(ref) and len(o.runs) == len(ref.runs) == 3
        assert all(r > 0 for r in o.runs) and o.step_time == pytest.approx(float(np.median(o.runs)))
        assert o.on_assigned_device == ref.on_assigned_device == 1.0
        assert o.peak_memory.shape == ref.peak_memory.shape == (2,)
    assert {o.worker for o in outs} == set(addrs)        # the batch was spread over both workers


def test_bad_placements_come_back_as_failed_outcomes(graph, workers):
    addrs = [a for _, a in workers]
    with RemotePool(graph, addrs, ["/CPU:0", "/CPU:1"], warmup=0, runs=1, timeout=120) as pool:
        far, short = np.full(graph.num_ops, 2, np.int64), np.zeros(3, np.int64)
        o_far, o_short, o_ok = pool.evaluate([far, short, np.zeros(graph.num_ops, np.int64)])
    assert o_far.failed and "device index 2" in o_far.reason
    assert o_short.failed and "ops" in o_short.reason
    assert o_ok.ok
    # a device the workers lack is not a per-placement failure: the workers are refused, naming it and the fix
    with RemotePool(graph, addrs, ["/CPU:0", "/GPU:0"], warmup=0, runs=1, timeout=120) as pool:
        with pytest.raises(MeasurementError, match=r"no measurement worker is alive.*has no device /GPU:0.*"
                                                   r"start it with --devices /CPU:0,/GPU:0"):
            pool.evaluate([np.zeros(graph.num_ops, np.int64)])
        assert all(w.measured == 0 for w in pool.workers)


def test_cluster_comes_from_the_devices_the_workers_report(graph, workers, monkeypatch):
    """(Before the kill test below, which stops the module's workers.) A client without the workers' devices (here: its own TF device list is off limits) builds the cluster from
    what the workers report when they load the graph; a device a worker lacks is an error naming both."""
    import placer.sim.cluster as sc
    from placer.errors import ClusterError

    def no_local(*_a, **_k):
        raise AssertionError("the local TensorFlow device list must not be consulted with --workers")

    monkeypatch.setattr(sc, "_local_tf_devices", no_local)
    addrs = [a for _, a in workers]
    with RemotePool(graph, addrs, ["/CPU:1", "/CPU:0"], warmup=0, runs=1, timeout=120) as pool:
        assert set(pool.reported_devices()) == set(addrs)
        c = pool.cluster()
        assert c.device_names == ["/CPU:1", "/CPU:0"] and all(d.kind == "cpu" for d in c.devices)
        [o] = pool.evaluate([np.zeros(graph.num_ops, np.int64)])     # index 0 = /CPU:1 on the worker
        assert o.ok and o.on_assigned_device == 1.0
    from placer.runtime import measured_cluster

    assert measured_cluster(graph, "/CPU:1", workers=addrs).device_names == ["/CPU:1"]
    with RemotePool(graph, addrs[:1], ["/CPU:0", "/GPU:0"], warmup=0, runs=1, timeout=120) as pool:
        with pytest.raises(ClusterError, match=f"worker {addrs[0]} has no device /GPU:0.*/CPU:1"):
            pool.cluster()


def test_wrong_token_is_refused(graph, token_worker):
    import grpc

    from placer.runtime import placer_pb2, placer_pb2_grpc

    with grpc.insecure_channel(token_worker) as ch:
        stub = placer_pb2_grpc.MeasurerStub(ch)
        for md in [(), (("x-placer-token", "wrong"),)]:
            with pytest.raises(grpc.RpcError) as e:
                stub.Health(placer_pb2.HealthRequest(), timeout=10, metadata=md)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = stub.Health(placer_pb2.HealthRequest(), timeout=10, metadata=(("x-placer-token", "s3cret-token"),))
        assert ok.ok and not ok.allow_unsafe_ops
    with RemotePool(graph, [token_worker], "cpu:1", token="nope", runs=1) as pool:
        with pytest.raises(MeasurementError, match="UNAUTHENTICATED"):
            pool.evaluate(_placements(graph, 1))


def test_file_writing_graph_is_refused(token_worker, tmp_path):
    target = tmp_path / "pwned.txt"
    g = write_file_graph(str(target))
    with RemotePool(g, [token_worker], "cpu:1", token="s3cret-token", runs=1, timeout=120) as pool:
        with pytest.raises(MeasurementError, match=r"PERMISSION_DENIED.*WriteFile.*--allow-unsafe-ops"):
            pool.evaluate([np.zeros(g.num_ops, np.int64)])
    assert not target.exists()


def test_non_loopback_needs_a_token():
    with pytest.raises(MeasurementError, match="without a token"):
        serve("0.0.0.0:0", block=False)
    with pytest.raises(MeasurementError, match="both"):
        serve("127.0.0.1:0", tls_cert="c.pem", block=False)


def test_killing_a_worker_mid_batch_still_returns_every_result(graph, workers):
    (pa, addr_a), (pb, addr_b) = workers
    pool = RemotePool(graph, [addr_a, addr_b], "cpu:2", warmup=1, runs=30, timeout=120, health_interval=3600)
    try:
        pool.evaluate(_placements(graph, 2))           # both loaded and warm
        wa = pool.workers[0]
        start = wa.measured

        def killer():
            deadline = time.monotonic() + 60
            while wa.measured <= start and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(pa.pid, signal.SIGKILL)            # A dies while it holds its next placement

        t = threading.Thread(target=killer)
        t.start()
        outs = pool.evaluate(_placements(graph, 10))
        t.join()
        assert len(outs) == 10 and all(o.ok for o in outs), [o.reason for o in outs if o.failed]
        assert all(o.on_assigned_device == 1.0 for o in outs)
        assert not wa.alive and pool.workers[1].alive
        out = [e for e in pool.events if e["event"] == "out"]                 # what a search's summary records
        assert [e["worker"] for e in out] == [addr_a] and out[0]["reason"] and out[0]["at_s"] > 0
        assert sum(o.worker == addr_b for o in outs) >= 6 and any(o.worker == addr_a for o in outs)
        # the last worker gone: the pool says so clearly
        os.kill(pb.pid, signal.SIGKILL)
        pb.wait(10)
        with pytest.raises(MeasurementError, match="no measurement worker is alive"):
            pool.evaluate(_placements(graph, 2))
    finally:
        pool.close()


def _tls_pair(tmp_path):
    """A self-signed certificate for localhost / 127.0.0.1 and its key (skips without openssl)."""
    import shutil
    import subprocess

    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make a test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    return key, cert


def test_tls_and_token_in_process(tmp_path):
    import grpc

    from placer.runtime import placer_pb2, placer_pb2_grpc

    key, cert = _tls_pair(tmp_path)
    w = serve("127.0.0.1:0", token="tok", tls_cert=str(cert), tls_key=str(key), block=False)
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"localhost:{w.port}", creds) as ch:
            stub = placer_pb2_grpc.MeasurerStub(ch)
            assert stub.Health(placer_pb2.HealthRequest(), timeout=10, metadata=(("x-placer-token", "tok"),)).ok
            with pytest.raises(grpc.RpcError) as e:
                stub.Health(placer_pb2.HealthRequest(), timeout=10, metadata=(("x-placer-token", "tak"),))
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(f"127.0.0.1:{w.port}") as ch:     # plaintext to a TLS port gets nowhere
            with pytest.raises(grpc.RpcError):
                placer_pb2_grpc.MeasurerStub(ch).Health(placer_pb2.HealthRequest(), timeout=3,
                                                        metadata=(("x-placer-token", "tok"),))
    finally:
        w.stop()


def test_search_and_place_measure_on_a_tls_worker(tmp_path, capsys):
    """`placer search --workers ... --tls-ca CERT` and `placer.place(..., workers=..., tls_ca=CERT)` measure on a
    worker started with TLS (neither could: only `placer measure` took the certificate, and the search said "no
    measurement worker is alive: ... DEADLINE_EXCEEDED"); place() builds its cluster from what the workers report,
    as the search does. The flag is stored for --resume."""
    import json

    import tensorflow as tf

    import placer
    from placer.cli import main

    key, cert = _tls_pair(tmp_path)
    tok = tmp_path / "token"
    tok.write_text("s3cret")
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 32], name="x")
        w = tf.compat.v1.get_variable("w", [32, 32])
        loss = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)), name="loss")
        tf.compat.v1.add_to_collection("train_op", tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss))
        meta = tmp_path / "mlp.meta"
        tf.compat.v1.train.export_meta_graph(filename=str(meta), graph=g)
    wk = serve("127.0.0.1:0", token="s3cret", tls_cert=str(cert), tls_key=str(key), devices="cpu:1", block=False)
    try:
        addr = f"localhost:{wk.port}"
        out = tmp_path / "run"
        argv = ["search", str(meta), "--devices", "/CPU:0", "--workers", addr, "--reward", "measure", "--tls-ca",
                str(cert), "--token-file", str(tok), "--max-updates", "0", "--warmup", "0", "--runs", "1",
                "--no-progress", "--out", str(out)]
        assert main(argv) == 0, capsys.readouterr().err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["reward"] == "measure" and summary["step_time_s"] > 0
        assert json.loads((out / "args.json").read_text())["tls_ca"] == str(cert)
        res = placer.place(str(meta), devices="/CPU:0", workers=[addr], reward="measure", tls_ca=str(cert),
                           token_file=str(tok), max_updates=0, budget_seconds=60)
        assert res.step_time > 0 and set(res.placement.mapping.values()) == {"/CPU:0"}
    finally:
        wk.stop()


@pytest.mark.slow
def test_restarted_worker_rejoins_and_gets_the_graph_again(graph):
    p, addr = start_worker("--devices", "cpu:1")
    port = addr.rsplit(":", 1)[1]
    pool = RemotePool(graph, [addr], "cpu:1", warmup=0, runs=1, timeout=120, health_interval=0)
    try:
        assert pool.evaluate(_placements(graph, 1))[0].ok
        stop_worker(p)
        with pytest.raises(MeasurementError, match="no measurement worker is alive"):
            pool.evaluate(_placements(graph, 1))
        p, _ = start_worker("--devices", "cpu:1", listen=f"127.0.0.1:{port}")
        [o] = pool.evaluate(_placements(graph, 1))     # health check revives it; LoadGraph is sent again
        assert o.ok and o.worker == addr and pool.workers[0].alive
    finally:
        pool.close()
        stop_worker(p)



def test_token_files_grpc_cannot_carry_are_refused_naming_the_file(graph, tmp_path):
    """A token file that is not UTF-8 gave a UnicodeDecodeError traceback; a token with a line break or a
    non-ASCII character was sent anyway and every call failed with "INTERNAL: Invalid metadata", blamed on the
    worker. Each is now one line naming the file (or the token), on the client and on the worker."""
    from placer.runtime import read_token

    for name, data, why in [("bin", b"\xff\xfe\x00", "not text"), ("lines", b"ab\ncd\n", r"'\\n' at position 2"),
                            ("accent", "s\u00e9cret\n".encode(), "printable ASCII"), ("empty", b" \n", "is empty")]:
        f = tmp_path / name
        f.write_bytes(data)
        with pytest.raises(MeasurementError, match=f"token file {f}.*{why}"):
            read_token(str(f))
    (tmp_path / "ok").write_text(" s3cret \n")
    assert read_token(str(tmp_path / "ok")) == "s3cret"
    with pytest.raises(MeasurementError, match="printable ASCII"):
        RemotePool(graph, ["127.0.0.1:1"], token="a\tb")
    with pytest.raises(MeasurementError, match="printable ASCII"):
        serve("127.0.0.1:0", token="s\u00e9cret", block=False)


def test_a_worker_refuses_a_port_in_use_and_says_why_it_cannot_listen():
    """A second worker on a port in use started "listening" (gRPC's SO_REUSEPORT: two workers shared the port,
    each client landing on either); a bind gRPC refused by raising (an address not of this host) was a
    RuntimeError traceback. Both are one line with the OS's reason."""
    w = serve("127.0.0.1:0", block=False)
    try:
        with pytest.raises(MeasurementError, match=f"cannot listen on 127.0.0.1:{w.port}: .*in use"):
            serve(f"127.0.0.1:{w.port}", block=False).stop()
    finally:
        w.stop()
    with pytest.raises(MeasurementError, match="cannot listen on 192.0.2.1:50051: .*address"):
        serve("192.0.2.1:50051", token="t", block=False).stop()


def test_an_unreachable_worker_is_out_with_the_connection_error(graph):
    """A worker address where nothing listens was out with "DEADLINE_EXCEEDED: Deadline Exceeded" (the probe
    waits for the channel to be ready, and it never is): the reason is now the channel's own (refused)."""
    import socket

    with socket.socket() as s:          # a port nothing listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        with RemotePool(graph, [addr], "cpu:1", runs=1) as pool:
            with pytest.raises(MeasurementError, match=f"{addr}: UNAVAILABLE: .*(refused|failed to connect)"):
                pool.check_devices()
    with pytest.raises(MeasurementError, match="worker address 127.0.0.1:1 is listed twice"):
        RemotePool(graph, ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"])
