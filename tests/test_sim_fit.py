"""The simulator's machine fit (`placer.sim.fit`): cpu_copy links and compute groups change simulated step times
the way the model says, and fitting to step times made by a known machine recovers that machine."""
from __future__ import annotations

import numpy as np
import pytest

from placer.sim.fit import fit_machine, with_machine

TASK = "/job:worker/replica:0/task:{}/device:CPU:0"


def _cluster(bw=1e8, lat=1e-4):
    link = {"bandwidth_Bps": bw, "latency_s": lat, "shared": None, "pipelined": True}
    return {"format": 1, "name": "two tasks",
            "devices": [{"name": TASK.format(i), "kind": "cpu", "concurrency": 1} for i in range(2)],
            "links": [[None, dict(link)], [dict(link), None]]}


@pytest.fixture(scope="module")
def graph():
    from placer.graphs.models import build_model

    return build_model("nmt", "tiny")


def _placements(graph, n=14, seed=0):
    rng = np.random.default_rng(seed)
    out = [np.zeros(graph.num_ops, np.int64), np.ones(graph.num_ops, np.int64)]
    col = np.asarray(graph.colocation)
    for _ in range(n - 2):
        k = rng.integers(1, 8)                     # contiguous-ish splits and scattered ones alike
        side = (col // k) % 2 if rng.random() < 0.5 else rng.integers(0, 2, col.max() + 1)[col]
        out.append(np.asarray(side, np.int64))
    return out


def _sim(graph, cluster, placements):
    from placer.sim.cluster import cluster_from_dict
    from placer.sim.simulator import Simulator

    s = Simulator(graph, cluster_from_dict(cluster, "test"))
    return np.array([s.simulate(p).step_time for p in placements])


def test_copy_work_and_sharing_slow_split_placements_only(graph):
    ps = _placements(graph)
    base = _sim(graph, _cluster(), ps)
    copy = _sim(graph, with_machine(_cluster(), 1.0, 1.0), ps)
    fast = _sim(graph, _cluster(1e10, 1e-7), ps)                         # compute-bound: the devices overlap
    shared = _sim(graph, with_machine(_cluster(1e10, 1e-7), 0.5, 0.0), ps)
    assert np.allclose(base[:2], copy[:2]) and np.allclose(fast[:2], shared[:2])   # one device: nothing shared
    assert (copy[2:] >= base[2:] - 1e-12).all() and (copy[2:] > base[2:] * 1.01).any()
    assert (shared[2:] >= fast[2:] - 1e-12).all() and (shared[2:] > fast[2:] * 1.01).any()


def test_fit_recovers_the_machine_that_made_the_times(graph):
    ps = _placements(graph)
    truth = _sim(graph, with_machine(_cluster(), 0.6, 0.5), ps)
    f = fit_machine(graph, _cluster(), None, ps, truth)
    assert (f.shared_speed, f.cpu_copy) == (0.6, 0.5) and f.median_abs_log_err < 1e-9


def test_fit_ignores_unmeasured_placements_and_refuses_none(graph):
    ps = _placements(graph, n=6)
    truth = _sim(graph, with_machine(_cluster(), 0.8, 0.25), ps)
    holes = truth.copy()
    holes[::2] = np.nan
    f = fit_machine(graph, _cluster(), None, ps, holes)
    assert f.median_abs_log_err < 1e-9
    with pytest.raises(ValueError):
        fit_machine(graph, _cluster(), None, ps, np.full(len(ps), np.nan), grid=f.simulated)
