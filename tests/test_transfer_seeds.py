"""benchmarks/transfer.py --seeds-table: the held-out targets over seeds, each seed's gap against its own search
from scratch."""
import json

import pytest


def test_seeds_table_gaps_are_per_seed_and_a_record_without_seed_is_seed_0(benchmark_script):
    mod = benchmark_script("transfer")
    recs = [{"graph": "gpt@DGX1:fp16", "zero_shot_s": 0.30, "finetune60_s": 0.22, "scratch300_s": 0.20,
             "best_baseline_s": 0.6, "zero_shot_wall_s": 7.0},
            {"graph": "gpt@DGX1:fp16", "seed": 1, "zero_shot_s": 0.33, "finetune60_s": 0.33, "scratch300_s": 0.30,
             "best_baseline_s": 0.3, "zero_shot_wall_s": 9.0},
            {"graph": "clip@DGX1:fp16", "seed": 2, "zero_shot_s": None, "finetune60_s": 0.2, "scratch300_s": 0.2}]
    rows = mod.seeds_table(recs).splitlines()
    merged = mod.seeds_table(recs + [{"graph": "clip@DGX1:fp16", "seed": 2, "zero_shot_s": 0.22, "finetune60_s": 0.2,
                                      "zero_shot_wall_s": 5.0, "best_baseline_s": 0.25}]).splitlines()
    assert merged[3] == ("| clip@DGX1:fp16 | 2 | 0.2200 (0.2200) | 5.0 | -12.0% (-12.0%) | 0.2000 (0.2000) | "
                         "0.2000 (0.2000) | +10.0% (+10.0%) | +0.0% (+0.0%) |")   # the earlier search kept
    assert rows[0].startswith("| graph | seeds | zero-shot (s) | zero-shot wall, max (s) | zero-shot vs best baseline "
                              "| finetune60 (s) | scratch300 (s) |")
    assert rows[2] == ("| gpt@DGX1:fp16 | 0,1 | 0.3150 (0.3000 / 0.3300) | 9.0 | -20.0% (-50.0% / +10.0%) | "
                       "0.2750 (0.2200 / 0.3300) | 0.2500 (0.2000 / 0.3000) | +30.0% (+50.0% / +10.0%) | "
                       "+10.0% (+10.0% / +10.0%) |")
    assert rows[3] == ("| clip@DGX1:fp16 | 2 | n/a | n/a | n/a | 0.2000 (0.2000) | 0.2000 (0.2000) | n/a | "
                       "+0.0% (+0.0%) |")


def test_seeds_table_reads_transfer_json_and_the_appended_lines(benchmark_script, tmp_path, monkeypatch, capsys):
    mod = benchmark_script("transfer")
    (tmp_path / "transfer.json").write_text(json.dumps([{"graph": "g@2xK80", "zero_shot_s": 0.2,
                                                         "finetune60_s": 0.2, "scratch300_s": 0.1}]))
    extra = tmp_path / "more.jsonl"
    extra.write_text(json.dumps({"graph": "g@2xK80", "seed": 1, "zero_shot_s": 0.1, "finetune60_s": 0.1,
                                 "scratch300_s": 0.1}) + "\n")
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    assert mod.main(["--seeds-table", str(extra)]) == 0
    out = capsys.readouterr().out
    assert "| g@2xK80 | 0,1 | 0.1500 (0.2000 / 0.1000) | n/a | n/a |" in out and "+50.0% (+100.0% / +0.0%) |" in out


def test_anneal_table_pairs_each_seeds_latest_fine_tune_with_annealing_at_its_evaluations(benchmark_script):
    mod = benchmark_script("transfer")
    recs = [{"graph": "g@2xK80", "finetune60_s": 0.19, "finetune60_evaluations": 30000},
            {"graph": "g@2xK80", "seed": 1, "finetune60_s": 0.5, "finetune60_evaluations": 9},
            {"graph": "g@2xK80", "seed": 1, "finetune60_s": 0.22, "finetune60_evaluations": 31000},   # the latest
            {"graph": "g@2xK80", "seed": 2, "finetune60_s": 0.1, "finetune60_evaluations": 5},  # no annealing run
            {"graph": "g@2xK80", "seed": 3, "finetune60_s": 0.1, "finetune60_evaluations": 7},
            {"graph": "g@2xK80", "seed": 3, "finetune60_s": 0.1, "finetune60_evaluations": 8}]  # latest: no run
    ann = [{"graph": "g@2xK80", "seed": 0, "evaluations": 30000, "anneal_s": 0.2},
           {"graph": "g@2xK80", "seed": 1, "evaluations": 9, "anneal_s": 0.1},
           {"graph": "g@2xK80", "seed": 1, "evaluations": 31000, "anneal_s": 0.2},
           {"graph": "g@2xK80", "seed": 3, "evaluations": 7, "anneal_s": 0.2},
           {"graph": "h@2xK80", "seed": 0, "evaluations": 10, "anneal_s": 0.2}]   # no fine-tune of h
    rows = mod.anneal_table(recs, ann).splitlines()
    assert len(rows) == 3
    assert rows[2] == ("| g@2xK80 | 0,1 | 30,000 / 31,000 | 0.2050 (0.1900 / 0.2200) | 0.2000 (0.2000 / 0.2000) | "
                       "+2.5% (-5.0% / +10.0%) |")


def test_anneal_at_finetune_gives_the_annealer_the_fine_tunes_evaluations(benchmark_script, tmp_path, monkeypatch,
                                                                          capsys):
    mod = benchmark_script("transfer")
    (tmp_path / "transfer.json").write_text(json.dumps([{"graph": "nmt/tiny@2xK80", "finetune60_s": 0.001,
                                                         "finetune60_evaluations": 60}]))
    extra = tmp_path / "more.jsonl"
    extra.write_text(json.dumps({"graph": "rnnlm/tiny@2xK80", "seed": 1, "finetune60_evaluations": 60}) + "\n")
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    assert mod.main(["--anneal-at-finetune", str(extra), "--graphs", "nmt/tiny@2xK80", "--anneal-config",
                     '{"cluster_prob": 0.2}']) == 0
    lines = [json.loads(x) for x in (tmp_path / "transfer_anneal.jsonl").read_text().splitlines()]
    assert len(lines) == 1                     # rnnlm is not among --graphs
    (ln,) = lines
    assert (ln["graph"], ln["seed"], ln["evaluations"]) == ("nmt/tiny@2xK80", 0, 60)
    assert 0 < ln["anneal_evaluations"] <= 60 and ln["anneal_s"] > 0 and ln["simulated"] is True
    assert ln["anneal_settings"] == {"cluster_prob": 0.2}
    with pytest.raises(SystemExit):
        mod.main(["--anneal-at-finetune", str(extra), "--anneal-config", '{"heat": 1}'])
    assert "--anneal-config: unknown AnnealConfig fields: heat" in capsys.readouterr().err
