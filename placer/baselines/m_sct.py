"""m-SCT: memory-constrained Small Communication Time scheduling (Baechi, SoCC 2020; SCT of Hanen & Munier,
"An approximation algorithm for scheduling dependent tasks on m processors with small communication
delays", 1995).

Rule:
1. Favorite children from a linear program (solved with scipy's HiGHS): variables x_e ∈ [0, 1] per edge
   (0 = the child runs right after its parent on the same device), start times s_i ≥ 0 and makespan w;
   minimise w subject to s_i + p_i + c_ij·x_ij ≤ s_j per edge, s_i + p_i ≤ w, at most one favorite child
   per op (Σ_j x_ij ≥ outdeg − 1) and at most one favorite parent per op (Σ_i x_ij ≥ indeg − 1); p_i is
   the op's mean cost, c_ij the mean GPU-to-GPU transfer time of the edge's bytes. Edges with x < 0.5 are
   favorite edges (rounded so that each op keeps at most one favorite child and one favorite parent, the
   smallest x winning). If HiGHS does not finish within `lp_time_limit` seconds, each op's favorite child is
   its successor with the largest transfer (greedy stand-in; logged).
2. m-ETF (see `m_etf`) where an op whose favorite parent is already placed is pinned to that parent's device
   whenever it fits there (the transfer on the heaviest edges is avoided). Memory and co-location as m-ETF;
   PlacementError names memory needed vs available when an op fits nowhere.

Forward-operator placement (`colocate_gradients`): see `placer.baselines._common.with_gradient_fallback`.
"""
from __future__ import annotations

import logging

import numpy as np

from placer.baselines._common import Problem, prepare, with_gradient_fallback
from placer.baselines._schedule import etf
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster

log = logging.getLogger(__name__)


def favorite_children(p: Problem, *, threshold: float = 0.5, lp_time_limit: float = 120.0) -> np.ndarray:
    """int[n]: each op's favorite parent (-1 when none), from SCT's LP relaxation (HiGHS)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n = p.n
    cnt = np.diff(p.succ_ptr)
    src = np.repeat(np.arange(n), cnt)
    dst = p.succ_idx.astype(np.int64)
    E = len(src)
    fav_parent = np.full(n, -1, np.int64)
    if E == 0:
        return fav_parent
    w = p.mean_gpu_cost()
    lat, spb = p.mean_gpu_link()
    c = lat + p.succ_bytes * spb
    x_all = None
    if c.max() > 0:
        nv = E + n + 1
        rows, cols, vals, rhs = [], [], [], []
        e = np.arange(E)
        # s_i - s_j + c_ij x_ij <= -p_i
        rows += [e, e, e]
        cols += [E + src, E + dst, e]
        vals += [np.ones(E), -np.ones(E), c]
        rhs.append(-w[src])
        r = E
        # at most one favorite child (keys = src) / parent (keys = dst): -sum x <= 1 - degree, degree >= 2
        for keys in (src, dst):
            deg = np.bincount(keys, minlength=n)
            multi = np.flatnonzero(deg >= 2)
            if len(multi):
                rid = np.full(n, -1, np.int64)
                rid[multi] = r + np.arange(len(multi))
                sel = rid[keys] >= 0
                rows.append(rid[keys][sel])
                cols.append(e[sel])
                vals.append(-np.ones(int(sel.sum())))
                rhs.append(1.0 - deg[multi])
                r += len(multi)
        # sinks finish before the makespan: s_i - w <= -p_i
        sinks = np.flatnonzero(cnt == 0)
        rid = r + np.arange(len(sinks))
        rows += [rid, rid]
        cols += [E + sinks, np.full(len(sinks), E + n)]
        vals += [np.ones(len(sinks)), -np.ones(len(sinks))]
        rhs.append(-w[sinks])
        r += len(sinks)
        A = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nv)).tocsr()
        b = np.concatenate(rhs)
        obj = np.zeros(nv)
        obj[-1] = 1.0
        bounds = np.zeros((nv, 2))
        bounds[:E, 1] = 1.0
        bounds[E:, 1] = np.inf
        res = linprog(obj, A_ub=A, b_ub=b, bounds=bounds, method="highs",
                      options={"time_limit": float(lp_time_limit), "presolve": True})
        if res.status == 0 and res.x is not None:
            x_all = res.x[:E]
        else:
            log.warning("m_sct: HiGHS did not solve the favorite-child LP (%s); using the heaviest edges", res.message)
    if x_all is None:
        # greedy stand-in: the heaviest out-edge of each op is its favorite
        x_all = np.ones(E)
        heavy = np.lexsort((-c, src))  # per source, heaviest first
        first = np.ones(E, bool)
        first[1:] = src[heavy][1:] != src[heavy][:-1]
        x_all[heavy[first]] = 0.0
    # round: favorite edges are x < threshold; at most one per parent and per child (smallest x wins)
    cand = np.flatnonzero(x_all < threshold)
    cand = cand[np.argsort(x_all[cand], kind="stable")]
    has_child = np.zeros(n, bool)
    for k in cand:
        i, j = src[k], dst[k]
        if has_child[i] or fav_parent[j] >= 0:
            continue
        has_child[i] = True
        fav_parent[j] = i
    return fav_parent


def m_sct(graph: OpGraph, cluster: Cluster, costs=None, *, lp_time_limit: float = 120.0,
          colocate_gradients: bool | None = None) -> np.ndarray:
    """Memory-constrained SCT placement: op→device index array.

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> g = OpGraph.build([("a", "X", 10**9, 0, 1e12), ("b", "X", 8, 0, 1e12)], [("a", "b")])
    >>> devs = tuple(Device(f"/GPU:{i}", "X", 2**34, peak_flops=1e12) for i in range(2))
    >>> c = Cluster(devs, np.full((2, 2), 1e9), np.zeros((2, 2)))
    >>> m_sct(g, c).tolist()   # b is a's favorite child: it stays with a
    [0, 0]
    """
    def run(cg: bool) -> np.ndarray:
        p = prepare(graph, cluster, costs, colocate_gradients=cg)
        return etf(p, favorite_parent=favorite_children(p, lp_time_limit=lp_time_limit), what="m_sct").device

    return with_gradient_fallback(run, colocate_gradients)
