"""Re-placement after device loss (`placer replace`, `placer.replace`): survivors only, fits in memory, the
run's policy restored onto the survivors, and one-line errors."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from placer.errors import ClusterError, SearchError


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A short search of tiny NMT on 4 simulated K80s, with its directory."""
    import placer
    from placer.graphs.models import build_model

    from placer.rl.reinforce import ReinforceConfig

    out = tmp_path_factory.mktemp("run") / "nmt"
    # the simulated defaults without the chain's time shares (which would make this search run to its budget here,
    # where TF's tracing dominates the wall; test_rl_search tests the shares)
    placer.place(build_model("nmt", "tiny"), cluster="4xK80", budget_seconds=60, max_updates=12, out_dir=out,
                 config=ReinforceConfig.for_reward("sim", seed=0, local_share=0.0, local_share_idle=0.0))
    return out


def test_replace_uses_no_lost_device_and_fits(run_dir, tmp_path):
    import placer

    res = placer.replace(run_dir, ["/GPU:3"], budget_seconds=30, max_updates=3, out_dir=tmp_path / "r")
    used = set(res.placement.mapping.values())
    assert "/GPU:3" not in used and used <= {"/GPU:0", "/GPU:1", "/GPU:2", "/CPU:0"}
    assert res.extra["restored"] and res.extra["notice"] is None
    assert np.isfinite(res.step_time) and res.step_time <= res.extra["quick_s"] + 1e-12
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["excluded"] == ["/GPU:3"] and s["quick_s"] == pytest.approx(res.extra["quick_s"])
    assert s["step_time_s"] == pytest.approx(res.step_time) and "/GPU:3" not in s["devices"]
    assert (tmp_path / "r" / "placement.json").exists()
    # the returned placement fits the survivors' memory in the simulator
    from placer.problem import build_problem
    from placer.search import load_run_problem
    from placer.sim.cluster import parse_cluster

    graph, cluster, cost, grouping, _ = load_run_problem(tmp_path / "r")
    p = build_problem(graph, cluster, costs=cost, grouping=grouping, baselines=False)
    out = p.simulator.evaluate([res.placement.to_indices(graph, p.device_names)])[0]
    assert out.ok and not out.oom
    p.close()
    assert cluster.device_names == parse_cluster("4xK80").device_names[:3] + ["/CPU:0"]


def test_restored_policy_keeps_surviving_groups_where_they_were(run_dir):
    """After restoring, the policy's mode puts most groups whose device survived on that device (its samples
    did too, but how peaked the run's policy is depends on its chain's wall share: 0.58 on a slow hour)."""
    from placer.problem import build_problem, cluster_without
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.search import load_run_problem

    graph, cluster, cost, grouping, h = load_run_problem(run_dir)
    full = build_problem(graph, cluster, costs=cost, grouping=grouping, baselines=False)
    before = Search(grouping, full.simulator, cpu_index=cluster.cpu_index, allowed=full.allowed, progress=False,
                    out_dir=run_dir, config=ReinforceConfig(seed=h["seed"]))
    assert before.load_checkpoint()
    old_mode, _ = before.agent.sample(1, greedy=True)
    # lose the GPU the policy's mode uses least (the search's chain runs for a share of the wall time, so which
    # devices the mode uses varies from run to run)
    gpus = [d for d, name in enumerate(cluster.device_names) if "GPU" in name]
    dead = min(gpus, key=lambda d: int((old_mode[0] == d).sum()))
    survivors, keep = cluster_without(cluster, [cluster.device_names[dead]])
    p = build_problem(graph, survivors, costs=np.ascontiguousarray(cost[:, keep]), grouping=grouping, baselines=False)
    s = Search(grouping, p.simulator, cpu_index=survivors.cpu_index, allowed=p.allowed, progress=False,
               config=ReinforceConfig(seed=1))
    assert s.restore_policy(run_dir / "checkpoint", keep) is None
    new_mode, _ = s.agent.sample(1, greedy=True)
    new_of = {o: k for k, o in enumerate(keep)}
    old = old_mode[0]
    stay = np.array([int(d) in new_of for d in old])
    assert stay.sum() >= grouping.num_groups // 3                       # the test means something
    same = (new_mode[0][stay] == np.array([new_of[int(d)] for d in old[stay]])).mean()
    assert same >= 0.8, same             # device rows mapped wrongly (or not kept) agree at about chance, 1/4
    full.close()
    p.close()


