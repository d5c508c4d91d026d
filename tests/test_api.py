import json
import re

import numpy as np
import pytest

from placer.placement import Placement, random_placement, round_robin_placement, single_placement
from placer.problem import resolve_placement
from placer.errors import OutputError, PlacementError
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster, Device


def small_cluster(n_gpu=2):
    devs = tuple(Device(f"/GPU:{i}", "K80", 12 << 30) for i in range(n_gpu)) + (Device("/CPU:0", "cpu", 64 << 30, concurrency=4),)
    D = len(devs)
    return Cluster(devs, np.full((D, D), 1e10), np.full((D, D), 1e-5), name=f"{n_gpu}xK80")


def small_graph():
    ops = [("v", "VarHandleOp", 8, 400), ("r", "ReadVariableOp", 400), ("x", "Const", 40),
           ("m", "MatMul", 40), ("s", "StringFormat", 8, 0, 0.0, True), ("u", "AssignSubVariableOp", 0)]
    edges = [("v", "r"), ("r", "m"), ("x", "m"), ("m", "s"), ("v", "u"), ("m", "u")]
    return OpGraph.build(ops, edges, colocate=[["v", "r", "u"]], name="small")


def test_placement_roundtrip_and_contract_keys(tmp_path):
    g, c = small_graph(), small_cluster()
    idx = round_robin_placement(g, c)
    p = Placement.from_indices(g, c.device_names, idx)
    p.save(tmp_path / "placement.json")
    d = json.loads((tmp_path / "placement.json").read_text())
    assert set(d) >= {"format", "graph_fingerprint", "devices", "placement", "placer_version", "tensorflow_version"}
    assert d["format"] == 1 and d["graph_fingerprint"] == g.fingerprint
    back = Placement.load(tmp_path / "placement.json")
    assert (back.to_indices(g, c.device_names) == idx).all()
    assert (resolve_placement(str(tmp_path / "placement.json"), g, c) == idx).all()


def test_a_hand_edited_map_device_joins_the_informational_devices_list(tmp_path):
    """A file whose map names a device its "devices" list lacks (an op moved by hand) loaded with the list as
    written: device_counts() then missed the device the op was on."""
    g, c = small_graph(), small_cluster()
    p = Placement.from_indices(g, c.device_names, np.zeros(g.num_ops, dtype=int))
    d = p.to_json()
    d["devices"] = [c.device_names[0]]
    d["placement"]["x"] = "/gpu:1"                  # another spelling of a device not listed
    (tmp_path / "p.json").write_text(json.dumps(d))
    back = Placement.load(tmp_path / "p.json")
    assert back.devices == [c.device_names[0], "/gpu:1"]
    assert back.device_counts() == {c.device_names[0]: g.num_ops - 1, "/gpu:1": 1}
    assert back.to_indices(g, c.device_names)[g.index("x")] == c.device_names.index("/GPU:1")


def test_placement_save_to_an_unwritable_path_is_one_line_naming_it(tmp_path):
    """save() raised the OS's error naming `PATH.tmp`, and a directory at PATH left PATH.tmp behind."""
    g, c = small_graph(), small_cluster()
    p = Placement.from_indices(g, c.device_names, round_robin_placement(g, c))
    (tmp_path / "adir").mkdir()
    for path in (tmp_path / "adir", tmp_path / "missing" / "p.json"):
        with pytest.raises(OutputError, match=f"placement file {re.escape(str(path))}: cannot write it: "):
            p.save(path)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["adir"] and not any((tmp_path / "adir").iterdir())


def test_placement_for_another_graph_is_an_error(tmp_path):
    g, c = small_graph(), small_cluster()
    other = OpGraph.build([("a", "Const", 4)], name="other")
    p = Placement.from_indices(other, c.device_names, np.zeros(1, np.int32))
    with pytest.raises(PlacementError, match=other.fingerprint):
        p.to_indices(g, c.device_names)


