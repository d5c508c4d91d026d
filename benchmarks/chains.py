"""Is the 2-task cluster a real 2-device system? Two independent chains of MatMul + tanh, measured with both
chains on task 0 and with one chain per task (`placer cluster up --tasks 2`, one core per task).

    .venv/bin/python benchmarks/chains.py [--n 512] [--length 20] [--rounds 5] [--runs 3]

Prints one JSON line (medians over all runs of interleaved rounds, and the speedup) and appends it to
results/chains.jsonl. Keep the machine otherwise idle while it runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _cluster import RESULTS, machine, now, tf_cluster  # noqa: E402


def chains_graph(n: int, length: int):
    """An OpGraph of two independent chains a_k = tanh(a_{k-1} @ W_a), b_k likewise (inference-only)."""
    import tensorflow as tf

    from placer.graphs import load

    wa = tf.Variable(tf.random.normal([n, n], stddev=1.0 / n ** 0.5, seed=1), name="wa")
    wb = tf.Variable(tf.random.normal([n, n], stddev=1.0 / n ** 0.5, seed=2), name="wb")

    @tf.function
    def step(x, y):
        for k in range(length):
            with tf.name_scope(f"chain_a/{k}"):
                x = tf.tanh(tf.matmul(x, wa))
            with tf.name_scope(f"chain_b/{k}"):
                y = tf.tanh(tf.matmul(y, wb))
        return tf.reduce_sum(x) + tf.reduce_sum(y)

    spec = tf.TensorSpec([n, n], tf.float32)
    return load(step.get_concrete_function(spec, spec))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/placer-chains")
    a = ap.parse_args(argv)
    from fidelity import measure_interleaved

    from placer.runtime import make_evaluator

    started, mach = now(), machine()
    graph = chains_graph(a.n, a.length)
    on_b = np.array(["chain_b" in nm or nm.startswith("wb") or "/wb" in nm for nm in graph.names])
    split = np.where(on_b, 1, 0)
    # a variable and its reads stay together (co-location groups)
    col = np.asarray(graph.colocation)
    for g in np.unique(col):
        members = col == g
        split[members] = int(np.round(split[members].mean()))
    single = np.zeros(graph.num_ops, np.int64)
    with tf_cluster(Path(a.workdir)) as tasks:
        with make_evaluator(graph, str(tasks), warmup=2, runs=a.runs) as ev:
            got = measure_interleaved(ev, [single, split], a.rounds, a.runs)
    one, two = float(np.median(got[0])), float(np.median(got[1]))
    rec = {"bench": "chains", "n": a.n, "length": a.length, "ops": graph.num_ops, "ops_on_task1": int(split.sum()),
           "one_task_s": one, "split_s": two, "speedup": one / two,
           "one_task_runs_s": [round(x, 5) for x in got[0]], "split_runs_s": [round(x, 5) for x in got[1]],
           "date": started, "machine": mach}
    print(json.dumps(rec), flush=True)
    with open(RESULTS / "chains.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
