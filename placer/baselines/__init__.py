"""Baseline placements (issue 6): one function per algorithm, graph + cluster (+ cost matrix) in, op→device
index array out.

    from placer.baselines import BASELINES, run_baseline
    placement = run_baseline("m_etf", graph, cluster)          # int64[num_ops] indices into cluster.devices

Names (CLI.md): `single_gpu`, `single_cpu`, `expert`, `metis` (the papers' MinCut), `scotch` (only when
`pyscotch` loads), `heft`, `m_topo`, `m_etf`, `m_sct`, `random`, plus `round_robin`. Every baseline keeps
co-location groups together and CPU-only ops on the CPU; the memory-aware ones (`metis`, `scotch`, `heft`,
`m_topo`, `m_etf`, `m_sct`) fit each GPU's capacity under the shared memory estimate or raise PlacementError
naming memory needed vs available; `single_*`, `random`, `round_robin` and `expert` are the fixed rules of
the papers and leave OOM to the simulator. Each module's docstring states its rule.

Not in `BASELINES`: the annealing reference `placer.baselines.anneal.anneal(problem, evaluator, ...)`, a local
search over group placements that needs an evaluator (the bench's baseline `anneal`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from placer.baselines.expert import expert
from placer.baselines.heft import heft
from placer.baselines.m_etf import m_etf
from placer.baselines.m_sct import m_sct
from placer.baselines.m_topo import m_topo
from placer.baselines.metis import metis_placement
from placer.baselines.rand import random_placement, round_robin
from placer.baselines.single import single_cpu, single_gpu
from placer.errors import PlacementError

__all__ = ["BASELINES", "SEEDED", "run_baseline", "single_gpu", "single_cpu", "expert", "metis_placement",
           "heft", "m_topo", "m_etf", "m_sct", "random_placement", "round_robin"]

BASELINES: dict[str, Callable[..., np.ndarray]] = {
    "single_gpu": single_gpu,
    "single_cpu": single_cpu,
    "expert": expert,
    "metis": metis_placement,
    "heft": heft,
    "m_topo": m_topo,
    "m_etf": m_etf,
    "m_sct": m_sct,
    "random": random_placement,
    "round_robin": round_robin,
}
SEEDED = {"metis", "scotch", "random"}  # baselines that take `seed=`

try:  # Scotch only when pyscotch's bundled libscotch loads (see benchmarks/RESULTS.md, "Baselines")
    from placer.baselines import scotch as _scotch

    if _scotch.available():
        BASELINES["scotch"] = _scotch.scotch_placement
        __all__.append("scotch_placement")
        scotch_placement = _scotch.scotch_placement
except ImportError:  # pragma: no cover - pyscotch not installed
    pass


def run_baseline(name: str, graph, cluster, costs=None, seed: int = 0) -> np.ndarray:
    """Run the baseline called `name`: op→device index array (int64, len = graph.num_ops).

    >>> import numpy as np
    >>> from placer.graphs.opgraph import OpGraph
    >>> from placer.sim.cluster import Cluster, Device
    >>> g = OpGraph.build([("a", "X", 4), ("b", "X", 4)], [("a", "b")])
    >>> c = Cluster((Device("/GPU:0", "X", 2**30), Device("/CPU:0", "cpu", 2**30)), np.ones((2, 2)), np.zeros((2, 2)))
    >>> run_baseline("single_gpu", g, c).tolist()
    [0, 0]
    """
    if name not in BASELINES:
        raise PlacementError(f"unknown baseline {name!r}: valid baselines are {sorted(BASELINES)}")
    fn = BASELINES[name]
    if name in SEEDED:
        out = fn(graph, cluster, costs, seed=seed)
    else:
        out = fn(graph, cluster, costs)
    return np.asarray(out, dtype=np.int64)
