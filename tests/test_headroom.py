"""benchmarks/headroom.py: "best known" counts every recorded `placer bench` table, not only results/results.json."""
import json


def test_best_known_reads_the_other_bench_tables(benchmark_script, tmp_path, monkeypatch):
    mod = benchmark_script("headroom")
    ann = {"bench": "anneal_vs_policy", "model": "rnnlm", "cluster": "4xK80", "evaluations": 1000,
           "anneal_s_seeds": [0.40, 0.40, 0.40, 0.40, 0.40], "anneal_config": {"block": "linked", "attract_prob": 0.2}}
    (tmp_path / "bench_anneal.jsonl").write_text(json.dumps(ann) + "\n")
    cell = {"model": "rnnlm", "gpus": 4, "kind": "K80"}
    (tmp_path / "results.json").write_text(json.dumps([{**cell, "search_best_s": 0.36}]))
    (tmp_path / "k80_later").mkdir()
    (tmp_path / "k80_later" / "results.json").write_text(json.dumps([{**cell, "search_best_s": 0.32, "anneal_s": 0.33},
                                                                      {**cell, "gpus": 2, "search_best_s": 0.01}]))
    monkeypatch.setattr(mod, "RESULTS", tmp_path)

    [row] = mod.table(anneal_attract=0.2)
    assert row["policy_300s_s"] == 0.36                     # the column stays the main table's
    assert row["best_known_s"] == 0.32                      # best known: the later table's search (not 2 GPUs' cell)
    assert abs(row["ceiling_pct"] - 20.0) < 1e-9


def test_annealing_mean_is_of_seeds_0_to_4_in_a_longer_record(benchmark_script, tmp_path, monkeypatch):
    mod = benchmark_script("headroom")
    ann = {"bench": "anneal_vs_policy", "model": "rnnlm", "cluster": "4xK80", "evaluations": 1000,
           "anneal_s_seeds": [0.40] * 5 + [0.80] * 3, "anneal_config": {"block": "linked", "attract_prob": 0.2}}
    (tmp_path / "bench_anneal.jsonl").write_text(json.dumps(ann) + "\n")
    monkeypatch.setattr(mod, "RESULTS", tmp_path)

    [row] = mod.table(anneal_attract=0.2)
    assert abs(row["anneal_1000_mean_s"] - 0.40) < 1e-12   # the table's column is "mean of seeds 0-4"


def test_pretrained_selects_the_runs_started_from_that_policy(benchmark_script, tmp_path, monkeypatch):
    mod = benchmark_script("headroom")
    ann = {"bench": "anneal_vs_policy", "model": "rnnlm", "cluster": "4xK80", "evaluations": 1000,
           "anneal_s_seeds": [0.40] * 5, "anneal_config": {"block": "linked", "attract_prob": 0.2}}
    run = {**ann, "policy_config": {"local_moves": 8}, "policy_seeds": [0]}
    lines = [ann, {**run, "policy_s_seeds": [0.30]}, {**run, "policy_s_seeds": [0.50], "pretrained": "default"}]
    (tmp_path / "bench_anneal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    monkeypatch.setattr(mod, "RESULTS", tmp_path)

    [scratch] = mod.table({"local_moves": 8}, anneal_attract=0.2)
    [pre] = mod.table({"local_moves": 8}, anneal_attract=0.2, pretrained="default")
    assert scratch["policy_s_seeds"] == [0.30] and pre["policy_s_seeds"] == [0.50]


def test_welch_gap_is_relative_to_annealing_and_symmetric_for_equal_samples(benchmark_script):
    mod = benchmark_script("headroom")
    mean, lo, hi = mod.welch_gap([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert mean == 0.0 and abs(lo + hi) < 1e-12 and lo < 0 < hi
    # t(0.975, 4 dof) = 2.776; se = sqrt(1/3 + 1/3): the interval's half width over annealing's mean 2
    assert abs(hi - 2.776445 * (2 / 3) ** 0.5 / 2) < 1e-5
    assert all(abs(x - 0.1) < 1e-12 for x in mod.welch_gap([1.1, 1.1], [1.0, 1.0]))   # no spread: a point
    assert mod.welch_gap([1.0], [1.0, 2.0]) is None
