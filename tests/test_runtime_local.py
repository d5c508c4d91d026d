"""LocalRunner on logical CPU devices: real TF measurements in a child process."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from placer.errors import MeasurementError
from placer.runtime.devices import canonical_device, cpu_split, parse_devices
from placer.runtime.local import LocalRunner
from placer.sim.evaluator import Outcome
from runtime_util import hang_graph, mlp_graph, oom_graph


@pytest.fixture(scope="module")
def mlp():
    return mlp_graph()


@pytest.fixture(scope="module")
def runner(mlp):
    # /GPU:0 is listed but absent on this machine: placements using it must fail cleanly
    r = LocalRunner(mlp, ["/CPU:0", "/CPU:1", "/GPU:0"], warmup=1, runs=3, timeout=60)
    yield r
    r.close()


def test_device_names():
    assert parse_devices("cpu:3") == ["/CPU:0", "/CPU:1", "/CPU:2"]
    assert parse_devices("/gpu:0, /device:CPU:0") == ["/GPU:0", "/CPU:0"]
    assert canonical_device("/job:localhost/replica:0/task:0/device:CPU:1") == "/CPU:1"
    assert canonical_device("/job:worker/replica:0/task:1/device:GPU:0") == "/job:worker/replica:0/task:1/device:GPU:0"
    assert cpu_split(["/GPU:0", "/CPU:0", "/CPU:3"]) == 4


def test_a_cpu_split_too_large_is_one_line(capsys):
    """--devices cpu:99999 was a MemoryError traceback (a 99999 x 99999 link matrix): now one line naming it."""
    from placer.cli import main
    from placer.errors import ClusterError

    assert len(parse_devices("cpu:1024")) == 1024
    with pytest.raises(ClusterError, match="--devices 'cpu:1025': the CPU can be split into at most 1024"):
        parse_devices("cpu:1025")
    assert main(["measure", "--model", "rnnlm", "--size", "tiny", "--devices", "cpu:99999", "--json"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "cpu:99999" in cap.err and "Traceback" not in cap.err


def test_measures_small_graph_on_two_logical_cpus(runner, mlp):
    split = (mlp.colocation % 2).astype(np.int64)          # co-location groups alternate between /CPU:0 and /CPU:1
    assert set(split) == {0, 1}
    outs = runner.evaluate([np.zeros(mlp.num_ops, np.int64), split])
    for o in outs:
        assert isinstance(o, Outcome) and o.ok, o.reason
        assert len(o.runs) == 3 and all(r > 0 for r in o.runs)
        assert o.step_time == pytest.approx(float(np.median(o.runs)))
        assert o.on_assigned_device == 1.0
    # nothing was rewritten away: every op the train step needs ran under its own name (fed placeholders aside)
    need, stack = set(), [mlp.index("train")]
    preds: dict[int, list[int]] = {}
    for s, d in list(zip(mlp.edge_src, mlp.edge_dst)) + list(zip(mlp.ctrl_src, mlp.ctrl_dst)):
        preds.setdefault(int(d), []).append(int(s))
    while stack:
        i = stack.pop()
        if i not in need:
            need.add(i)
            stack.extend(preds.get(i, []))
    expected = sum(1 for i in need if mlp.types[i] != "Placeholder")
    assert outs[1].executed == expected
    # the single-device placement allocated nothing on /CPU:1; the split one used both devices
    assert outs[0].peak_memory[1] == 0 and outs[1].peak_memory[:2].min() > 0
    assert runner.available == ["/CPU:0", "/CPU:1"]


def test_nonexistent_device_is_a_failed_outcome(runner, mlp):
    [o] = runner.evaluate([np.full(mlp.num_ops, 2, np.int64)])
    assert o.failed and not o.oom
    assert "/GPU:0" in o.reason and "/CPU:0" in o.reason
    [ok] = runner.evaluate([np.zeros(mlp.num_ops, np.int64)])      # the CPU placement still measures
    assert ok.ok and ok.step_time > 0


def test_bad_placements_are_failed_outcomes(runner, mlp):
    n = mlp.num_ops
    out_of_range, short = np.full(n, 5), np.zeros(n - 1, np.int64)
    # splitting a co-location group (a variable and its Assign) is refused by TF without soft placement
    var = mlp.index("w0")
    split = np.zeros(n, np.int64)
    split[var] = 1
    o1, o2, o3 = runner.evaluate([out_of_range, short, split])
    assert o1.failed and "device index 5" in o1.reason
    assert o2.failed and "ops" in o2.reason
    assert o3.failed and o3.reason and "Traceback" not in o3.reason
    assert runner.evaluate([np.zeros(n, np.int64)])[0].ok


# the same cut (the parent's wait on the child times out and kills it, whatever the child is doing) is default in
# test_dead_child_is_replaced and test_runtime_faults' baseline-failure test; a child in a real hung TF step in
# test_child_never_outlives_its_parent
@pytest.mark.slow     # ~8 s: a real hung TF step cut by the timeout (make test-slow)
def test_hanging_step_is_cut_by_the_timeout():
    g = hang_graph()
    with LocalRunner(g, "cpu:1", warmup=0, runs=1, timeout=4) as r:
        r.start()
        t = time.perf_counter()
        [o] = r.evaluate([np.zeros(g.num_ops, np.int64)])
        took = time.perf_counter() - t
    assert o.failed and "timed out after 4 s" in o.reason
    assert 3.5 < took < 20


def test_out_of_memory_is_a_failed_outcome(monkeypatch):
    # the child without oneDNN: its CPU allocator (a BFC allocator) waits 10 s for memory before it reports the
    # OOM; TF's plain CPU allocator reports the same ResourceExhaustedError at once
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    g = oom_graph()
    with LocalRunner(g, "cpu:1", warmup=0, runs=1, timeout=60) as r:
        [o] = r.evaluate([np.zeros(g.num_ops, np.int64)])
    assert o.failed and o.oom and "OOM" in o.reason and "'big'" in o.reason
    assert o.reason.startswith("out of memory on /CPU:0: needs 4.0 TiB for one tensor")  # device and bytes first


def test_ctrl_c_is_for_the_parent_not_the_measurement_child(runner, mlp):
    """A terminal's Ctrl-C (SIGINT to the whole process group) does not cut the child's measurement: the search
    in the parent finishes its step and checkpoints, and that step's placements are not failures."""
    assert runner.evaluate([np.zeros(mlp.num_ops, np.int64)])[0].ok
    pid = runner._child.proc.pid
    threading.Timer(0.5, lambda: os.kill(pid, signal.SIGINT)).start()
    o = runner.debug_sleep(1.5)
    assert o.ok and runner._child is not None and runner._child.proc.pid == pid


