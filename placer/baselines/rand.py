"""Random and round-robin baselines: uniform over the N GPUs (seeded) / cyclic over the N GPUs.

Both draw one device per co-location group (so groups are never split); CPU-only groups go to the CPU.
No memory check: an over-full device shows up as OOM in the simulator.
"""
from __future__ import annotations

import numpy as np

from placer.baselines._common import group_fixed_device, prepare
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster


def random_placement(graph: OpGraph, cluster: Cluster, costs=None, seed: int = 0) -> np.ndarray:
    """Each co-location group on a GPU drawn uniformly (numpy `default_rng(seed)`).

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> g = OpGraph.build([(f"op{i}", "X", 4) for i in range(6)])
    >>> devs = tuple(Device(f"/GPU:{i}", "X", 2**30) for i in range(2))
    >>> c = Cluster(devs, np.full((2, 2), 1e9), np.zeros((2, 2)))
    >>> (random_placement(g, c, seed=1) == random_placement(g, c, seed=1)).all()
    np.True_
    """
    p = prepare(graph, cluster, costs)
    rng = np.random.default_rng(seed)
    fixed = group_fixed_device(p)
    gd = np.asarray(p.gpus)[rng.integers(0, len(p.gpus), size=p.num_groups)]
    # a group that may not use the drawn GPU takes its first allowed device
    bad = ~p.group_allowed[np.arange(p.num_groups), gd]
    gd[bad] = np.argmax(p.group_allowed[bad], axis=1)
    gd = np.where(fixed >= 0, fixed, gd)
    return gd[p.group]


def round_robin(graph: OpGraph, cluster: Cluster, costs=None) -> np.ndarray:
    """Co-location groups, in the topological order of their first op, dealt to the GPUs in turn.

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> g = OpGraph.build([(f"op{i}", "X", 4) for i in range(4)], [(f"op{i}", f"op{i+1}") for i in range(3)])
    >>> devs = tuple(Device(f"/GPU:{i}", "X", 2**30) for i in range(2))
    >>> round_robin(g, Cluster(devs, np.full((2, 2), 1e9), np.zeros((2, 2)))).tolist()
    [0, 1, 0, 1]
    """
    p = prepare(graph, cluster, costs)
    fixed = group_fixed_device(p)
    rank = np.empty(p.num_groups, np.int64)
    rank[np.argsort(p.group_first, kind="stable")] = np.arange(p.num_groups)
    gd = np.asarray(p.gpus)[rank % len(p.gpus)]
    bad = ~p.group_allowed[np.arange(p.num_groups), gd]
    gd[bad] = np.argmax(p.group_allowed[bad], axis=1)
    gd = np.where(fixed >= 0, fixed, gd)
    return gd[p.group]
