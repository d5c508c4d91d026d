"""Small runnable TF1 graphs for the runtime tests (independent of the graph importer)."""
from __future__ import annotations

import numpy as np

from placer.graphs.opgraph import OpGraph


def opgraph_from_tf(g, fetches, name="test") -> OpGraph:
    """An OpGraph (4-byte tensors, data + control edges) carrying `g`'s runnable MetaGraphDef."""
    import tensorflow as tf

    with g.as_default():
        mg = tf.compat.v1.train.export_meta_graph(graph=g)
    ops, edges, control, coloc = [], [], [], {}
    for op in g.get_operations():
        ops.append((op.name, op.type, [4] * max(1, len(op.outputs))))
        for t in op.inputs:
            edges.append((t.op.name, op.name, t.value_index))
        for c in op.control_inputs:
            control.append((c.name, op.name))
        for c in op.colocation_groups():
            coloc.setdefault(c.decode(), []).append(op.name)
    groups = []
    for key, members in coloc.items():
        root = key.split("@", 1)[1]
        groups.append([root] + members if root not in members else members)
    return OpGraph.build(ops, edges, control, colocate=groups, name=name, fetches=fetches,
                         meta_graph=mg.SerializeToString())


def mlp_graph(width: int = 64, batch: int = 8, layers: int = 2) -> OpGraph:
    """A small MLP training step: placeholder input, variables, SGD train op."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, width], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [batch], name="labels")
        h = x
        for i in range(layers):
            w = tf.compat.v1.get_variable(f"w{i}", [width, width])
            h = tf.nn.relu(tf.matmul(h, w))
        wo = tf.compat.v1.get_variable("wo", [width, 10])
        logits = tf.matmul(h, wo)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train")
        tf.compat.v1.add_to_collection("train_op", train)
    return opgraph_from_tf(g, [train.name], name="mlp")


def hang_graph() -> OpGraph:
    """Dequeues from a queue nobody fills: the step blocks forever."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        q = tf.queue.FIFOQueue(4, [tf.float32], shapes=[[2]], name="q")
        v = q.dequeue(name="deq")
        out = tf.reduce_sum(v, name="out")
    return opgraph_from_tf(g, [out.name], name="hang")


def write_file_graph(path: str) -> OpGraph:
    """A graph whose step writes a file (must be refused by workers)."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        w = tf.io.write_file(tf.constant(path), tf.constant("pwned"), name="write")
    return opgraph_from_tf(g, [w.name], name="writer")


def device_indices(graph: OpGraph, fn) -> np.ndarray:
    return np.asarray([fn(i, n) for i, n in enumerate(graph.names)], dtype=np.int64)


def start_worker(*extra: str, timeout: float = 60.0, listen: str = "127.0.0.1:0"):
    """Start `placer worker --listen 127.0.0.1:0 ...` as a subprocess; returns (Popen, "127.0.0.1:PORT")."""
    import os
    import select
    import subprocess
    import sys

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.Popen([sys.executable, "-m", "placer", "worker", "--listen", listen, *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    line = p.stdout.readline() if ready else ""
    if "listening on" not in line:
        p.kill()
        raise RuntimeError(f"worker did not start: {line!r}")
    return p, line.split("listening on", 1)[1].split()[0]


def stop_worker(p) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=20)
        except Exception:  # noqa: BLE001
            p.kill()
            p.wait(timeout=10)


def oom_graph() -> OpGraph:
    """Allocates a 4 TiB tensor: TensorFlow's CPU allocator refuses it (ResourceExhaustedError)."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        big = tf.fill([2**20, 2**20], 1.0, name="big")
        out = tf.reduce_sum(big, name="out")
    return opgraph_from_tf(g, [out.name], name="oom")
