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

from numba import njit

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
    charged: np.ndarray = field(init=False)
    device: np.ndarray = field(init=False)
    start: np.ndarray = field(init=False)
    finish: np.ndarray = field(init=False)

    def __post_init__(self):
        p = self.p
        self.free_at = np.zeros(p.D)
        self.used = np.zeros(p.D, np.int64)
        self.group_dev = np.full(p.num_groups, -1, np.int64)
        self.charged = np.zeros((len(p.t_bytes), p.D), bool)  # kept tensor t has a copy on device d
        self.device = np.full(p.n, -1, np.int64)
        self.start = np.zeros(p.n)
        self.finish = np.zeros(p.n)

    def copies(self, i: int) -> np.ndarray:
        """int64[D]: bytes of kept tensors op i would have to copy onto each device (not there yet)."""
        p = self.p
        out = np.zeros(p.D, np.int64)
        for t in p.kin_tensor[p.kin_ptr[i]:p.kin_ptr[i + 1]]:
            miss = ~self.charged[t]
            miss[self.device[p.t_op[t]]] = False
            out[miss] += p.t_bytes[t]
        return out

    def feasible(self, i: int) -> np.ndarray:
        """bool[D]: devices op i may go to now (allowed, pinned group, memory incl. copies fits)."""
        p = self.p
        g = p.group[i]
        pin = self.group_dev[g]
        need = self.copies(i) + (p.group_mem[g] if pin < 0 else 0)
        ok = p.allowed[i] & (self.used + need <= p.capacity)
        if pin >= 0:
            ok &= np.arange(p.D) == pin
        return ok

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
        self.used[d] += self.copies(i)[d]
        for t in p.kin_tensor[p.kin_ptr[i]:p.kin_ptr[i + 1]]:
            if self.device[p.t_op[t]] != d:
                self.charged[t, d] = True
        self.device[i] = d
        self.start[i] = start
        self.finish[i] = start + p.cost[i, d]
        self.free_at[d] = max(self.free_at[d], self.finish[i])

    def fail(self, i: int, what: str):
        """The PlacementError for op i having no feasible device (memory needed vs available)."""
        p = self.p
        g = int(p.group[i])
        devs = np.flatnonzero(p.allowed[i]) if self.group_dev[g] < 0 else np.array([self.group_dev[g]])
        need = self.copies(i) + (p.group_mem[g] if self.group_dev[g] < 0 else 0)
        return memory_error(p, g, self.used, devs, what, need=need)

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


