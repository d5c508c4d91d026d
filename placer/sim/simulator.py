"""Event simulator of one training step of a placed graph: ops on devices, transfers on links, memory per device.

Semantics (issue 3):
- Each device keeps a ready queue. An op is ready when every data input is present on its device (produced
  there, or received) and every control predecessor finished. A GPU runs one op at a time, a CPU
  `concurrency` ops at once. Order (`order="ready"`, the default) is the order TensorFlow's executor starts
  them: FIFO by the time the op became ready, ties by topological index. `order="critical"`: highest
  bottom level first (longest remaining path of assigned op costs, transfers not counted), ties by index.
- Each tensor crossing devices is ONE transfer per (tensor, destination device), started when its producer
  finishes and queued FIFO on the link i→j; it holds the link for bytes / bandwidth + latency and arrives
  at its end; on a *pipelined* link (cluster JSON `"pipelined": true`, e.g. gRPC between TF tasks, which keeps
  many transfers in flight) it holds the link for bytes / bandwidth only and arrives the latency after that.
  Control edges never transfer. A link that crosses a SHARED link (cluster JSON "links"[i][j]
  "shared": a node's NIC, a PCIe switch; "shared_links" gives its bandwidth) also queues FIFO on it: the
  transfer starts when both are free, runs at the slower of the two rates, and holds the shared link for
  bytes / its bandwidth, so two flows through one NIC take turns. On a *cpu_copy* link (`"cpu_copy": true`,
  gRPC between CPU-only TF tasks) both endpoint devices' processors also do the copy, for `cpu_copy` (a
  fraction, `true` = 1) of its bytes / bandwidth: a busy device's next op runs that much longer, an idle one
  copies first and an op it starts meanwhile runs longer by the rest (first-order time sharing; the transfer
  itself still arrives when the link says).
- Memory per device: persistent bytes (variables, optimizer slots) of its ops for the whole step, plus
  activations: a tensor is allocated on its producer's device when the producer finishes (on a receiving
  device when the transfer arrives) and freed when its last consumer on that device finishes (the producer
  copy also waits for its outgoing transfers). At one instant the op's outputs are allocated before its
  inputs are freed. A variable read (ReadVariableOp) returns the variable's own buffer, as TF's kernel does:
  it allocates nothing on its device; a copy sent to another device is allocated there. A device is OOM when
  its peak exceeds memory - reserve.
- Step time = makespan (the last op's finish).
- Events at the same instant are all applied (transfer arrivals first, then op finishes by op index) before
  any device picks its next op.

The hot loop is numba-compiled (`_simulate_kernel`, nogil, cache=True) over CSR arrays built once per graph.

>>> from placer.graphs.opgraph import OpGraph
>>> from placer.sim.cluster import parse_cluster
>>> g = OpGraph.build([("a", "X", 8), ("b", "X", 8)], [("a", "b")])
>>> sim = Simulator(g, parse_cluster("1xK80"), np.array([[1.0, 1.0], [2.0, 2.0]]))
>>> sim.simulate(np.array([0, 0])).step_time
3.0
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from numba import njit

from placer.errors import PlacementError
from placer.graphs.opgraph import OpGraph, aliases_variable
from placer.sim.cluster import Cluster, link_cpu_copy, link_pipelined
from placer.sim.evaluator import Evaluator, Outcome

ORDERS = {"ready": 0, "critical": 1}


# =================================================================================================================
# compiled core
# =================================================================================================================
@njit(cache=True, nogil=True)
def _bottom_levels(w, t_start, t_cons_ptr, t_cons, c_ptr, c_succ):
    """bl[i] = w[i] + max over successors (data + control) of bl: the longest path starting at op i."""
    n = w.shape[0]
    bl = np.zeros(n)
    for i in range(n - 1, -1, -1):
        m = 0.0
        for t in range(t_start[i], t_start[i + 1]):
            for k in range(t_cons_ptr[t], t_cons_ptr[t + 1]):
                v = bl[t_cons[k]]
                if v > m:
                    m = v
        for k in range(c_ptr[i], c_ptr[i + 1]):
            v = bl[c_succ[k]]
            if v > m:
                m = v
        bl[i] = w[i] + m
    return bl


@njit(cache=True, nogil=True)
def _top_levels(w, t_start, t_cons_ptr, t_cons, c_ptr, c_succ):
    """tl[i] = the longest path (sum of w) over op i's predecessors: the earliest op i can start."""
    n = w.shape[0]
    tl = np.zeros(n)
    for i in range(n):
        f = tl[i] + w[i]
        for t in range(t_start[i], t_start[i + 1]):
            for k in range(t_cons_ptr[t], t_cons_ptr[t + 1]):
                if f > tl[t_cons[k]]:
                    tl[t_cons[k]] = f
        for k in range(c_ptr[i], c_ptr[i + 1]):
            if f > tl[c_succ[k]]:
                tl[c_succ[k]] = f
    return tl


