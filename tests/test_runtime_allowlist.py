"""The worker's op allowlist: file/Python ops refused at top level and inside function bodies."""
from __future__ import annotations

import pytest

from placer.runtime.allowlist import FAMILIES, KNOWN_UNSAFE, SAFE_OPS, UnsafeGraphError, check_graph, unsafe_ops


def _graph_def(fn):
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        fn(tf)
    return g.as_graph_def()


def test_families_are_disjoint_from_the_unsafe_ops():
    assert not SAFE_OPS & set(KNOWN_UNSAFE)
    assert {"MatMul", "Conv2D", "ResourceApplyAdam", "VarHandleOp", "TensorArrayV3", "While"} <= SAFE_OPS
    assert sum(len(f) for f in FAMILIES.values()) >= len(SAFE_OPS)


def test_training_step_is_safe():
    def build(tf):
        x = tf.compat.v1.placeholder(tf.float32, [4, 8])
        w = tf.compat.v1.get_variable("w", [8, 2])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        tf.compat.v1.train.AdamOptimizer().minimize(loss)

    assert unsafe_ops(_graph_def(build)) == []


def test_file_and_python_ops_are_refused():
    def build(tf):
        tf.io.write_file("/tmp/x", "data", name="w")
        tf.io.read_file("/etc/hostname", name="r")

    bad = unsafe_ops(_graph_def(build))
    assert {(b.node, b.op) for b in bad} == {("w", "WriteFile"), ("r", "ReadFile")}
    with pytest.raises(UnsafeGraphError, match="ReadFile, WriteFile.*--allow-unsafe-ops"):
        check_graph(_graph_def(build))


def test_ops_inside_function_bodies_are_checked():
    def build(tf):
        @tf.function
        def sneaky(s):
            tf.io.write_file("/tmp/y", s)
            return tf.strings.length(s)

        @tf.function
        def fine(a):
            return a * 2.0

        sneaky.get_concrete_function(tf.TensorSpec([], tf.string)).add_to_graph()
        fine.get_concrete_function(tf.TensorSpec([], tf.float32)).add_to_graph()

    gd = _graph_def(build)
    assert len(gd.library.function) == 2
    bad = unsafe_ops(gd)
    assert [b.op for b in bad] == ["WriteFile"] and bad[0].function and "sneaky" in bad[0].function
    assert "in function" in bad[0].describe()
