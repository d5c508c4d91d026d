"""Cost tables (analytical: Grappler + roofline; files; graph checks), Grappler agreement, trace, `placer simulate`."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from placer.errors import CostTableError, PlacementError
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import make_device, parse_cluster
from placer.sim.costs import (LAUNCH_OVERHEAD, CostTable, analytical_costs, cache_dir, grappler_step_time,
                              load_or_analytical, roofline_seconds)
from placer.sim.simulator import Simulator
from placer.sim.trace import chrome_trace, write_trace


def hand_graph() -> OpGraph:
    return OpGraph.build([("a", "MatMul", 4000, 0, 4.37e9), ("b", "Relu", 4000), ("q", "Queue", 8, 0, 0.0, True)],
                         [("a", "b"), ("b", "q")], name="hand")


# ---- roofline / tables -------------------------------------------------------------------------------------------
def test_roofline_by_hand():
    g = hand_graph()
    k80 = make_device("/GPU:0", "K80")
    r = roofline_seconds(g, k80)
    oh = LAUNCH_OVERHEAD["gpu"]
    assert r[g.index("a")] == pytest.approx(4.37e9 / 4.37e12 + oh)           # compute-bound
    assert r[g.index("b")] == pytest.approx((4000 + 4000) / 240e9 + oh)       # memory-bound: reads a, writes b


def test_matrix_inf_for_cpu_only_ops_on_gpus_and_kinds():
    g = hand_graph()
    cl = parse_cluster("2xK80")
    t = analytical_costs(g, cl, cache=False)
    assert t.source == "analytical:roofline" and set(t.kinds) == {"K80", "cpu"}
    m = t.matrix(cl)
    q = g.index("q")
    assert m.shape == (3, 3)
    assert np.isinf(m[q, :2]).all() and np.isfinite(m[q, 2])
    assert np.isfinite(m[:2]).all() and m[0, 0] == m[0, 1]
    with pytest.raises(CostTableError, match="V100"):
        t.matrix(parse_cluster("1xV100"))


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_save_load_round_trip_and_other_graph_error(tmp_path, suffix):
    g = hand_graph()
    t = analytical_costs(g, parse_cluster("1xK80"), cache=False)
    p = tmp_path / f"costs{suffix}"
    t.save(p)
    t2 = CostTable.load(p, g)
    assert t2.fingerprint == g.fingerprint and t2.source == t.source
    assert np.array_equal(t2.matrix(parse_cluster("1xK80")), t.matrix(parse_cluster("1xK80")))
    other = OpGraph.build([("x", "X", 8)], name="other")
    with pytest.raises(CostTableError) as e:
        CostTable.load(p, other)
    assert g.fingerprint in str(e.value) and other.fingerprint in str(e.value)
    with pytest.raises(CostTableError, match="does not exist"):
        CostTable.load(tmp_path / "nope.npz", g)
    (tmp_path / "junk.npz").write_bytes(b"garbage")
    with pytest.raises(CostTableError, match="junk.npz"):
        CostTable.load(tmp_path / "junk.npz", g)


@pytest.mark.parametrize("content, reason", [
    (b"garbage", "is not a cost table \\(neither JSON nor an npz"),
    (b"\x80\x04\x95pickle", "is not a cost table \\(neither JSON nor an npz"),
    (b'{"a": 1}', "it has no 'graph_fingerprint' field")])
def test_file_that_is_no_cost_table_says_so(tmp_path, content, reason):
    """Neither the advice to load a file `allow_pickle` (numpy's words for any non-npz file) nor a bare KeyError:
    one line naming the file and what is wrong with it."""
    p = tmp_path / "costs.json"
    p.write_bytes(content)
    with pytest.raises(CostTableError, match=f"costs.json.*{reason}") as e:
        CostTable.load(p, hand_graph())
    assert "pickle" not in str(e.value)


def test_an_archive_that_is_no_cost_table_is_named_as_such(tmp_path):
    """`--costs model.keras` (a zip) said "it has no 'kinds is not a file in the archive' field"."""
    import zipfile

    p = tmp_path / "m.keras"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("config.json", "{}")
    np.savez(tmp_path / "other.npz", seconds=np.zeros(3))
    for f, key in ((p, "kinds"), (tmp_path / "other.npz", "kinds")):
        with pytest.raises(CostTableError) as e:
            CostTable.load(f)
        assert str(e.value) == (f"{str(f)!r} is not a cost table (an archive without {key!r}; `placer profile --out "
                                f"FILE` writes one)")


def test_analytical_is_cached_per_kind():
    g = hand_graph()
    cl = parse_cluster("2xV100")
    analytical_costs(g, cl)
    files = sorted(f.name for f in cache_dir().glob(f"{g.fingerprint}-*.npy"))
    assert any("-V100-" in f for f in files) and any("-cpu-" in f for f in files)
    # a cached column is reused (overwrite it and observe)
    f = next(cache_dir().glob(f"{g.fingerprint}-V100-*.npy"))
    np.save(f, np.array([1.0, 2.0, 3.0]))
    assert list(analytical_costs(g, cl).seconds["V100"]) == [1.0, 2.0, 3.0]


def test_analytical_cache_is_keyed_by_placer_version(monkeypatch):
    """A placer upgrade that changes the estimate must not read the columns an older placer cached (the key held
    the graph, the device figures and TF's version only)."""
    import placer._version

    g = OpGraph.build([("mm", "MatMul", 4000, 0, 1e9), ("r", "Relu", 4000)], [("mm", "r")], name="versioned")
    cl = parse_cluster("1xV100")                               # (a graph of its own: other tests' entries differ)
    for old in cache_dir().glob(f"{g.fingerprint}-*"):         # a PLACER_TEST_CACHE kept from an earlier run
        old.unlink()
    true = analytical_costs(g, cl, cache=False).seconds["V100"]
    assert np.array_equal(analytical_costs(g, cl).seconds["V100"], true)
    [f] = cache_dir().glob(f"{g.fingerprint}-V100-*.npy")
    np.save(f, np.array([1.0, 2.0]))                           # what an older placer left there
    assert list(analytical_costs(g, cl).seconds["V100"]) == [1.0, 2.0]
    monkeypatch.setattr(placer._version, "__version__", placer._version.__version__ + ".next")
    assert np.array_equal(analytical_costs(g, cl).seconds["V100"], true)


def test_tf_version_key_without_importing_tensorflow(tmp_path):
    """The cost cache's TF-version key comes from the package metadata: a cached table (`placer simulate`, a
    zero-shot placement) is read without the seconds of importing TensorFlow, and the key is TF's own version."""
    import subprocess
    import sys

    code = ("import sys; from placer.sim.costs import _tf_version; v = _tf_version(); "
            "print(v, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PLACER_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    version, imported = out.stdout.split()
    import tensorflow as tf

    assert (version, imported) == (tf.__version__, "False")


def test_load_or_analytical_fills_missing_kinds(tmp_path):
    g = hand_graph()
    prof = CostTable(g.fingerprint, g.names, g.cpu_only, {"cpu": np.array([1.0, 2.0, 3.0])}, "profiled")
    p = tmp_path / "prof.json"
    prof.save(p)
    t = load_or_analytical(g, parse_cluster("1xK80"), p)
    assert list(t.seconds["cpu"]) == [1.0, 2.0, 3.0] and t.has_kind("K80")
    assert "profiled" in t.source
    assert load_or_analytical(g, parse_cluster("cpu"), p).kinds == ["cpu"]


def test_simulator_accepts_cost_table_and_rejects_bad_matrix():
    g = hand_graph()
    cl = parse_cluster("1xK80")
    t = analytical_costs(g, cl, cache=False)
    sim = Simulator(g, cl, t)
    r = sim.simulate(np.array([0, 0, 1]))
    m = t.matrix(cl)
    assert r.step_time == pytest.approx(m[0, 0] + m[1, 0] + 4000 / cl.bandwidth[0, 1] + cl.latency[0, 1] + m[2, 1])
    with pytest.raises(PlacementError, match="shape"):
        Simulator(g, cl, np.ones((3, 5)))


# ---- trace -------------------------------------------------------------------------------------------------------
def test_chrome_trace_rows_per_device_and_link(tmp_path):
    g = OpGraph.build([("a", "X", 1000), ("b", "X", 8), ("c", "X", 8)], [("a", "b"), ("a", "c")])
    cl = parse_cluster("2xK80")
    sim = Simulator(g, cl, np.ones(3))
    r = sim.simulate(np.array([0, 1, 2]), trace=True)
    tr = chrome_trace(g, cl, r)
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    ops = {e["name"]: e for e in xs if e["cat"] != "transfer"}
    assert set(ops) == {"a", "b", "c"} and ops["a"]["dur"] == pytest.approx(1e6)
    links = [e for e in xs if e["cat"] == "transfer"]
    assert len(links) == 2 and {e["args"]["to"] for e in links} == {"/GPU:1", "/CPU:0"}
    thread_names = {e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "thread_name"}
    assert {"/GPU:0", "/GPU:1", "/CPU:0", "/GPU:0 -> /GPU:1", "/GPU:0 -> /CPU:0"} <= thread_names
    p = tmp_path / "t.json"
    write_trace(p, g, cl, r)
    assert json.loads(p.read_text())["otherData"]["step_time_s"] == pytest.approx(r.step_time)
    with pytest.raises(PlacementError, match="trace=True"):
        chrome_trace(g, cl, sim.simulate(np.array([0, 1, 2])))


# ---- TF graphs: Grappler agreement + CLI ----------------------------------------------------------------------------
def _tf_mlp(tmp_path):
    import tensorflow as tf

    from placer.graphs import load

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 512], name="x")
        h = x
        for i in range(3):
            w = tf.compat.v1.get_variable(f"w{i}", [512, 512])
            h = tf.nn.relu(tf.matmul(h, w), name=f"relu{i}")
        loss = tf.reduce_mean(h, name="loss")
        train = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, name="train")
        g.add_to_collection("train_op", train)
        meta = tmp_path / "mlp.meta"
        tf.compat.v1.train.export_meta_graph(str(meta), graph=g)
    return load(str(meta)), meta