def test_unknown_device_and_unknown_spec_named():
    g, c = small_graph(), small_cluster()
    p = Placement({n: "/GPU:7" for n in g.names}, ["/GPU:7"], g.fingerprint)
    with pytest.raises(PlacementError, match="GPU:7"):
        p.to_indices(g, c.device_names)
    with pytest.raises(PlacementError, match="unknown placement 'nonsense'"):
        resolve_placement("nonsense", g, c)
    with pytest.raises(PlacementError, match="does not exist"):
        Placement.load("/nonexistent/placement.json")


@pytest.mark.parametrize("change, message", [
    ({"placement": {"v": None}}, "op 'v' is placed on None, not on a device name (a string)"),   # was: on 'None'
    ({"placement": {"v": 3}}, "op 'v' is placed on 3, not on a device name (a string)"),
    ({"format": "1"}, "placement format '1' is not supported (expected 1)"),          # was: format 1 ... expected 1
    ({"graph_fingerprint": 7}, "\"graph_fingerprint\" must be a string, got 7"),
    ({"devices": "/GPU:0"}, "\"devices\" must be a list of device names, got '/GPU:0'")])
def test_a_placement_file_field_of_the_wrong_type_is_named(tmp_path, change, message):
    g, c = small_graph(), small_cluster()
    d = Placement.from_indices(g, c.device_names, round_robin_placement(g, c)).to_json()
    for k, v in change.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(PlacementError) as e:
        Placement.load(tmp_path / "p.json")
    assert str(e.value) == f"{tmp_path / 'p.json'}: {message}"


def test_placement_naming_ops_not_in_the_graph_is_an_error(tmp_path):
    """A (hand-edited) placement file that names an op the graph does not have is refused, naming the op, even
    when it places every op of the graph."""
    g, c = small_graph(), small_cluster()
    p = Placement.from_indices(g, c.device_names, round_robin_placement(g, c))
    p.mapping["no/such/op"] = c.device_names[0]
    p.save(tmp_path / "placement.json")
    with pytest.raises(PlacementError, match="'no/such/op', which is not in graph"):
        resolve_placement(str(tmp_path / "placement.json"), g, c)


@pytest.mark.parametrize("max_groups", [0, -2, 2.5])
def test_bad_max_groups_is_an_error_naming_it(max_groups):
    """place(..., max_groups=0) was silently taken as the default (the CLI's --groups 0 is refused)."""
    import placer
    from placer.errors import PlacerError

    with pytest.raises(PlacerError, match=f"max_groups must be a positive integer .*got {max_groups!r}"):
        placer.place(small_graph(), cluster=small_cluster(), budget_seconds=5, max_groups=max_groups)


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_bad_seed_is_a_placer_error_naming_it(seed):
    """placer.place(..., seed=-1) raised numpy's bare ValueError ("expected non-negative integer") from deep in the
    baselines; the problem's builder now names the seed."""
    import placer
    from placer.errors import PlacerError

    with pytest.raises(PlacerError, match=f"seed must be a non-negative integer, got {seed!r}"):
        placer.place(small_graph(), cluster=small_cluster(), budget_seconds=5, seed=seed)


def test_workers_without_a_measured_reward_are_an_error_not_ignored():
    """place(..., workers=[...]) with the default reward="sim" simulated and never used the workers, silently."""
    import placer
    from placer.errors import PlacerError

    with pytest.raises(PlacerError, match=r"workers=\['127.0.0.1:50051'\] .* give reward='measure'"):
        placer.place(small_graph(), cluster=small_cluster(), budget_seconds=5, workers=["127.0.0.1:50051"])


@pytest.mark.parametrize("kwargs, words", [
    ({"samples": 128}, "samples=128 sets how a pretrained policy places: give policy="),
    ({"refine_seconds": 2.0}, "refine_seconds=2.0 sets how a pretrained policy places"),
    ({"batch_size": 512}, "fetches= and batch_size= apply when place() imports the graph, not to an OpGraph"),
    ({"fetches": ["m"]}, "fetches= and batch_size= apply when place() imports the graph")])
