"""TF cluster devices: `placer cluster up/down`, TFClusterRunner, `placer calibrate`, the tasks file's bad input.

Every TF server here is started by the test itself on 127.0.0.1 and stopped by the PIDs it started, also when the
test fails (fixtures with finally). One 2-task cluster is shared by the module; the up/down and kill tests make
their own, except the killed-search test, which kills a task of the shared cluster and so comes last.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

from placer.cli import main
from placer.errors import ClusterError, MeasurementError, PlacementError
from placer.runtime.servers import cluster_down, cluster_up, listening_addresses
from placer.runtime.tfcluster import TFClusterRunner
from placer.tasks import TasksFileError, load_tasks
from runtime_util import mlp_graph


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def _kill_all(pids) -> None:
    """Last resort for a fixture: SIGKILL the PIDs this test started (if they are still ours)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"placer.runtime._task" not in f.read():
                    continue
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def _need_cores(n: int) -> None:
    """Skip (not fail) where this process may not use a core per task (a CI runner or `taskset` with fewer)."""
    if len(os.sched_getaffinity(0)) < n:
        pytest.skip(f"a cluster of {n} tasks needs {n} cores (one per task); this process may use "
                    f"{len(os.sched_getaffinity(0))}")


def _tf_cluster(path, n=2):
    """Start an n-task cluster; yield its TasksFile; stop it (by its PIDs) whatever happened."""
    _need_cores(n)
    tasks = None
    try:
        tasks = cluster_up(n, path)
        yield tasks
    finally:
        if tasks is not None:
            pids = [t.pid for t in tasks.tasks]
            try:
                cluster_down(path)
            finally:
                _kill_all(pids)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    yield from _tf_cluster(tmp_path_factory.mktemp("tfc") / "c.json")


@pytest.fixture(scope="module")
def mlp():
    return mlp_graph()


@pytest.fixture(scope="module")
def mlp_meta(mlp, tmp_path_factory):
    """The small MLP as a graph file for `placer search`: its placements measure in ~0.1 s on the tasks (tiny
    NMT's take ~1 s), so the measured searches below spend their time searching, not waiting."""
    path = tmp_path_factory.mktemp("g") / "mlp.meta"
    path.write_bytes(mlp.meta_graph)
    return str(path)


def _one_line_error(capsys, rc):
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ---- cluster up / down --------------------------------------------------------------------------------------------
def test_cluster_up_and_down_leave_no_process(tmp_path, capsys, monkeypatch):
    _need_cores(2)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.json"
    pids = []
    try:
        assert main(["cluster", "up", "--tasks", "2", "--out", "c.json"]) == 0      # relative, from tmp_path
        obj = json.loads(path.read_text())
        assert obj["format"] == 1 and obj["job"] == "worker" and len(obj["tasks"]) == 2
        pids = [t["pid"] for t in obj["tasks"]]
        for k, t in enumerate(obj["tasks"]):
            assert set(t) >= {"address", "pid", "cores", "devices"}
            assert t["address"].startswith("127.0.0.1:") and isinstance(t["pid"], int)
            assert t["devices"] == [f"/job:worker/replica:0/task:{k}/device:CPU:0"]
            # its log named absolutely (it was relative to where `cluster up` ran, wrong read from elsewhere)
            assert t["log"] == str(tmp_path / f"c.task{k}.log") and os.path.isfile(t["log"])
            # pinned to its own cores, serving on loopback only, surviving the command (it runs detached)
            assert os.sched_getaffinity(t["pid"]) == set(t["cores"])
            port = int(t["address"].rsplit(":", 1)[1])
            addrs = listening_addresses(port)
            assert addrs and all(a.startswith("127.") for a in addrs), addrs
            assert os.getsid(t["pid"]) == t["pid"]
        assert not set(obj["tasks"][0]["cores"]) & set(obj["tasks"][1]["cores"])
        capsys.readouterr()
        assert main(["cluster", "down", str(path)]) == 0
        assert capsys.readouterr().out.count(": stopped") == 2
        assert all(_gone(p) for p in pids)
        assert main(["cluster", "down", str(path)]) == 0          # again: nothing to stop, nothing else touched
        assert capsys.readouterr().out.count("not running") == 2
    finally:
        _kill_all(pids)


