"""The memory-constrained list-scheduling engine shared by `heft`, `m_etf` and `m_sct` (Baechi, SoCC 2020).

State is typed arrays, not string keys on networkx node dicts: `DeviceState` keeps per-device free time and
memory in use and the device each co-location group is pinned to. A co-location group reserves its whole
memory (`Problem.group_mem`) on the device its first op is scheduled on, and every later member of the group
is pinned there (Baechi's co-placement rule), so the schedule works on the op graph itself (contracting the
groups would create cycles: a variable and its update op share a group but sit at both ends of the step).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from placer.baselines._common import Problem, memory_error


@dataclass
class Schedule:
    """A list schedule: device, start and finish seconds per op, and its makespan (the schedulers' estimate
    of the step time, without link contention)."""

    device: np.ndarray
    start: np.ndarray
    finish: np.ndarray

    @property
    def makespan(self) -> float:
        return float(self.finish.max()) if len(self.finish) else 0.0


@dataclass
class DeviceState:
    """Per-device free time and memory in use, and each co-location group's device (-1 = not yet placed)."""

    p: Problem
    free_at: np.ndarray = field(init=False)
    used: np.ndarray = field(init=False)
    group_dev: np.ndarray = field(init=False)
    device: np.ndarray = field(init=False)
    start: np.ndarray = field(init=False)
    finish: np.ndarray = field(init=False)

    def __post_init__(self):
        p = self.p
        self.free_at = np.zeros(p.D)
        self.used = np.zeros(p.D, np.int64)
        self.group_dev = np.full(p.num_groups, -1, np.int64)
        self.device = np.full(p.n, -1, np.int64)
        self.start = np.zeros(p.n)
        self.finish = np.zeros(p.n)

    def feasible(self, ops: np.ndarray) -> np.ndarray:
        """bool[len(ops), D]: devices each op may go to now (allowed, pinned group, memory fits)."""
        p = self.p
        g = p.group[ops]
        pin = self.group_dev[g]
        fits = self.used[None, :] + p.group_mem[g][:, None] <= p.capacity[None, :]
        pinned = np.arange(p.D)[None, :] == pin[:, None]
        return p.allowed[ops] & np.where(pin[:, None] >= 0, pinned, fits)

    def data_ready(self, i: int) -> np.ndarray:
        """float64[D]: when all of op i's inputs could be on each device (predecessors already scheduled)."""
        p = self.p
        out = np.zeros(p.D)
        for k in range(p.pred_ptr[i], p.pred_ptr[i + 1]):
            j = p.pred_idx[k]
            dj = self.device[j]
            arr = self.finish[j] + p.lat[dj] + p.pred_bytes[k] * p.inv_bw[dj]
            arr[dj] = self.finish[j]
            np.maximum(out, arr, out=out)
        return out

    def place(self, i: int, d: int, start: float) -> None:
        p = self.p
        g = p.group[i]
        if self.group_dev[g] < 0:
            self.group_dev[g] = d
            self.used[d] += p.group_mem[g]
        self.device[i] = d
        self.start[i] = start
        self.finish[i] = start + p.cost[i, d]
        self.free_at[d] = max(self.free_at[d], self.finish[i])

    def fail(self, i: int, what: str):
        """The PlacementError for op i having no feasible device (memory needed vs available)."""
        p = self.p
        devs = np.flatnonzero(p.allowed[i])
        return memory_error(p, int(p.group[i]), self.used, devs, what)

    def schedule(self) -> Schedule:
        return Schedule(self.device.copy(), self.start.copy(), self.finish.copy())


def bottom_level(p: Problem) -> np.ndarray:
    """Static b-level (HEFT's upward rank): mean cost + max over successors of (mean transfer + their rank)."""
    w = p.mean_gpu_cost()
    lat, spb = p.mean_gpu_link()
    rank = np.zeros(p.n)
    for i in range(p.n - 1, -1, -1):  # ops are in topological order
        s, e = p.succ_ptr[i], p.succ_ptr[i + 1]
        if e > s:
            tail = rank[p.succ_idx[s:e]] + lat + p.succ_bytes[s:e] * spb
            rank[i] = w[i] + tail.max()
        else:
            rank[i] = w[i]
    return rank


def etf(p: Problem, *, favorite_parent: np.ndarray | None = None, what: str = "m_etf") -> Schedule:
    """Memory-constrained Earliest Task First (Hwang et al. 1989; Baechi's m-ETF).

    Repeatedly schedule the (ready op, feasible device) pair with the earliest start time
    `max(device free, inputs arrived)`; ties go to the op with the larger b-level, then the lower op index,
    then the lower device index. With `favorite_parent` (m-SCT), an op whose favorite parent is already
    placed may only go to that parent's device when it fits there.
    """
    st = DeviceState(p)
    prio = bottom_level(p)
    indeg = np.diff(p.pred_ptr).astype(np.int64)
    cap = max(16, p.n)
    r_ops = np.zeros(cap, np.int64)
    r_dr = np.zeros((cap, p.D))
    m = 0
    for i in np.flatnonzero(indeg == 0):
        r_ops[m] = i
        r_dr[m] = 0.0
        m += 1
    dev_idx = np.arange(p.D)
    for _ in range(p.n):
        ops = r_ops[:m]
        feas = st.feasible(ops)
        if favorite_parent is not None:
            fp = favorite_parent[ops]
            has = fp >= 0
            if has.any():
                pd = np.where(has, st.device[np.maximum(fp, 0)], -1)
                rows = np.flatnonzero((pd >= 0) & feas[np.arange(m), np.maximum(pd, 0)])
                if len(rows):
                    feas[rows] = dev_idx[None, :] == pd[rows, None]
        est = np.maximum(r_dr[:m], st.free_at[None, :])
        est[~feas] = np.inf
        best_d = np.argmin(est, axis=1)
        best_t = est[np.arange(m), best_d]
        k = int(np.lexsort((ops, -prio[ops], best_t))[0])
        i, d, t = int(ops[k]), int(best_d[k]), float(best_t[k])
        if not np.isfinite(t):
            # every ready op is stuck; report the one with the highest priority
            k = int(np.lexsort((ops, -prio[ops]))[0])
            raise st.fail(int(ops[k]), what)
        st.place(i, d, t)
        m -= 1
        r_ops[k] = r_ops[m]
        r_dr[k] = r_dr[m]
        for j in p.succ_idx[p.succ_ptr[i]:p.succ_ptr[i + 1]]:
            indeg[j] -= 1
            if indeg[j] == 0:
                r_ops[m] = j
                r_dr[m] = st.data_ready(int(j))
                m += 1
    return st.schedule()