def test_place_arguments_that_would_be_unused_are_an_error(kwargs, words):
    """place(graph, samples=128) without policy= ran a search from scratch and never sampled; place(op_graph,
    batch_size=512) searched the graph at the batch size it was imported with: both silently."""
    import placer
    from placer.errors import PlacerError

    with pytest.raises(PlacerError, match=re.escape(words)):
        placer.place(small_graph(), cluster=small_cluster(), budget_seconds=5, **kwargs)


def test_place_out_dir_is_checked_before_the_search(tmp_path):
    """place(..., out_dir=) that is a file failed with NotADirectoryError after the whole search; one that holds
    a search had that search's files silently overwritten. Both are now one error before any work."""
    import time

    import placer
    from placer.errors import OutputError, SearchError

    (tmp_path / "afile").write_text("x")
    t0 = time.perf_counter()
    with pytest.raises(OutputError, match="afile.*cannot create it or write in it"):
        placer.place(small_graph(), cluster=small_cluster(), budget_seconds=30, out_dir=tmp_path / "afile")
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    with pytest.raises(SearchError, match="already holds a search"):
        placer.place(small_graph(), cluster=small_cluster(), budget_seconds=30, out_dir=tmp_path / "run")
    with pytest.raises(SearchError, match="already holds a search"):
        placer.replace(tmp_path / "run", ["/GPU:1"], budget_seconds=30, out_dir=tmp_path / "run")
    assert time.perf_counter() - t0 < 20          # no 30-second search ran first


@pytest.mark.parametrize("fn", [single_placement, lambda g, c: random_placement(g, c, 3), round_robin_placement])
def test_builtin_placements_keep_colocation_and_cpu_only(fn):
    g, c = small_graph(), small_cluster()
    idx = fn(g, c)
    assert idx.shape == (g.num_ops,)
    assert idx[g.index("s")] == c.cpu_index                   # CPU-only op
    assert len({idx[g.index(n)] for n in ("v", "r", "u")}) == 1  # co-located
    assert set(idx[~g.cpu_only]) <= set(c.gpu_indices)


def test_single_on_cpu_cluster_is_all_cpu():
    g = small_graph()
    c = Cluster((Device("/CPU:0", "cpu", 1 << 34),), np.zeros((1, 1)), np.zeros((1, 1)), name="cpu")
    assert (single_placement(g, c) == 0).all()


def test_apply_sets_devices_on_graphdef():
    from tensorflow.core.framework import graph_pb2

    gd = graph_pb2.GraphDef()
    for nm in ("a", "b"):
        gd.node.add(name=nm, op="NoOp")
    placed = Placement({"a": "/GPU:1"}, ["/GPU:1"]).apply(gd)
    assert [n.device for n in placed.node] == ["/GPU:1", ""]
    assert [n.device for n in gd.node] == ["", ""]  # the input is not modified
    with pytest.raises(PlacementError) as e:          # another graph's placement returned the graph unplaced
        Placement({"x": "/GPU:1"}, ["/GPU:1"], "f00").apply(gd)
    assert str(e.value) == "the placement (for graph f00) names none of the 2 nodes of this graph (its first: 'a')"


def test_retrace_reports_matched_ops():
    import tensorflow as tf

    @tf.function
    def f(x):
        return tf.nn.relu(tf.matmul(x, x, name="mm"), name="r")

    spec = tf.TensorSpec([2, 2])
    names = [op.name for op in f.get_concrete_function(spec).graph.get_operations()]
    p = Placement({n: "/CPU:0" for n in names if n != "r"}, ["/CPU:0"])
    cf, df = p.retrace(f, spec)
    devices = {op.name: op.device for op in cf.graph.get_operations()}
    assert devices["mm"].endswith("CPU:0")
    assert df.unmatched == ["r"] and df.matched == len(names) - 1