@njit(cache=True, nogil=True)
def _simulate_kernel(dev, cost, bw, lat, hold, cc, sh, sh_bw, grp, gslow, conc, capacity, order_mode,
                     t_start, t_op, t_bytes, t_alloc, t_cons_ptr, t_cons, in_ptr, in_tensor, c_ptr, c_succ, indeg,
                     persistent,
                     op_start, op_end, x_tensor, x_src, x_dst, x_start, x_end, busy, peak):
    """One simulated step. Fills op_start/op_end (n), transfer records x_* and busy/peak (D).
    Returns (step_time, number of transfers, transfer bytes)."""
    n = dev.shape[0]
    D = bw.shape[0]
    T = t_op.shape[0]
    pending = indeg.astype(np.int32)
    # each op's cost on its device, read once in op order: the dispatch below reads it in event order, and
    # cost[i, dev[i]] there missed the cache (the [n, D] table is ~1.5 MB at 20k ops: 12-18% of the step on clip)
    wc = np.empty(n)
    for i in range(n):
        wc[i] = cost[i, dev[i]]
    prio = np.zeros(n)
    if order_mode == 1:
        prio = -_bottom_levels(wc, t_start, t_cons_ptr, t_cons, c_ptr, c_succ)
    # per (tensor, device) consumer counts -> refcounts of live copies
    ref = np.zeros(T * D, np.int32)
    for t in range(T):
        for k in range(t_cons_ptr[t], t_cons_ptr[t + 1]):
            ref[t * D + dev[t_cons[k]]] += 1
    mem = np.zeros(D, np.int64)
    for i in range(n):
        mem[dev[i]] += persistent[i]
    for d in range(D):
        peak[d] = mem[d]
        busy[d] = 0.0
    link_free = np.zeros((D, D))
    sh_free = np.zeros(sh_bw.shape[0])   # shared links (a NIC, a PCIe switch): busy until, FIFO over their links
    running = np.zeros(D, np.int64)
    overlap = np.zeros(gslow.shape[0])
    # cc links: a transfer is also work for both endpoints' processors. An idle device copies until
    # copy_until[d] (an op started before then runs longer by the rest); a busy one owes debt[d] to its next op
    copy_until = np.zeros(D)
    debt = np.zeros(D)
    # rows 0..D-1: ready queues; row D: events (finish of op i: id i >= 0; arrival of transfer k: id -1-k).
    # At most sum(conc) ops run at once and each link has at most one arrival queued (its FIFO head).
    width = max(n + 1, int(conc.sum()) + D * D + 1)
    rq1 = np.empty((D + 1, width))
    rq2 = np.empty((D + 1, width), np.int64)
    rqn = np.zeros(D + 1, np.int64)
    # binary min-heaps on (rq1, rq2), one per row d (rqn[d] entries). Closures, which numba inlines with no
    # reference counting: as functions taking the arrays, every call increfed and decrefed them (atomics,
    # ~20% of a step on clip in `perf`, even inlined)
    def push(d, a, b):
        k = rqn[d]
        rq1[d, k] = a
        rq2[d, k] = b
        while k > 0:
            p = (k - 1) >> 1
            if rq1[d, p] < rq1[d, k] or (rq1[d, p] == rq1[d, k] and rq2[d, p] < rq2[d, k]):
                break
            rq1[d, p], rq1[d, k] = rq1[d, k], rq1[d, p]
            rq2[d, p], rq2[d, k] = rq2[d, k], rq2[d, p]
            k = p
        rqn[d] = rqn[d] + 1

    def pop(d):
        top = rq2[d, 0]
        size = rqn[d] - 1
        rqn[d] = size
        rq1[d, 0] = rq1[d, size]
        rq2[d, 0] = rq2[d, size]
        k = 0
        while True:
            l = 2 * k + 1
            if l >= size:
                break
            c = l
            r = l + 1
            if r < size and (rq1[d, r] < rq1[d, l] or (rq1[d, r] == rq1[d, l] and rq2[d, r] < rq2[d, l])):
                c = r
            if rq1[d, k] < rq1[d, c] or (rq1[d, k] == rq1[d, c] and rq2[d, k] < rq2[d, c]):
                break
            rq1[d, c], rq1[d, k] = rq1[d, k], rq1[d, c]
            rq2[d, c], rq2[d, k] = rq2[d, k], rq2[d, c]
            k = c
        return top
    EV = D
    link_tail = np.full((D, D), -1, np.int64)
    x_next = np.empty(x_tensor.shape[0], np.int64)
    stamp = np.full(D, -1, np.int64)
    nx = 0
    xbytes = 0
    for i in range(n):
        op_start[i] = np.nan
        op_end[i] = np.nan
        if pending[i] == 0:
            push(dev[i], prio[i] if order_mode == 1 else 0.0, i)
    now = 0.0
    makespan = 0.0
    while True:
        # dispatch: every device with a free slot starts its next ready ops at `now`
        for d in range(D):
            while running[d] < conc[d] and rqn[d] > 0:
                i = pop(d)
                c = wc[i]
                busy[d] += c
                c += debt[d]            # copies for cc links (0 elsewhere): owed, or still running at `now`
                debt[d] = 0.0
                if copy_until[d] > now:
                    c += copy_until[d] - now
                    copy_until[d] = now
                op_start[i] = now
                running[d] += 1
                push(EV, now + c, i)
        if rqn[EV] == 0:
            break
        nxt = rq1[EV, 0]
        # devices sharing one physical core (SMT siblings, tasks on shared cores): time during which two or
        # more of a group are busy stretches by 1/speed (first order; see compute_group_arrays)
        # (a cc copy counts only through the op it lengthens)
        for g in range(gslow.shape[0]):
            k = 0
            for d in range(D):
                if grp[d] == g and running[d] > 0:
                    k += 1
            if k >= 2:
                overlap[g] += nxt - now
        now = nxt
        # apply every event at this instant
        while rqn[EV] > 0 and rq1[EV, 0] == now:
            eid = pop(EV)
            if eid >= 0:  # op finished
                i = eid
                d = dev[i]
                running[d] -= 1
                op_end[i] = now
                if now > makespan:
                    makespan = now
                # outputs: allocate, wake local consumers, send to remote devices (one transfer per device)
                for t in range(t_start[i], t_start[i + 1]):
                    b = t_bytes[t]
                    mem[d] += t_alloc[t]      # 0 for outputs aliasing a variable's buffer (its reads)
                    if mem[d] > peak[d]:
                        peak[d] = mem[d]
                    for k in range(t_cons_ptr[t], t_cons_ptr[t + 1]):
                        cns = t_cons[k]
                        j = dev[cns]
                        if j == d:
                            pending[cns] -= 1
                            if pending[cns] == 0:
                                push(d, prio[cns] if order_mode == 1 else now, cns)
                        elif stamp[j] != t:
                            stamp[j] = t
                            s0 = link_free[d, j]
                            if s0 < now:
                                s0 = now
                            sk = sh[d, j]
                            rate = bw[d, j]
                            if sk >= 0:     # queue on the shared link too; it carries the bytes at its own rate
                                if sh_free[sk] > s0:
                                    s0 = sh_free[sk]
                                if sh_bw[sk] < rate:
                                    rate = sh_bw[sk]
                                sh_free[sk] = s0 + b / sh_bw[sk]
                            if cc[d, j] > 0.0:
                                # both processors copy, time-sharing with their compute: a device running an
                                # op owes the copy time to its next op; an idle one copies until copy_until
                                dt = cc[d, j] * b / rate
                                for q in (d, j):
                                    if running[q] > 0:
                                        debt[q] += dt
                                    else:
                                        copy_until[q] = max(copy_until[q], now) + dt
                                    busy[q] += dt
                            # the link is busy for the bytes, plus the latency where the latency holds it
                            # (hold = 1); arrival is the latency after the bytes (FIFO either way)
                            e1 = s0 + b / rate + lat[d, j] * hold[d, j]
                            link_free[d, j] = e1
                            e0 = e1 + lat[d, j] * (1.0 - hold[d, j])
                            x_tensor[nx] = t
                            x_src[nx] = d
                            x_dst[nx] = j
                            x_start[nx] = s0
                            x_end[nx] = e0
                            x_next[nx] = -1
                            # FIFO link: only the head transfer of each link sits in the event queue
                            if link_tail[d, j] < 0:
                                push(EV, e0, -1 - nx)
                            else:
                                x_next[link_tail[d, j]] = nx
                            link_tail[d, j] = nx
                            nx += 1
                            xbytes += b
                            ref[t * D + d] += 1  # the producer copy lives until the send completes
                    if ref[t * D + d] == 0:
                        mem[d] -= t_alloc[t]
                for k in range(c_ptr[i], c_ptr[i + 1]):
                    cns = c_succ[k]
                    pending[cns] -= 1
                    if pending[cns] == 0:
                        push(dev[cns], prio[cns] if order_mode == 1 else now, cns)
                # inputs: release this device's copies whose last consumer this was
                for k in range(in_ptr[i], in_ptr[i + 1]):
                    t = in_tensor[k]
                    r = t * D + d
                    ref[r] -= 1
                    if ref[r] == 0:
                        mem[d] -= t_alloc[t] if dev[t_op[t]] == d else t_bytes[t]
            else:  # transfer of tensor t arrived on device j
                xk = -1 - eid
                t = x_tensor[xk]
                j = x_dst[xk]
                nxt = x_next[xk]
                if nxt >= 0:
                    push(EV, x_end[nxt], -1 - nxt)
                else:
                    link_tail[x_src[xk], j] = -1
                b = t_bytes[t]
                mem[j] += b
                if mem[j] > peak[j]:
                    peak[j] = mem[j]
                for k in range(t_cons_ptr[t], t_cons_ptr[t + 1]):
                    cns = t_cons[k]
                    if dev[cns] == j:
                        pending[cns] -= 1
                        if pending[cns] == 0:
                            push(j, prio[cns] if order_mode == 1 else now, cns)
                p = dev[t_op[t]]
                r = t * D + p
                ref[r] -= 1
                if ref[r] == 0:
                    mem[p] -= t_alloc[t]
    for g in range(gslow.shape[0]):
        makespan += overlap[g] * gslow[g]
    return makespan, nx, xbytes


