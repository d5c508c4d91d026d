"""MinCut via METIS (the papers' "MinCut" baseline; Mirhoseini et al. 2017 used METIS-style min-cut).

Rule: contract co-location groups into vertices (vertex weight = compute seconds, the mean over the GPUs;
edge weight = bytes crossing between the groups), leave CPU-only groups on the CPU, and split the rest into N
compute-balanced parts minimising the bytes cut with pymetis (`part_graph`, k-way, seeded). Parts map to
GPUs in order. If a GPU's estimated memory (persistent + activation bytes) exceeds its capacity, groups are
moved (largest first) to the GPU with the most free memory; if that cannot fit the model, PlacementError
names memory needed vs available.
"""
from __future__ import annotations

import numpy as np

from placer._mute import muted
from placer.baselines._common import partition_placement, prepare, to_int_weights
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster


def metis_placement(graph: OpGraph, cluster: Cluster, costs=None, seed: int = 0) -> np.ndarray:
    """Compute-balanced min-cut placement over the N GPUs: op→device index array.

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> ops = [(f"{s}{i}", "X", 4, 0, 1e9) for s in "ab" for i in range(3)]
    >>> edges = [("a0", "a1"), ("a1", "a2"), ("b0", "b1"), ("b1", "b2"), ("a2", "b2")]
    >>> devs = tuple(Device(f"/GPU:{i}", "X", 2**30) for i in range(2))
    >>> pl = metis_placement(OpGraph.build(ops, edges), Cluster(devs, np.full((2, 2), 1e9), np.zeros((2, 2))))
    >>> sorted(np.bincount(pl).tolist())   # two chains, one per GPU
    [3, 3]
    """
    import pymetis

    def part(cg, k: int) -> np.ndarray:
        ew = to_int_weights(cg.eweight) if len(cg.adjncy) else None
        with muted(1):          # METIS's own complaints go to stdout (a command's JSON output)
            _, parts = pymetis.part_graph(k, xadj=cg.xadj, adjncy=cg.adjncy, vweights=to_int_weights(cg.vweight),
                                          eweights=ew, options=pymetis.Options(seed=int(seed)))
        return np.asarray(parts, np.int64)

    return partition_placement(prepare(graph, cluster, costs), part, "metis")