def test_replace_bad_input_one_line(run_dir, tmp_path, capsys):
    import placer
    from placer.cli import main

    with pytest.raises(ClusterError, match=r"leaves no accelerator"):
        placer.replace(run_dir, ["/GPU:0", "/GPU:1", "/GPU:2", "/GPU:3"], budget_seconds=5)
    with pytest.raises(ClusterError, match=r"cannot exclude '/GPU:9'"):
        placer.replace(run_dir, ["/GPU:9"], budget_seconds=5)
    with pytest.raises(SearchError, match=r"not a search directory"):
        placer.replace(tmp_path, ["/GPU:0"], budget_seconds=5)
    capsys.readouterr()
    rc = main(["replace", str(run_dir), "--exclude", "/GPU:9", "--out", str(tmp_path / "x")])   # the CLI, in-process
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "/GPU:9" in err and "Traceback" not in err


def test_replace_of_a_missing_or_unfinished_run_says_which(tmp_path):
    """Both said "is not a search directory of this placer version (no graph.npz, ...)": a mistyped path, and a
    search killed before writing its results, which --resume can still finish."""
    import placer

    with pytest.raises(SearchError, match=r"run directory \S+nowhere does not exist"):
        placer.replace(tmp_path / "nowhere", ["/GPU:0"], budget_seconds=5)
    (tmp_path / "killed" / "checkpoint").mkdir(parents=True)
    (tmp_path / "killed" / "args.json").write_text("{}")
    with pytest.raises(SearchError, match=r"killed holds a search that never finished \(no graph.npz.*: finish it "
                                          r"with `placer search --resume \S+killed` first"):
        placer.replace(tmp_path / "killed", ["/GPU:0"], budget_seconds=5)


def test_replace_of_a_run_with_a_damaged_problem_file_names_it(run_dir, tmp_path):
    """problem.npz truncated was zipfile's BadZipFile traceback, and one missing an array a KeyError traceback."""
    import placer
    from placer.search import RUN_PROBLEM

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("checkpoint"))
    good = (copy / RUN_PROBLEM).read_bytes()
    (copy / RUN_PROBLEM).write_bytes(good[:300])
    with pytest.raises(SearchError, match=r"cannot read the run in \S+: problem.npz is not an npz archive"):
        placer.replace(copy, ["/GPU:2"], budget_seconds=5)
    (copy / RUN_PROBLEM).write_bytes(good)
    with np.load(copy / RUN_PROBLEM) as z:
        kept = {k: z[k] for k in z.files if k != "features"}
    np.savez(copy / RUN_PROBLEM, **kept)
    with pytest.raises(SearchError, match=r"problem.npz is incomplete or corrupt \(KeyError: 'features'\)"):
        placer.replace(copy, ["/GPU:2"], budget_seconds=5)


def test_replace_without_checkpoint_searches_cold_with_a_notice(run_dir, tmp_path):
    import placer

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("checkpoint"))
    res = placer.replace(copy, ["/GPU:2"], budget_seconds=30, max_updates=2, out_dir=tmp_path / "r")
    assert not res.extra["restored"] and "could not be restored" in res.extra["notice"]
    assert "/GPU:2" not in set(res.placement.mapping.values())


# ---- a device lost during a measured search -----------------------------------------------------------------------
class _Dying:
    """A 'measured' evaluator (the simulator underneath) whose device `victim` is found dead from evaluation
    `after` on, as TFClusterRunner reports a task that is down (`Outcome.lost_devices`)."""

    def __init__(self, problem, victim: int, after: int):
        self.problem, self.victim, self.after, self.n = problem, victim, after, 0
        self.devices = list(problem.device_names)
        self.survivors = None

    def evaluate(self, placements):
        from placer.sim.evaluator import Outcome

        outs = []
        for p in placements:
            self.n += 1
            if self.n > self.after:
                o = Outcome.failure(f"{self.devices[self.victim]} is down: its process is gone")
                o.lost_devices = (self.victim,)
                outs.append(o)
            else:
                outs.extend(self.problem.simulator.evaluate([p]))
        return outs

    def without(self, lost):
        from placer.problem import cluster_without
        from placer.sim.simulator import SimEvaluator

        surv, keep = cluster_without(self.problem.cluster, [self.devices[i] for i in lost])
        self.survivors = SimEvaluator(self.problem.graph, surv, np.ascontiguousarray(self.problem.cost[:, keep]))
        return self.survivors

    def close(self):
        pass