# =================================================================================================================
# Python side
# =================================================================================================================
@dataclass
class TraceEvents:
    """Raw timeline of one simulated step (seconds)."""

    op_start: np.ndarray            # [n]
    op_end: np.ndarray              # [n]
    placement: np.ndarray           # [n] device index
    x_tensor: np.ndarray            # [X] tensor id of each transfer
    x_src: np.ndarray               # [X] source device
    x_dst: np.ndarray               # [X] destination device
    x_start: np.ndarray             # [X]
    x_end: np.ndarray               # [X]


@dataclass
class SimResult:
    """One simulated step. step_time seconds (the makespan, also when OOM); busy[D] seconds of op work per
    device; peak_memory[D] bytes; oom / oom_devices (names); transfer_bytes across all links;
    transfers = number of transfers; trace when asked."""

    step_time: float
    busy: np.ndarray
    peak_memory: np.ndarray
    oom: bool
    oom_devices: list[str] = field(default_factory=list)
    transfer_bytes: int = 0
    transfers: int = 0
    trace: TraceEvents | None = None

    def to_outcome(self, cluster: Cluster) -> Outcome:
        if self.oom:
            caps = {d.name: d.capacity_bytes for d in cluster.devices}
            parts = [f"{nm} needs {int(self.peak_memory[cluster.device_names.index(nm)])} bytes > "
                     f"{caps[nm]} available" for nm in self.oom_devices]
            return Outcome(step_time=self.step_time, peak_memory=self.peak_memory, oom=True, failed=True,
                           reason="out of memory on " + "; ".join(parts))
        return Outcome(step_time=self.step_time, peak_memory=self.peak_memory)


