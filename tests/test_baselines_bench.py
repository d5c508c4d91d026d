"""`placer bench`: baselines simulated by one simulator, the report, and the CLI smoke run (tiny nmt, 2 GPUs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from placer.baselines.bench import RESULT_KEYS, _curve, best_baseline, evaluate_baselines, write_report


def test_best_baseline_ignores_nulls_and_sanity_checks():
    assert best_baseline({"expert": 2.0, "metis": None, "m_etf": 1.5, "random": 0.1}) == ("m_etf", 1.5)
    assert best_baseline({"metis": None}) == (None, None)


def _cell(model, gpus, rl, expert, lb=0.5):
    return {"model": model, "gpus": gpus, "kind": "K80", "rl_s": rl, "search_best_s": rl * 1.01,
            "lower_bound_s": lb, "search_wall_s": 12.0,
            "baselines": {"single_gpu": None, "single_cpu": 3.0, "expert": expert, "metis": 1.2, "scotch": 1.1,
                          "heft": 1.3, "m_topo": 1.4, "m_etf": 1.0, "m_sct": 1.05, "random": 2.0},
            "baseline_errors": {"single_gpu": "out of memory on /GPU:0"}}


def test_report_table_and_figures(tmp_path):
    results = [_cell("nmt", 2, 0.8, 1.6), _cell("nmt", 4, 0.7, 1.4), _cell("rnnlm", 2, 0.9, 1.0)]
    (tmp_path / "nmt_2xK80").mkdir()
    (tmp_path / "nmt_2xK80" / "history.json").write_text(json.dumps(
        [{"wall_s": float(i), "search_best_s": 2.0 / (1 + i), "best_s": 1.0} for i in range(10)]))
    write_report(results, tmp_path, command="placer bench --models nmt")
    md = (tmp_path / "RESULTS.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| Model"))
    for col in ("Single-CPU", "Single-GPU", "#GPUs", "Scotch", "MinCut", "Expert", "RL", "Speedup", "HEFT", "m-ETF",
                "m-SCT", "Lower bound", "RL / LB", "Search (s)"):
        assert col in header, col
    row = next(line for line in md.splitlines() if line.startswith("| nmt | 3 | OOM | 2 |"))
    assert "+25.0%" in row  # best baseline m_etf 1.0 / RL 0.8 - 1
    assert "| 1.60 |" in row  # RL / lower bound = 0.8 / 0.5
    assert "out of memory on /GPU:0" in md
    xs, ys = _curve([{"wall_s": 0.0, "search_best_s": float("inf")}, {"wall_s": 1.0, "search_best_s": 2.0},
                     {"wall_s": 2.0, "search_best_s": 3.0}, {"wall_s": 3.0, "search_best_s": 0.5}], norm=1.0)
    assert xs.tolist() == [1.0, 2.0, 3.0] and ys.tolist() == [2.0, 2.0, 0.5]  # best so far / best baseline
    for f in ("bars_nmt.png", "bars_rnnlm.png", "learning_curves.png"):
        assert (tmp_path / f).stat().st_size > 1000, f
        assert f in md


def test_baselines_evaluated_by_one_simulator():
    models = pytest.importorskip("placer.graphs.models")
    sim_mod = pytest.importorskip("placer.sim.simulator")
    from placer.sim.cluster import parse_cluster
    from placer.sim.costs import analytical_costs

    g = models.build_model("nmt", "tiny")
    c = parse_cluster("2xK80")
    costs = analytical_costs(g, c).matrix(c)
    sim = sim_mod.Simulator(g, c, costs)
    times, walls, errors, placements = evaluate_baselines(g, c, costs, sim)
    for name in ("single_gpu", "single_cpu", "expert", "metis", "heft", "m_topo", "m_etf", "m_sct", "random"):
        assert name in times and walls[name] >= 0
    for name, pl in placements.items():
        r = sim.simulate(pl)
        assert times[name] == (None if r.oom else r.step_time)
        assert name not in errors or times[name] is None
    assert times["single_cpu"] > times["single_gpu"] > 0  # the tiny model fits one GPU; the CPU is slower
    lb = sim.lower_bound()
    assert all(v is None or v >= lb * (1 - 1e-9) for v in times.values())


def _have_search() -> str | None:
    try:
        import placer.graphs.models  # noqa: F401
        import placer.sim.simulator  # noqa: F401
        from placer.rl.commands import search_graph  # noqa: F401  (what placer.api.place runs)
    except ImportError as e:
        return f"bench smoke test needs graphs, sim and the search (placer.rl.commands.search_graph): {e}"
    return None


@pytest.mark.skipif(_have_search() is not None, reason=str(_have_search()))
def test_bench_cli_smoke(tmp_path):
    out = tmp_path / "bench"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, "-m", "placer", "bench", "--models", "nmt", "--size", "tiny", "--gpus", "2",
           "--budget", "30", "--out", str(out), "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    cells = json.loads((out / "results.json").read_text())
    assert isinstance(cells, list) and len(cells) == 1
    cell = cells[0]
    assert set(RESULT_KEYS) <= set(cell)
    assert (cell["model"], cell["gpus"], cell["kind"]) == ("nmt", 2, "K80")
    assert all(isinstance(v, float) for v in (cell["rl_s"], cell["lower_bound_s"], cell["search_wall_s"]))
    assert cell["search_best_s"] is None or isinstance(cell["search_best_s"], float)
    assert {"single_gpu", "expert", "metis", "m_etf", "m_sct"} <= set(cell["baselines"])
    known = [v for v in cell["baselines"].values() if v is not None]
    assert cell["rl_s"] <= min(v for k, v in cell["baselines"].items()
                               if v is not None and k not in ("random", "round_robin")) + 1e-12
    assert cell["rl_s"] >= cell["lower_bound_s"] * (1 - 1e-9) and known
    assert "| nmt |" in (out / "RESULTS.md").read_text()
    # resumable: a rerun with the same settings skips the cell (same content, fast)
    before = (out / "results.json").read_text()
    r2 = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert json.loads((out / "results.json").read_text()) == json.loads(before)
    assert np.isfinite(cell["rl_s"])
