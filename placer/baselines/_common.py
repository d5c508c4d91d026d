"""Shared plumbing for the baselines: the per-op cost matrix, memory model, link model and a validity check.

Every baseline works on the same `Problem` (plain arrays built once from an OpGraph, a Cluster and a cost
matrix), so all of them see the same op costs, the same memory estimate and the same transfer times:

- cost[i, d]   seconds of op i on device d (`inf` where op i cannot run on d), from helper B's
               `placer.sim.costs.analytical_costs(graph, cluster).matrix(cluster)` when available, else a
               roofline stand-in (`flops / peak_flops + out_bytes / mem_bandwidth`; see `stand_in_costs`).
- mem[i]       bytes op i holds on its device during a training step: persistent bytes (variables, optimizer
               slots) + its outputs that the backward pass reads (see `op_memory`), scaled so the one-device
               total matches the simulator's peak (`calibrated`). A co-location group needs the sum over its ops.
- capacity[d]  `Device.capacity_bytes` = memory - reserve, minus the largest short-lived tensor.
- comm(a, b, bytes) = latency[a, b] + bytes / bandwidth[a, b]  (0 on the same device).

Rules every baseline follows: ops sharing `graph.colocation` share a device; `graph.cpu_only` ops (and ops
whose cost is `inf` on every GPU) go to `cluster.cpu_index`; all other ops go to the N GPUs
(`cluster.gpu_indices`, "N devices" in CLI.md).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from placer.errors import CostTableError, PlacementError, fmt_bytes
from placer.graphs.opgraph import OpGraph, aliases_variable
from placer.sim.cluster import Cluster


def stand_in_costs(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Roofline stand-in cost matrix float64[n, D]: flops / peak_flops + out_bytes / mem_bandwidth (+1 µs launch).

    `inf` for CPU-only ops on non-CPU devices. Used only when the simulator's cost model is unavailable.

    >>> from placer.sim.cluster import Cluster, Device
    >>> g = OpGraph.build([("a", "MatMul", 4, 0, 2e12)])
    >>> c = Cluster((Device("/GPU:0", "X", 2**30, peak_flops=1e12),), np.ones((1, 1)), np.zeros((1, 1)))
    >>> round(float(stand_in_costs(g, c)[0, 0]), 3)
    2.0
    """
    n, D = graph.num_ops, cluster.num_devices
    out = np.empty((n, D), np.float64)
    for d, dev in enumerate(cluster.devices):
        out[:, d] = 1e-6 + graph.flops / float(dev.peak_flops) + graph.out_bytes / float(dev.mem_bandwidth)
        if not dev.is_cpu:
            out[graph.cpu_only, d] = np.inf
    return out


def cost_matrix(graph: OpGraph, cluster: Cluster, costs=None) -> np.ndarray:
    """The per-op seconds per device matrix float64[n, D].

    `costs` may be None (helper B's analytical estimate, falling back to `stand_in_costs` when the simulator
    package is not importable), an array, or anything with `.matrix(cluster)` (a CostTable).
    """
    if costs is None:
        try:
            from placer.sim.costs import analytical_costs  # helper B's module
        except ImportError:
            return stand_in_costs(graph, cluster)
        costs = analytical_costs(graph, cluster)
    if hasattr(costs, "matrix"):
        costs = costs.matrix(cluster)
    m = np.asarray(costs, dtype=np.float64)
    if m.shape != (graph.num_ops, cluster.num_devices):
        raise CostTableError(f"cost matrix has shape {m.shape}, expected ({graph.num_ops}, {cluster.num_devices}) "
                             f"for graph {graph.name!r} on cluster {cluster.name!r}")
    return m


_BACKWARD = re.compile(r"^(gradients(_\d+)?|gradient_tape)/")  # TF1 tf.gradients / Keras GradientTape
_GRAD_TAIL = re.compile(r"_grad(_\d+)?$")
_UPDATE = re.compile(r"(^|/)update_(.+?)(/[^/]*Apply[^/]*|/[^/]*Resource[^/]*|/[^/]*$)")