def test_measured_search_drops_a_dead_device_and_replaces_on_the_survivors(tmp_path):
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import search

    problem = build_problem(build_model("nmt", "tiny"), "4xK80", seed=0)
    n_base = len(problem.baselines)
    ev = _Dying(problem, victim=3, after=n_base + 40)               # dies in the search's fifth update
    cfg = ReinforceConfig.for_reward("measure", seed=0, elite_steps=5)   # about the drop, not the fit
    res = search(problem, ev, reward="measure", budget_seconds=120, max_updates=6, out_dir=tmp_path / "d",
                 config=cfg)
    s = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert [d["devices"] for d in s["dropped"]] == [["/GPU:3"]], s.get("dropped")
    assert "is down" in s["dropped"][0]["reason"] and s["dropped"][0]["after_evaluations"] >= n_base + 40
    assert s["excluded"] == ["/GPU:3"] and "/GPU:3" not in s["devices"] and s["reward"] == "measure"
    assert "/GPU:3" not in set(res.placement.mapping.values()) and np.isfinite(res.step_time)
    assert ev.survivors is not None and s["confirmed"]          # the survivors measured the candidates
    problem.close()


def test_a_device_lost_while_the_baselines_are_measured_is_dropped(tmp_path):
    """A device found dead while the baselines were measured (its TF task killed early): the search dropped it
    only when an update ran after, so a search whose budget (or max_updates) the baselines used up ended with
    stop_reason "budget", no drop, exit 0 and a returned placement on the dead device."""
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import search

    problem = build_problem(build_model("nmt", "tiny"), "2xK80", seed=0)
    ev = _Dying(problem, victim=1, after=len(problem.baselines) // 2)      # dies amid the baselines
    cfg = ReinforceConfig.for_reward("measure", seed=0, baseline_rounds=1)   # the first half stay measured
    res = search(problem, ev, reward="measure", budget_seconds=120, max_updates=0, out_dir=tmp_path / "d",
                 config=cfg)
    s = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert [d["devices"] for d in s.get("dropped", [])] == [["/GPU:1"]], (s["stop_reason"], s.get("dropped"))
    assert "/GPU:1" not in set(res.placement.mapping.values()) and ev.survivors is not None
    problem.close()


def test_a_search_whose_workers_all_die_keeps_its_updates_in_the_checkpoint(tmp_path):
    """Every measurement worker gone mid-search (RemotePool raises MeasurementError): the updates since the last
    checkpoint (up to 10, or 60 s of them) were lost; the checkpoint is now written before the error goes up,
    and `--resume` continues from the last update."""
    from placer.errors import MeasurementError
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.search import search

    problem = build_problem(build_model("nmt", "tiny"), "2xK80", seed=0)

    class Pool:           # the simulator, until no worker is left
        devices, n = problem.device_names, 0

        def evaluate(self, placements):
            Pool.n += 1
            if Pool.n > 4:
                raise MeasurementError("no measurement worker is alive: 127.0.0.1:5: UNAVAILABLE: Socket closed")
            return problem.simulator.evaluate(placements)

        def close(self):
            pass

    with pytest.raises(MeasurementError, match="no measurement worker"):
        search(problem, Pool(), reward="measure", budget_seconds=120, max_updates=50, out_dir=tmp_path / "d")
    state = json.loads((tmp_path / "d" / "checkpoint" / "state.json").read_text())
    assert state["updates"] >= 1, state["updates"]
    problem.close()


def test_a_search_whose_devices_live_is_not_dropped(tmp_path):
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.search import search

    problem = build_problem(build_model("nmt", "tiny"), "2xK80", seed=0)
    ev = _Dying(problem, victim=1, after=10 ** 9)
    search(problem, ev, reward="measure", budget_seconds=60, max_updates=2, out_dir=tmp_path / "d")
    s = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert "dropped" not in s and "excluded" not in s and ev.survivors is None
    problem.close()


def test_measured_search_records_the_workers_that_went_out(tmp_path):
    """A measured evaluator over workers (RemotePool) keeps the workers that went out; the summary lists them."""
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.search import search

    problem = build_problem(build_model("nmt", "tiny"), "2xK80", seed=0)

    class Pool:        # the simulator, with the RemotePool's record of a worker that went out and came back
        devices = problem.device_names
        events = [{"worker": "127.0.0.1:5", "event": "out", "reason": "UNAVAILABLE: Socket closed", "at_s": 1.5},
                  {"worker": "127.0.0.1:5", "event": "rejoined", "reason": "", "at_s": 9.0}]

        def evaluate(self, placements):
            return problem.simulator.evaluate(placements)

        def close(self):
            pass

    search(problem, Pool(), reward="measure", budget_seconds=60, max_updates=1, out_dir=tmp_path / "d")
    s = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert s["workers_out"] == Pool.events and "dropped" not in s
    problem.close()


def test_replace_stops_on_max_evaluations(run_dir, tmp_path):
    # a measured search that loses a device hands its remaining evaluations to the re-placement (_drop_and_replace)
    from placer.search import replace

    res = replace(run_dir, ["/GPU:2"], budget_seconds=30, max_evaluations=1, out_dir=tmp_path / "r")
    assert res.extra["stop_reason"] == "max_evaluations" and res.extra["updates"] == 0
    assert "/GPU:2" not in set(res.placement.mapping.values())


def test_replace_of_a_result_without_a_directory(tmp_path, monkeypatch):
    """`placer.replace(result, ...)` of a `place()` that wrote no directory re-places from the result itself (it
    said "re-placement needs the search's directory"): the run's policy restored, the survivors only; and the
    re-placed result can itself be re-placed. Nothing is read from or written to the working directory."""
    import placer
    from placer.graphs.models import build_model
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import replace      # placer.replace's body, with a config

    monkeypatch.chdir(tmp_path)
    res = placer.place(build_model("nmt", "tiny"), cluster="4xK80", budget_seconds=60, max_updates=3,
                       config=ReinforceConfig.for_reward("sim", seed=0, local_share=0.0, local_share_idle=0.0))
    assert res.extra["out_dir"] is None and res.run is not None and res.run.policy is not None
    # no chain's time shares: seconds, not 30
    fast = ReinforceConfig.for_reward("sim", seed=0, local_share=0.0, local_share_idle=0.0)
    again = replace(res, ["/GPU:3"], budget_seconds=30, max_updates=2, config=fast)
    assert again.extra["restored"] and again.extra["notice"] is None
    assert set(again.placement.mapping.values()) <= {"/GPU:0", "/GPU:1", "/GPU:2", "/CPU:0"}
    assert np.isfinite(again.step_time) and again.step_time <= again.extra["quick_s"] + 1e-12
    twice = replace(again, "/GPU:1", budget_seconds=30, max_updates=2, config=fast)
    assert twice.extra["restored"] and set(twice.placement.mapping.values()) <= {"/GPU:0", "/GPU:2", "/CPU:0"}
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ClusterError, match=r"cannot exclude '/GPU:3'"):       # already gone
        replace(again, ["/GPU:3"], budget_seconds=5)