def _tasks_logging_to(log) -> list[int]:
    """PIDs of the processes whose stdout is the file `log` (a task's log: only this test's tasks write there)."""
    out = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and os.readlink(f"/proc/{d}/fd/1") == str(log) and not _gone(int(d)):
                out.append(int(d))
        except OSError:
            pass
    return out


def test_a_cluster_that_does_not_serve_in_time_leaves_no_task_running(tmp_path):
    """`cluster up --timeout 0` said "task(s) [0] did not serve within 0 s" and left the task serving (its pid,
    written on the ready pipe, was never read), with no tasks file for `cluster down` to stop it by."""
    _need_cores(1)
    path = tmp_path / "c.json"
    try:
        with pytest.raises(ClusterError, match=r"task\(s\) \[0\] did not serve within 0 s"):
            cluster_up(1, path, timeout=0)
        assert _tasks_logging_to(tmp_path / "c.task0.log") == [] and not path.exists()
    finally:
        _kill_all(_tasks_logging_to(tmp_path / "c.task0.log"))


def test_cluster_up_never_overwrites_a_file_that_is_no_tasks_file(tmp_path, capsys):
    """`placer cluster up --out placement.json` (a slip) replaced the search's placement file with a tasks file."""
    path = tmp_path / "placement.json"
    text = json.dumps({"format": 1, "graph_fingerprint": "f", "devices": ["/CPU:0"], "placement": {"a": "/CPU:0"}})
    path.write_text(text)
    try:
        err = _one_line_error(capsys, main(["cluster", "up", "--tasks", "1", "--out", str(path)]))
        assert f"--out {path}: {path} is a placement file" in err and "will not overwrite it" in err
        assert path.read_text() == text and not (tmp_path / "placement.task0.log").exists()
    finally:
        _kill_all(_tasks_logging_to(tmp_path / "placement.task0.log"))


