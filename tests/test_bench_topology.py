"""`placer bench --cluster DGX1 --precision fp16`: cells carry cluster and precision (CLI.md, issue 14)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from placer.bench import RESULT_KEYS


def test_bench_cell_on_a_topology_preset_in_fp16(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "placer", "bench", "--models", "gpt", "--size", "tiny", "--cluster", "DGX1",
           "--precision", "fp16", "--budget", "5", "--no-anneal", "--out", str(out), "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert r.returncode == 0, r.stderr[-2000:]
    (cell,) = json.loads((out / "results.json").read_text())
    assert set(RESULT_KEYS) <= set(cell)
    assert (cell["model"], cell["gpus"], cell["kind"], cell["cluster"], cell["precision"]) == \
        ("gpt", 8, "V100", "DGX1", "fp16")
    assert cell["baselines"]["expert"] is not None and (out / "gpt_DGX1_fp16" / "history.json").is_file()
    assert "| gpt (DGX1, fp16) |" in (out / "RESULTS.md").read_text()