def forward_name(name: str) -> str:
    """The forward op (or variable) an op belongs to: gradient ops (`gradients[_k]/<forward>_grad/...`, Keras
    `gradient_tape/<forward scope>/...`) and optimizer updates (`<Optimizer>/update_<variable>/...`) map to
    their forward op / variable (scope).

    >>> forward_name("gradients/encoder/layer_1/lstm/MatMul_grad/MatMul_1")
    'encoder/layer_1/lstm/MatMul'
    >>> forward_name("Adam/update_decoder/layer_0/kernel/ApplyAdam")
    'decoder/layer_0/kernel'
    >>> forward_name("softmax/MatMul")
    'softmax/MatMul'
    """
    if _BACKWARD.match(name):
        parts = _BACKWARD.sub("", name).split("/")
        for k in range(len(parts) - 1, -1, -1):
            if _GRAD_TAIL.search(parts[k]):
                return "/".join(parts[:k] + [_GRAD_TAIL.sub("", parts[k])])
        return "/".join(parts)
    m = _UPDATE.search(name)
    if m:
        return m.group(2)
    return name


def gradient_groups(graph: OpGraph, group: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Co-location groups with every backward op merged into its forward op's group (when the forward op
    exists and both can share a device): Baechi's forward-operator placement, where backward ops follow
    their forward ops, so saved activations never cross devices. Returns new group ids (0..G'-1)."""
    G = int(group.max()) + 1 if len(group) else 0
    parent = np.arange(G)
    g_allowed = np.ones((G, allowed.shape[1]), bool)
    np.logical_and.at(g_allowed, group, allowed)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    index = graph._name_index
    for i, nm in enumerate(graph.names):
        if not _BACKWARD.match(nm):
            continue
        fwd = forward_name(nm)
        j = index.get(fwd)
        while j is None and "/" in fwd:  # GradientTape names the scope, not the op: take the nearest op
            fwd = fwd.rsplit("/", 1)[0]
            j = index.get(fwd)
        if j is None:
            continue
        a, b = find(int(group[i])), find(int(group[j]))
        if a != b and (g_allowed[a] & g_allowed[b]).any():
            parent[a] = b
            g_allowed[b] &= g_allowed[a]
    roots = np.array([find(int(x)) for x in range(G)], np.int64)
    _, new = np.unique(roots[group], return_inverse=True)
    return new.astype(np.int64)


@dataclass
class MemoryModel:
    """Per-op resident bytes and the long-lived tensors each op reads (see `op_memory`).

    A long-lived tensor read on another device is copied there when its producer finishes and the copy
    lives until its consumer runs (the simulator's semantics), so placements that split a producer from its
    late consumers pay the bytes twice: `kin_ptr/kin_tensor` (CSR over consumer ops) list those tensors.
    """

    mem: np.ndarray         # int64[n]
    headroom: int           # bytes every device keeps free for short-lived tensors
    kin_ptr: np.ndarray     # int64[n+1]
    kin_tensor: np.ndarray  # int64[K]


def op_memory(graph: OpGraph) -> MemoryModel:
    """The memory model every memory-aware baseline shares.

    Training graphs (ops under `gradients/`, TF's convention): a tensor is *long-lived* when the backward
    pass reads it (an activation kept from the forward pass until its gradient runs) or when its producer
    only reads sources (variable reads, constants: they run at the start of the step, so their outputs wait
    for their consumers from then on). An op holds its persistent bytes (variables, optimizer slots) + its
    long-lived outputs, and every other device that consumes one of them holds a copy (received when the
    producer finishes, freed when its consumer runs). Addends of a gradient aggregation (AddN) are long-lived
    too (they wait for the last addend). A variable read (ReadVariableOp) is the variable's own buffer and
    adds nothing where it runs. Other tensors live only briefly; the largest of them is the headroom each
    device keeps free. `prepare` then scales the activation bytes to the simulator's one-device peak
    (`calibrated`). Graphs without backward ops fall back
    to Baechi's sum.
    """
    n = graph.num_ops
    pers = np.asarray(graph.persistent_bytes, np.int64)
    backward = np.fromiter((bool(_BACKWARD.match(nm)) for nm in graph.names), bool, n)
    if not backward.any():
        return MemoryModel(pers + np.asarray(graph.out_bytes, np.int64), 0, np.zeros(n + 1, np.int64),
                           np.zeros(0, np.int64))
    es, ed, et = (np.asarray(a, np.int64) for a in (graph.edge_src, graph.edge_dst, graph.edge_tensor))
    cs, cd = np.asarray(graph.ctrl_src, np.int64), np.asarray(graph.ctrl_dst, np.int64)
    source = (np.bincount(ed, minlength=n) + np.bincount(cd, minlength=n)) == 0
    non_source_in = np.bincount(ed[~source[es]], minlength=n) + np.bincount(cd[~source[cs]], minlength=n)
    early = source | (non_source_in == 0)
    t_op = np.asarray(graph.tensor_op, np.int64)
    kept = early[t_op].copy()
    kept[et[backward[ed] & ~backward[es]]] = True
    # addends of a gradient aggregation (AddN) wait for the last of them (per-step weight gradients of an
    # unrolled RNN: NMT's add up to more than its activations)
    addn = np.fromiter((t == "AddN" for t in graph.types), bool, n)
    kept[et[addn[ed] & backward[ed]]] = True
    tb = np.asarray(graph.tensor_bytes, np.int64)
    # a variable read is the variable's own buffer where it runs (as in the simulator); remote copies still count
    own = kept & ~aliases_variable(graph)[t_op]
    saved = np.bincount(t_op[own], weights=tb[own], minlength=n).astype(np.int64)
    headroom = int(tb[~kept].max()) if (~kept).any() else 0
    sel = kept[et]
    order = np.argsort(ed[sel], kind="stable")
    kin_ptr = np.searchsorted(ed[sel][order], np.arange(n + 1)).astype(np.int64)
    return MemoryModel(pers + saved, headroom, kin_ptr, et[sel][order])


_CALIBRATED: dict[tuple, MemoryModel] = {}   # calibrations done (few: one per graph x cluster x costs)


def calibrated(mm: MemoryModel, graph: OpGraph, cluster: Cluster, cost: np.ndarray,
               allowed: np.ndarray) -> MemoryModel:
    """`_calibrate`, done once per (graph, cluster, cost matrix, allowed devices): every baseline of a
    problem, and both tries of `with_gradient_fallback`, share one simulation."""
    key = (id(graph), graph.fingerprint, cluster.name, tuple(cluster.device_names),
           hashlib.sha1(np.ascontiguousarray(cost)).hexdigest(),
           hashlib.sha1(np.packbits(np.ascontiguousarray(allowed))).hexdigest(), allowed.shape)
    if key not in _CALIBRATED:
        if len(_CALIBRATED) >= 16:
            _CALIBRATED.pop(next(iter(_CALIBRATED)))
        _CALIBRATED[key] = _calibrate(mm, graph, cluster, cost, allowed)
    return _CALIBRATED[key]


def _calibrate(mm: MemoryModel, graph: OpGraph, cluster: Cluster, cost: np.ndarray,
               allowed: np.ndarray) -> MemoryModel:
    """Scale the model's activation bytes so that its one-device total equals the simulator's peak for the
    single-device placement (same cost matrix). An additive per-op model cannot see *when* tensors die: with
    every gradient addend and saved activation counted it overestimates NMT's one-GPU peak 2x (14.6 vs 7.4
    GiB); without the addends it underestimates it 2.8x. The simulator's one-device peak fixes the scale;
    persistent bytes, headroom and remote copies are kept as they are."""
    from placer.sim.simulator import Simulator

    n = graph.num_ops
    if n == 0 or not allowed.any():
        return mm
    first = int(np.flatnonzero(allowed.any(axis=0))[0]) if not len(cluster.gpu_indices) else int(cluster.gpu_indices[0])
    p = np.where(allowed[:, first], first, allowed.argmax(axis=1)).astype(np.int64)
    try:
        peak = float(Simulator(graph, cluster, cost).simulate(p).peak_memory[first])
    except PlacementError:
        return mm
    on = p == first
    pers = np.asarray(graph.persistent_bytes, np.float64)
    saved = mm.mem.astype(np.float64) - pers
    s = float(saved[on].sum())
    if s <= 0:
        return mm
    f = float(np.clip((peak - pers[on].sum() - mm.headroom) / s, 0.05, 10.0))
    return MemoryModel((pers + saved * f).astype(np.int64), mm.headroom, mm.kin_ptr, mm.kin_tensor)


@dataclass
class Problem:
    """Arrays every baseline shares (built by `prepare`)."""

    graph: OpGraph
    cluster: Cluster
    cost: np.ndarray          # float64[n, D] seconds
    allowed: np.ndarray       # bool[n, D]: where each op may go (class rule + finite cost), before memory
    gpus: np.ndarray          # int[N] accelerator indices
    cpu: int | None           # host CPU index
    group: np.ndarray         # int[n] co-location group id (0..G-1)
    num_groups: int
    group_mem: np.ndarray     # int64[G] bytes per co-location group
    group_allowed: np.ndarray  # bool[G, D] intersection of its ops' allowed devices
    group_first: np.ndarray   # int[G] first op (topological index) of each group
    mem: np.ndarray           # int64[n] per-op bytes
    capacity: np.ndarray      # int64[D] memory - reserve - headroom
    kin_ptr: np.ndarray       # int64[n+1] long-lived tensors each op reads (copied when remote)
    kin_tensor: np.ndarray
    t_op: np.ndarray          # int64[T] producer of each tensor
    t_bytes: np.ndarray       # int64[T]
    # predecessors in CSR form (data + control, merged per (pred, op) pair; bytes summed)
    pred_ptr: np.ndarray
    pred_idx: np.ndarray
    pred_bytes: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    succ_bytes: np.ndarray
    inv_bw: np.ndarray        # float64[D, D] 1/bandwidth (0 on the diagonal)
    lat: np.ndarray           # float64[D, D] latency (0 on the diagonal)

    @property
    def n(self) -> int:
        return self.graph.num_ops

    @property
    def D(self) -> int:
        return self.cluster.num_devices

    def comm(self, a: int, b: int, nbytes: float) -> float:
        """Seconds to move `nbytes` from device a to device b (0 when a == b)."""
        return 0.0 if a == b else float(self.lat[a, b] + nbytes * self.inv_bw[a, b])

    def comm_row(self, a: int, nbytes: float) -> np.ndarray:
        """Seconds to move `nbytes` from device a to every device (float64[D])."""
        return self.lat[a] + nbytes * self.inv_bw[a]

    def mean_gpu_cost(self) -> np.ndarray:
        """Per-op mean cost over the devices each op may use (HEFT's w̄)."""
        c = np.where(self.allowed, self.cost, np.nan)
        with np.errstate(invalid="ignore"):
            m = np.nanmean(c, axis=1)
        return np.nan_to_num(m, nan=0.0, posinf=0.0)

    def mean_gpu_link(self) -> tuple[float, float]:
        """(mean latency, mean seconds per byte) over distinct GPU pairs (the list schedulers' c̄)."""
        g = self.gpus
        if len(g) < 2:
            return 0.0, 0.0
        mask = ~np.eye(len(g), dtype=bool)
        return float(self.lat[np.ix_(g, g)][mask].mean()), float(self.inv_bw[np.ix_(g, g)][mask].mean())


def prepare(graph: OpGraph, cluster: Cluster, costs=None, *, colocate_gradients: bool = False) -> Problem:
    """Build the shared arrays. Raises PlacementError when an op has no device it can run on.

    colocate_gradients: merge each backward op into its forward op's co-location group (`gradient_groups`)."""
    n, D = graph.num_ops, cluster.num_devices
    cost = cost_matrix(graph, cluster, costs)
    gpus = np.asarray(cluster.gpu_indices, np.int64)
    cpu = cluster.cpu_index
    allowed = np.zeros((n, D), bool)
    allowed[:, gpus] = True
    finite = np.isfinite(cost)
    allowed &= finite
    cpu_only = np.asarray(graph.cpu_only, bool).copy()
    if cpu is not None:
        # ops that cannot run on any GPU behave as CPU-only
        cpu_only |= ~allowed.any(axis=1)
        allowed[cpu_only] = False
        allowed[cpu_only, cpu] = True
    _, group = np.unique(np.asarray(graph.colocation), return_inverse=True)
    group = group.astype(np.int64)
    if colocate_gradients:
        group = gradient_groups(graph, group, allowed)
    G = int(group.max()) + 1 if n else 0
    # a group with a CPU-only member is CPU-only as a whole; otherwise intersect the members' devices
    if cpu is not None and cpu_only.any():
        g_cpu = np.zeros(G, bool)
        g_cpu[group[cpu_only]] = True
        rows = g_cpu[group]
        allowed[rows] = False
        allowed[rows, cpu] = True
    group_allowed = np.ones((G, D), bool)
    np.logical_and.at(group_allowed, group, allowed)
    bad = np.flatnonzero(~group_allowed.any(axis=1))
    if len(bad):
        op = int(np.flatnonzero(group == bad[0])[0])
        raise PlacementError(f"op {graph.names[op]!r} (co-location group of {int((group == bad[0]).sum())} ops) "
                             f"has no device in cluster {cluster.name!r} on which all its ops can run")
    allowed = group_allowed[group]
    mm = calibrated(op_memory(graph), graph, cluster, cost, allowed)
    mem = mm.mem
    group_mem = np.bincount(group, weights=mem, minlength=G).astype(np.int64)
    group_first = np.full(G, n, np.int64)
    np.minimum.at(group_first, group, np.arange(n))

    # predecessor / successor CSR over data + control edges, merged per pair
    src = np.concatenate([graph.edge_src, graph.ctrl_src]).astype(np.int64)
    dst = np.concatenate([graph.edge_dst, graph.ctrl_dst]).astype(np.int64)
    byt = np.concatenate([graph.tensor_bytes[graph.edge_tensor].astype(np.float64),
                          np.zeros(len(graph.ctrl_src))])
    if len(src):
        key = src * max(n, 1) + dst
        uk, inv = np.unique(key, return_inverse=True)
        b = np.bincount(inv, weights=byt, minlength=len(uk))
        src, dst, byt = uk // max(n, 1), uk % max(n, 1), b
    order = np.lexsort((src, dst))
    pred_ptr = np.searchsorted(dst[order], np.arange(n + 1))
    order_s = np.lexsort((dst, src))
    succ_ptr = np.searchsorted(src[order_s], np.arange(n + 1))
    bw = np.asarray(cluster.bandwidth, np.float64)
    with np.errstate(divide="ignore"):
        inv_bw = np.where(bw > 0, 1.0 / np.where(bw > 0, bw, 1.0), np.inf)
    np.fill_diagonal(inv_bw, 0.0)
    lat = np.asarray(cluster.latency, np.float64).copy()
    np.fill_diagonal(lat, 0.0)
    capacity = np.asarray([d.capacity_bytes for d in cluster.devices], np.int64) - mm.headroom
    return Problem(graph=graph, cluster=cluster, cost=cost, allowed=allowed, gpus=gpus, cpu=cpu, group=group,
                   num_groups=G, group_mem=group_mem, group_allowed=group_allowed, group_first=group_first,
                   mem=mem, capacity=capacity, kin_ptr=mm.kin_ptr, kin_tensor=mm.kin_tensor,
                   t_op=np.asarray(graph.tensor_op, np.int64), t_bytes=np.asarray(graph.tensor_bytes, np.int64),
                   pred_ptr=pred_ptr, pred_idx=src[order], pred_bytes=byt[order],
                   succ_ptr=succ_ptr, succ_idx=dst[order_s], succ_bytes=byt[order_s],
                   inv_bw=inv_bw, lat=lat)


def group_fixed_device(p: Problem) -> np.ndarray:
    """int[G]: the device a group is forced onto (the CPU for CPU-only groups), -1 when free among GPUs."""
    fixed = np.full(p.num_groups, -1, np.int64)
    if p.cpu is not None:
        only_cpu = p.group_allowed[:, p.cpu] & (p.group_allowed.sum(axis=1) == 1)
        fixed[only_cpu] = p.cpu
    return fixed


def memory_error(p: Problem, g: int, used: np.ndarray, devices, what: str, need=None) -> PlacementError:
    """A PlacementError naming the group's first op, the bytes it needs (an int, or per device int64[D];
    default: the group's resident bytes) and the free memory of the device closest to fitting it."""
    devices = list(devices)
    need_d = np.broadcast_to(np.asarray(p.group_mem[g] if need is None else need, np.int64), (p.D,))
    free = p.capacity[devices] - used[devices] if devices else np.zeros(1, np.int64)
    best = int(np.argmax(free - need_d[devices])) if devices else 0
    op = int(p.group_first[g])
    dev_name = p.cluster.devices[devices[best]].name if devices else "(none)"
    nb = int(need_d[devices[best]]) if devices else int(need_d[0])
    return PlacementError(
        f"{what}: op {p.graph.names[op]!r} (co-location group of {int((p.group == g).sum())} ops) needs "
        f"{fmt_bytes(nb)} on {dev_name} but only {fmt_bytes(max(int(free[best]), 0))} is free there (the "
        f"closest fit); the model needs about {fmt_bytes(int(p.mem.sum()))} and the devices hold "
        f"{fmt_bytes(int(p.capacity[devices].sum()) if devices else 0)}")


def memory_use(p: Problem, placement: np.ndarray) -> np.ndarray:
    """Estimated bytes per device (int64[D]) of a complete placement: resident bytes of its ops + one copy
    of each kept tensor per other device whose backward ops read it."""
    a = np.asarray(placement, np.int64)
    use = np.bincount(a, weights=p.mem, minlength=p.D)
    if len(p.kin_tensor):
        cons = np.repeat(np.arange(p.n), np.diff(p.kin_ptr))
        t = p.kin_tensor
        dc, dp = a[cons], a[p.t_op[t]]
        remote = dc != dp
        pairs = np.unique(t[remote] * p.D + dc[remote])
        use += np.bincount(pairs % p.D, weights=p.t_bytes[pairs // p.D], minlength=p.D)
    return use.astype(np.int64)


def check_placement(p: Problem, placement: np.ndarray, *, check_memory: bool = False, what: str = "placement"
                    ) -> np.ndarray:
    """Validate an op→device array (range, allowed devices, co-location; memory when asked). Returns int64."""
    a = np.asarray(placement, dtype=np.int64)
    if a.shape != (p.n,):
        raise PlacementError(f"{what}: {a.shape} placement for a graph of {p.n} ops")
    if p.n and (a.min() < 0 or a.max() >= p.D):
        i = int(np.flatnonzero((a < 0) | (a >= p.D))[0])
        raise PlacementError(f"{what}: op {p.graph.names[i]!r} on device index {int(a[i])} "
                             f"(cluster has {p.D} devices)")
    bad = np.flatnonzero(~p.allowed[np.arange(p.n), a]) if p.n else []
    if len(bad):
        i = int(bad[0])
        raise PlacementError(f"{what}: op {p.graph.names[i]!r} cannot run on {p.cluster.devices[a[i]].name}")
    first = a[p.group_first[p.group]]
    split = np.flatnonzero(first != a)
    if len(split):
        i = int(split[0])
        raise PlacementError(f"{what}: op {p.graph.names[i]!r} is split from its co-location group")
    if check_memory:
        use = memory_use(p, a)
        over = np.flatnonzero(use > p.capacity)
        if len(over):
            d = int(over[0])
            raise PlacementError(f"{what}: {p.cluster.devices[d].name} needs {fmt_bytes(use[d])} but holds "
                                 f"{fmt_bytes(p.capacity[d])}")
    return a


def expand_groups(p: Problem, group_device: np.ndarray) -> np.ndarray:
    """Op→device array from a group→device array."""
    return np.asarray(group_device, np.int64)[p.group]


# ---- contracted (co-location) graph, for the partitioners -------------------------------------------------
@dataclass
class Contracted:
    """Undirected graph over the free (GPU-placeable) co-location groups, in CSR form (both directions)."""

    groups: np.ndarray     # int[V] group id of each vertex
    xadj: np.ndarray       # int64[V+1]
    adjncy: np.ndarray     # int64[2M]
    eweight: np.ndarray    # float64[2M] bytes
    vweight: np.ndarray    # float64[V] mean GPU seconds


def contract(p: Problem) -> Contracted:
    """Contract co-location groups (vertex weight = compute seconds, edge weight = bytes), dropping CPU-only
    groups (they are fixed to the CPU). Self-loops vanish; parallel edges are summed."""
    fixed = group_fixed_device(p)
    free = np.flatnonzero(fixed < 0)
    vid = np.full(p.num_groups, -1, np.int64)
    vid[free] = np.arange(len(free))
    w = p.mean_gpu_cost()
    vweight = np.bincount(p.group, weights=w, minlength=p.num_groups)[free]
    cnt = np.diff(p.succ_ptr)
    src_op = np.repeat(np.arange(p.n), cnt)
    a, b = vid[p.group[src_op]], vid[p.group[p.succ_idx]]
    keep = (a >= 0) & (b >= 0) & (a != b)
    a, b, wt = a[keep], b[keep], p.succ_bytes[keep]
    u, v = np.concatenate([a, b]), np.concatenate([b, a])
    wt = np.concatenate([wt, wt])
    V = len(free)
    if len(u):
        key = u * V + v
        uk, inv = np.unique(key, return_inverse=True)
        ew = np.bincount(inv, weights=wt, minlength=len(uk))
        u, v = uk // V, uk % V
    else:
        ew = np.zeros(0)
    xadj = np.searchsorted(u, np.arange(V + 1)).astype(np.int64)
    return Contracted(groups=free, xadj=xadj, adjncy=v.astype(np.int64), eweight=ew, vweight=vweight)


def to_int_weights(x: np.ndarray, total: float = 2**28) -> np.ndarray:
    """Scale non-negative floats to positive ints whose sum stays below `total` (METIS/Scotch weights)."""
    x = np.asarray(x, np.float64)
    s = float(x.sum())
    if s <= 0:
        return np.ones(len(x), np.int64)
    return np.maximum(1, np.round(x * (total / s))).astype(np.int64)


def rebalance_memory(prob: Problem, group_device: np.ndarray, what: str) -> np.ndarray:
    """Move free groups off GPUs whose estimated memory (`memory_use`) exceeds capacity onto the GPU with the
    most free memory, largest groups first. Raises PlacementError (memory needed vs available) when the
    model still does not fit."""
    gd = np.asarray(group_device, np.int64).copy()
    fixed = group_fixed_device(prob)
    gpus = np.asarray(prob.gpus)
    used = memory_use(prob, gd[prob.group])
    for d in gpus:
        if used[d] <= prob.capacity[d]:
            continue
        movable = np.flatnonzero((gd == d) & (fixed < 0))
        for g in movable[np.argsort(-prob.group_mem[movable], kind="stable")]:
            if used[d] <= prob.capacity[d]:
                break
            free = np.where(prob.group_allowed[g, gpus] & (gpus != d), prob.capacity[gpus] - used[gpus], -1)
            if free.max() < prob.group_mem[g]:
                continue
            e = int(gpus[int(np.argmax(free))])
            gd[g] = e
            after = memory_use(prob, gd[prob.group])
            if after[e] > prob.capacity[e]:
                gd[g] = d  # the copies it drags along do not fit there either
                continue
            used = after
        if used[d] > prob.capacity[d]:
            need, have = int(prob.mem.sum()), int(prob.capacity[gpus].sum())
            raise PlacementError(f"{what}: cannot fit the model in GPU memory: {prob.cluster.devices[d].name} "
                                 f"still needs {fmt_bytes(used[d])} of {fmt_bytes(prob.capacity[d])} after "
                                 f"re-balancing (model {fmt_bytes(need)}, GPUs hold {fmt_bytes(have)})")
    return gd


def with_gradient_fallback(run, colocate_gradients: bool | None) -> np.ndarray:
    """Run a list scheduler `run(colocate_gradients) -> placement`. None (the default): op-level first and,
    if that runs out of memory, again with backward ops co-located with their forward ops (fewer copies of
    saved activations); the first error is raised when both fail.

    Forward-operator placement (Baechi's option): with `colocate_gradients=True` every backward op
    (`gradients/<forward op>_grad/...`) joins its forward op's co-location group, so only forward ops are
    scheduled freely and saved activations never cross devices. Default (None): op-level scheduling, retried
    with forward-operator placement only when it runs out of memory (on the built-in LSTM models the merged
    groups, chained through TF's own co-location of gradient sums, grow to hundreds of ops and op-level
    schedules were usually faster).
    """
    if colocate_gradients is not None:
        return run(bool(colocate_gradients))
    try:
        return run(False)
    except PlacementError as first:
        try:
            return run(True)
        except PlacementError:
            raise first from None


def partition_placement(p: Problem, partition, what: str) -> np.ndarray:
    """Op→device array from a k-way partitioner over the contracted graph (metis, scotch).

    `partition(cg: Contracted, k: int) -> int[V]` splits the free groups into k = N parts; part i goes to the
    i-th GPU; CPU-only groups stay on the CPU; memory is then re-balanced (`rebalance_memory`)."""
    gd = group_fixed_device(p)
    cg = contract(p)
    N, V = len(p.gpus), len(cg.groups)
    if V:
        if N == 1:
            parts = np.zeros(V, np.int64)
        elif V <= N:
            parts = np.arange(V) % N
        else:
            parts = np.asarray(partition(cg, N), np.int64)
        gd[cg.groups] = np.asarray(p.gpus)[parts]
        bad = ~p.group_allowed[np.arange(p.num_groups), gd]
        gd[bad] = np.argmax(p.group_allowed[bad], axis=1)
    gd = rebalance_memory(p, gd, what)
    return gd[p.group]