def test_port_in_use_and_too_many_cores_are_one_line_errors(tmp_path, capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        port = s.getsockname()[1]
        err = _one_line_error(capsys, main(["cluster", "up", "--tasks", "1", "--port", str(port),
                                            "--out", str(tmp_path / "x.json")]))
        assert f"127.0.0.1:{port}" in err and "in use" in err
    finally:
        s.close()
    n = len(os.sched_getaffinity(0)) + 1
    err = _one_line_error(capsys, main(["cluster", "up", "--tasks", str(n), "--cores-per-task", "1",
                                        "--out", str(tmp_path / "y.json")]))
    assert "--share-cores" in err
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()


# ---- measuring on the tasks ---------------------------------------------------------------------------------------
def test_measure_cli_round_robin_runs_on_both_tasks(tasks, capsys):
    rc = main(["measure", "--model", "nmt", "--size", "tiny", "--devices", tasks.path, "--placement", "round_robin",
               "--runs", "3", "--warmup", "1", "--json"])
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and obj["error"] is None, obj
    assert obj["on_assigned_device"] == 1.0
    assert len(obj["runs_s"]) == 3 and obj["step_time_s"] == pytest.approx(float(np.median(obj["runs_s"])))


def test_runner_places_ops_on_their_tasks(tasks, mlp):
    from placer.api import resolve_placement
    from placer.sim.cluster import cluster_from_devices

    cluster = cluster_from_devices(tasks.path)
    assert cluster.device_names == tasks.devices and all(d.kind == "cpu" for d in cluster.devices)
    single = resolve_placement("single", mlp, cluster)
    assert set(single) == {0}                                       # `single`: everything on task 0
    split = (mlp.colocation % 2).astype(np.int64)
    with TFClusterRunner(mlp, tasks.path, warmup=1, runs=3, timeout=60) as r:
        assert r.devices == tasks.devices
        one, two = r.evaluate([single, split])
    for o in (one, two):
        assert o.ok, o.reason
        assert o.on_assigned_device == 1.0 and len(o.runs) == 3
    assert one.peak_memory[0] > 0 and one.peak_memory[1] == 0
    assert two.peak_memory.min() > 0                                # ops ran (and allocated) on both tasks
    assert set(two.peak_by_device) == set(tasks.devices)


def test_killed_task_is_a_failed_outcome_naming_it(tmp_path, mlp):
    for tf_ in _tf_cluster(tmp_path / "k.json"):
        victim = tf_.tasks[1]
        split = (mlp.colocation % 2).astype(np.int64)
        with TFClusterRunner(mlp, tf_, warmup=1, runs=100000, timeout=60) as r:
            r.start()
            killer = threading.Timer(1.0, os.kill, (victim.pid, signal.SIGKILL))
            killer.start()
            t0 = time.perf_counter()
            try:
                [out] = r.evaluate([split])
            finally:
                killer.cancel()
            assert time.perf_counter() - t0 < 30
            assert out.failed and "task 1" in out.reason and str(victim.pid) in out.reason, out.reason
            [again] = r.evaluate([split])                           # at once, without a session
            assert again.failed and "task 1" in again.reason
        assert _gone(victim.pid)


# ---- calibration --------------------------------------------------------------------------------------------------
def test_calibrate_fits_links_and_writes_files_the_simulator_reads(tasks, mlp, tmp_path, monkeypatch):
    import functools

    import placer.runtime.calibrate as cal
    from placer.runtime.calibrate import calibrate
    from placer.sim.cluster import parse_cluster
    from placer.sim.costs import CostTable
    from placer.sim.simulator import Simulator

    # the compute-sharing measurement (two MatMul chains) in one round of one timed run, not 3 x 3: it is most of
    # calibrate's time, and only its shape is checked here
    monkeypatch.setattr(cal, "compute_sharing", functools.partial(cal.compute_sharing, rounds=1, runs=1))
    summary = calibrate(mlp, tasks.path, tmp_path / "cal", sizes=(1024, 65536, 1 << 20, 4 << 20), link_runs=5,
                        profile_runs=2, timeout=120)
    sharing = summary["compute_sharing"]
    assert sharing["runs"] == [1, 1] and sharing["one_task_s"] > 0 and sharing["split_s"] > 0
    assert 0 < sharing["shared_speed"] <= 1.0
    assert len(summary["links"]) == 2                               # task 0 -> 1 and 1 -> 0
    for ln in summary["links"]:
        assert np.isfinite(ln["latency_s"]) and 1e-7 < ln["latency_s"] < 0.1, ln
        assert np.isfinite(ln["bandwidth_Bps"]) and 1e6 < ln["bandwidth_Bps"] < 1e12, ln
    obj = json.loads((tmp_path / "cal" / "cluster.json").read_text())
    assert obj["links"][0][0] is None and obj["links"][0][1]["shared"] is None
    assert [d["concurrency"] for d in obj["devices"]] == [len(t.cores) for t in tasks.tasks]
    c = parse_cluster(str(tmp_path / "cal" / "cluster.json"))
    assert c.device_names == tasks.devices
    assert c.latency[0, 1] == pytest.approx(obj["links"][0][1]["latency_s"])
    assert c.bandwidth[1, 0] == pytest.approx(obj["links"][1][0]["bandwidth_Bps"])
    costs = CostTable.load(tmp_path / "cal" / "costs.json", mlp)
    assert costs.source == "profiled" and costs.kinds == ["cpu"]
    sim = Simulator(mlp, c, costs)
    one = sim.simulate(np.zeros(mlp.num_ops, np.int64)).step_time
    split = sim.simulate((mlp.colocation % 2).astype(np.int64)).step_time
    assert 0 < one < split                                         # crossing tasks costs gRPC time
    # the machine fit of `calibrate --fit-placements`: measured placements, the fitted figures in the cluster
    from placer.runtime.calibrate import fit_to_placements
    from placer.sim.fit import CPU_COPY, SHARED_SPEEDS, with_machine

    fit = fit_to_placements(mlp, tasks.path, obj, tmp_path / "cal" / "costs.json", 5, rounds=1, runs=2, timeout=120)
    assert fit["shared_speed"] in SHARED_SPEEDS and fit["cpu_copy"] in CPU_COPY and fit["median_abs_log_err"] >= 0
    assert len(fit["placements"]) == 5 and all(p["measured_s"] > 0 and p["simulated_s"] > 0 for p in fit["placements"])
    assert {"all_on_0", "all_on_1"} <= {p["source"] for p in fit["placements"]} or len(
        {p["source"] for p in fit["placements"]}) == 5
    fitted = parse_cluster_dict(with_machine(obj, fit["shared_speed"], fit["cpu_copy"]))
    assert fitted.device_names == tasks.devices


def parse_cluster_dict(obj):
    from placer.sim.cluster import cluster_from_dict

    return cluster_from_dict(obj, "fitted")


# ---- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, words", [
    ("{not json", "not valid JSON"),
    ('{"format": 1, "job": "worker"}', "expected"),
    ('{"format": 1, "job": "worker", "tasks": [{"address": "127.0.0.1", "pid": null, "cores": [], '
     '"devices": ["/job:worker/replica:0/task:0/device:CPU:0"]}]}', "HOST:PORT"),
    ('{"format": 1, "job": "worker", "tasks": [{"address": "127.0.0.1:1234", "pid": null, "cores": [], '
     '"devices": ["/job:worker/replica:0/task:3/device:CPU:0"]}]}', "not a device of"),
    ('{"format": 1, "devices": [{"name": "/CPU:0", "kind": "cpu"}]}', "--cluster"),
    ('{"format": 1, "graph_fingerprint": "f", "devices": ["/CPU:0"], "placement": {"a": "/CPU:0"}}',
     "is a placement file (op → device), not a tasks file"),           # it said "a cluster JSON"
    ('{"format": 1, "job": "worker", "tasks": [{"address": "127.0.0.1:1234", "pid": 1180591620717411303424, '
     '"cores": [], "devices": ["/job:worker/replica:0/task:0/device:CPU:0"]}]}',
     "is not a process id"),                                           # OverflowError traceback from os.kill
])
def test_malformed_tasks_file_is_a_one_line_error(tmp_path, capsys, text, words):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(TasksFileError, match=str(p)):
        load_tasks(p)
    err = _one_line_error(capsys, main(["measure", "--model", "nmt", "--size", "tiny", "--devices", str(p)]))
    assert str(p) in err and words in err


