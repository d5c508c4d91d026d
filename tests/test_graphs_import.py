"""Graph import: every accepted source form, exact facts on tiny hand-made graphs, bad input, cache, models."""
from __future__ import annotations

import logging
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from placer.errors import GraphImportError
from placer.cli import load_from_args
from placer.graphs import OpGraph, load
from placer.graphs.load import runtime_spec, synthetic_feeds

tf = pytest.importorskip("tensorflow")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path / "cache"))


# ------------------------------------------------------------------------------------------ helpers
def tf1_graph():
    """x[2,4] @ w[4,3] -> y; loss = sum(y); SGD on w. Returns (graph, train op name)."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 3], use_resource=True)
        y = tf.matmul(x, w, name="y")
        loss = tf.reduce_sum(y, name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return g


def plain_graph():
    """A graph with no variables: a=Const[2,3] f32, b=Neg(a), c=Add(a,b), d=Identity(c) w/ ctrl dep on b."""
    g = tf.Graph()
    with g.as_default():
        a = tf.constant(np.ones((2, 3), np.float32), name="a")
        b = tf.negative(a, name="b")
        c = tf.add(a, b, name="c")
        with tf.control_dependencies([b]):
            tf.identity(c, name="d")
        tf.constant(1.0, name="unused")
    return g


def colocation_ok(g: OpGraph) -> None:
    """Every op consuming a variable handle shares the variable's co-location group."""
    var_types = {"VarHandleOp", "VariableV2"}
    for s, d in zip(g.edge_src, g.edge_dst):
        if g.types[s] in var_types:
            assert g.colocation[s] == g.colocation[d], (g.names[s], g.names[d])


def run_meta_graph(g: OpGraph):
    mg = g.meta_graph_def()
    spec = runtime_spec(mg)
    with tf.Graph().as_default():
        tf.compat.v1.train.import_meta_graph(mg)
        with tf.compat.v1.Session() as s:
            s.run(spec.init_op)
            return s.run(list(spec.fetches), feed_dict=synthetic_feeds(spec))


# ------------------------------------------------------------------------------------------ exact facts
def test_plain_graph_exact():
    g = load(plain_graph(), fetches=["d"], cache=False)
    assert set(g.names) == {"a", "b", "c", "d"}  # `unused` pruned
    assert g.num_ops == 4
    i = g.index
    assert list(g.out_bytes[[i("a"), i("b"), i("c"), i("d")]]) == [24, 24, 24, 24]
    data = {(g.names[s], g.names[d]) for s, d in zip(g.edge_src, g.edge_dst)}
    assert data == {("a", "b"), ("a", "c"), ("b", "c"), ("c", "d")}
    ctrl = {(g.names[s], g.names[d]) for s, d in zip(g.ctrl_src, g.ctrl_dst)}
    assert ctrl == {("b", "d")}
    assert g.num_edges == 5
    assert g.persistent_bytes.sum() == 0
    assert g.num_colocation_groups == 4
    assert not g.cpu_only.any()
    assert g.flops[i("c")] == 6  # one flop per element of Add
    assert g.fetches == ("d",)
    # topological order
    pos = {n: k for k, n in enumerate(g.names)}
    assert pos["a"] < pos["b"] < pos["c"] < pos["d"]


def check_tf1(g: OpGraph) -> None:
    i = g.index
    assert g.num_ops == 18, g.names
    assert g.persistent_bytes[i("w")] == 48 and g.persistent_bytes.sum() == 48
    assert g.out_bytes[i("x")] == 2 * 4 * 4
    assert g.out_bytes[i("y")] == 2 * 3 * 4
    assert g.out_bytes[i("y/ReadVariableOp")] == 48
    assert g.flops[i("y")] == 2 * 2 * 4 * 3
    w = g.colocation[i("w")]
    members = {g.names[k] for k in np.flatnonzero(g.colocation == w)}
    assert members == {"w", "y/ReadVariableOp", "train/update_w/ResourceApplyGradientDescent"}
    # `_class` colocation attr: tuple/control_dependency_1 is colocated with the MatMul_1 gradient op
    assert g.colocation[i("gradients/y_grad/tuple/control_dependency_1")] == g.colocation[i("gradients/y_grad/MatMul_1")]
    assert g.num_colocation_groups == g.num_ops - 3
    assert len(g.edge_src) == 18 and len(g.ctrl_src) == 4 and g.num_edges == 22
    assert (g.edge_src < g.edge_dst).all() and (g.ctrl_src < g.ctrl_dst).all()  # ops in topological order
    edges = {(g.names[s], g.names[d]) for s, d in zip(g.edge_src, g.edge_dst)}
    assert ("w", "y/ReadVariableOp") in edges and ("x", "y") in edges
    assert ("w", "train/update_w/ResourceApplyGradientDescent") in edges
    colocation_ok(g)


def test_tf_graph_train_op_collection():
    g = load(tf1_graph(), batch_size=2, cache=False)
    assert g.fetches == ("train",)
    check_tf1(g)
    assert not g.cpu_only.any()


def test_tf_graph_runs_in_session():
    g = load(tf1_graph(), fetches=["train", "loss:0"], batch_size=2, cache=False)
    out = run_meta_graph(g)
    assert out[0] is None and np.isfinite(out[1])
    spec = runtime_spec(g.meta_graph_def())
    assert spec.feeds == {"x": ("float32", (2, 4))}
    assert spec.init_op == "placer_init"


