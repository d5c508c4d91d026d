"""benchmarks/bench_anneal.py's policy-against-annealing run builds the model in the precision it is given."""
import json


def test_the_run_builds_and_records_the_precision_it_is_given(benchmark_script, tmp_path, monkeypatch):
    import placer.graphs.models as models

    mod = benchmark_script("bench_anneal")
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    built = []
    real = models.build_model

    def spy(name, size="full", **kw):
        built.append(kw.get("precision", "fp32"))
        return real(name, size, **kw)
    monkeypatch.setattr(models, "build_model", spy)
    recs = mod.run("gpt", "2xV100", "tiny", [60], 0, 1, 60.0, {"local_moves": 8}, 1, precision="fp16")
    assert built == ["fp16"]
    saved = [json.loads(x) for x in (tmp_path / "bench_anneal.jsonl").read_text().splitlines()]
    assert [r["precision"] for r in saved] == ["fp16"] == [r["precision"] for r in recs]
    assert saved[0]["evaluations"] == 60 and saved[0]["policy_s"] is not None and saved[0]["anneal_s"] is not None
    assert len(saved[0]["policy_wall_s_seeds"]) == 1 and saved[0]["policy_local_moves_seeds"][0]["evaluations"] > 0
