"""Faults survived and failures told truly (issue 16): a device-mismatched worker is refused when the pool connects,
failure reasons travel into summary.json and the CLI table, a restarted worker is re-checked and used again."""
from __future__ import annotations

import json

import numpy as np
import pytest

from placer.errors import MeasurementError
from placer.runtime.remote import DeviceMismatch, RemotePool, devices_flag, missing_devices_message
from runtime_util import mlp_graph, start_worker, stop_worker


@pytest.fixture(scope="module")
def graph():
    return mlp_graph(width=32, layers=2)


def test_missing_devices_message_names_the_place_the_devices_and_the_fix():
    assert devices_flag(["/CPU:0", "/CPU:1"]) == "cpu:2"
    assert devices_flag(["/GPU:0", "/CPU:0"]) == "/GPU:0,/CPU:0"
    msg = missing_devices_message("worker 127.0.0.1:1", ["/CPU:0", "/CPU:1", "/CPU:2"], ["/device:CPU:0"])
    assert msg == ("worker 127.0.0.1:1 has no device /CPU:1, /CPU:2 (it reports: /CPU:0): "
                   "start it with --devices cpu:3")
    assert missing_devices_message("w", ["/CPU:0"], ["/CPU:0", "/CPU:1"]) is None


def test_device_mismatched_worker_is_refused_before_any_work(graph):
    """A worker started without --devices has only /CPU:0: a pool that needs cpu:2 refuses it when it connects,
    in one line naming the worker, the missing device and the fix; nothing is measured."""
    from placer.runtime import make_evaluator

    p, addr = start_worker()                 # no --devices: /CPU:0 only
    try:
        with pytest.raises(DeviceMismatch) as ei:
            make_evaluator(graph, "cpu:2", workers=addr, warmup=0, runs=1, timeout=120)
        msg = str(ei.value)
        assert "\n" not in msg
        assert f"worker {addr} has no device /CPU:1" in msg and "start it with --devices cpu:2" in msg
        assert isinstance(ei.value, MeasurementError)
        # the cluster path of `placer search --workers` / `placer measure --workers` refuses the same way
        with RemotePool(graph, [addr], "cpu:2", warmup=0, runs=1, timeout=120) as pool:
            with pytest.raises(DeviceMismatch, match=f"worker {addr} has no device /CPU:1.*--devices cpu:2"):
                pool.cluster()
            assert pool.workers[0].measured == 0 and not pool.workers[0].alive
        # the devices it has are fine
        with make_evaluator(graph, "cpu:1", workers=addr, warmup=0, runs=1, timeout=120) as ev:
            [o] = ev.evaluate([np.zeros(graph.num_ops, np.int64)])
            assert o.ok
    finally:
        stop_worker(p)


def test_local_device_tf_lacks_is_refused_up_front(graph):
    from placer.runtime import make_evaluator

    with pytest.raises(MeasurementError, match=r"this machine's TensorFlow has no device /GPU:7 .*--devices"):
        make_evaluator(graph, "/CPU:0,/GPU:7", warmup=0, runs=1, timeout=120)


def test_baseline_failure_reasons_reach_summary_and_table(graph, tmp_path, capsys):
    """A measured search in which one baseline's measurement hangs (cut at the timeout: a real killed child):
    summary.json's baseline_errors carries the timeout reason, and the CLI table prints it (not 'out of memory')."""
    from placer.cli.search import _print_summary
    from placer.problem import build_problem
    from placer.runtime.local import LocalRunner
    from placer.search import search

    problem = build_problem(graph, devices="cpu:2", seed=0)
    bl = {k: np.asarray(v) for k, v in problem.baselines.items()}
    unique = [k for k in sorted(bl) if sum(np.array_equal(bl[k], v) for v in bl.values()) == 1]
    assert unique, f"no baseline with a placement of its own among {sorted(bl)}"
    victim = unique[0]
    target = bl[victim]          # baselines are op -> device index arrays, evaluated as they are

    class HangsOnOne(LocalRunner):
        """Measures for real; the victim baseline's placement hangs in the child until the runner's timeout."""

        def measure(self, placement, **kw):
            if np.array_equal(np.asarray(placement), np.asarray(target)):
                return self.debug_sleep(self.timeout + 30)
            return super().measure(placement, **kw)

    ev = HangsOnOne(graph, problem.device_names, warmup=0, runs=1, timeout=5)
    try:
        search(problem, ev, reward="measure", budget_seconds=120, max_updates=0, out_dir=tmp_path,
               remeasure=False)
    finally:
        ev.close()
        problem.close()
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["baselines"][victim] is None
    why = s["baseline_errors"][victim]
    assert why.startswith("timed out after 5 s") and "memory" not in why
    assert any(v is not None for v in s["baselines"].values())      # the others were measured
    _print_summary(s, tmp_path)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith(victim))
    assert "timed out after 5 s" in line and "out of memory" not in line