def test_grappler_agreement_single_gpu_tf_graph(tmp_path):
    og, _ = _tf_mlp(tmp_path)
    cl = parse_cluster("2xK80")
    t = analytical_costs(og, cl)
    assert t.source == "analytical:grappler+roofline" and t.meta["grappler_coverage"]["K80"] > 0.9
    from placer.placement import single_placement

    p = single_placement(og, cl)
    sim_t = Simulator(og, cl, t).simulate(p).step_time
    assert sim_t == pytest.approx(grappler_step_time(og, cl, p), rel=0.05)


def test_grappler_costs_a_graph_larger_than_one_device():
    """Grappler's MeasureCosts refuses a graph that needs more memory than its one virtual device ("Graph requires
    N bytes of memory"), so a model too big for one GPU -- the models worth splitting -- had every op costed by the
    roofline while the summary said "grappler+roofline". Per-op times do not depend on the memory size."""
    import dataclasses

    import tensorflow as tf

    from placer.graphs import load

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 128], name="x")
        w = tf.compat.v1.get_variable("w", [128, 128])
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(tf.matmul(x, w)), name="train")
    og = load(g, fetches=["train"], cache=False)
    cl = parse_cluster("1xK80")
    tiny = dataclasses.replace(cl, devices=[dataclasses.replace(d, memory_bytes=2**14, reserve_bytes=0)
                                            if not d.is_cpu else d for d in cl.devices])
    big, small = analytical_costs(og, cl, cache=False), analytical_costs(og, tiny, cache=False)
    assert small.meta["grappler_coverage"]["K80"] > 0.9
    np.testing.assert_allclose(small.for_kind("K80"), big.for_kind("K80"))


