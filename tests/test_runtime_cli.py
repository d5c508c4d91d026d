"""`placer measure` / `placer profile` end to end (real TF in a child process, logical CPUs)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from placer.cli import main
from placer.sim.costs import CostTable


@pytest.fixture(scope="module")
def meta_file(tmp_path_factory):
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [16, 128], name="x")
        w = tf.compat.v1.get_variable("w", [128, 128])
        loss = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)), name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
        tf.compat.v1.add_to_collection("train_op", train)
        path = tmp_path_factory.mktemp("g") / "mlp.meta"
        tf.compat.v1.train.export_meta_graph(filename=str(path), graph=g)
    return str(path)


def test_measure_json(meta_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path / "cache"))
    rc = main(["measure", meta_file, "--devices", "cpu:2", "--placement", "round_robin", "--runs", "3",
               "--warmup", "1", "--json"])
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0
    assert set(obj) >= {"step_time_s", "runs_s", "oom", "error", "on_assigned_device"}
    assert obj["error"] is None and obj["oom"] is False
    assert len(obj["runs_s"]) == 3 and all(r > 0 for r in obj["runs_s"])
    assert obj["step_time_s"] == pytest.approx(float(np.median(obj["runs_s"])))
    assert obj["on_assigned_device"] == 1.0


def test_profile_writes_a_cost_table_the_simulator_loads(meta_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "costs.json"
    assert main(["profile", meta_file, "--devices", "cpu:1", "--out", str(out), "--runs", "2"]) == 0
    from placer.graphs import load

    g = load(meta_file)
    t = CostTable.load(out, g)                     # same graph fingerprint, one time per op
    assert t.source == "profiled" and t.kinds == ["cpu"]
    secs = t.for_kind("cpu")
    mm = [i for i, ty in enumerate(g.types) if ty == "MatMul"]
    assert mm and all(secs[i] > 0 for i in mm)
    assert t.meta["runs"] == 2 and t.meta["estimated_ops"]["cpu"] == 0


def test_a_token_or_tls_certificate_without_workers_is_refused_not_ignored(meta_file, tmp_path, capsys):
    """--token-file / --tls-ca authenticate to --workers only: without them the placements were measured (or
    searched) here and the flag silently unused."""
    import placer
    from placer.errors import MeasurementError
    from placer.runtime import make_evaluator

    tok = tmp_path / "token"
    tok.write_text("s3cret")
    for argv in (["measure", meta_file, "--devices", "cpu:1", "--token-file", str(tok)],
                 ["measure", meta_file, "--devices", "cpu:1", "--tls-ca", str(tok)],
                 ["search", meta_file, "--cluster", "2xK80", "--token-file", str(tok), "--out", str(tmp_path / "r")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"({tok}) is for remote workers: give them (--workers" in err, err
    assert not (tmp_path / "r").exists()                    # refused before any work
    with pytest.raises(MeasurementError, match="token file"):
        make_evaluator(None, "cpu:1", token_file=str(tok))
    with pytest.raises(MeasurementError, match="token file"):
        placer.place(meta_file, cluster="2xK80", token_file=str(tok), budget_seconds=1)