def test_dead_child_is_replaced(runner, mlp):
    zero = np.zeros(mlp.num_ops, np.int64)
    assert runner.evaluate([zero])[0].ok
    started = runner.stats["children_started"]
    # a crash in the middle of a measurement: kill the child while it is busy
    pid = runner._child.proc.pid
    threading.Timer(1.0, lambda: os.kill(pid, signal.SIGKILL)).start()
    o = runner.debug_sleep(30)
    assert o.failed and "SIGKILL" in o.reason
    # a hang (sleep stands in for a stuck TF call) under a short timeout
    runner.evaluate([zero])
    old, runner.timeout = runner.timeout, 2.0
    try:
        o = runner.debug_sleep(30)
    finally:
        runner.timeout = old
    assert o.failed and "timed out" in o.reason
    o = runner.evaluate([zero])[0]
    assert o.ok and o.on_assigned_device == 1.0
    assert runner.stats["children_started"] == started + 2


def test_graph_without_tf_is_rejected():
    from placer.graphs.opgraph import OpGraph

    g = OpGraph.build([("a", "Const", 4)])
    with pytest.raises(MeasurementError, match="no runnable"):
        LocalRunner(g, "cpu:1")


@pytest.mark.parametrize("kw, match", [(dict(runs=0), "runs >= 1"), (dict(warmup=-1), "warmup >= 0"),
                                       (dict(timeout=0), "--timeout must be positive"),
                                       (dict(timeout=-1), "--timeout must be positive")])
def test_settings_that_measure_nothing_are_refused(mlp, kw, match):
    """--runs 0, --warmup -1, --timeout 0: one error naming the setting, before any child starts (a timeout of 0
    or less made every measurement a failed placement; `search --runs 0` was silently run with 1)."""
    from placer.runtime.remote import RemotePool

    with pytest.raises(MeasurementError, match=match):
        LocalRunner(mlp, "cpu:1", **kw)
    with pytest.raises(MeasurementError, match=match):
        RemotePool(mlp, ["127.0.0.1:1"], "cpu:1", **kw)


@pytest.mark.parametrize("flag, match", [("--runs", "runs >= 1"), ("--timeout", "--timeout must be positive")])
def test_search_cli_passes_runs_and_timeout_as_given(tmp_path, capsys, flag, match):
    """`placer search --reward measure --runs 0` / `--timeout 0` reach the runner's check: one line, exit 2 (they
    were replaced by the defaults 1 / 600 s, the bad flag silently ignored)."""
    from placer.cli import main

    rc = main(["search", "--model", "rnnlm", "--size", "tiny", "--devices", "cpu:1", "--reward", "measure", flag,
               "0", "--budget", "5", "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and match in err and "Traceback" not in err


def test_child_never_outlives_its_parent(tmp_path):
    """A search killed with SIGKILL leaves no TF process behind, even one busy in a hung step."""
    import subprocess
    import sys

    # the graph is built here and read from a file there: the parent itself never imports TensorFlow
    hang_graph().save(tmp_path / "hang.npz")
    script = tmp_path / "parent.py"
    script.write_text(
        "import numpy as np\n"
        "from placer.graphs.opgraph import OpGraph\n"
        "from placer.runtime.local import LocalRunner\n"
        f"g = OpGraph.load({str(tmp_path / 'hang.npz')!r})\n"
        "r = LocalRunner(g, 'cpu:1', timeout=600).start()\n"
        "print(r._child.proc.pid, flush=True)\n"
        "r.evaluate([np.zeros(g.num_ops, int)])\n")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        child = int(p.stdout.readline())
        time.sleep(1.0)                      # the child is now blocked inside the hanging step
        os.kill(child, 0)
    finally:
        p.kill()
        p.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the measurement child outlived its parent")


@pytest.mark.parametrize("addr", ["notanaddr", "127.0.0.1", "host:0", "host:99999", "127.0.0.1:50051/x"])
def test_a_worker_address_that_is_no_host_port_is_one_line_naming_it(mlp, addr):
    """`--workers notanaddr` named nothing useful (the first measurement said DEADLINE_EXCEEDED after its
    deadline): the pool refuses it when built, naming the address, before any connection is tried."""
    from placer.runtime.remote import RemotePool

    with pytest.raises(MeasurementError, match=f"worker address {addr!r} is not HOST:PORT"):
        RemotePool(mlp, ["127.0.0.1:1", addr], "cpu:1")