def test_excluding_the_host_cpu_of_a_graph_with_cpu_only_ops_says_so_first():
    """`replace(..., exclude=["/CPU:0"])` of a graph with CPU-only ops said "no placement ... fits on the survivors"
    and named the op only inside the first baseline's reason: now one line saying the host CPU cannot be
    excluded, naming the op."""
    import placer
    from placer.graphs.opgraph import OpGraph

    ops = [("v", "VarHandleOp", 8, 400), ("r", "ReadVariableOp", 400), ("x", "Const", 40),
           ("m", "MatMul", 40, 0, 1e6), ("s", "StringFormat", 8, 0, 0.0, True), ("u", "AssignSubVariableOp", 0)]
    edges = [("v", "r"), ("r", "m"), ("x", "m"), ("m", "s"), ("v", "u"), ("m", "u")]
    g = OpGraph.build(ops, edges, colocate=[["v", "r", "u"]], name="small")
    res = placer.place(g, cluster="2xK80", budget_seconds=5, max_updates=1)
    with pytest.raises(ClusterError, match=r"^cannot exclude the host CPU \(/CPU:0\): op 's' \(StringFormat\) of "
                                           r"'small' run only on the CPU$"):
        placer.replace(res, ["/CPU:0"], budget_seconds=2, max_updates=1)
    assert placer.replace(res, ["/GPU:1"], budget_seconds=2, max_updates=1).placement.mapping["s"] == "/CPU:0"
