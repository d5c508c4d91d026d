"""A measured search (each evaluation a real step of seconds) takes the settings tuned for few evaluations
(`FEW_EVALUATIONS`, issue 13); a simulated one keeps the defaults (every other search test runs with them); an
explicit config wins over both."""
from __future__ import annotations

import json

from placer.rl.reinforce import FEW_EVALUATIONS, ReinforceConfig


def test_for_reward_picks_the_settings():
    few, sim = ReinforceConfig.for_reward("measure", seed=3), ReinforceConfig.for_reward("sim", seed=3)
    assert sim == ReinforceConfig(seed=3)
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


def test_measured_search_samples_few_per_update(tmp_path):
    res, cfg = _run_config(tmp_path, "measure")
    assert cfg["num_samples"] == FEW_EVALUATIONS["num_samples"] and cfg["elite_steps"] == FEW_EVALUATIONS["elite_steps"]
    rows = [r for r in res.history if "update" in r]
    assert len(rows) == 2 and rows[1]["evaluations"] - rows[0]["evaluations"] == FEW_EVALUATIONS["num_samples"]
