"""m-ETF: memory-constrained Earliest Task First (Baechi, SoCC 2020; ETF of Hwang et al., SIAM J. Comput. 1989).

Rule: simulate the step with a global clock; at each step take, over all ready ops and all devices they may
use (allowed kind, co-location pin, memory left), the pair with the earliest start time
`max(device free, inputs arrived)` (inputs from another device arrive after latency + bytes / bandwidth);
ties go to the op with the larger b-level (longest remaining path). CPU-only ops can only go to the CPU;
every other op goes to one of the N GPUs. A co-location group reserves its whole memory on the device its
first op lands on. When no ready op fits anywhere, PlacementError names the op, memory needed and available.

Forward-operator placement (`colocate_gradients`): see `placer.baselines._common.with_gradient_fallback`.
"""
from __future__ import annotations

import numpy as np

from placer.baselines._common import prepare, with_gradient_fallback
from placer.baselines._schedule import etf
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster


def m_etf(graph: OpGraph, cluster: Cluster, costs=None, *, colocate_gradients: bool | None = None) -> np.ndarray:
    """Memory-constrained ETF placement: op→device index array.

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> g = OpGraph.build([("a", "X", 8, 0, 1e12), ("b", "X", 8, 0, 1e12), ("c", "X", 8, 0, 1e12)],
    ...                   [("a", "c"), ("b", "c")])
    >>> devs = tuple(Device(f"/GPU:{i}", "X", 2**30, peak_flops=1e12) for i in range(2))
    >>> c = Cluster(devs, np.full((2, 2), 1e12), np.zeros((2, 2)))
    >>> sorted(m_etf(g, c).tolist()[:2])   # a and b run in parallel on the two GPUs
    [0, 1]
    """
    return with_gradient_fallback(
        lambda cg: etf(prepare(graph, cluster, costs, colocate_gradients=cg), what="m_etf").device, colocate_gradients)