def test_graph_def_and_meta_graph_def(tmp_path):
    graph = tf1_graph()
    gd = graph.as_graph_def()
    check_tf1(load(gd, fetches=["train"], batch_size=2, cache=False))
    with graph.as_default():
        mg = tf.compat.v1.train.export_meta_graph()
    g = load(mg, batch_size=2, cache=False)
    check_tf1(g)
    # files: .pb (GraphDef), .pbtxt (GraphDef text), .meta (MetaGraphDef), .pbtxt (MetaGraphDef text)
    (tmp_path / "g.pb").write_bytes(gd.SerializeToString())
    check_tf1(load(tmp_path / "g.pb", fetches=["train"], batch_size=2, cache=False))
    tf.io.write_graph(gd, str(tmp_path), "g.pbtxt", as_text=True)
    check_tf1(load(str(tmp_path / "g.pbtxt"), fetches=["train"], batch_size=2, cache=False))
    (tmp_path / "m.meta").write_bytes(mg.SerializeToString())
    check_tf1(load(tmp_path / "m.meta", batch_size=2, cache=False))
    from google.protobuf import text_format

    (tmp_path / "m.pbtxt").write_text(text_format.MessageToString(mg))
    check_tf1(load(tmp_path / "m.pbtxt", batch_size=2, cache=False))


def test_ref_variables_and_existing_initializer():
    g = tf.Graph()
    with g.as_default():
        x = tf.constant(np.ones((2, 2), np.float32), name="x")
        v = tf.compat.v1.get_variable("v", [2, 2], use_resource=False,
                                      initializer=tf.compat.v1.ones_initializer())
        y = tf.matmul(x, v, name="y")
        upd = tf.compat.v1.assign_add(v, y, name="upd")
    og = load(g, fetches=[upd.op.name], cache=False)
    i = og.index
    assert og.types[i("v")] == "VariableV2" and og.persistent_bytes[i("v")] == 16
    assert og.colocation[i("v")] == og.colocation[i("upd")]
    assert "v/Assign" not in og.names  # the initializer is not part of the step...
    assert "v/Assign" in {n.name for n in og.meta_graph_def().graph_def.node}  # ...but is in the runnable graph
    run_meta_graph(og)


# ------------------------------------------------------------------------------------------ TF2 forms
class Tiny(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.ones([4, 3]), name="w")
        self.b = tf.Variable(tf.zeros([3]), name="b")

    @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32)])
    def train(self, x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, self.w) + self.b)
        gw, gb = tape.gradient(loss, [self.w, self.b])
        self.w.assign_sub(0.1 * gw)
        self.b.assign_sub(0.1 * gb)
        return {"loss": loss}


def check_tf2(g: OpGraph) -> None:
    i = g.index
    assert g.types[i("w")] == "VarHandleOp" and g.persistent_bytes[i("w")] == 48
    assert g.types[i("b")] == "VarHandleOp" and g.persistent_bytes[i("b")] == 12
    assert g.persistent_bytes.sum() == 60
    assert "train_op" in g.fetches
    colocation_ok(g)
    for var in ("w", "b"):
        grp = g.colocation[i(var)]
        types = {g.types[k] for k in np.flatnonzero(g.colocation == grp)}
        assert "AssignSubVariableOp" in types and "ReadVariableOp" in types
    assert not any(t == "Placeholder" and g.out_bytes[k] == 8 for k, t in enumerate(g.types))  # no resource inputs
    out = run_meta_graph(g)
    assert any(isinstance(o, np.floating) or isinstance(o, np.ndarray) for o in out)


def test_concrete_function():
    m = Tiny()
    cf = m.train.get_concrete_function()
    g = load(cf, cache=False)
    check_tf2(g)


def test_nested_function_is_inlined():
    m = Tiny()

    @tf.function
    def inner(x):
        return tf.nn.relu(tf.matmul(x, m.w))

    @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32)])
    def outer(x):
        y = inner(x)
        m.w.assign_add(tf.zeros([4, 3]))
        return tf.reduce_sum(y)

    g = load(outer.get_concrete_function(), cache=False)
    assert "Relu" in g.types and "MatMul" in g.types
    assert not {"PartitionedCall", "StatefulPartitionedCall"} & set(g.types)
    run_meta_graph(g)


def test_tf1_graph_calling_a_tf_function_is_inlined():
    g = tf.Graph()
    with g.as_default():
        @tf.function
        def f(x):
            return tf.nn.relu(x * 2.0)

        x = tf.constant(np.ones((2, 2), np.float32), name="x")
        tf.identity(f(x), name="out")
    assert {"PartitionedCall", "StatefulPartitionedCall"} & {op.type for op in g.get_operations()}
    og = load(g, fetches=["out:0"], cache=False)
    assert {"Relu", "Mul"} <= set(og.types)
    assert not {"PartitionedCall", "StatefulPartitionedCall"} & set(og.types)
    assert np.allclose(run_meta_graph(og)[0], 2.0)


def test_saved_model_dir(tmp_path):
    m = Tiny()
    tf.saved_model.save(m, str(tmp_path / "sm"), signatures={"train": m.train.get_concrete_function()})
    g = load(tmp_path / "sm", cache=False)
    i = g.index
    assert not {"PartitionedCall", "StatefulPartitionedCall"} & set(g.types)
    var_ops = [k for k, t in enumerate(g.types) if t == "VarHandleOp"]
    assert sorted(g.persistent_bytes[var_ops]) == [12, 48]
    colocation_ok(g)
    assert g.persistent_bytes[i("w")] == 48 and g.persistent_bytes[i("b")] == 12  # variables keep their names
    assert runtime_spec(g.meta_graph_def()).feeds == {"train_x": ("float32", (2, 4))}
    run_meta_graph(g)