@dataclass(frozen=True)
class _GraphArrays:
    """Placement-independent CSR arrays of an OpGraph, built once per Simulator."""

    t_start: np.ndarray     # [n+1] tensors of op i are t_start[i]..t_start[i+1]
    t_op: np.ndarray        # [T]
    t_bytes: np.ndarray     # [T]
    t_alloc: np.ndarray     # [T] bytes allocated on the producer's device (0 when the output aliases a variable)
    t_cons_ptr: np.ndarray  # [T+1]
    t_cons: np.ndarray      # consumers of each tensor
    in_ptr: np.ndarray      # [n+1]
    in_tensor: np.ndarray   # tensors consumed by each op
    c_ptr: np.ndarray       # [n+1]
    c_succ: np.ndarray      # control successors
    indeg: np.ndarray       # [n] data + control in-edges
    persistent: np.ndarray  # [n]

    @staticmethod
    def of(g: OpGraph) -> "_GraphArrays":
        n = g.num_ops
        t_op = np.asarray(g.tensor_op, np.int64)
        T = len(t_op)
        if T and np.any(np.diff(t_op) < 0):
            raise PlacementError(f"graph {g.name!r}: tensors are not in op order")
        t_start = np.searchsorted(t_op, np.arange(n + 1)).astype(np.int64)
        et = np.asarray(g.edge_tensor, np.int64)
        ed = np.asarray(g.edge_dst, np.int64)
        o = np.lexsort((ed, et))
        t_cons_ptr = np.searchsorted(et[o], np.arange(T + 1)).astype(np.int64)
        t_cons = ed[o]
        o2 = np.lexsort((et, ed))
        in_ptr = np.searchsorted(ed[o2], np.arange(n + 1)).astype(np.int64)
        in_tensor = et[o2]
        cs = np.asarray(g.ctrl_src, np.int64)
        cd = np.asarray(g.ctrl_dst, np.int64)
        o3 = np.lexsort((cd, cs))
        c_ptr = np.searchsorted(cs[o3], np.arange(n + 1)).astype(np.int64)
        c_succ = cd[o3]
        indeg = (np.bincount(ed, minlength=n) + np.bincount(cd, minlength=n)).astype(np.int64)
        t_bytes = np.asarray(g.tensor_bytes, np.int64)
        return _GraphArrays(t_start, t_op, t_bytes, np.where(aliases_variable(g)[t_op], 0, t_bytes), t_cons_ptr,
                            t_cons, in_ptr, in_tensor, c_ptr, c_succ, indeg, np.asarray(g.persistent_bytes, np.int64))


