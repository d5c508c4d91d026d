"""benchmarks/bench_anneal.py --tune-table: seeds of one setting recorded by several runs are pooled per seed."""
import json


def _rec(settings, seeds, values, date="2026-12-06 03:00:00", model="clip", cluster="DGX1", evals=25000,
         precision="fp16"):
    """A record as `tune` writes it: the config the runs used (merges' and cluster moves' shares resolved for the
    cluster)."""
    from placer.baselines.anneal import AnnealConfig
    from placer.grouped import auto_shares
    from placer.sim.cluster import parse_cluster

    c = parse_cluster(cluster)
    cfg = auto_shares(AnnealConfig(**settings), c.num_devices, c.cpu_index).to_dict()
    return {"bench": "anneal_tune", "model": model, "cluster": cluster, "evaluations": evals, "date": date,
            "settings": settings, "config": cfg, "seeds": seeds, "values_s": values, "precision": precision}


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


def test_tune_table_names_merges_against_the_default_of_the_cells_device_count(benchmark_script, tmp_path,
                                                                              monkeypatch, capsys):
    """Merges' default share follows the device count (0.05 from 8 accelerators on, else 0): on 4 K80s a run
    without merges is the default, on 8 V100s it is the setting {"merge_prob": 0.0} and a run with 0.05 the
    default; records from before the share was automatic (no key, or 0.0) read the same way. Cluster moves
    likewise (0.1 from 8 accelerators on): a DGX1 record from before them is the setting {"cluster_prob": 0.0}."""
    mod = benchmark_script("bench_anneal")
    old = _rec({}, [1], [5.0], model="nmt", cluster="4xK80", precision="fp32")
    del old["config"]["merge_prob"]                          # a record from before merges existed
    recs = [_rec({}, [0], [1.0], model="nmt", cluster="4xK80", precision="fp32"), old,
            _rec({"merge_prob": 0.0}, [0], [2.0]),            # DGX1 without merges
            _rec({}, [1], [3.0])]                             # DGX1 with the default: 0.05
    assert recs[3]["config"]["merge_prob"] == 0.05 and recs[0]["config"]["merge_prob"] == 0.0
    before = _rec({}, [2], [7.0])                             # DGX1 from before cluster moves existed
    del before["config"]["cluster_prob"]
    recs.append(before)
    (tmp_path / "bench_anneal_tune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(mod, "RESULTS", tmp_path)

    mod.tune_table("2026-12-06", 25000)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].count("|") == 7     # model, cluster, seeds, three settings
    assert "default" in lines[0] and '{"merge_prob": 0.0}' in lines[0] and '{"cluster_prob": 0.0}' in lines[0]
    cols = [[c.strip() for c in x.strip("|").split("|")] for x in lines[2:]]
    rows = {tuple(c[:2]): c[3:] for c in cols}
    assert rows[("nmt", "4xK80")] == ["3.0000 (1.000-5.000)", "n/a", "n/a"]  # seeds 0 and 1
    assert rows[("clip", "DGX1:fp16")] == ["3.0000 (3.000-3.000)", "2.0000 (2.000-2.000)", "7.0000 (7.000-7.000)"]