def test_retrace_counts_the_ops_colocation_creates():
    """TF creates an op under colocate_with (tf.gradients' ops, optimizer slots) on its colocated op's device
    without calling the device function: retrace left such ops out of matched/unmatched (4 of 5 ops counted,
    match_fraction 1.0 whatever they were), and never said when colocation put a placed op elsewhere."""
    import tensorflow as tf

    def f(x):
        y = tf.matmul(x, x, name="mm")
        with tf.compat.v1.colocate_with(y):
            z = tf.identity(y, name="z")
        return tf.nn.relu(z, name="r")

    spec = tf.TensorSpec([2, 2])
    names = [op.name for op in tf.function(f).get_concrete_function(spec).graph.get_operations()]
    assert "z" in names
    cf, df = Placement({n: "/CPU:0" for n in names}, ["/CPU:0"]).retrace(f, spec)
    assert df.matched == len(names) and df.unmatched == [] and df.colocated == ["z"] and df.off_device == []
    # z placed apart from mm: colocation wins, and retrace says so
    cf, df = Placement({**{n: "/CPU:0" for n in names}, "z": "/CPU:1"}, ["/CPU:0", "/CPU:1"]).retrace(f, spec)
    assert {op.name: op.device for op in cf.graph.get_operations()}["z"].endswith("CPU:0")
    assert df.colocated == ["z"] and df.off_device == ["z"] and df.matched == len(names)
    # an op colocation creates that the placement does not name is unmatched, as any other
    cf, df = Placement({n: "/CPU:0" for n in names if n != "z"}, ["/CPU:0"]).retrace(f, spec)
    assert df.unmatched == ["z"] and df.matched == len(names) - 1 and df.match_fraction < 1


def test_retrace_keeps_layers_apart():
    """A drifted name is matched within its own layer: `dense_1/*` never takes the device of `dense/*`."""
    from placer.placement import DeviceFunction

    p = Placement({"dense/MatMul": "/GPU:0", "dense/BiasAdd": "/GPU:0",
                   "dense_1/MatMul": "/GPU:1", "dense_1/BiasAdd": "/GPU:1"}, ["/GPU:0", "/GPU:1"])
    df = DeviceFunction(p)
    assert df.device_for("dense_1/MatMul") == "/GPU:1"
    assert df.device_for("dense_1/MatMul_3") == "/GPU:1"     # the op renamed within dense_1
    assert df.device_for("dense/BiasAdd_1") == "/GPU:0"
    assert df.device_for("dense_2/MatMul") is None           # dense and dense_1 differ: ambiguous, not guessed
    same = DeviceFunction(Placement({"dense/MatMul": "/GPU:0", "dense_1/MatMul": "/GPU:0"}, ["/GPU:0"]))
    assert same.device_for("dense_7/MatMul") == "/GPU:0"     # unambiguous: every layer of that name agrees

    import tensorflow as tf

    def two_layers(x):
        with tf.name_scope("dense"):
            h = tf.matmul(x, x, name="MatMul")
        with tf.name_scope("dense_1"):
            return tf.matmul(h, h, name="MatMul_1")            # a name this placement does not hold exactly

    spec = tf.TensorSpec([2, 2])
    p = Placement({"dense/MatMul": "/CPU:0", "dense_1/MatMul": "/CPU:1"}, ["/CPU:0", "/CPU:1"])
    cf, df = p.retrace(two_layers, spec)
    devices = {op.name: op.device for op in cf.graph.get_operations()}
    assert devices["dense/MatMul"].endswith("CPU:0") and devices["dense_1/MatMul_1"].endswith("CPU:1")


def test_import_placer_alone_reaches_the_lower_level_pieces_the_readme_names():
    """`import placer; placer.graphs.load(model)` raised AttributeError unless something (place()) had imported
    placer.graphs first; likewise placer.sim.cluster.parse_cluster, placer.problem.build_problem..."""
    import os
    import subprocess
    import sys

    code = ("import placer, sys\n"
            "fns = [placer.graphs.load, placer.problem.build_problem, placer.search.search,"
            " placer.baselines.run_baseline, placer.sim.cluster.parse_cluster, placer.runtime.make_evaluator]\n"
            "print(all(callable(f) for f in fns), 'tensorflow' in sys.modules)\n"
            "try:\n    placer.nope\nexcept AttributeError as e:\n    print(e)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["True False", "module 'placer' has no attribute 'nope'"]