def tiny_keras(batch=None):
    import keras

    inp = keras.Input((4,), batch_size=batch, name="features")
    out = keras.layers.Dense(3, activation="softmax", name="dense")(inp)
    model = keras.Model(inp, out, name="tiny_keras")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="categorical_crossentropy")
    return model


def test_keras_model_with_dict_inputs_imports_without_a_structure_warning():
    """A functional model built on a dict of inputs was called with a tuple: Keras printed "UserWarning: The
    structure of `inputs` doesn't match the expected structure" on every import (`placer inspect m.keras`)."""
    import warnings

    import keras

    a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
    out = keras.layers.Dense(3, name="d")(keras.layers.Concatenate()([a, b]))
    model = keras.Model({"b": b, "a": a}, out, name="dict_inputs")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = load(model, batch_size=2, cache=False)
    assert not [w for w in caught if "structure" in str(w.message)], [str(w.message) for w in caught]
    kernel = [k for k, t in enumerate(g.types) if t == "VarHandleOp" and g.names[k].endswith("kernel")]
    assert len(kernel) == 1 and g.persistent_bytes[kernel[0]] == 6 * 3 * 4     # the 4 + 2 inputs both reached d


def check_keras(g: OpGraph) -> None:
    kernel = [k for k, t in enumerate(g.types) if t == "VarHandleOp" and g.persistent_bytes[k] == 48]
    bias = [k for k, t in enumerate(g.types) if t == "VarHandleOp" and g.persistent_bytes[k] == 12]
    assert len(kernel) == 1 and len(bias) == 1
    assert g.names[kernel[0]].endswith("kernel") and g.names[bias[0]].endswith("bias")
    types = set(g.types)
    assert {"MatMul", "AssignSubVariableOp"} <= types or {"MatMul", "AssignVariableOp"} <= types
    # gradient of the dense layer: a MatMul with the transposed input (forward + 2 backward MatMuls)
    assert g.types.count("MatMul") >= 2
    colocation_ok(g)
    spec = runtime_spec(g.meta_graph_def())
    assert sorted(shape for _, shape in spec.feeds.values()) == [(5, 3), (5, 4)]
    # TF2 auto control deps come in set order; sorted control inputs keep the fingerprint stable across runs
    for nd in g.meta_graph_def().graph_def.node:
        ctrl = [i for i in nd.input if i.startswith("^")]
        if not nd.name.startswith("placer_init"):
            assert ctrl == sorted(ctrl), nd.name
    run_meta_graph(g)


def test_a_mixed_float16_keras_model_keeps_its_optimizer_update_splittable():
    """compile() under mixed_float16 wraps the optimizer in a LossScaleOptimizer, whose update runs under
    cond(all gradients finite): one `If` op reading every variable, co-located with all of them, so the whole model
    had to sit on one device and the optimizer's work was hidden in one op. Traced as the finite-gradient step,
    each variable keeps its own update and its own co-location group; the step still runs."""
    import keras

    old = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        inp = keras.Input((4,), name="features")
        h = keras.layers.Dense(8, activation="relu", name="d1")(inp)
        out = keras.layers.Dense(3, name="d2", dtype="float32")(h)
        model = keras.Model(inp, out, name="mixed")
        model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
        assert type(model.optimizer).__name__ == "LossScaleOptimizer"
        g = load(model, batch_size=5, cache=False)
    finally:
        keras.mixed_precision.set_global_policy(old)
    assert "apply" not in vars(model.optimizer)           # the model's own optimizer is left as it was
    kernels = [k for k, t in enumerate(g.types) if t == "VarHandleOp" and g.names[k].endswith("kernel")]
    assert len(kernels) == 2 and g.colocation[kernels[0]] != g.colocation[kernels[1]]
    assert g.types.count("AssignSubVariableOp") >= 2 and "Cast" in g.types
    colocation_ok(g)
    run_meta_graph(g)


def test_a_keras_output_shaped_by_the_batch_takes_the_given_batch_size():
    """A CLIP-style contrastive model's logits are (batch, batch): Keras reports (None, None), and the import
    refused it ("has unknown dimensions (None, None); build the model with static input shapes") although its
    inputs were static and --batch-size was given. The outputs' shapes now follow from the fixed inputs."""
    import keras

    class Similarity(keras.layers.Layer):
        def call(self, a, b):
            return keras.ops.matmul(a, keras.ops.transpose(b))

    img, txt = keras.Input((6,), name="image"), keras.Input((5,), name="text")
    ie, te = keras.layers.Dense(4, name="img_proj")(img), keras.layers.Dense(4, name="txt_proj")(txt)
    model = keras.Model({"image": img, "text": txt}, Similarity(name="logits")(ie, te), name="two_towers")
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    g = load(model, batch_size=3, cache=False)
    spec = runtime_spec(g.meta_graph_def())
    assert sorted(shape for _, shape in spec.feeds.values()) == [(3,), (3, 5), (3, 6)]
    run_meta_graph(g)