def test_placer_simulate_cli_json(tmp_path, capsys):
    from placer.cli import main

    og, meta = _tf_mlp(tmp_path)
    trace = tmp_path / "trace.json"
    rc = main(["simulate", str(meta), "--cluster", "2xK80", "--placement", "round_robin", "--trace", str(trace),
               "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key, typ in [("step_time_s", float), ("lower_bound_s", float), ("oom", bool), ("peak_memory_bytes", dict),
                     ("ops", int), ("simulate_ms", float)]:
        assert isinstance(out[key], typ), key
    assert out["ops"] == og.num_ops and set(out["peak_memory_bytes"]) == {"/GPU:0", "/GPU:1", "/CPU:0"}
    assert 0 < out["lower_bound_s"] <= out["step_time_s"] and not out["oom"]
    assert json.loads(trace.read_text())["traceEvents"]
    # bad input: one line, exit 2
    assert main(["simulate", str(meta), "--cluster", "4xK81"]) == 2
    assert "K81" in capsys.readouterr().err
    # a placement file for another graph
    from placer.placement import Placement

    other = OpGraph.build([("x", "X", 8)], name="other")
    pf = tmp_path / "other.json"
    Placement.from_indices(other, ["/GPU:0"], np.zeros(1, np.int64)).save(pf)
    assert main(["simulate", str(meta), "--cluster", "2xK80", "--placement", str(pf)]) == 2
    err = capsys.readouterr().err
    assert other.fingerprint in err and og.fingerprint in err
    # a placement naming a device not in the cluster
    pf2 = tmp_path / "gpu7.json"
    Placement({n: "/GPU:7" for n in og.names}, ["/GPU:7"], og.fingerprint).save(pf2)
    assert main(["simulate", str(meta), "--cluster", "2xK80", "--placement", str(pf2)]) == 2
    assert "/GPU:7" in capsys.readouterr().err
    # a cost table of another graph
    cf = tmp_path / "c.npz"
    analytical_costs(other, parse_cluster("1xK80"), cache=False).save(cf)
    assert main(["simulate", str(meta), "--cluster", "2xK80", "--costs", str(cf)]) == 2
    assert other.fingerprint in capsys.readouterr().err


def _models_available() -> bool:
    try:
        from placer.graphs.models import build_model  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not _models_available(), reason="built-in models not available")