def test_tasks_file_save_to_an_unwritable_path_is_one_line_naming_it(tmp_path):
    """TasksFile.save raised the OS's error naming `PATH.tmp` (and a directory at PATH kept PATH.tmp), as
    Placement.save did: both write through placer.errors.write_text_atomic now."""
    from placer.errors import OutputError
    from placer.tasks import tasks_from_dict

    task = {"address": "127.0.0.1:1234", "pid": None, "cores": [0],
            "devices": ["/job:worker/replica:0/task:0/device:CPU:0"]}
    tf = tasks_from_dict({"format": 1, "job": "worker", "tasks": [task]})
    (tmp_path / "adir").mkdir()
    with pytest.raises(OutputError, match=f"tasks file {tmp_path / 'adir'}: cannot write it: "):
        tf.save(tmp_path / "adir")
    assert not any((tmp_path / "adir").iterdir()) and [x.name for x in tmp_path.iterdir()] == ["adir"]
    tf.save(tmp_path / "t.json")
    assert load_tasks(tmp_path / "t.json").tasks[0].address == "127.0.0.1:1234"


@pytest.mark.parametrize("flags, message", [(["--tasks", "0"], "--tasks 0: need at least one task"),
                                            (["--tasks", "1", "--cores-per-task", "0"],
                                             "--cores-per-task 0: need at least one core per task")])
def test_cluster_up_names_the_flag_at_fault(flags, message, tmp_path, capsys):
    """--tasks 0 said "need --tasks >= 1 and --cores-per-task >= 1 (got 0, 2)", the 2 a default never given."""
    err = _one_line_error(capsys, main(["cluster", "up", *flags, "--out", str(tmp_path / "t.json")]))
    assert err == "placer cluster: error: " + message and not (tmp_path / "t.json").exists()