def test_restarted_worker_is_rechecked_and_rejoins(graph):
    """Two workers; one is killed and restarted at the same port: the pool re-checks its devices and graph and
    measures on it again. Restarted without the needed devices, it is kept out with the reason and the fix."""
    import signal
    import time

    pa, addr_a = start_worker("--devices", "cpu:2")
    pb, addr_b = start_worker("--devices", "cpu:2")
    port_a = addr_a.rsplit(":", 1)[1]
    pool = RemotePool(graph, [addr_a, addr_b], "cpu:2", warmup=0, runs=1, timeout=120, health_interval=0)
    placements = [np.zeros(graph.num_ops, np.int64)] * 4
    try:
        pool.check_devices()
        assert all(o.ok for o in pool.evaluate(placements))
        pa.send_signal(signal.SIGKILL)
        pa.wait(timeout=20)
        outs = pool.evaluate(placements)                       # the survivor takes the whole batch
        assert all(o.ok and o.worker == addr_b for o in outs) and not pool.workers[0].alive
        pa, _ = start_worker("--devices", "cpu:1", listen=f"127.0.0.1:{port_a}")    # back, but one CPU short
        for _ in range(20):             # probed in the background: it answers, is re-checked, and is kept out
            outs = pool.evaluate(placements)
            assert all(o.ok and o.worker == addr_b for o in outs)
            if "has no device" in pool.workers[0].reason:
                break
            time.sleep(0.5)
        assert not pool.workers[0].alive and "has no device /CPU:1" in pool.workers[0].reason
        assert "--devices cpu:2" in pool.workers[0].reason
        stop_worker(pa)
        pa, _ = start_worker("--devices", "cpu:2", listen=f"127.0.0.1:{port_a}")    # back as it was
        before = pool.workers[0].measured
        for _ in range(20):
            outs = pool.evaluate(placements)
            assert all(o.ok for o in outs)
            if pool.workers[0].measured > before:
                break
            time.sleep(0.5)
        assert pool.workers[0].alive and pool.workers[0].measured > before
        assert any(o.worker == addr_a for o in outs)
    finally:
        pool.close()
        stop_worker(pa)
        stop_worker(pb)


@pytest.mark.slow     # ~15-55 s: a hang is cut by a deadline (make test-slow)
def test_hung_worker_is_cut_by_the_heartbeat_and_its_placements_go_elsewhere(graph):
    """SIGSTOP of one of two workers mid-batch (a hang): the health heartbeat cuts it within seconds, not at the
    RPC deadline, and the other worker measures every placement."""
    import signal
    import threading
    import time

    pa, addr_a = start_worker("--devices", "cpu:2")
    pb, addr_b = start_worker("--devices", "cpu:2")
    pool = RemotePool(graph, [addr_a, addr_b], "cpu:2", warmup=0, runs=3, timeout=120, heartbeat=1.0,
                      heartbeat_misses=2, health_interval=3600)
    stopped = threading.Event()
    try:
        pool.check_devices()

        def stopper():
            while pool.workers[0].measured < 1:
                time.sleep(0.05)
            pa.send_signal(signal.SIGSTOP)
            stopped.set()

        t = threading.Thread(target=stopper, daemon=True)
        t.start()
        t0 = time.monotonic()
        outs = pool.evaluate([np.zeros(graph.num_ops, np.int64)] * 12)
        wall = time.monotonic() - t0
        t.join(5)
        assert stopped.is_set() and all(o.ok for o in outs) and len(outs) == 12
        assert not pool.workers[0].alive and "stopped answering" in pool.workers[0].reason
        assert wall < 60, f"the hang was cut after {wall:.0f} s"
    finally:
        pool.close()
        pa.send_signal(signal.SIGCONT)
        stop_worker(pa)
        stop_worker(pb)
