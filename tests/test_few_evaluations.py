"""A measured search (each evaluation a real step of seconds) takes the settings tuned for few evaluations
(`FEW_EVALUATIONS`, issue 13); a simulated one adds local moves to the defaults (`CHEAP_EVALUATIONS`: an
evaluation costs less than a policy update); an explicit config wins over both."""
from __future__ import annotations

import json

from placer.rl.reinforce import CHEAP_EVALUATIONS, FEW_EVALUATIONS, ReinforceConfig


def test_for_reward_picks_the_settings():
    few, sim = ReinforceConfig.for_reward("measure", seed=3), ReinforceConfig.for_reward("sim", seed=3)
    assert sim == ReinforceConfig(seed=3, **CHEAP_EVALUATIONS) and sim.local_moves > 0
    assert 0 < few.local_moves < sim.local_moves   # a few: each one is a measurement of seconds
    assert ReinforceConfig.for_reward("sim", local_moves=0) == ReinforceConfig()        # the policy alone
    assert all(getattr(few, k) == v for k, v in FEW_EVALUATIONS.items()) and few.seed == 3
    assert few.num_samples < sim.num_samples and few.elite_steps > sim.elite_steps
    assert ReinforceConfig.for_reward("measure", num_samples=16).num_samples == 16     # overrides win


def _run_config(tmp_path, reward, config=None):
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.search import search

    problem = build_problem(build_model("nmt", "tiny"), "2xK80", seed=0)
    try:
        res = search(problem, reward=reward, budget_seconds=60, max_updates=2, out_dir=tmp_path / reward,
                     config=config, remeasure=False)
    finally:
        problem.close()
    state = json.loads((tmp_path / reward / "checkpoint" / "state.json").read_text())
    return res, state["config"]


def test_simulated_search_makes_local_moves_between_updates(tmp_path):
    # the simulated defaults without the chain's time share, which would make the first update's chain run for
    # 3x the TF tracing that dominates this tiny search's wall (test_rl_search tests the share)
    res, cfg = _run_config(tmp_path, "sim", ReinforceConfig.for_reward("sim", local_share=0.0))
    assert cfg["local_moves"] == CHEAP_EVALUATIONS["local_moves"] and cfg["local_share"] == 0.0
    rows = [r for r in res.history if "update" in r]
    assert rows[-1]["local_evaluations"] == res.extra["local_moves"]["evaluations"] > 0
    assert rows[1]["evaluations"] - rows[0]["evaluations"] == rows[1]["new"] + (
        rows[1]["local_evaluations"] - rows[0]["local_evaluations"])
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["local_moves"] == res.extra["local_moves"]


def test_measured_search_samples_few_per_update(tmp_path):
    res, cfg = _run_config(tmp_path, "measure")
    assert cfg["num_samples"] == FEW_EVALUATIONS["num_samples"] and cfg["elite_steps"] == FEW_EVALUATIONS["elite_steps"]
    assert cfg["reuse_evaluations"] is True                  # a measurement is never repeated for the same placement
    assert cfg["local_moves"] == FEW_EVALUATIONS["local_moves"] > 0
    assert cfg["local_screen"] == FEW_EVALUATIONS["local_screen"] > 1    # the simulator screens what is measured
    assert cfg["sample_screen"] == FEW_EVALUATIONS["sample_screen"] > 1  # the policy's samples too
    rows = [r for r in res.history if "update" in r]
    local = rows[1]["local_evaluations"] - rows[0]["local_evaluations"]
    assert len(rows) == 2 and 0 < rows[1]["new"] <= FEW_EVALUATIONS["num_samples"]
    assert 0 < local <= FEW_EVALUATIONS["local_moves"]
    assert rows[1]["evaluations"] - rows[0]["evaluations"] == rows[1]["new"] + local
    summary = json.loads((tmp_path / "measure" / "summary.json").read_text())
    assert summary["repeats_looked_up"] == res.extra["repeats_looked_up"] == sum(r["drawn"] - r["new"] for r in rows)


