"""HEFT: Heterogeneous Earliest Finish Time (Topcuoglu et al., IEEE TPDS 2002), memory-constrained.

Rule: rank every op by its upward rank (mean cost over the devices it may use + the longest path of mean
costs and mean GPU-to-GPU transfer times to an exit op); in decreasing rank order (ties: topological order),
put each op on the device, among those it may use with memory left (co-location groups pinned to the device
of their first op, whose memory they reserve as a whole), that gives the earliest finish time
`max(device free, inputs arrived) + cost` (non-insertion variant: an op is appended after the device's last
op). CPU-only ops go to the CPU. When an op fits nowhere, PlacementError names memory needed vs available.

Forward-operator placement (`colocate_gradients`): see `placer.baselines._common.with_gradient_fallback`.
"""
from __future__ import annotations

import numpy as np

from placer.baselines._common import prepare, with_gradient_fallback
from placer.baselines._schedule import DeviceState, bottom_level
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster


def heft(graph: OpGraph, cluster: Cluster, costs=None, *, colocate_gradients: bool | None = None) -> np.ndarray:
    """Memory-constrained HEFT placement: op→device index array.

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> chain = OpGraph.build([(n, "X", 10**8, 0, 1e11) for n in "abc"], [("a", "b"), ("b", "c")])
    >>> gpus = tuple(Device(f"/GPU:{i}", "X", 2**34, peak_flops=1e12) for i in range(2))
    >>> heft(chain, Cluster(gpus, np.full((2, 2), 1e9), np.zeros((2, 2)))).tolist()   # moving costs 0.1 s
    [0, 0, 0]
    """
    def run(cg: bool) -> np.ndarray:
        p = prepare(graph, cluster, costs, colocate_gradients=cg)
        rank = bottom_level(p)
        order = np.lexsort((np.arange(p.n), -rank))
        st = DeviceState(p)
        for i in order:
            i = int(i)
            feas = st.feasible(i)
            if not feas.any():
                raise st.fail(i, "heft")
            est = np.maximum(st.data_ready(i), st.free_at)
            eft = np.where(feas, est + p.cost[i], np.inf)
            d = int(np.argmin(eft))
            st.place(i, d, float(est[d]))
        return st.device

    return with_gradient_fallback(run, colocate_gradients)
