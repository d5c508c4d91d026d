"""Bad command-line input: one line naming the flag, path or file at fault, a non-zero exit, no traceback."""
from __future__ import annotations

import pytest

from placer.cli import main

TINY = ["--model", "nmt", "--size", "tiny"]


def _usage_error(argv, capsys) -> str:
    """argparse's usage error for `argv`: exit 2, its last line (the one naming the flag)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, message", [
    (["simulate", *TINY, "--cluster", "2xK80", "--placement", "random", "--seed", "-1"],
     "argument --seed: must be 0 or more, got -1"),
    (["search", *TINY, "--cluster", "2xK80", "--seed", "-1", "--out", "o"], "argument --seed: must be 0 or more"),
    (["measure", *TINY, "--devices", "cpu:1", "--seed", "-1"], "argument --seed: must be 0 or more"),
    (["place", *TINY, "--cluster", "2xK80", "--seed", "-1", "--out", "o"], "argument --seed: must be 0 or more"),
    (["replace", "run", "--exclude", "/GPU:0", "--seed", "x", "--out", "o"],
     "argument --seed: expected an integer, got 'x'"),
    (["bench", "--seed", "-1"], "argument --seed: must be 0 or more"),
    (["pretrain", "--out", "o", "--seed", "-1"], "argument --seed: must be 0 or more"),
    (["inspect", *TINY, "--groups", "0"], "argument --groups: must be 1 or more, got 0"),
    (["search", *TINY, "--cluster", "2xK80", "--groups", "-3", "--out", "o"], "argument --groups: must be 1 or more"),
    (["place", *TINY, "--cluster", "2xK80", "--groups", "0", "--out", "o"], "argument --groups: must be 1 or more"),
    (["search", *TINY, "--cluster", "2xK80", "--max-evaluations", "-1", "--out", "o"],
     "argument --max-evaluations: must be 1 or more, got -1"),
    (["search", *TINY, "--cluster", "2xK80", "--max-updates", "-2", "--out", "o"],
     "argument --max-updates: must be 0 or more, got -2"),
    (["search", *TINY, "--cluster", "2xK80", "--patience", "0", "--out", "o"],
     "argument --patience: must be 1 or more"),
])
def test_out_of_range_numbers_are_a_usage_error_naming_the_flag(argv, message, capsys):
    assert message in _usage_error(argv, capsys)


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "127.0.0.1:65536"])
def test_worker_port_out_of_range_is_one_line(listen):
    from placer.errors import MeasurementError
    from placer.runtime.worker import serve

    with pytest.raises(MeasurementError, match=f"--listen '{listen}': the port must be 1-65535"):
        serve(listen, block=False)


@pytest.mark.parametrize("timeout", ["0", "-5"])
def test_worker_timeout_that_cuts_every_measurement_is_one_line(timeout, capsys):
    """`placer worker --timeout 0` ran with 600 s (0 was replaced by the default); a negative one cut every
    measurement. Both are now refused at start, naming the flag."""
    from placer.cli import main

    assert main(["worker", "--listen", "127.0.0.1:0", "--timeout", timeout]) == 2
    err = capsys.readouterr().err
    assert f"--timeout must be positive seconds, got {float(timeout)}" in err and err.count("\n") == 1


def test_simulate_anneal_placement_as_cli_md_says(capsys):
    import json

    assert main(["simulate", *TINY, "--cluster", "2xK80", "--placement", "anneal", "--json"]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["placement"] == "anneal" and not s["oom"] and s["step_time_s"] >= s["lower_bound_s"]


def test_unknown_placement_lists_each_name_once(capsys):
    import ast

    assert main(["simulate", *TINY, "--cluster", "2xK80", "--placement", "bogus"]) == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    names = ast.literal_eval(err[err.index("["):err.index("]") + 1])
    assert len(names) == len(set(names)) and {"single", "random", "round_robin", "anneal", "expert"} <= set(names)


DIR_FAILS = "cannot create it or write in it: Not a directory"


@pytest.mark.parametrize("argv, message", [
    (["search", *TINY, "--cluster", "2xK80", "--budget", "2", "--out", "{file}/sub"],
     f"--out {{file}}/sub: {DIR_FAILS}"),
    (["place", *TINY, "--cluster", "2xK80", "--out", "{file}"], f"--out {{file}}: {DIR_FAILS}"),
    (["replace", "run", "--exclude", "/GPU:0", "--out", "{file}/x"], f"--out {{file}}/x: {DIR_FAILS}"),
    (["calibrate", *TINY, "--devices", "cpu:1", "--out", "{file}/calib"], f"--out {{file}}/calib: {DIR_FAILS}"),
    (["pretrain", "--out", "{file}/policy"], f"--out {{file}}/policy: {DIR_FAILS}"),
    (["simulate", *TINY, "--cluster", "2xK80", "--trace", "{file}/t.json"],
     "--trace {file}/t.json: cannot write it: Not a directory"),
    (["profile", *TINY, "--devices", "cpu:1", "--out", "{file}/costs.json"],
     "--out {file}/costs.json: cannot write it: Not a directory"),
])
def test_an_output_path_that_cannot_be_written_is_one_line_before_any_work(argv, message, tmp_path, capsys,
                                                                             monkeypatch):
    import placer.cli

    def no_work(*a, **k):
        raise AssertionError("work began before the output path was checked")

    monkeypatch.setattr(placer.cli, "load_from_args", no_work)
    monkeypatch.setattr("placer.pretrain.pretrain", no_work)
    f = tmp_path / "file.json"          # a file where a directory must be
    f.write_text("{}")
    assert main([a.replace("{file}", str(f)) for a in argv]) == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    assert err == f"placer {argv[0]}: error: " + message.replace("{file}", str(f))


@pytest.mark.parametrize("argv, kind", [
    (["simulate", *TINY, "--cluster", "2xK80", "--trace", "{file}"], "Chrome trace"),
    (["profile", *TINY, "--devices", "cpu:1", "--out", "{file}"], "cost table"),
])
def test_an_output_file_of_another_kind_is_never_overwritten(argv, kind, tmp_path, capsys, monkeypatch):
    """`placer simulate --trace placement.json` / `placer profile --out placement.json` (a slip) replaced the
    user's placement file: refused now, one line, before any work (as `placer cluster up --out`); a file of the
    kind the command writes (a trace, a cost table) is still replaced."""
    import json

    import numpy as np

    import placer.cli
    def no_work(*a, **k):
        raise AssertionError("work began before the output path was checked")

    monkeypatch.setattr(placer.cli, "load_from_args", no_work)
    f = tmp_path / "placement.json"
    text = json.dumps({"format": 1, "graph_fingerprint": "f", "devices": ["/CPU:0"], "placement": {"a": "/CPU:0"}})
    f.write_text(text)
    assert main([a.replace("{file}", str(f)) for a in argv]) == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    flag = argv[-2]
    assert err == (f"placer {argv[0]}: error: {flag} {f}: the file exists and is no {kind}; placer {argv[0]} will "
                   f"not overwrite it (remove it or pick another {flag})")
    assert f.read_text() == text
    # what the command wrote before is replaced: a trace, a cost table (.json or .npz)
    from placer.cli import out_file
    from placer.graphs.opgraph import OpGraph
    from placer.sim.cluster import parse_cluster
    from placer.sim.costs import CostTable, is_cost_table
    from placer.sim.simulator import Simulator
    from placer.sim.trace import is_chrome_trace, write_trace

    g = OpGraph.build([("a", "X", 8), ("b", "X", 8)], [("a", "b")])
    cl = parse_cluster("2xK80")
    write_trace(tmp_path / "t.json", g, cl, Simulator(g, cl, np.ones(2)).simulate(np.array([0, 1]), trace=True))
    table = CostTable(g.fingerprint, g.names, g.cpu_only, {"cpu": np.array([1.0, 2.0])})
    table.save(tmp_path / "c.json")
    table.save(tmp_path / "c.npz")
    for name, test in (("t.json", is_chrome_trace), ("c.json", is_cost_table), ("c.npz", is_cost_table)):
        out_file(str(tmp_path / name), "--out", ("that kind", test), "x")
    assert not is_chrome_trace(tmp_path / "c.json") and not is_cost_table(tmp_path / "t.json")


@pytest.mark.parametrize("flags, message", [
    (["--link-runs", "0"], "calibrate: --link-runs must be an integer >= 1, got 0"),
    (["--runs", "0"], "calibrate: --runs must be an integer >= 1, got 0"),
    (["--fit-placements", "-1"], "calibrate: --fit-placements must be an integer >= 0, got -1"),
    (["--fit-placements", "3"], "calibrate: --fit-placements fits the shared speed of two or more TF cluster tasks: "
                                "give --devices a tasks file of `placer cluster up` (not cpu:2)")])
def test_calibrate_settings_are_checked_before_any_measurement(flags, message, tmp_path, capsys, monkeypatch):
    """--link-runs 0 failed after the ping-pongs with "a link fit needs at least two sizes with a time (got 0)";
    --fit-placements -1, or K on cpu:N (it fits TF cluster tasks only), was silently ignored."""
    def no_work(*a, **k):
        raise AssertionError("measuring began before the settings were checked")

    monkeypatch.setattr("placer.runtime.local.LocalRunner", no_work)
    monkeypatch.setattr("placer.cli.load_from_args", lambda args: None)     # the checks need no graph
    assert main(["calibrate", *TINY, "--devices", "cpu:2", "--out", str(tmp_path / "cal"), *flags]) == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    assert err == "placer calibrate: error: " + message


@pytest.mark.parametrize("files, at_fault", [
    ({"checkpoint/state.json": "{}", "cluster.json": '{"devices": []}'}, "holds a search (its checkpoint/)"),
    ({"cluster.json": '{"devices": []}'}, "cluster.json exists and is no calibrated cluster"),
    ({"costs.json": "my notes"}, "costs.json exists and is no cost table")])
def test_calibrate_never_overwrites_a_search_or_a_foreign_file(files, at_fault, tmp_path, capsys, monkeypatch):
    """`placer calibrate --out RUN_DIR` replaced the search's cluster.json with the calibrated one, after which
    `placer replace RUN_DIR` and --resume read the wrong cluster ("cannot exclude '/GPU:1': cluster 'calibrated
    cpu:2' has devices ['/CPU:0', '/CPU:1']")."""
    def no_work(*a, **k):
        raise AssertionError("measuring began before --out was checked")

    monkeypatch.setattr("placer.runtime.local.LocalRunner", no_work)
    monkeypatch.setattr("placer.cli.load_from_args", lambda args: None)
    out = tmp_path / "run"
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    assert main(["calibrate", *TINY, "--devices", "cpu:2", "--out", str(out)]) == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("placer calibrate: error: calibrate: ") and at_fault in err and str(out) in err
    assert {n: (out / n).read_text() for n in files} == files


@pytest.mark.parametrize("flag", ["--runs", "--warmup", "--timeout"])
def test_measurement_flags_of_a_simulated_search_are_refused_not_ignored(flag, tmp_path, capsys):
    """`placer search --cluster 2xK80 --runs 10` simulated every placement and never used --runs, silently."""
    assert main(["search", *TINY, "--cluster", "2xK80", flag, "3", "--out", str(tmp_path / "run")]) == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    assert err == (f"placer search: error: {flag} sets how placements are measured (--reward measure): a search on "
                   "--cluster 2xK80 only simulates them")
    assert not (tmp_path / "run").exists()


def test_a_simulated_search_on_devices_remeasures_with_the_given_timing(tmp_path, monkeypatch):
    """`placer search --devices cpu:2 --reward sim --runs 1 --warmup 0` re-measures its best placements on those
    devices at the end: with the given --runs/--warmup/--timeout (they were accepted and the defaults used)."""
    import json

    import placer.runtime
    from placer.sim.evaluator import Evaluator, Outcome

    seen = []

    class Fake(Evaluator):
        devices = ["/CPU:0", "/CPU:1"]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def evaluate(self, placements):
            return [Outcome(step_time=0.01) for _ in placements]

    def fake_make_evaluator(graph, devices, **kw):
        seen.append(kw)
        return Fake()

    monkeypatch.setattr(placer.runtime, "make_evaluator", fake_make_evaluator)
    out = tmp_path / "run"
    assert main(["search", *TINY, "--devices", "cpu:2", "--reward", "sim", "--runs", "1", "--warmup", "0",
                 "--timeout", "30", "--max-updates", "0", "--no-progress", "--out", str(out)]) == 0
    assert seen and all(kw == {"warmup": 0, "runs": 1, "timeout": 30.0} for kw in seen)
    assert json.loads((out / "summary.json").read_text())["measured"][0]["measured_s"] == 0.01


def test_a_refused_command_leaves_no_empty_output_directory_behind(tmp_path, capsys):
    """A command (or place() call) refused after it created its --out (a cluster spec is checked once the graph is
    loaded) left that directory behind, empty. The directories it created and wrote nothing into go; one that was
    there before stays. (A search refused there keeps its args.json, for --resume.)"""
    import placer
    from placer.errors import ClusterError
    from placer.graphs.models import build_model

    out = tmp_path / "a" / "b"
    argv = ["place", "--policy", "default", *TINY, "--cluster", "3xNOPE", "--no-progress", "--out"]
    assert main([*argv, str(out)]) == 2
    assert "'3xNOPE'" in capsys.readouterr().err and not (tmp_path / "a").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main([*argv, str(kept)]) == 2 and kept.is_dir()
    with pytest.raises(ClusterError):
        placer.place(build_model("nmt", "tiny"), cluster="3xNOPE", out_dir=tmp_path / "c" / "d", budget_seconds=5)
    assert not (tmp_path / "c").exists()


def test_bench_with_an_unknown_model_is_one_line_before_any_cell(tmp_path, capsys):
    """`placer bench --models nmt,foo` found 'foo' only when its cell was built, under the progress bar (a tqdm line
    before the error, the nmt cells first): one line naming it now, before any work or output."""
    out = tmp_path / "b"
    assert main(["bench", "--models", "nmt,foo", "--size", "tiny", "--gpus", "2", "--budget", "1", "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--models: unknown model 'foo'" in err and "nmt" in err
    assert not out.exists()


def test_a_placement_file_that_does_not_fit_the_graph_is_named_in_the_error(tmp_path, capsys):
    """`--placement FILE` whose map lacks an op or names a device the cluster lacks said which op, not which file."""
    import json

    assert main(["search", *TINY, "--cluster", "2xK80", "--max-updates", "0", "--no-progress", "--out",
                 str(tmp_path / "run")]) == 0
    capsys.readouterr()
    d = json.loads((tmp_path / "run" / "placement.json").read_text())
    op = next(iter(d["placement"]))
    for name, edit in (("missing", lambda m: m.pop(op)), ("gpu7", lambda m: m.__setitem__(op, "/GPU:7"))):
        m = dict(d["placement"])
        edit(m)
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({**d, "placement": m}))
        assert main(["simulate", *TINY, "--cluster", "2xK80", "--placement", str(f)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"placement file {f}: " in err and repr(op) in err, err