def test_an_imported_step_computing_in_16_bit_is_costed_at_its_precision():
    """A user's own 16-bit step (a Keras mixed policy, a hand-cast tf.function) was tagged fp32: only the built-in
    models' --precision set OpGraph.precision, so the simulator costed its matmuls at the fp32 rate (a V100's
    15.7 TFLOP/s, not its 125 of fp16 tensor cores). The import now reads it from the matmuls' dtype."""
    from placer.sim.cluster import parse_cluster
    from placer.sim.costs import analytical_costs

    w = tf.Variable(tf.ones([2048, 2048]))

    def step_in(dtype):
        @tf.function
        def step(x):
            y = tf.matmul(tf.cast(x, dtype), tf.cast(w, dtype))
            w.assign_sub(tf.cast(tf.matmul(tf.cast(x, dtype), y, transpose_a=True), tf.float32))
            return tf.reduce_sum(tf.cast(y, tf.float32))
        return load(step.get_concrete_function(tf.TensorSpec([2048, 2048])), cache=False)

    graphs = {dt: step_in(dt) for dt in (tf.float32, tf.float16, tf.bfloat16)}
    assert [g.precision for g in graphs.values()] == ["fp32", "fp16", "bf16"]
    v100 = parse_cluster("1xV100")
    matmul_s = {}
    for dt in (tf.float32, tf.float16):
        g = graphs[dt]
        col = analytical_costs(g, v100, cache=False).for_kind("V100")
        matmul_s[dt] = sum(col[k] for k, t in enumerate(g.types) if t == "MatMul")
    assert matmul_s[tf.float16] < matmul_s[tf.float32] / 2, matmul_s