@njit(cache=True, nogil=True)
def _etf_kernel(cost, allowed, group, group_mem, capacity, pred_ptr, pred_idx, pred_bytes, succ_ptr, succ_idx,
                lat, inv_bw, prio, fav_parent, num_groups, kin_ptr, kin_tensor, t_op, t_bytes
                ):  # pragma: no cover - compiled
    n, D = cost.shape
    free_at = np.zeros(D)
    used = np.zeros(D, np.int64)
    gdev = np.full(num_groups, -1, np.int64)
    charged = np.zeros((len(t_bytes), D), np.bool_)
    device = np.full(n, -1, np.int64)
    start = np.zeros(n)
    finish = np.zeros(n)
    indeg = np.zeros(n, np.int64)
    for i in range(n):
        indeg[i] = pred_ptr[i + 1] - pred_ptr[i]
    r_ops = np.empty(n, np.int64)
    r_dr = np.zeros((n, D))

    # bytes of op i's inputs not yet on device d (charged once per tensor and device). A closure, which numba
    # inlines with no reference counting: as a function taking the six arrays, every call increfed and decrefed them
    def copy_bytes(i, d):
        extra = 0
        for q in range(kin_ptr[i], kin_ptr[i + 1]):
            t = kin_tensor[q]
            if device[t_op[t]] != d and not charged[t, d]:
                extra += t_bytes[t]
        return extra

    m = 0
    for i in range(n):
        if indeg[i] == 0:
            r_ops[m] = i
            m += 1
    for _ in range(n):
        best_t, best_k, best_d = np.inf, -1, -1
        for k in range(m):
            i = r_ops[k]
            g = group[i]
            pin = gdev[g]
            only = -1
            fp = fav_parent[i]
            if fp >= 0 and device[fp] >= 0:
                pd = device[fp]
                need = copy_bytes(i, pd)
                if pin < 0:
                    need += group_mem[g]
                if allowed[i, pd] and (pin == pd or pin < 0) and used[pd] + need <= capacity[pd]:
                    only = pd
            for d in range(D):
                if (only >= 0 and d != only) or not allowed[i, d]:
                    continue
                if pin >= 0 and d != pin:
                    continue
                need = copy_bytes(i, d)
                if pin < 0:
                    need += group_mem[g]
                if used[d] + need > capacity[d]:
                    continue
                t = max(r_dr[k, d], free_at[d])
                if best_k < 0 or t < best_t:
                    best_t, best_k, best_d = t, k, d
                elif t == best_t and best_k != k:
                    j = r_ops[best_k]
                    if prio[i] > prio[j] or (prio[i] == prio[j] and i < j):
                        best_t, best_k, best_d = t, k, d
        if best_k < 0:
            # every ready op is stuck: report the one with the highest priority
            worst = r_ops[0]
            for k in range(1, m):
                i = r_ops[k]
                if prio[i] > prio[worst] or (prio[i] == prio[worst] and i < worst):
                    worst = i
            return device, start, finish, worst, used
        i, d = r_ops[best_k], best_d
        g = group[i]
        if gdev[g] < 0:
            gdev[g] = d
            used[d] += group_mem[g]
        for q in range(kin_ptr[i], kin_ptr[i + 1]):
            t = kin_tensor[q]
            if device[t_op[t]] != d and not charged[t, d]:
                charged[t, d] = True
                used[d] += t_bytes[t]
        device[i] = d
        start[i] = best_t
        finish[i] = best_t + cost[i, d]
        free_at[d] = max(free_at[d], finish[i])
        m -= 1
        r_ops[best_k] = r_ops[m]
        for e in range(D):
            r_dr[best_k, e] = r_dr[m, e]
        for s in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[s]
            indeg[j] -= 1
            if indeg[j] == 0:
                for e in range(D):
                    r_dr[m, e] = 0.0
                for q in range(pred_ptr[j], pred_ptr[j + 1]):
                    a = pred_idx[q]
                    da = device[a]
                    for e in range(D):
                        arr = finish[a] if e == da else finish[a] + lat[da, e] + pred_bytes[q] * inv_bw[da, e]
                        if arr > r_dr[m, e]:
                            r_dr[m, e] = arr
                r_ops[m] = j
                m += 1
    return device, start, finish, -1, used


def etf(p: Problem, *, favorite_parent: np.ndarray | None = None, what: str = "m_etf") -> Schedule:
    """Memory-constrained Earliest Task First (Hwang et al. 1989; Baechi's m-ETF).

    Repeatedly schedule the (ready op, feasible device) pair with the earliest start time
    `max(device free, inputs arrived)`; ties go to the op with the larger b-level, then the lower op index,
    then the lower device index. With `favorite_parent` (m-SCT), an op whose favorite parent is already
    placed may only go to that parent's device when it fits there. The loop is numba-compiled.
    """
    prio = bottom_level(p)
    fav = np.full(p.n, -1, np.int64) if favorite_parent is None else np.asarray(favorite_parent, np.int64)
    device, start, finish, stuck, used = _etf_kernel(
        np.ascontiguousarray(p.cost), np.ascontiguousarray(p.allowed), p.group.astype(np.int64),
        p.group_mem.astype(np.int64), p.capacity.astype(np.int64), p.pred_ptr.astype(np.int64),
        p.pred_idx.astype(np.int64), p.pred_bytes.astype(np.float64), p.succ_ptr.astype(np.int64),
        p.succ_idx.astype(np.int64), np.ascontiguousarray(p.lat), np.ascontiguousarray(p.inv_bw), prio, fav,
        int(p.num_groups), p.kin_ptr.astype(np.int64), p.kin_tensor.astype(np.int64), p.t_op, p.t_bytes)
    if stuck >= 0:
        st = DeviceState(p)
        st.device[:] = device
        st.used[:] = used
        placed = device >= 0
        st.group_dev[p.group[placed]] = device[placed]
        raise st.fail(int(stuck), what)
    return Schedule(device, start, finish)


def memory_by_device(p: Problem, device: np.ndarray) -> np.ndarray:
    """int64[D] memory reserved by the co-location groups placed so far (device -1 = not placed)."""
    gdev = np.full(p.num_groups, -1, np.int64)
    placed = device >= 0
    gdev[p.group[placed]] = device[placed]
    ok = gdev >= 0
    return np.bincount(gdev[ok], weights=p.group_mem[ok], minlength=p.D).astype(np.int64)