@pytest.mark.parametrize("model,size", [
    ("inception_v3", "tiny"), ("nmt", "tiny"),
    pytest.param("inception_v3", "full", marks=pytest.mark.slow),
    pytest.param("nmt", "full", marks=pytest.mark.slow),
])
def test_grappler_agreement_models(model, size):
    """Every op on one GPU (CPU-only ops on /CPU:0 in both): simulated step within 5% of Grappler's."""
    from placer.placement import single_placement
    from placer.graphs.models import build_model

    g = build_model(model, size=size)
    cl = parse_cluster("4xK80")
    t = analytical_costs(g, cl)
    p = single_placement(g, cl)
    sim = Simulator(g, cl, t)
    r = sim.simulate(p)
    ref = grappler_step_time(g, cl, p)
    assert r.step_time == pytest.approx(ref, rel=0.05)
    assert sim.lower_bound() <= r.step_time


@pytest.mark.slow
@pytest.mark.skipif(not _models_available(), reason="built-in models not available")
def test_random_4way_inception_slower_than_one_gpu():
    from placer.placement import random_placement, single_placement
    from placer.graphs.models import build_model

    g = build_model("inception_v3")
    cl = parse_cluster("4xK80")
    sim = Simulator(g, cl, analytical_costs(g, cl))
    one = sim.simulate(single_placement(g, cl)).step_time
    for seed in range(3):
        r = sim.simulate(random_placement(g, cl, seed=seed))
        assert r.step_time > one and r.transfer_bytes > 0
