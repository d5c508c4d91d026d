"""benchmarks/finetune_start.py: --config's overrides are checked before any work; they and --split-groups make rows
of their own."""
import json

import pytest


def test_config_overrides_are_a_row_of_their_own(benchmark_script, tmp_path):
    mod = benchmark_script("finetune_start")
    base = {"bench": "finetune_start", "graph": "gpt@DGX1:fp16", "method": "auto", "evals": 30000,
            "s_at_evals": {"1000": 0.4, "5000": 0.3, "30000": 0.2}}
    lines = [{**base, "seed": 0}, {**base, "seed": 1, "s_at_evals": {"1000": 0.4, "5000": 0.3, "30000": 0.3}},
             {**base, "seed": 0, "config": {"local_accept0": 0.05}, "s_at_evals": {"1000": 0.5, "5000": 0.4,
                                                                                  "30000": 0.1}},
             {**base, "seed": 3, "split_groups": "best", "groups": 294},
             {**base, "seed": 4, "split_groups": "best", "groups": 752}]      # another refinement: its own row
    path = tmp_path / "finetune_start.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows = mod.table(path).splitlines()[2:]
    assert rows == ['| gpt@DGX1:fp16 | auto | 0,1 | 0.4000 | 0.3000 | 0.2500 | 30,000 |',
                    '| gpt@DGX1:fp16 | auto --split-groups best (294 groups) | 3 | 0.4000 | 0.3000 | 0.2000 | 30,000 |',
                    '| gpt@DGX1:fp16 | auto --split-groups best (752 groups) | 4 | 0.4000 | 0.3000 | 0.2000 | 30,000 |',
                    '| gpt@DGX1:fp16 | auto {"local_accept0": 0.05} | 0 | 0.5000 | 0.4000 | 0.1000 | 30,000 |']


@pytest.mark.parametrize("config, message", [("{bad", "--config is not JSON"), ("[1]", "wants a JSON object"),
                                             ('{"bogus": 1}', "unknown ReinforceConfig fields: bogus")])
def test_a_bad_config_is_one_line_before_any_work(benchmark_script, capsys, monkeypatch, config, message):
    mod = benchmark_script("finetune_start")
    monkeypatch.setattr(mod, "run", lambda *a, **k: pytest.fail("ran with a bad --config"))
    with pytest.raises(SystemExit) as e:
        mod.main(["--graph", "gpt@DGX1:fp16", "--config", config])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