def test_measured_baselines_take_interleaved_rounds_and_copies_share_one_time():
    """With baseline_rounds 2 (measured rewards) each distinct baseline placement is evaluated once per round,
    the rounds in opposite orders, and gets the median of all its runs; baselines that give the same placement
    (on a 2-task cluster single_gpu and single_cpu both mean task 0) share that one time instead of two noisy
    ones. A failure in either round is kept."""
    import numpy as np

    from placer.rl.search import Search
    from placer.sim.evaluator import Outcome

    class Toy:                                   # 4 groups = 4 ops, 2 devices
        num_groups = 4
        op_group = np.arange(4)
        cpu_only = np.zeros(4, bool)
        features = np.zeros((4, 3), np.float32)
        adjacency = np.zeros((4, 4), np.float32)

        def expand(self, a, cpu_index=None):
            return np.asarray(a)

    class Noisy:                                 # each evaluation: runs that depend on the call, not the placement
        devices = ["/task:0", "/task:1"]

        def __init__(self):
            self.calls = []

        def evaluate(self, placements):
            self.calls.append([tuple(int(x) for x in p) for p in placements])
            k = len(self.calls)
            return [Outcome(float("inf"), failed=True, reason="boom") if p.tolist() == [1, 1, 1, 1] and k == 2
                    else Outcome(1.0 + 0.1 * k + 0.01 * i, runs=(1.0 + 0.1 * k + 0.01 * i,) * 3)
                    for i, p in enumerate(placements)]

    zero, split, bad = np.zeros(4, int), np.array([0, 1, 0, 1]), np.ones(4, int)
    ev = Noisy()
    s = Search(Toy(), ev, baselines={"single_gpu": zero, "split": split, "single_cpu": zero.copy(), "bad": bad},
               config=ReinforceConfig(baseline_rounds=2), progress=False, tensorboard=False)
    s._evaluate_baselines()
    assert ev.calls == [[(0, 0, 0, 0), (0, 1, 0, 1), (1, 1, 1, 1)], [(1, 1, 1, 1), (0, 1, 0, 1), (0, 0, 0, 0)]]
    assert s.evaluations == 6
    assert s.baselines["single_gpu"] == s.baselines["single_cpu"] == np.median([1.1] * 3 + [1.22] * 3)
    assert s.baselines["split"] == np.median([1.11] * 3 + [1.21] * 3)
    assert s.baselines["bad"] is None and s.baseline_failures["bad"] == "boom"
    # a placement that failed in the first round is not evaluated again
    ev2 = Noisy()
    s2 = Search(Toy(), ev2, baselines={"split": split, "bad": bad}, config=ReinforceConfig(baseline_rounds=3),
                progress=False, tensorboard=False)
    ev2.calls.append([])                         # the fake fails `bad` on its second call: make that round 1
    s2._evaluate_baselines()
    assert ev2.calls[1:] == [[(0, 1, 0, 1), (1, 1, 1, 1)], [(0, 1, 0, 1)], [(0, 1, 0, 1)]]
    assert s2.evaluations == 4 and s2.baselines["bad"] is None and s2.baselines["split"] is not None
    # one round (simulated rewards, the default): one batch over every name, as before
    ev1 = Noisy()
    s1 = Search(Toy(), ev1, baselines={"single_gpu": zero, "single_cpu": zero.copy()}, progress=False,
                tensorboard=False)
    s1._evaluate_baselines()
    assert len(ev1.calls) == 1 and len(ev1.calls[0]) == 2 and s1.evaluations == 2


def test_bench_cells_record_their_local_moves():
    # a bench cell searched with local moves must not be taken for an older one searched without them (same key)
    from placer.bench import CellSettings

    cell = CellSettings("nmt", 4, "K80", "full", "sim", 120.0, 0)
    assert cell.key()["local_moves"] == CHEAP_EVALUATIONS["local_moves"]
    # ...nor one searched before the chain had its share of the wall time
    assert cell.key()["local_share"] == CHEAP_EVALUATIONS["local_share"] > 0
    assert cell.search_config() == ReinforceConfig.for_reward("sim", seed=0)
    # ...nor one searched before the chain took more of the wall while the policy brought no best (2026-12-06)
    assert (cell.key()["local_share_idle"], cell.key()["local_share_patience"]) == (
        CHEAP_EVALUATIONS["local_share_idle"], CHEAP_EVALUATIONS["local_share_patience"]) and \
        CHEAP_EVALUATIONS["local_share_idle"] > CHEAP_EVALUATIONS["local_share"]
    # ...nor one whose chain's schedule spanned the whole budget (before the evening of 2026-12-06)
    assert cell.key()["local_schedule"] == CHEAP_EVALUATIONS["local_schedule"] == "chain"
    assert "local_schedule" not in CellSettings("nmt", 4, "K80", "full", "sim", 120.0, 0,
                                                local_moves=0).key()
    # ...nor one whose search or annealer made no attraction moves (before 2026-12-06)
    from placer.baselines.anneal import AnnealConfig

    assert cell.key()["local_attract_prob"] == ReinforceConfig().local_attract_prob > 0
    assert cell.key()["anneal_attract_prob"] == AnnealConfig().attract_prob > 0
    assert "anneal_attract_prob" not in CellSettings("nmt", 4, "K80", "full", "sim", 120.0, 0, anneal=False).key()
    off = CellSettings("nmt", 4, "K80", "full", "sim", 120.0, 0, local_moves=0)
    assert not {"local_moves", "local_share", "local_share_idle"} & set(off.key())
    assert CellSettings("nmt", 4, "K80", "full", "sim", 120.0, 0, local_moves=32).key()["local_moves"] == 32
    # ...nor a cell of 8 accelerators searched or annealed before merges were their default there (2026-12-06):
    # the key holds the share used; on fewer accelerators it is 0, so older cells keep their keys
    assert not {"local_merge_prob", "anneal_merge_prob"} & set(cell.key())
    dgx = CellSettings("clip", 8, "V100", "full", "sim", 120.0, 0, cluster="DGX1", precision="fp16").key()
    assert dgx["local_merge_prob"] == dgx["anneal_merge_prob"] == 0.05
    assert CellSettings("nmt", 8, "K80", "full", "sim", 120.0, 0).key()["local_merge_prob"] == 0.05


def test_bench_rejects_negative_local_moves(tmp_path, capsys):
    from placer.cli import main

    assert main(["bench", "--models", "nmt", "--gpus", "2", "--size", "tiny", "--local-moves", "-5",
                 "--out", str(tmp_path)]) == 2
    assert "--local-moves must be 0 or more, got -5" in capsys.readouterr().err
