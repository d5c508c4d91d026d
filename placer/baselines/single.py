"""Single-device baselines of the papers (Mirhoseini et al. 2017, Table 1: Single-CPU, Single-GPU).

`single_gpu`: every op on the first GPU, CPU-only ops on /CPU:0. `single_cpu`: every op on /CPU:0.
They do not check memory: when the model does not fit, the simulator reports OOM and the table shows null,
as the papers do ("OOM").
"""
from __future__ import annotations

import numpy as np

from placer.baselines._common import prepare
from placer.errors import PlacementError
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster


def single_gpu(graph: OpGraph, cluster: Cluster, costs=None) -> np.ndarray:
    """Every op on the first GPU; CPU-only ops (and their co-location groups) on the CPU.

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> g = OpGraph.build([("a", "X", 4), ("b", "X", 4, 0, 0.0, True)], [("a", "b")])
    >>> devs = (Device("/GPU:0", "X", 2**30), Device("/CPU:0", "cpu", 2**30))
    >>> single_gpu(g, Cluster(devs, np.full((2, 2), 1e9), np.zeros((2, 2)))).tolist()
    [0, 1]
    """
    p = prepare(graph, cluster, costs)
    first = int(p.gpus[0])
    out = np.full(p.n, first, np.int64)
    if p.cpu is not None:
        out[~p.allowed[:, first]] = p.cpu
    return out


def single_cpu(graph: OpGraph, cluster: Cluster, costs=None) -> np.ndarray:
    """Every op on the host CPU (/CPU:0).

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> g = OpGraph.build([("a", "X", 4), ("b", "X", 4)], [("a", "b")])
    >>> devs = (Device("/GPU:0", "X", 2**30), Device("/CPU:0", "cpu", 2**30))
    >>> single_cpu(g, Cluster(devs, np.full((2, 2), 1e9), np.zeros((2, 2)))).tolist()
    [1, 1]
    """
    cpu = cluster.cpu_index
    if cpu is None:
        raise PlacementError(f"single_cpu: cluster {cluster.name!r} has no CPU device")
    return np.full(graph.num_ops, cpu, np.int64)
