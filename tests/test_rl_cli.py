"""`placer search` end to end on the tiny NMT model (simulated 4xK80): files, summary keys, resume, bad input."""
from __future__ import annotations

import json

import numpy as np

import pytest

pytest.importorskip("tensorflow")

from placer.cli import main  # noqa: E402

SUMMARY_KEYS = {"model", "cluster", "step_time_s", "search_best_s", "lower_bound_s", "baselines", "evaluations",
                "wall_s", "seed", "reward", "cost_source", "versions"}


def test_search_cli_files_summary_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    # the update counts end both runs; the budget bounds them (120 s ran out after 1 update under a load of 6: the
    # chain takes 3/4 of the wall, up to 98% once the policy is idle, so the budget is also the worst case's time)
    rc = main(["search", "--model", "nmt", "--size", "tiny", "--cluster", "4xK80", "--max-updates", "3",
               "--budget", "240", "--out", str(out), "--no-progress", "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert SUMMARY_KEYS <= set(s)
    for f in ("placement.json", "placed.meta", "summary.json", "trace.json", "curve.png", "tb", "checkpoint"):
        assert (out / f).exists(), f
    assert s["model"] == "nmt" and s["reward"] == "sim" and s["updates"] == 3
    assert set(s["versions"]) == {"placer", "tensorflow"}
    ok = [v for v in s["baselines"].values() if v is not None]
    assert ok and s["step_time_s"] <= min(ok) + 1e-12          # never worse than the best baseline
    assert s["lower_bound_s"] <= s["step_time_s"]
    pl = json.loads((out / "placement.json").read_text())
    assert pl["format"] == 1 and set(pl["placement"].values()) <= set(pl["devices"])
    trace = json.loads((out / "trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    # resume: nothing else needed but the directory; the update count continues
    rc = main(["search", "--resume", str(out), "--max-updates", "5", "--json"])
    assert rc == 0
    s2 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s2["updates"] == 5 and s2["step_time_s"] <= s["step_time_s"]
    cfg = json.loads((out / "checkpoint" / "state.json").read_text())["config"]
    local = cfg["local_moves"]
    assert cfg["local_merge_prob"] == 0.0                     # merges: none by default on 4 accelerators
    assert local > 0 and s2["local_moves"]["evaluations"] > s["local_moves"]["evaluations"] > 0   # sim: local moves
    # two more updates of 16 samples, and the chain's moves (at least `local_moves` each; more for its share of
    # the wall time, `local_share`)
    more_local = s2["local_moves"]["evaluations"] - s["local_moves"]["evaluations"]
    assert more_local >= 2 * local and s2["evaluations"] - s["evaluations"] == more_local + 2 * 16
    # starting again into the same directory is refused (it would clobber the search)
    assert main(["search", "--model", "nmt", "--size", "tiny", "--cluster", "4xK80", "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_search_cli_bad_input(tmp_path, capsys):
    base = ["search", "--model", "nmt", "--size", "tiny", "--no-progress"]
    assert main(base + ["--cluster", "4xK80", "--budget", "0", "--out", str(tmp_path / "a")]) == 2
    assert "budget must be positive" in capsys.readouterr().err
    assert main(base + ["--cluster", "4xK80", "--local-moves", "-1", "--out", str(tmp_path / "b")]) == 2
    assert "--local-moves must be 0 or more, got -1" in capsys.readouterr().err
    assert main(base + ["--cluster", "4xK80", "--merge-share", "0.9", "--out", str(tmp_path / "m")]) == 2
    assert "--merge-share must be between 0 and 0.8 (the chain's moves left after its attraction moves), got 0.9" \
        in capsys.readouterr().err
    assert main(base + ["--cluster", "4xK80", "--cluster-share", "-0.1", "--out", str(tmp_path / "m")]) == 2
    assert "--cluster-share must be between 0 and 0.8" in capsys.readouterr().err
    assert main(base + ["--cluster", "4xK80", "--merge-share", "0.5", "--cluster-share", "0.5", "--out",
                        str(tmp_path / "m")]) == 2
    assert "--merge-share + --cluster-share must be at most 0.8 (the chain's moves left after its attraction " \
           "moves), got 0.5 + 0.5" in capsys.readouterr().err
    assert main(base + ["--cluster", "4xK80", "--merge-share", "0.1", "--cluster-share", "0.2", "--max-updates", "1",
                        "--out", str(tmp_path / "m")]) == 0
    cfg = json.loads((tmp_path / "m" / "checkpoint" / "state.json").read_text())["config"]
    assert (cfg["local_merge_prob"], cfg["local_cluster_prob"]) == (0.1, 0.2)
    assert main(["search", "--resume", str(tmp_path / "nothing")]) == 2
    assert "not a search directory" in capsys.readouterr().err
    # one device: returns at once with the only placement there is
    rc = main(base + ["--cluster", "cpu", "--budget", "60", "--out", str(tmp_path / "one"), "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["updates"] == 0 and s["stop_reason"] == "one_device"


def test_problem_model_too_big_names_memory():
    from placer.errors import SearchError
    from placer.graphs.opgraph import OpGraph
    from placer.problem import build_problem
    from placer.sim.cluster import make_cluster, make_device

    g = OpGraph.build([("v", "VariableV2", 8), ("r", "Identity", 8)], [("v", "r")])
    g = type(g)(**{**g.__dict__, "persistent_bytes": g.persistent_bytes * 0 + 3 * 2**30})
    cl = make_cluster([make_device("/GPU:0", "K80", memory_bytes=2**30, reserve_bytes=0),
                       make_device("/GPU:1", "K80", memory_bytes=2**30, reserve_bytes=0),
                       make_device("/CPU:0", "cpu", memory_bytes=2**36)])
    with pytest.raises(SearchError, match=r"needs at least 6\.0 GiB .* hold 2\.0 GiB together \(/GPU:0 1\.0 GiB"):
        build_problem(g, cl, costs=np.ones((2, 3)))


def test_search_cli_max_evaluations(tmp_path, capsys):
    # `--max-evaluations N`: the search stops at the first update that brings the evaluations to N or more
    out = tmp_path / "run"
    rc = main(["search", "--model", "nmt", "--size", "tiny", "--cluster", "4xK80", "--max-evaluations", "60",
               "--budget", "120", "--out", str(out), "--no-progress", "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["stop_reason"] == "max_evaluations" and 60 <= s["evaluations"] < 60 + 16
    assert json.loads((out / "args.json").read_text())["max_evaluations"] == 60


def test_resume_with_a_budget_continues_to_that_total_or_says_why_not(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["search", "--model", "nmt", "--size", "tiny", "--cluster", "2xK80", "--budget", "2",
                 "--out", str(out), "--no-progress", "--json"]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["stop_reason"] == "budget"
    # a budget the run has already spent: nothing more, and one line saying why
    assert main(["search", "--resume", str(out), "--budget", "1", "--json"]) == 0
    cap = capsys.readouterr()
    s1 = json.loads(cap.out.strip().splitlines()[-1])
    assert s1["evaluations"] == s["evaluations"]
    assert cap.err.strip().splitlines() == [f"placer search: notice: the search in {out} had already reached "
                                            f"--budget 1 ({s1['wall_s']:.0f} s spent), counted over its runs: give a "
                                            f"larger --budget to continue it"]
    # a larger one: the search goes on to that total
    more = s["wall_s"] + 3
    assert main(["search", "--resume", str(out), "--budget", f"{more}", "--json"]) == 0
    s2 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s2["evaluations"] > s["evaluations"] and s2["stop_reason"] == "budget" and s2["wall_s"] >= more


def test_resume_keeps_the_model_settings_and_refuses_conflicting_flags(tmp_path, capsys):
    """args.json keeps every flag that shapes the search (--precision, --layers, --local-moves... were lost, so a
    resumed fp16 search rebuilt the fp32 graph and failed); a flag given with --resume that contradicts the
    stored search (--cluster 4xK80 on a 2xK80 search, another --out) is an error naming it, not silently
    ignored; an args.json that is no JSON object is one line, not a traceback."""
    from placer.cli import build_parser
    from placer.cli.search import _load_args, _save_args

    out = tmp_path / "run"
    _save_args(out, build_parser().parse_args(["search", "--model", "gpt", "--size", "tiny", "--precision", "fp16",
                                               "--layers", "2", "--local-moves", "0", "--cluster", "2xK80",
                                               "--out", str(out)]))
    back = _load_args(out, build_parser().parse_args(["search", "--resume", str(out), "--budget", "9"]))
    assert (back.precision, back.layers, back.local_moves, back.cluster) == ("fp16", 2, 0, "2xK80")
    (out / "checkpoint").mkdir()
    # --size full equals the parser's default, yet contradicts the tiny search: refused too (it was ignored)
    for extra, flag in ((["--cluster", "4xK80"], "--cluster 4xK80"), (["--seed", "3"], "--seed 3"),
                        (["--out", str(tmp_path / "elsewhere")], "--out"), (["--size", "full"], "--size full")):
        assert main(["search", "--resume", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flag in err and "Traceback" not in err
    (out / "args.json").write_text("[1]")
    assert main(["search", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert "args.json is not the args.json of a search" in err and "Traceback" not in err
    # a stored value the flag never takes (a damaged or hand-edited file) was a traceback (float("abc")) or worse
    good = json.loads(json.dumps(vars(back)))
    for key, bad in (("budget", "abc"), ("seed", 1.5), ("size", "huge"), ("groups", 0), ("no_progress", "yes"),
                     ("cluster", 4), ("fetch", "x")):
        (out / "args.json").write_text(json.dumps({**good, key: bad}))
        assert main(["search", "--resume", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f'args.json: "{key}": {json.dumps(bad)} is no value of' in err, err
    (out / "args.json").unlink()      # a library run's directory (place(out_dir=...)): a checkpoint, no args.json
    assert main(["search", "--resume", str(out)]) == 2
    assert "holds a checkpoint but no args.json" in capsys.readouterr().err


def test_resume_of_a_search_stopped_before_its_first_checkpoint_starts_it_over(tmp_path, capsys):
    """Ctrl-C while the graph is imported or the baselines run leaves DIR with args.json only: `--resume DIR`
    runs that search from the start with its stored flags (it said "no checkpoint to resume", so the interrupted
    search could not be continued at all)."""
    from placer.cli import build_parser
    from placer.cli.search import _save_args

    out = tmp_path / "run"
    _save_args(out, build_parser().parse_args(["search", "--model", "nmt", "--size", "tiny", "--cluster", "2xK80",
                                               "--max-updates", "0", "--out", str(out)]))
    assert main(["search", "--resume", str(out), "--no-progress", "--json"]) == 0
    cap = capsys.readouterr()
    assert "holds no checkpoint yet" in cap.err and "starting it over" in cap.err
    s = json.loads(cap.out.strip().splitlines()[-1])
    assert s["cluster"] == "2xK80" and s["updates"] == 0 and (out / "checkpoint" / "state.json").is_file()


def test_a_signal_stopped_search_exits_with_128_plus_the_signal(tmp_path, monkeypatch, capsys):
    """A search stopped by SIGTERM exits 143 (as a process SIGTERM had killed: schedulers read it), by Ctrl-C
    130; both name the --resume command."""
    import signal

    import placer.cli.search as cli_search
    from placer.cli import main
    from placer.rl.search import Interrupted

    for exc, code in ((Interrupted(signal.SIGTERM), 143), (Interrupted(signal.SIGINT), 130),
                      (KeyboardInterrupt(), 130)):
        def stopped(args, exc=exc):
            (tmp_path / "args.json").write_text("{}")
            raise exc
        monkeypatch.setattr(cli_search, "run_search", stopped)
        assert main(["search", "--model", "rnnlm", "--size", "tiny", "--cluster", "2xK80", "--out",
                     str(tmp_path)]) == code
        assert f"--resume {tmp_path}" in capsys.readouterr().err


def test_an_interrupted_search_writes_its_best_so_far_beside_the_checkpoint(tmp_path, capsys, monkeypatch):
    """Ctrl-C in the search loop kept only the checkpoint: a library run (place(out_dir=...), no args.json) left
    nothing usable, and a CLI one no answer until resumed. Now placement.json and summary.json (stop_reason
    "interrupted") hold the best so far, and `placer search --resume` still continues from the checkpoint."""
    import signal

    import placer.search as search_mod

    class CtrlC:
        """The problem's simulator, sending this process SIGINT (a user's Ctrl-C) once in the search loop (where
        the search's own handler is installed), after the baselines and the warm start."""

        def __init__(self, inner):
            self.inner, self.devices, self.sent = inner, inner.devices, False

        def evaluate(self, placements):
            if not self.sent and signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                self.sent = True
                signal.raise_signal(signal.SIGINT)
            return self.inner.evaluate(placements)

        def close(self):
            pass

    real = search_mod.search

    def interrupted_search(problem, evaluator=None, **kw):
        return real(problem, evaluator or CtrlC(problem.simulator), **kw)

    out = tmp_path / "run"
    monkeypatch.setattr(search_mod, "search", interrupted_search)
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)     # a terminal's (pytest-xdist ignores it)
    try:
        rc = main(["search", "--model", "nmt", "--size", "tiny", "--cluster", "2xK80", "--budget", "60",
                   "--local-moves", "0", "--no-progress", "--out", str(out)])
    finally:
        signal.signal(signal.SIGINT, saved)
    err = capsys.readouterr().err
    assert rc == 130 and f"best placement so far is in {out / 'placement.json'}" in err
    assert f"--resume {out}" in err and "Traceback" not in err
    s = json.loads((out / "summary.json").read_text())
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert s["stop_reason"] == "interrupted" and s["evaluations"] == state["evaluations"] > 0
    assert (out / "placement.json").is_file() and s["step_time_s"] > 0
    monkeypatch.setattr(search_mod, "search", real)
    assert main(["search", "--resume", str(out), "--max-updates", str(state["updates"] + 1), "--no-progress",
                 "--json"]) == 0
    s2 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s2["stop_reason"] == "max_updates" and s2["updates"] == state["updates"] + 1
    assert s2["evaluations"] > s["evaluations"] and s2["step_time_s"] <= s["step_time_s"]


def test_a_search_that_lost_its_workers_names_the_resume_command(tmp_path, monkeypatch, capsys):
    """A measured search whose workers all died mid-search checkpoints its updates (Search.run); the one-line
    error now says so and names the --resume command (it gave the error alone). A refusal before any checkpoint
    does not."""
    import placer.cli.search as cli_search
    from placer.cli import main
    from placer.errors import MeasurementError

    for checkpointed in (True, False):
        out = tmp_path / str(checkpointed)

        def lost(args):
            out.mkdir()
            (out / "args.json").write_text("{}")
            if checkpointed:
                (out / "checkpoint").mkdir()
                (out / "checkpoint" / "state.json").write_text("{}")
            raise MeasurementError("no measurement worker is alive: 127.0.0.1:5: UNAVAILABLE: Socket closed")
        monkeypatch.setattr(cli_search, "run_search", lost)
        assert main(["search", "--model", "rnnlm", "--size", "tiny", "--cluster", "2xK80", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("placer search: error: no measurement worker"), err
        assert (f"continue with: placer search --resume {out}" in err) == checkpointed, err
