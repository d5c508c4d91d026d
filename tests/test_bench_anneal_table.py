"""benchmarks/bench_anneal.py --tune-table: seeds of one setting recorded by several runs are pooled per seed."""
import json


def _rec(settings, seeds, values, date="2026-12-06 03:00:00", model="clip", cluster="DGX1", evals=25000):
    from placer.baselines.anneal import AnnealConfig

    return {"bench": "anneal_tune", "model": model, "cluster": cluster, "evaluations": evals, "date": date,
            "settings": settings, "config": AnnealConfig(**settings).to_dict(), "seeds": seeds,
            "values_s": values, "precision": "fp16"}


def test_tune_table_pools_seeds_of_one_setting_and_a_rerun_seed_keeps_its_latest_value(benchmark_script, tmp_path,
                                                                                       monkeypatch, capsys):
    mod = benchmark_script("bench_anneal")
    recs = [_rec({}, [0, 1], [1.0, 2.0]),
            _rec({}, [2, 3], [3.0, 6.0]),                      # --first-anneal-seed 2: added to seeds 0-1
            _rec({"attract_prob": 0.0}, [0, 1], [4.0, 4.0]),
            _rec({"attract_prob": 0.0}, [1], [8.0]),           # seed 1 run again: the later value replaces it
            _rec({}, [0], [100.0], date="2026-12-05 23:00:00"),  # another day: not read
            _rec({}, [0], [100.0], evals=1000)]                # another count: not read
    (tmp_path / "bench_anneal_tune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(mod, "RESULTS", tmp_path)

    mod.tune_table("2026-12-06", 25000)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3                                     # header, rule, one cell
    assert "default" in lines[0] and '{"attract_prob": 0.0}' in lines[0]
    cols = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cols[:3] == ["clip", "DGX1:fp16", "2/4"]            # 4 seeds of the default, 2 of the other
    assert cols[3] == "3.0000 (1.000-6.000)"                  # seeds 0-3 pooled: mean of 1, 2, 3, 6
    assert cols[4] == "6.0000 (4.000-8.000)"                  # seed 0: 4, seed 1: 8 (not 4)