def _dead_tasks_file(tmp_path):
    """A tasks file of one task (pid null) at a port nothing listens on: (its path, the port)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                                       # nothing listens there now
    p = tmp_path / "dead.json"
    p.write_text(json.dumps({"format": 1, "job": "worker", "tasks": [
        {"address": f"127.0.0.1:{port}", "pid": None, "cores": [0],
         "devices": ["/job:worker/replica:0/task:0/device:CPU:0"]}]}))
    return p, port


def test_dead_ports_are_a_one_line_error(tmp_path, capsys, mlp):
    p, port = _dead_tasks_file(tmp_path)
    for argv in (["measure", "--model", "nmt", "--size", "tiny", "--devices", str(p)],
                 ["calibrate", "--model", "nmt", "--size", "tiny", "--devices", str(p), "--out", str(tmp_path)]):
        err = _one_line_error(capsys, main(argv))
        assert str(p) in err and f"task 0 (127.0.0.1:{port})" in err and "down" in err
    with pytest.raises(MeasurementError, match="task 0"):
        TFClusterRunner(mlp, str(p))


def test_a_task_that_dies_while_the_runner_connects_is_named(tmp_path, mlp, monkeypatch):
    """A task found up by the runner's check but down when the measurement child connects (killed in between):
    the error was TF's "TensorFlow failed to start in the measurement process: UnavailableError: failed to
    connect to all addresses..." without the task; it now names the task and why it is down."""
    p, port = _dead_tasks_file(tmp_path)
    checks = []
    monkeypatch.setattr(TFClusterRunner, "check_tasks", lambda self: checks.append(1))    # "up" when checked
    with TFClusterRunner(mlp, str(p), timeout=3) as runner:       # TF gives up on the dead master in 2.7 s
        with pytest.raises(MeasurementError, match=rf"{p}: task 0 \(127.0.0.1:{port}\) is down: its port does not "
                                                   r"answer .*\(TensorFlow failed to start"):
            runner.check_devices()
    assert checks


def test_device_not_in_the_cluster_is_an_error(tasks, mlp, tmp_path, capsys):
    bogus = "/job:worker/replica:0/task:7/device:CPU:0"
    with pytest.raises(ClusterError, match=r"task:7.*" + str(tasks.path).replace(".", r"\.")):
        TFClusterRunner(mlp, tasks.path, devices=[tasks.devices[0], bogus])
    from placer.api import Placement
    from placer.graphs.models import build_model

    g = build_model("nmt", "tiny")
    pl = Placement.from_indices(g, [tasks.devices[0], bogus], np.ones(g.num_ops, np.int64))
    pl.save(tmp_path / "p.json")
    err = _one_line_error(capsys, main(["measure", "--model", "nmt", "--size", "tiny", "--devices", tasks.path,
                                        "--placement", str(tmp_path / "p.json")]))
    assert bogus in err
    with pytest.raises(PlacementError):
        pl.to_indices(g, tasks.devices)


@pytest.mark.slow     # ~15-55 s: a hang is cut by a deadline (make test-slow)
def test_hang_is_cut_and_the_tasks_measure_again(tasks, mlp):
    from runtime_util import hang_graph

    g = hang_graph()
    with TFClusterRunner(g, tasks.path, warmup=1, runs=1, timeout=4) as r:
        t0 = time.perf_counter()
        [o] = r.evaluate([np.zeros(g.num_ops, np.int64)])
        assert o.failed and "timed out" in o.reason, o.reason
        assert time.perf_counter() - t0 < 15
    with TFClusterRunner(mlp, tasks.path, warmup=1, runs=1, timeout=60) as r:
        [ok] = r.evaluate([(mlp.colocation % 2).astype(np.int64)])
        assert ok.ok, ok.reason