def compute_group_arrays(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(int64[D] compute group of each device, -1 for none; float64[G] 1/speed - 1 of each group) from the
    cluster's "compute_groups": devices that share one physical core (SMT siblings; TF tasks on shared cores).
    While two or more devices of a group are busy, each runs at `shared_speed` of its own speed; the simulator
    charges this to first order: every interval in which two or more of a group are busy lasts 1/speed as long
    (the schedule itself is the unshared one)."""
    D = cluster.num_devices
    grp = np.full(D, -1, np.int64)
    slow = []
    for g, cg in enumerate(cluster.meta.get("compute_groups") or ()):
        for d in cg["devices"]:
            grp[int(d)] = g
        slow.append(1.0 / float(cg["shared_speed"]) - 1.0)
    return grp, np.asarray(slow, np.float64).reshape(-1)


def shared_link_arrays(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(D x D int64 index of the shared link each link i->j crosses, -1 for none; bytes/s of each shared link)
    from the cluster's per-link "shared" names (`meta["link_shared"]`) and "shared_links". A name that
    "shared_links" does not define gets the bandwidth of the fastest link naming it."""
    D = cluster.num_devices
    sh = np.full((D, D), -1, np.int64)
    names: dict[str, int] = {}
    bws: list[float] = []
    defined = cluster.meta.get("shared_links") or {}
    for key, nm in sorted((cluster.meta.get("link_shared") or {}).items()):
        i, j = (int(x) for x in key.split(","))
        if nm not in names:
            names[nm] = len(bws)
            bws.append(float(defined[nm]["bandwidth_Bps"]) if nm in defined else 0.0)
        k = names[nm]
        sh[i, j] = k
        if nm not in defined:
            bws[k] = max(bws[k], float(cluster.bandwidth[i, j]))
    return sh, np.asarray(bws, np.float64).reshape(-1)


def _cost_matrix(graph: OpGraph, cluster: Cluster, costs) -> tuple[np.ndarray, str]:
    if costs is None:
        from placer.sim.costs import load_or_analytical

        costs = load_or_analytical(graph, cluster)
    if hasattr(costs, "matrix"):
        return np.ascontiguousarray(costs.matrix(cluster), np.float64), str(getattr(costs, "source", "table"))
    m = np.asarray(costs, np.float64)
    n, D = graph.num_ops, cluster.num_devices
    if m.ndim == 1:
        m = np.repeat(m[:, None], D, axis=1)
    if m.shape != (n, D):
        raise PlacementError(f"cost matrix has shape {m.shape}, expected ({n}, {D}) for graph {graph.name!r} "
                             f"on cluster {cluster.name!r}")
    if np.any(np.isnan(m)) or np.any(m < 0):
        raise PlacementError("cost matrix has negative or NaN entries")
    return np.ascontiguousarray(m), "explicit"


class Simulator:
    """Simulates training steps of placements of `graph` on `cluster`.

    costs: a CostTable, a float array [n, D] (seconds of op i on device d; `inf` = cannot run there) or
    [n] (same on every device), or None (the analytical table, cached).
    Co-location groups are not enforced here (placements from a Grouping never split them); an op on a device
    where its cost is `inf` (a CPU-only op on a GPU) is a PlacementError naming the op.

    >>> from placer.graphs.opgraph import OpGraph
    >>> from placer.sim.cluster import parse_cluster
    >>> g = OpGraph.build([("a", "X", 8), ("b", "X", 8), ("c", "X", 8), ("d", "X", 8)],
    ...                   [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    >>> sim = Simulator(g, parse_cluster("2xK80"), np.ones(4))
    >>> round(sim.simulate(np.array([0, 0, 1, 0])).step_time, 6)  # b and c overlap; two 8-byte hops
    3.00003
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, costs=None, order: str = "ready"):
        if order not in ORDERS:
            raise PlacementError(f"unknown simulation order {order!r}; valid: {', '.join(ORDERS)}")
        self.graph = graph
        self.cluster = cluster
        self.order = order
        self.cost, self.cost_source = _cost_matrix(graph, cluster, costs)
        self.arrays = _GraphArrays.of(graph)
        self.bw = np.ascontiguousarray(cluster.bandwidth, np.float64)
        self.lat = np.ascontiguousarray(cluster.latency, np.float64)
        self.hold = np.ascontiguousarray(1.0 - link_pipelined(cluster), np.float64)
        self.cc = np.ascontiguousarray(link_cpu_copy(cluster), np.float64)
        self.grp, self.gslow = compute_group_arrays(cluster)
        self.sh, self.sh_bw = shared_link_arrays(cluster)
        self.conc = np.asarray([max(1, int(d.concurrency)) for d in cluster.devices], np.int64)
        self.capacity = np.asarray([d.capacity_bytes for d in cluster.devices], np.int64)
        self._allowed = np.isfinite(self.cost)
        self._rows = np.arange(graph.num_ops)
        self._scratch = threading.local()    # per-thread timeline buffers of _run
        self._lb: float | None = None

    # ---- validation ---------------------------------------------------------------------------------------
    def check(self, placement) -> np.ndarray:
        """The placement as a contiguous int64 array; PlacementError naming the op/device when invalid."""
        p = np.asarray(placement)
        n, D = self.graph.num_ops, self.cluster.num_devices
        if p.shape != (n,):
            raise PlacementError(f"placement has shape {p.shape}, expected ({n},) for graph {self.graph.name!r}")
        if p.dtype.kind not in "iu":
            raise PlacementError(f"placement must be integer device indices, got dtype {p.dtype}")
        p = np.ascontiguousarray(p, np.int64)
        bad = np.flatnonzero((p < 0) | (p >= D))
        if len(bad):
            i = int(bad[0])
            raise PlacementError(f"op {self.graph.names[i]!r} is placed on device index {int(p[i])}, but cluster "
                                 f"{self.cluster.name!r} has devices 0..{D - 1} ({', '.join(self.cluster.device_names)})")
        ok = self._allowed[self._rows, p]
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise PlacementError(f"op {self.graph.names[i]!r} ({self.graph.types[i]}) cannot run on "
                                 f"{self.cluster.device_names[int(p[i])]} (CPU-only or no cost for that device)")
        return p

    # ---- simulation ---------------------------------------------------------------------------------------
    def simulate(self, placement, trace: bool = False) -> SimResult:
        """Simulate one step of `placement` (op→device index array)."""
        p = self.check(placement)
        return self._run(p, trace)

    def _run(self, p: np.ndarray, trace: bool = False) -> SimResult:
        a = self.arrays
        n, D = self.graph.num_ops, self.cluster.num_devices
        T = len(a.t_op)
        xcap = max(1, min(T * D, len(self.graph.edge_src) + 1))
        # the timeline's arrays: fresh for a trace, else this thread's scratch (allocating ~1.5 MB a call at 20k
        # ops cost ~10% of a step)
        bufs = None if trace else getattr(self._scratch, "bufs", None)
        if bufs is None:
            bufs = (np.empty(n), np.empty(n), np.empty(xcap, np.int64), np.empty(xcap, np.int64),
                    np.empty(xcap, np.int64), np.empty(xcap), np.empty(xcap))
            if not trace:
                self._scratch.bufs = bufs
        op_start, op_end, x_tensor, x_src, x_dst, x_start, x_end = bufs
        busy = np.zeros(D)
        peak = np.zeros(D, np.int64)
        step, nx, xbytes = _simulate_kernel(
            p, self.cost, self.bw, self.lat, self.hold, self.cc, self.sh, self.sh_bw, self.grp, self.gslow, self.conc,
            self.capacity, ORDERS[self.order],
            a.t_start, a.t_op, a.t_bytes, a.t_alloc, a.t_cons_ptr, a.t_cons, a.in_ptr, a.in_tensor, a.c_ptr, a.c_succ,
            a.indeg, a.persistent,
            op_start, op_end, x_tensor, x_src, x_dst, x_start, x_end, busy, peak)
        oom_mask = peak > self.capacity
        tr = None
        if trace:
            tr = TraceEvents(op_start, op_end, p.copy(), x_tensor[:nx].copy(), x_src[:nx].copy(),
                             x_dst[:nx].copy(), x_start[:nx].copy(), x_end[:nx].copy())
        return SimResult(step_time=float(step), busy=busy, peak_memory=peak, oom=bool(oom_mask.any()),
                         oom_devices=[self.cluster.device_names[i] for i in np.flatnonzero(oom_mask)],
                         transfer_bytes=int(xbytes), transfers=int(nx), trace=tr)

    # ---- bounds -------------------------------------------------------------------------------------------
    def lower_bound(self) -> float:
        """A valid lower bound on the step time of ANY placement on this cluster. Reported:
        max(critical path, load bound, interval bound), where (all three ignore transfers, so they stay loose
        when communication matters)
        - critical path = the longest path when each op takes its fastest allowed device's time;
        - load bound = the smallest T for which the ops' work can be split (fractionally: ops may be cut) over
          the devices with no device holding more than concurrency x T, each share charged at that device's
          time (CPU-only ops only on CPUs). Exact for one accelerator kind plus CPUs (ops sorted by CPU/GPU
          time ratio, bisection on T); with several accelerator kinds it falls back to
          sum(fastest op time) / sum(concurrency), weaker but valid;
        - interval (energy) bound = max over thresholds a, b of a + b + load bound of the ops S that cannot
          start before a (head: longest predecessor path, fastest times) and need at least b after they finish
          (tail: longest successor path): all of S's work fits in [a, T - b]. Thresholds: quantiles of the
          heads and tails. It dominates the other two at a = b = 0 and on single chains."""
        if self._lb is None:
            self._lb = max(self.critical_path_bound(), self.load_bound(), self.interval_bound())
        return self._lb

    def _fastest(self) -> np.ndarray:
        fastest = np.where(self._allowed, self.cost, np.inf).min(axis=1)
        return np.ascontiguousarray(np.where(np.isfinite(fastest), fastest, 0.0))

    def critical_path_bound(self) -> float:
        a = self.arrays
        bl = _bottom_levels(self._fastest(), a.t_start, a.t_cons_ptr, a.t_cons, a.c_ptr, a.c_succ)
        return float(bl.max()) if len(bl) else 0.0

    def interval_bound(self, quantiles: int = 12) -> float:
        a = self.arrays
        w = self._fastest()
        if len(w) == 0:
            return 0.0
        head = _top_levels(w, a.t_start, a.t_cons_ptr, a.t_cons, a.c_ptr, a.c_succ)
        tail = _bottom_levels(w, a.t_start, a.t_cons_ptr, a.t_cons, a.c_ptr, a.c_succ) - w
        qs = np.linspace(0, 1, quantiles, endpoint=False)
        hs = np.unique(np.quantile(head, qs, method="lower"))
        ts = np.unique(np.quantile(tail, qs, method="lower"))
        full = self.load_bound()
        best = full
        for h in hs:
            for t in ts:
                if h + t + full <= best:   # the load of a subset never exceeds the full load
                    continue
                mask = (head >= h) & (tail >= t)
                if mask.any():
                    best = max(best, h + t + self.load_bound(mask))
        return float(best)

    def load_bound(self, mask: np.ndarray | None = None) -> float:
        cost = np.where(self._allowed, self.cost, np.inf)
        if mask is not None:
            cost = cost[mask]
        n = cost.shape[0]
        if n == 0:
            return 0.0
        devs = self.cluster.devices
        # devices grouped into classes of identical cost columns
        classes: dict[bytes, list[int]] = {}
        for d in range(len(devs)):
            classes.setdefault(np.ascontiguousarray(cost[:, d]).tobytes(), []).append(d)
        cls = list(classes.values())
        slots = [float(sum(self.conc[d] for d in c)) for c in cls]
        cols = [cost[:, c[0]] for c in cls]
        if len(cls) == 1:
            return float(cols[0].sum() / slots[0])
        if len(cls) == 2:
            return _two_class_load_bound(cols[0], slots[0], cols[1], slots[1])
        fastest = cost.min(axis=1)
        return float(fastest[np.isfinite(fastest)].sum() / float(self.conc.sum()))


def _two_class_load_bound(a: np.ndarray, sa: float, b: np.ndarray, sb: float) -> float:
    """min T such that ops can be fractionally split between class A (capacity sa*T, op time a) and class B
    (capacity sb*T, op time b). Exchange argument: the optimal split moves ops to B in increasing b/a order."""
    a = np.asarray(a, float)
    b = np.asarray(b, float)
    only_a = ~np.isfinite(b)
    only_b = ~np.isfinite(a)
    base_a = float(a[only_a].sum())
    base_b = float(b[only_b].sum())
    free = ~(only_a | only_b)
    fa, fb = a[free], b[free]
    ratio = np.where(fa > 0, fb / np.maximum(fa, 1e-300), np.inf)
    ratio = np.where((fa == 0) & (fb == 0), 0.0, ratio)
    o = np.argsort(ratio, kind="stable")
    fa, fb = fa[o], fb[o]
    cum_a_rest = np.concatenate([[fa.sum()], fa.sum() - np.cumsum(fa)])  # A work when the first k go to B
    cum_b = np.concatenate([[0.0], np.cumsum(fb)])

    def feasible(T: float) -> bool:
        cap_b = sb * T - base_b
        if cap_b < 0 or sa * T < base_a:
            return False
        # move ops to B greedily (fractional) while B has capacity
        k = int(np.searchsorted(cum_b, cap_b, side="right")) - 1
        k = min(k, len(fa))
        load_a = cum_a_rest[k]
        if k < len(fa) and fb[k] > 0:
            frac = (cap_b - cum_b[k]) / fb[k]
            load_a -= min(1.0, frac) * fa[k]
        return base_a + load_a <= sa * T * (1 + 1e-12)

    lo = 0.0
    hi = (base_a + fa.sum()) / sa + base_b / sb + 1e-12
    if not feasible(hi):
        hi = max(hi, (base_b + fb.sum()) / sb + base_a / sa)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(hi, 1e-30):
            break
    return float(hi)


# =================================================================================================================
# batch evaluation
# =================================================================================================================
class SimEvaluator(Evaluator):
    """The simulated reward: Evaluator over a Simulator. Batches run on `workers` threads (the compiled kernel
    releases the GIL, so two threads use both cores). OOM and invalid placements come back as failed Outcomes
    whose reason names the device / op.

    >>> from placer.sim.cluster import parse_cluster
    >>> from placer.graphs.opgraph import OpGraph
    >>> g = OpGraph.build([("a", "X", 8), ("b", "X", 8)], [("a", "b")])
    >>> with SimEvaluator(g, parse_cluster("2xK80"), np.ones(2)) as ev:
    ...     [o.step_time for o in ev.evaluate([np.array([0, 0])])]
    [2.0]
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, costs=None, order: str = "ready", workers: int = 2):
        self.sim = Simulator(graph, cluster, costs, order=order)
        self.cluster = cluster
        self.devices = cluster.device_names
        self.workers = max(1, int(workers))
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _one(self, placement) -> Outcome:
        try:
            p = self.sim.check(placement)
        except PlacementError as e:
            return Outcome.failure(str(e))
        r = self.sim._run(p)
        return r.to_outcome(self.cluster)

    def evaluate(self, placements: Sequence[np.ndarray]) -> list[Outcome]:
        pls = list(placements)
        if self.workers == 1 or len(pls) < 2:
            return [self._one(p) for p in pls]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="placer-sim")
        return list(self._pool.map(self._one, pls))

    def lower_bound(self) -> float:
        return self.sim.lower_bound()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