def test_inspect_says_the_precision_the_import_read(tmp_path, capsys):
    """`placer inspect` showed nothing of the precision the simulator will cost a graph at, so a user could not
    check that their fp16 graph is seen as fp16; it now says it (text and --json `precision`)."""
    import json

    from placer.cli import main

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float16, [4, 4], name="x")
        tf.matmul(x, x, name="y")
    path = tmp_path / "half.pbtxt"
    path.write_text(str(g.as_graph_def()))
    assert main(["inspect", str(path), "--fetch", "y", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["precision"] == "fp16"
    assert main(["inspect", str(path), "--fetch", "y"]) == 0
    assert re.search(r"precision +fp16", capsys.readouterr().out)


def test_keras_model_needs_batch_size():
    with pytest.raises(GraphImportError, match="batch size"):
        load(tiny_keras(), cache=False)


def test_keras_model_and_file(tmp_path):
    model = tiny_keras()
    check_keras(load(model, batch_size=5, cache=False))
    model.save(tmp_path / "m.keras")
    check_keras(load(tmp_path / "m.keras", batch_size=5, cache=False))


def test_fetches_for_a_keras_model_or_a_built_in_model_are_refused_not_ignored(tmp_path):
    from argparse import Namespace

    model = tiny_keras()
    with pytest.raises(GraphImportError, match="Keras model 'tiny_keras': fetches \\('loss'\\) apply to graphs"):
        load(model, fetches=["loss"], batch_size=5, cache=False)
    model.save(tmp_path / "m.keras")
    with pytest.raises(GraphImportError, match="m.keras: fetches"):
        load(tmp_path / "m.keras", fetches=["loss"], batch_size=5, cache=False)
    with pytest.raises(GraphImportError, match="--fetch applies to a graph file, not to --model nmt"):
        load_from_args(Namespace(graph=None, model="nmt", size="tiny", batch_size=None, fetch=["loss"]))


def test_keras_step_that_fails_to_trace_names_the_error_not_autographs_header():
    """A Keras model compiled without a loss said only "cannot trace the training step of Keras model 'm': in user
    code:" (the first line of autograph's wrapped error), never why."""
    import keras

    inp = keras.Input((4,), batch_size=2)
    model = keras.Model(inp, keras.layers.Dense(2)(inp), name="m")
    model.compile(optimizer="sgd")
    with pytest.raises(GraphImportError) as e:
        load(model, cache=False)
    assert str(e.value) == ("cannot trace the training step of Keras model 'm': ValueError: No loss to compute. "
                            "Provide a `loss` argument in `compile()`.")


def test_keras_not_compiled():
    import keras

    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(2)(inp))
    with pytest.raises(GraphImportError, match="not compiled"):
        load(model, batch_size=2, cache=False)


# ------------------------------------------------------------------------------------------ bad input
def test_missing_file(tmp_path):
    with pytest.raises(GraphImportError, match="not found"):
        load(tmp_path / "nope.pb")


def test_unreadable_graph_file_or_saved_model_is_one_error_naming_it(tmp_path, monkeypatch):
    """A graph file without read permission raised the OS's PermissionError (a traceback from the CLI)."""
    import pathlib

    real = pathlib.Path.read_bytes

    def read_bytes(self):
        if self.name.startswith("locked") or self.name == "saved_model.pb":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    (tmp_path / "sm").mkdir()
    for p in (tmp_path / "locked.pb", tmp_path / "locked.keras", tmp_path / "sm" / "saved_model.pb"):
        p.write_bytes(b"x")
        with pytest.raises(GraphImportError) as e:
            load(p.parent if p.name == "saved_model.pb" else p, fetches=None, batch_size=2, cache=False)
        assert str(e.value) == f"{p}: cannot read it: Permission denied"


@pytest.mark.parametrize("suffix", [".pb", ".meta", ".pbtxt"])
def test_truncated_and_non_graph_files(tmp_path, suffix):
    gd = tf1_graph().as_graph_def().SerializeToString()
    p = tmp_path / f"trunc{suffix}"
    p.write_bytes(gd[: len(gd) // 2])
    with pytest.raises(GraphImportError, match="not a TensorFlow graph"):
        load(p, fetches=["train"], batch_size=2, cache=False)
    q = tmp_path / f"text{suffix}"
    q.write_text("hello, this is not a graph\n" * 10)
    with pytest.raises(GraphImportError, match="not a TensorFlow graph"):
        load(q, fetches=["train"], cache=False)


def test_a_pbtxt_with_a_syntax_error_names_the_line(tmp_path):
    """A .pbtxt with a typo said only "is not a TensorFlow graph (truncated, corrupt or another kind of file)"."""
    text = str(tf1_graph().as_graph_def()).splitlines()
    text[2] = text[2] + " }}{ oops"
    p = tmp_path / "typo.pbtxt"
    p.write_text("\n".join(text))
    with pytest.raises(GraphImportError) as e:
        load(p, fetches=["train"], batch_size=2, cache=False)
    assert str(e.value).startswith(f"{p} is not a TensorFlow graph (truncated, corrupt or another kind of file): "
                                   f"line 3 column {len(text[2]) - 6}: ")


def test_a_file_named_keras_that_is_no_keras_file_says_so(tmp_path):
    p = tmp_path / "x.keras"
    p.write_text("hello, this is not a Keras model\n")
    with pytest.raises(GraphImportError) as e:
        load(p, batch_size=2, cache=False)
    assert str(e.value) == (f"cannot load Keras model {p}: not a readable Keras file (a .keras zip archive): "
                            f"File is not a zip file")


def test_empty_file_and_graph(tmp_path):
    p = tmp_path / "empty.pb"
    p.write_bytes(b"")
    with pytest.raises(GraphImportError, match="empty"):
        load(p, fetches=["x"])
    with pytest.raises(GraphImportError, match="empty"):
        load(tf.Graph().as_graph_def(), fetches=["x"], cache=False)


def test_dangling_input_and_bad_keras_file(tmp_path):
    gd = plain_graph().as_graph_def()
    for n in gd.node:
        if n.name == "c":
            n.input[1] = "ghost"
    with pytest.raises(GraphImportError, match=r"\['ghost'\] are used as inputs but not defined"):
        load(gd, fetches=["d"], cache=False)
    p = tmp_path / "bad.keras"
    p.write_bytes(b"PK\x03\x04 definitely not a keras archive")
    with pytest.raises(GraphImportError, match="cannot load Keras model"):
        load(p, batch_size=2, cache=False)


def test_not_a_saved_model_dir(tmp_path):
    with pytest.raises(GraphImportError, match="not a SavedModel"):
        load(tmp_path)


def test_cycle():
    gd = plain_graph().as_graph_def()
    for n in gd.node:
        if n.name == "b":
            n.input.append("^d")
    with pytest.raises(GraphImportError, match="cycle"):
        load(gd, fetches=["d"], cache=False)


def test_unknown_fetch():
    with pytest.raises(GraphImportError, match=r"fetch 'trian'.*did you mean \['train'\]"):
        load(tf1_graph(), fetches=["trian"], batch_size=2, cache=False)
    with pytest.raises(GraphImportError, match="needs fetch names"):
        load(tf1_graph().as_graph_def(), cache=False)


def test_a_fetch_naming_no_tensor_of_its_op_is_refused():
    """`--fetch loss:3` (Sum has one output) and `--fetch ^train` were accepted and written into the runnable
    graph's fetches, where running them fails."""
    with pytest.raises(GraphImportError) as e:
        load(tf1_graph(), fetches=["loss:3"], batch_size=2, cache=False)
    assert str(e.value) == "tf.Graph: fetch 'loss:3' names no tensor: op 'loss' (Sum) has 1 output(s)"
    for bad in ("^train", "loss:x"):
        with pytest.raises(GraphImportError, match=re.escape(f"fetch {bad!r} is neither an op name nor")):
            load(tf1_graph(), fetches=[bad], batch_size=2, cache=False)
    assert load(tf1_graph(), fetches=["loss:0"], batch_size=2, cache=False).fetches == ("loss:0",)


def test_one_fetch_name_as_a_string_and_a_bool_batch_size():
    """fetches="train" was split into its characters ("fetch 't' names no op"); batch_size=True imported batch 1."""
    assert load(tf1_graph(), fetches="train", batch_size=2, cache=False).fetches == ("train",)
    with pytest.raises(GraphImportError, match="batch size must be a positive integer, got True"):
        load(tf1_graph(), batch_size=True, cache=False)


def test_a_batch_size_beyond_int32_is_one_line_before_import():
    """--batch-size 100000000000 got TensorFlow's "out of int32 range" wording from deep in the import."""
    from placer.graphs.models import build_model
    with pytest.raises(GraphImportError, match=r"^batch size 100000000000 is too large: at most 2147483647"):
        load(tf1_graph(), batch_size=10**11, cache=False)
    with pytest.raises(GraphImportError, match=r"^batch size 100000000000 is too large"):
        build_model("nmt", size="tiny", batch_size=10**11)


def test_tf1_while_loop_refused():
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.disable_control_flow_v2()
        try:
            i = tf.constant(0)
            r = tf.while_loop(lambda i: i < 10, lambda i: i + 1, [i])
        finally:
            tf.compat.v1.enable_control_flow_v2()
        tf.identity(r, name="out")
    with pytest.raises(GraphImportError, match="loop.*unroll"):
        load(g, fetches=["out"], cache=False)


def test_functional_while_refused():
    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def f(x):
        return tf.while_loop(lambda i, a: i < 10, lambda i, a: (i + 1, a * 2.0), [0, x])[1]

    with pytest.raises(GraphImportError, match="loop.*unroll"):
        load(f.get_concrete_function(), cache=False)


def test_keras_lstm_not_unrolled_is_refused_naming_the_keras_model():
    """A Keras model's loop error said "function 'name'" (its trace's words): it names the Keras model now."""
    import keras

    m = keras.Sequential([keras.Input((4, 3), batch_size=2), keras.layers.LSTM(5), keras.layers.Dense(1)],
                         name="lstm_model")
    m.compile(optimizer="sgd", loss="mse")
    with pytest.raises(GraphImportError, match="^Keras model 'lstm_model': the graph has a loop.*unroll"):
        load(m, cache=False)


def test_functional_if_is_one_op_with_body_cost():
    @tf.function(input_signature=[tf.TensorSpec([8, 8], tf.float32), tf.TensorSpec([], tf.bool)])
    def f(x, p):
        return tf.cond(p, lambda: tf.matmul(x, x), lambda: x + 1.0)

    g = load(f.get_concrete_function(), cache=False)
    ifs = [k for k, t in enumerate(g.types) if t in ("If", "StatelessIf")]
    assert len(ifs) == 1
    assert g.flops[ifs[0]] == 2 * 8 * 8 * 8  # the larger branch (the matmul)
    run_meta_graph(g)


def test_a_cond_that_updates_every_variable_warns_that_they_share_its_device(caplog):
    """A tf.function step with a LossScaleOptimizer applies its update under cond(all gradients finite): one If op
    reading every variable, which the import co-locates with all of them, pinning the model to one device without
    a word. The import now warns, naming the op and the count (one op reading 2 variables stays quiet)."""
    ws = [tf.Variable(tf.ones([4, 4]), name=f"w{i}") for i in range(10)]

    @tf.function(input_signature=[tf.TensorSpec([4, 4], tf.float32)])
    def step(x):
        losses = [tf.reduce_sum(tf.matmul(x, w)) for w in ws]

        def update(k):
            def apply():
                for w in ws[:k]:
                    w.assign_sub(0.1 * w)
                return tf.constant(True)
            return apply

        tf.cond(tf.math.is_finite(losses[0]), update(len(ws)), lambda: tf.constant(False))
        tf.cond(tf.math.is_finite(losses[1]), update(2), lambda: tf.constant(False))
        return tf.add_n(losses)

    with caplog.at_level(logging.WARNING, logger="placer.graphs.opfacts"):
        g = load(step.get_concrete_function(), cache=False)
    warned = [r.getMessage() for r in caplog.records if "share its device" in r.getMessage()]
    assert len(warned) == 1 and "reads 10 variables" in warned[0], warned
    assert [t for t in g.types if t in ("If", "StatelessIf")] == ["If", "If"]


def test_unknown_shapes_warn_with_fallback(caplog):
    g = tf.Graph()
    with g.as_default():
        x = tf.constant([1, 2, 2, 3], name="x")
        u, _ = tf.unique(x, name="u")
        tf.identity(u, name="out")
    with caplog.at_level(logging.WARNING, logger="placer.graphs"):
        og = load(g, fetches=["out"], cache=False)
    assert "unknown shape" in caplog.text and "'u'" in caplog.text
    assert og.out_bytes[og.index("out")] == 4  # unknown dim counts as 1 element of int32


def test_placeholder_unknown_batch_needs_batch_size():
    with pytest.raises(GraphImportError, match="placeholder 'x'.*batch size"):
        load(tf1_graph(), cache=False)


def test_a_batch_size_no_placeholder_needs_is_refused_not_ignored():
    """--batch-size 8 on a graph (or Keras model) whose batch is already 2 was silently unused: the step kept 2."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 4], name="x")
        tf.reduce_sum(x * 2.0, name="loss")
    with pytest.raises(GraphImportError) as e:
        load(g, fetches=["loss"], batch_size=8, cache=False)
    assert str(e.value) == ("tf.Graph: batch size 8 is unused: no placeholder of the step has an unknown batch "
                            "dimension (drop --batch-size / batch_size=)")
    assert load(g, fetches=["loss"], cache=False).num_ops
    with pytest.raises(GraphImportError, match="Keras model 'tiny_keras': batch size 8 is unused: its inputs have a "
                                               "batch dimension"):
        load(tiny_keras(batch=2), batch_size=8, cache=False)


def test_unsupported_source():
    with pytest.raises(GraphImportError, match="cannot import a int"):
        load(42)


def test_load_from_args():
    from argparse import Namespace

    with pytest.raises(GraphImportError, match="no graph given"):
        load_from_args(Namespace(graph=None, model=None, size="full", batch_size=None, fetch=[]))
    with pytest.raises(GraphImportError, match="not both"):
        load_from_args(Namespace(graph="x.pb", model="nmt", size="full", batch_size=None, fetch=[]))
    with pytest.raises(GraphImportError, match="valid models: inception_v3, nmt, nmt4, rnnlm"):
        load_from_args(Namespace(graph=None, model="resnet", size="tiny", batch_size=None, fetch=[]))


def test_cpu_only_from_kernel_registry():
    g = tf.Graph()
    with g.as_default():
        s = tf.strings.as_string(tf.constant([1.0, 2.0], name="x"), name="s")   # AsString: CPU kernel only
        tf.strings.join([s, s], name="j")                                      # StringJoin: CPU kernel only
        tf.identity(tf.constant(1.0) * 2.0, name="k")
    og = load(g, fetches=["j", "k"], cache=False)
    i = og.index
    assert og.cpu_only[i("s")] and og.cpu_only[i("j")]
    assert not og.cpu_only[i("k")] and not og.cpu_only[i("x")]


# ------------------------------------------------------------------------------------------ cache
def test_cache_hit(tmp_path):
    graph = tf1_graph()
    a = load(graph, batch_size=2)
    files = list((tmp_path / "cache").rglob("*.npz"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    b = load(graph, batch_size=2)
    assert files[0].stat().st_mtime_ns == mtime
    assert a.fingerprint == b.fingerprint and a.names == b.names
    assert np.array_equal(a.colocation, b.colocation) and a.meta_graph == b.meta_graph
    load(graph, batch_size=3)  # another batch size is another entry
    assert len(list((tmp_path / "cache").rglob("*.npz"))) == 2


def test_cache_is_keyed_by_placer_version(tmp_path, monkeypatch):
    """An entry another placer version wrote is a miss: an upgrade that changes how graphs are imported (OpGraph
    fields, grouping inputs) must not reuse it (the key held the graph, the TF version and CACHE_FORMAT only)."""
    import placer._version
    from placer.graphs.cache import cached

    built = []

    def build(name):
        built.append(name)
        return OpGraph.build([("a", "X", 8)], name=name)

    assert cached(("k",), lambda: build("old")).name == "old"
    assert cached(("k",), lambda: build("again")).name == "old" and built == ["old"]      # a hit
    monkeypatch.setattr(placer._version, "__version__", placer._version.__version__ + ".next")
    assert cached(("k",), lambda: build("new")).name == "new" and built == ["old", "new"]


def _entry(tmp_path):
    [f] = (tmp_path / "cache").rglob("*.npz")
    return f


def test_corrupt_cache_entry_is_rebuilt(tmp_path):
    graph = tf1_graph()
    a = load(graph, batch_size=2)
    f = _entry(tmp_path)
    for junk in (b"not a zip file at all", f.read_bytes()[: f.stat().st_size // 2]):   # garbage, truncated
        f.write_bytes(junk)
        b = load(graph, batch_size=2)
        assert b.fingerprint == a.fingerprint and b.names == a.names and b.meta_graph == a.meta_graph
        assert OpGraph.load(f).fingerprint == a.fingerprint   # the entry was written again, readable


_UNPICKLED = []


class _Trap:
    """Records being unpickled: an old cache entry must never be unpickled."""

    def __reduce__(self):
        return (_UNPICKLED.append, ("unpickled",))


def test_old_pickled_cache_entry_is_rebuilt_not_unpickled(tmp_path):
    graph = tf1_graph()
    a = load(graph, batch_size=2)
    f = _entry(tmp_path)
    arrays = {k: getattr(a, k) for k in OpGraph._ARRAYS}
    np.savez(f, names=np.asarray([_Trap()] + list(a.names[1:]), dtype=object),   # the format placer used to write
             types=np.asarray(a.types, dtype=object), fetches=np.asarray(a.fetches, dtype=object),
             header=np.asarray([a.fingerprint, a.name], dtype=object), meta_graph=np.frombuffer(a.meta_graph, np.uint8),
             has_meta=np.asarray(True), **arrays)
    b = load(graph, batch_size=2)
    assert _UNPICKLED == []
    assert b.fingerprint == a.fingerprint and b.names == a.names
    with np.load(f, allow_pickle=False) as z:   # rewritten in the new format: plain numbers only
        assert all(z[k].dtype != object for k in z.files)


def test_fingerprint_stable_across_imports():
    a = load(tf1_graph(), batch_size=2, cache=False)
    b = load(tf1_graph(), batch_size=2, cache=False)
    c = load(tf1_graph(), batch_size=4, cache=False)
    assert a.fingerprint == b.fingerprint != c.fingerprint


# ------------------------------------------------------------------------------------------ models
@pytest.mark.parametrize("name", ["rnnlm", "nmt", "nmt4", "inception_v3"])
def test_tiny_models(name):
    from placer.graphs.models import build_model

    g = build_model(name, size="tiny")
    assert g.num_ops > 300
    colocation_ok(g)
    assert g.persistent_bytes.sum() > 0 and g.flops.sum() > 0
    assert (g.out_bytes >= 0).all()
    # every variable's group holds its readers and updaters
    var_ids = [k for k, t in enumerate(g.types) if t == "VarHandleOp"]
    for k in var_ids:
        grp = set(np.flatnonzero(g.colocation == g.colocation[k]))
        consumers = set(g.edge_dst[g.edge_src == k])
        assert consumers <= grp
    if name != "inception_v3":
        assert "train_op" in g.fetches
        assert any(n.startswith("encoder/layer_1/step_") or n.startswith("layer_1/step_") for n in g.names)
        assert any(n.startswith("gradients/") for n in g.names)
    assert build_model(name, size="tiny").fingerprint == g.fingerprint  # cached


def test_tiny_nmt_runs_and_names():
    from placer.graphs.models import build_model

    g = build_model("nmt", size="tiny", batch_size=3)
    spec = runtime_spec(g.meta_graph_def())
    assert spec.feeds["encoder/embedding/source_ids"] == ("int32", (3, 6))
    layers = ("encoder/embedding", "encoder/layer_", "decoder/embedding", "decoder/layer_", "decoder/attention",
              "softmax", "loss")
    fwd = [n for n in g.names if not n.startswith(("gradients", "Adam", "beta", "train_op"))]
    unnamed = [n for n in fwd if not n.startswith(layers)]
    assert unnamed == [], unnamed[:10]
    # gradient and update ops map to a layer once their prefix is stripped (only the backprop seed does not)
    import re

    stripped = [re.sub(r"^(gradients/|Adam/update_)", "", n) for n in g.names if n.startswith(("gradients/", "Adam/update_"))]
    no_layer = sorted({n for n in stripped if not n.startswith(layers)})
    assert no_layer == ["Shape", "grad_ys_0", "grad_ys_0/Const"], no_layer
    assert sum(n.startswith("gradients/encoder/layer_0/kernel_grad/sum") for n in g.names) == 1
    out = run_meta_graph(g)
    assert np.isfinite(out[-1])


def test_synthetic_feeds_seeded_random_and_valid():
    from placer.graphs.models import build_model

    spec = runtime_spec(build_model("nmt", size="tiny").meta_graph_def())
    ids = ("encoder/embedding/source_ids", "decoder/embedding/target_ids", "loss/labels")
    assert spec.feed_limits == {n: 1000 for n in ids}   # the vocabulary: embedding rows, softmax classes
    a, b = synthetic_feeds(spec), synthetic_feeds(spec)
    assert sorted(a) == sorted(f"{n}:0" for n in ids)
    for k, v in a.items():
        assert v.dtype == np.int32 and v.shape == (8, 6) and v.min() >= 0 and v.max() < 1000
        assert len(np.unique(v)) > 20 and np.array_equal(v, b[k])   # random, and the same every call
    assert not np.array_equal(a["loss/labels:0"], synthetic_feeds(spec, seed=1)["loss/labels:0"])
    # floats: small normal values; integers the graph does not index with: zeros
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 4], name="x")
        k = tf.compat.v1.placeholder(tf.int32, [3], name="k")
        tf.add(tf.reduce_sum(x), tf.cast(tf.reduce_sum(k * 2), tf.float32), name="out")
    spec = runtime_spec(load(g, fetches=["out"], cache=False).meta_graph_def())
    assert spec.feed_limits == {}
    f = synthetic_feeds(spec)
    assert f["x:0"].dtype == np.float32 and 0.05 < f["x:0"].std() < 0.2 and not (f["k:0"] != 0).any()


def test_runtime_spec_fallbacks_for_a_foreign_meta_graph():
    """A MetaGraphDef placer did not write: train_op collection, variable initializers, every placeholder."""
    graph = tf1_graph()
    with graph.as_default():
        tf.compat.v1.placeholder(tf.int32, None, name="no_rank")
        mg = tf.compat.v1.train.export_meta_graph()
    spec = runtime_spec(mg)
    assert spec.fetches == ("train",)
    assert spec.init_ops == ("w/Assign",)
    assert spec.feeds == {"x": ("float32", (1, 4)), "no_rank": ("int32", ())}
    assert len(spec.warnings) == 2 and "unknown dimensions" in spec.warnings[0] and "unknown rank" in spec.warnings[1]
    assert runtime_spec(mg, ["loss:0"]).fetches == ("loss:0",)
    with pytest.raises(GraphImportError, match="fetch 'nope'"):
        runtime_spec(mg, ["nope"])


def test_small_rnnlm_sits_between_tiny_and_full():
    from placer.graphs.models import build_model

    g = build_model("rnnlm", size="small")
    assert build_model("rnnlm", size="tiny").num_ops < g.num_ops < 5000
    spec = runtime_spec(g.meta_graph_def())
    assert spec.feeds == {"embedding/input_ids": ("int32", (32, 10)), "loss/labels": ("int32", (32, 10))}
    assert spec.feed_limits == {"embedding/input_ids": 8000, "loss/labels": 8000}
    assert g.persistent_bytes[g.index("layer_0/kernel")] == 4 * (640 + 640) * 4 * 640


@pytest.mark.slow
@pytest.mark.parametrize("name", ["inception_v3", "nmt", "nmt4"])
def test_small_models(name):
    from placer.graphs.models import build_model

    g = build_model(name, size="small")
    assert build_model(name, size="tiny").num_ops <= g.num_ops < 5000
    colocation_ok(g)


def test_unknown_model():
    from placer.graphs.models import build_model

    with pytest.raises(GraphImportError, match="valid models"):
        build_model("alexnet")
    with pytest.raises(GraphImportError, match="valid sizes"):
        build_model("nmt", size="huge")


@pytest.mark.slow
@pytest.mark.parametrize("name,min_ops", [("inception_v3", 4000), ("nmt4", 5000), ("nmt", 3000), ("rnnlm", 1000)])
def test_full_models(name, min_ops):
    from placer.graphs.models import build_model

    g = build_model(name)
    assert g.num_ops >= min_ops
    colocation_ok(g)
    var_ids = [k for k, t in enumerate(g.types) if t == "VarHandleOp"]
    for k in var_ids:
        assert set(g.edge_dst[g.edge_src == k]) <= set(np.flatnonzero(g.colocation == g.colocation[k]))