# ---- measured-reward search on the tasks ---------------------------------------------------------------------------
def test_measured_search_on_the_tasks(tasks, mlp_meta, tmp_path, capsys):
    """`placer search --devices tasks.json --reward measure`: every evaluation a real run on the two tasks; the
    summary holds measured times and the re-measured candidates the returned placement was confirmed from."""
    out = tmp_path / "d"
    rc = main(["search", mlp_meta, "--devices", tasks.path, "--reward", "measure",
               "--budget", "120", "--max-updates", "1", "--warmup", "1", "--runs", "2", "--out", str(out),
               "--no-progress", "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["reward"] == "measure" and s["updates"] == 1
    assert s["evaluations"] > len(s["baselines"])                       # baselines, samples, confirmations
    assert 0 < s["step_time_s"] < 1.0 and all(c["measured_s"] is None or c["measured_s"] > 0 for c in s["confirmed"])
    assert s["step_time_s"] == min(c["measured_s"] for c in s["confirmed"] if c["measured_s"] is not None)
    assert set(s["devices"]) == set(tasks.devices)
    for f in ("placement.json", "placed.meta", "summary.json", "curve.png"):
        assert (out / f).exists(), f


def test_runner_without_a_dead_master_measures_on_the_survivor(tmp_path, mlp):
    """Task 0 (the session's master) killed: `without` moves the session to task 1, which sees only itself."""
    for tf_ in _tf_cluster(tmp_path / "m.json"):
        with TFClusterRunner(mlp, tf_, warmup=1, runs=2, timeout=60) as r:
            os.kill(tf_.tasks[0].pid, signal.SIGKILL)
            time.sleep(0.5)
            [o] = r.evaluate([np.zeros(mlp.num_ops, np.int64)])
            assert o.failed and o.lost_devices == (0,) and "task 0" in o.reason
            with r.without(o.lost_devices) as s:
                assert s.devices == list(tf_.tasks[1].devices) and s.tasks.target.endswith(tf_.tasks[1].address)
                [ok] = s.evaluate([np.zeros(mlp.num_ops, np.int64)])
                assert ok.ok and ok.step_time > 0 and ok.on_assigned_device == 1.0, ok.reason


# ---- last: it kills a task of the module's cluster ------------------------------------------------------------------
def test_task_killed_during_a_measured_search_is_dropped_and_the_search_goes_on(tasks, mlp_meta, tmp_path, capsys,
                                                                                  caplog):
    """A task killed mid-search: its device is dropped (logged, in summary.json "dropped") and the search
    finishes as a re-placement on the surviving task; it never hangs.

    It kills task 1 of the module's cluster, so it comes last in this file (pytest runs a file's tests in order).
    The search runs in-process (`placer.cli.main` in a thread) while this thread kills a real task process."""
    import logging

    out = tmp_path / "d"
    victim = tasks.tasks[1]
    rc: list = []
    search = threading.Thread(target=lambda: rc.append(main([
        "search", mlp_meta, "--devices", tasks.path, "--reward", "measure", "--budget",
        "300", "--warmup", "1", "--runs", "2", "--out", str(out), "--no-progress"])), daemon=True)
    with caplog.at_level(logging.WARNING):
        search.start()
        deadline = time.time() + 240
        while not (out / "checkpoint" / "state.json").exists():      # the baselines have been measured
            assert search.is_alive() and time.time() < deadline, "the search ended or stalled too early"
            time.sleep(0.5)
        os.kill(victim.pid, signal.SIGKILL)
        search.join(240)
        assert not search.is_alive(), "the search did not finish after the task was killed"
    captured = capsys.readouterr()
    assert rc == [0], captured.err[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["reward"] == "measure" and s["devices"] == list(tasks.tasks[0].devices), s["devices"]
    assert [d["devices"] for d in s["dropped"]] == [list(victim.devices)], s.get("dropped")
    assert "task 1" in s["dropped"][0]["reason"] and s["excluded"] == list(victim.devices)
    assert "dropped" in captured.out                                      # said on screen and in the log
    assert any(r.levelno == logging.WARNING and "dropping" in r.getMessage() for r in caplog.records)
    assert s["step_time_s"] > 0 and all(c["measured_s"] for c in s["confirmed"])
    assert _gone(victim.pid)
