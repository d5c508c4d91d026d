"""`placer bench --cluster DGX1 --precision fp16`: cells carry cluster and precision (CLI.md, issue 14)."""
from __future__ import annotations

import json

import pytest

from placer.bench import RESULT_KEYS


def test_bench_cell_on_a_topology_preset_in_fp16(tmp_path, capsys):
    from placer.cli import main     # in-process: a `python -m placer` process would add a TensorFlow start-up

    out = tmp_path / "bench"
    rc = main(["bench", "--models", "gpt", "--size", "tiny", "--cluster", "DGX1", "--precision", "fp16",
               "--budget", "3", "--no-anneal", "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    (cell,) = json.loads((out / "results.json").read_text())
    assert set(RESULT_KEYS) <= set(cell)
    assert (cell["model"], cell["gpus"], cell["kind"], cell["cluster"], cell["precision"]) == \
        ("gpt", 8, "V100", "DGX1", "fp16")
    assert cell["baselines"]["expert"] is not None and (out / "gpt_DGX1_fp16" / "history.json").is_file()
    assert "| gpt (DGX1, fp16) |" in (out / "RESULTS.md").read_text()


@pytest.mark.parametrize("content, match", [("[1, 2]", "entry #0 is not a cell"), ("{", "cannot read"),
                                            ("{}", "is not a list of cells")])
def test_bench_out_with_a_results_json_that_is_no_list_of_cells(tmp_path, capsys, content, match):
    """A results.json in --out that is not placer's (here a list of numbers) is one line naming the file before
    any cell runs (it was an AttributeError traceback)."""
    from placer.cli import main

    (tmp_path / "results.json").write_text(content)
    assert main(["bench", "--models", "rnnlm", "--gpus", "2", "--size", "tiny", "--budget", "5", "--no-anneal",
                 "--no-progress", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "results.json" in err and match in err and "Traceback" not in err and err.count("\n") == 1


def test_bench_kind_that_is_no_device_kind_names_the_flag(tmp_path, capsys):
    """`placer bench --kind FOO` named the spec it built ('1xFOO'), not the flag the user gave."""
    from placer.cli import main

    assert main(["bench", "--kind", "FOO", "--models", "rnnlm", "--gpus", "2", "--size", "tiny", "--budget", "5",
                 "--no-progress", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placer bench: error: --kind FOO: ") and "Traceback" not in err and err.count("\n") == 1
