"""The search process never starts TensorFlow on a GPU: the policy, `place()` and the CLI hide the GPUs from this
process's runtime (the measured graphs run in child processes). This machine has no GPU, so TensorFlow's device
calls are replaced by a fake machine with two GPUs, in a child interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    calls, listed = [], []
    fake = [tf.config.PhysicalDevice("/physical_device:CPU:0", "CPU"),
            tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU"),
            tf.config.PhysicalDevice("/physical_device:GPU:1", "GPU")]
    tf.config.list_physical_devices = lambda t=None: [d for d in fake if t in (None, d.device_type)]
    tf.config.set_visible_devices = lambda devs, t=None: calls.append((list(devs), t))
    tf.config.experimental.get_device_details = lambda d: {"device_name": "Tesla V100-SXM2-16GB"}
    from placer import _tf
    what = sys.argv[1]
    if what == "policy":
        from placer.rl.policy import PlacementPolicy
        PlacementPolicy(np.ones((3, 2), np.float32), np.ones((3, 2), bool), hidden_size=8, attn_size=4, jit=False)
    elif what == "cli":
        from placer.cli import main
        main(["inspect", "--model", "nmt", "--size", "tiny", "--json"])
    elif what == "devices":
        from placer.sim.cluster import cluster_from_devices
        c = cluster_from_devices("/GPU:0,/GPU:1,/CPU:0")
        listed = [(d.name, d.kind) for d in c.devices]
    print(json.dumps({"calls": calls, "listed": listed}))
""")


def _run(what: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, what], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_policy_hides_gpus_before_its_variables_exist():
    assert _run("policy")["calls"] == [[[], "GPU"]]


def test_cli_hides_gpus():
    assert _run("cli")["calls"] == [[[], "GPU"]]


def test_local_gpus_are_listed_without_starting_tensorflow_on_them():
    out = _run("devices")
    assert out["listed"] == [["/GPU:0", "V100"], ["/GPU:1", "V100"], ["/CPU:0", "cpu"]]
    assert out["calls"] == []          # listing devices neither hides nor starts them


LAZY_CHILD = textwrap.dedent("""
    import json, sys
    from placer import _tf
    hidden = []
    if sys.argv[1] == "fake":
        _tf.hide_gpus = lambda: hidden.append("tensorflow" in sys.modules) or True
    _tf.defer_import(quiet=True, hide=True)
    import importlib.util
    assert importlib.util.find_spec("tensorflow") is not None     # asking whether TF is there keeps the hook
    before = "tensorflow" in sys.modules
    from tensorflow.core.framework import graph_pb2   # a submodule first: the package's import is the one hooked
    import tensorflow as tf
    value = int(tf.constant(2) + 1)
    print(json.dumps({"before": before, "hidden": hidden, "value": value, "graph_def": graph_pb2.GraphDef.__name__,
                      "finders_left": sum(type(f).__name__ == "_Finder" for f in sys.meta_path)}))
""")


def test_deferred_import_hides_gpus_when_tensorflow_is_first_imported():
    r = subprocess.run([sys.executable, "-c", LAZY_CHILD, "fake"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"before": False, "hidden": [True], "value": 3, "graph_def": "GraphDef", "finders_left": 0}


def test_deferred_import_is_quiet():
    """The real hiding on this GPU-less host probes CUDA (`cuInit` fails): that chatter, and TensorFlow's own
    start-up lines, stay out of the user's terminal."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    r = subprocess.run([sys.executable, "-c", LAZY_CHILD, "real"], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["value"] == 3
    assert r.stderr.strip() == ""


SIMULATE_CHILD = textwrap.dedent("""
    import json, sys
    from placer.cli import main
    rc = main(["simulate", "--model", "nmt", "--size", "tiny", "--cluster", "2xK80", "--placement", "single",
               "--json"])
    print(json.dumps({"rc": rc, "tensorflow": "tensorflow" in sys.modules}))
""")


def test_simulate_on_a_cached_graph_does_not_import_tensorflow(tmp_path):
    env = dict(os.environ, PLACER_CACHE_DIR=str(tmp_path))
    runs = []
    for _ in range(2):     # the first builds the graph (TensorFlow), the second finds it in the cache
        r = subprocess.run([sys.executable, "-c", SIMULATE_CHILD], capture_output=True, text=True, timeout=300,
                           env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert runs == [{"rc": 0, "tensorflow": True}, {"rc": 0, "tensorflow": False}]
