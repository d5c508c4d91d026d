"""Grouping: turn an OpGraph's ops into at most G groups the policy places (Mirhoseini et al. 2017, §3;
the hierarchical placer's default G = min(256, 20 × #devices)).

Steps, in order; no step ever splits a co-location group:
  1. co-location groups are the atomic units (a variable and every op reading/updating it, `_class` attrs);
  2. merge single-consumer chains: an op whose outputs all go to one consumer joins that consumer's unit
     (the paper's "an op and its only consumer are placed together"), while the merged cost stays ≤ a cap;
  3. fold tiny units (negligible compute and no persistent memory) into the neighbour they exchange the
     most bytes with;
  4. cluster along the *forward* order within name scopes: every op gets an anchor (a gradient op
     `gradients/<op>_grad/...` or `gradient_tape/<op>/...` is anchored at its forward op `<op>`, an optimizer
     update `Adam/update_<var>/...` at `<var>`, an op with no scope of its own, such as a gradient sum
     `AddN_8`, at its heaviest input's anchor, an update of a flat optimizer such as Keras 3's `adam/Mul_239`
     at its gradient's anchor, a variable with no layer scope at its first reader's, any other op at itself)
     and a scope: the anchor's name scope cut along the scope tree, each op at its deepest significant scope
     while the scopes number under G (`encoder/layer_0/attention`, `encoder/layer_0` for the layer's small
     sub-scopes, `softmax`...);
     each significant scope gets a share of the G groups in proportion to its compute (≥ 1), and its units,
     sorted by their anchors' topological position, are cut into that many contiguous runs of balanced
     compute. So a layer's forward and backward ops share groups (no activation crosses devices just
     because its gradient was grouped elsewhere), no group straddles two layers, and the hand-made rule
     "layer i on GPU f(i)" stays expressible at the group level. A scope is significant when it costs at
     least a quarter of a mean group; ops under no significant scope (hubs such as the learning rate or the
     step counter) share a "misc" budget.
CPU-only units (ops with no GPU kernel, whole co-location group) are never merged with GPU-capable ones: their
groups are `cpu_only` and the policy may only put them on the CPU.

Example:
    >>> from placer.graphs.opgraph import OpGraph
    >>> g = OpGraph.build([("a", "Const", 4), ("b", "Neg", 4), ("c", "Neg", 4)], [("a", "b"), ("b", "c")])
    >>> gr = group(g, max_groups=2)
    >>> gr.num_groups <= 2, gr.op_group.shape
    (True, (3,))
"""
from __future__ import annotations

from dataclasses import dataclass

import re

import numpy as np

from placer.graphs.opgraph import OpGraph, UnionFind

# op-type histogram width: the graph's most frequent types, plus one "other" column
TOP_TYPES = 24
# a unit costing under this fraction of the mean group cost is "tiny" (step 3)
TINY_FRACTION = 0.02
# chain merging (step 2) stops once a unit would exceed this fraction of the mean group cost
CHAIN_CAP_FRACTION = 0.5
# a scope is significant (gets groups of its own) when it costs at least this fraction of the mean group cost
SCOPE_FRACTION = 0.25
# with `split_by`, groups are split exactly along the placement's devices unless that multiplies them beyond this.
# 5, not 2, since 2026-12-07: clip on DGX-A100 follows m_etf exactly in 752 groups (160 without the split), and
# the search from there matches m_etf where it stayed 14-16% slower on 160 (benchmarks/RESULTS.md "Transformers
# on 8-GPU nodes")
REFINE_FACTOR = 5
_GRAD_PREFIX = re.compile(r"^(?:gradients(?:_\d+)?|gradient_tape)/")
_UPDATE_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9]*/update_")


def anchors(graph: OpGraph) -> tuple[np.ndarray, list[list[str]]]:
    """Each op's forward anchor: (anchor op index int64[n], the anchor's name-scope components per op).

    `gradients/enc/MatMul_grad/MatMul_1` → `enc/MatMul`; `gradient_tape/model/dense/MatMul/MatMul_1` →
    `model/dense/MatMul` (longest name prefix that is an op); `Adam/update_enc/kernel/ResourceApplyAdam` →
    `enc/kernel`; anything else → itself. When no op matches, the stripped name still gives the scope.
    """
    index = {nm: i for i, nm in enumerate(graph.names)}
    anchor = np.arange(graph.num_ops, dtype=np.int64)
    scopes: list[list[str]] = []
    for i, nm in enumerate(graph.names):
        path = nm
        m = _GRAD_PREFIX.match(nm)
        if m:
            path = nm[m.end():]
            if "_grad/" in path:
                path = path[:path.index("_grad/")]
        else:
            m = _UPDATE_PREFIX.match(nm)
            if m:
                path = nm[m.end():]
        if path != nm:
            parts = path.split("/")
            for k in range(len(parts), 0, -1):
                j = index.get("/".join(parts[:k]))
                if j is not None:
                    anchor[i] = j
                    path = graph.names[j]
                    break
        scopes.append(path.split("/")[:-1])
    # an op with no scope of its own (a top-level `AddN_8` summing a layer's gradient contributions, TF1's
    # `gradients/AddN_3`) belongs where its heaviest input comes from: in topological order, it takes that
    # producer's anchor and scope, so a layer's gradient sums stay in the layer's groups
    src, dst = graph.edge_src, graph.edge_dst
    if len(src):
        ebytes = graph.tensor_bytes[graph.edge_tensor]
        order = np.lexsort((-ebytes, dst))             # each op's in-edges, heaviest first
        first = np.full(graph.num_ops, -1, np.int64)
        d_sorted = dst[order]
        starts = np.flatnonzero(np.r_[True, d_sorted[1:] != d_sorted[:-1]])
        first[d_sorted[starts]] = src[order[starts]]
        for i in range(graph.num_ops):
            j = int(first[i])
            if j >= 0 and not scopes[i] and anchor[i] == i:
                anchor[i], scopes[i] = anchor[j], scopes[j]
        _anchor_updates(graph, anchor, scopes, ebytes)
    return anchor, scopes


def _anchor_updates(graph: OpGraph, anchor: np.ndarray, scopes: list[list[str]], ebytes: np.ndarray) -> None:
    """Anchor a flat optimizer (Keras 3's `adam/Mul_239`, `scaled_adam/AssignSubVariableOp_73`: no per-variable
    scope to read) and the variables at the layers they belong to, in place:
      - an update op (downstream of a gradient op, upstream of none, not itself a gradient op) takes the anchor
        of its heaviest input that is a gradient or an already anchored update op, in topological order: so
        `m = b1*m + (1-b1)*g` follows its gradient `g`, not the scalar `b1`;
      - an op feeding only updates (a slot variable and its reads) takes its consumers' anchor when they all
        share one, in reverse order; a hub feeding every layer (the learning rate, the step counter) stays put;
      - a variable (persistent bytes, no inputs) that anchors at itself takes the anchor of its earliest
        reader, so `layer_2/kernel` joins `model/layer_2/MatMul` even when the two scopes are spelt apart.
    Not further: in a Keras 3 fp16 model most optimizer ops (the weight's own write reads its slot variables, not
    the gradient) stay unanchored and form groups of their own. Anchoring them too (every write at its variable's
    layer, the loss-unscaled gradient as an anchored input) was measured worse (benchmarks/grouped_start.py,
    simulated, annealing at 1,000 evaluations, mean of seeds 0-2, 2026-12-04): gpt@DGX1:fp16 0.3349 -> 0.3465 s
    (0.3724 s with the unscaled gradient too), clip@DGX1:fp16 0.2701 -> 0.2766 (0.3068): optimizer groups of
    their own likely let a search spread the update work over idle devices (not verified).
    """
    n = graph.num_ops
    src, dst = graph.edge_src, graph.edge_dst
    is_grad = np.fromiter((bool(_GRAD_PREFIX.match(nm)) for nm in graph.names), bool, n)
    if not is_grad.any():
        return
    # feeds[i]: i is an ancestor of a gradient op (forward ops, variables); below[i]: a descendant of one
    order_rev = np.argsort(-src, kind="stable")
    feeds = is_grad.copy()
    for s, d in zip(src[order_rev].tolist(), dst[order_rev].tolist()):
        if feeds[d]:
            feeds[s] = True
    order_fwd = np.argsort(src, kind="stable")
    below = is_grad.copy()
    for s, d in zip(src[order_fwd].tolist(), dst[order_fwd].tolist()):
        if below[s]:
            below[d] = True
    own = anchor == np.arange(n)
    update = below & ~feeds & ~is_grad & own
    # update ops, in topological order (by destination): heaviest gradient/update input
    best_w = np.full(n, -1.0)
    best_j = np.full(n, -1, np.int64)
    done = np.zeros(n, bool)
    by_dst = np.argsort(dst, kind="stable")
    k = 0
    E = len(dst)
    for i in np.flatnonzero(update).tolist():
        while k < E and dst[by_dst[k]] < i:
            k += 1
        e = k
        while e < E and dst[by_dst[e]] == i:
            j = int(src[by_dst[e]])
            if (is_grad[j] or done[j]) and ebytes[by_dst[e]] > best_w[i]:
                best_w[i], best_j[i] = ebytes[by_dst[e]], j
            e += 1
        j = int(best_j[i])
        if j >= 0:
            anchor[i], scopes[i] = anchor[j], scopes[j]
            done[i] = True
    # ops feeding only anchored updates, in reverse topological order: their consumers' one shared anchor
    feeder = ~feeds & ~below & own
    cons_anchor = np.full(n, -1, np.int64)   # -1 none yet, -2 several
    for s, d in zip(src[order_rev].tolist(), dst[order_rev].tolist()):
        if not feeder[s] or cons_anchor[s] == -2:
            continue
        a = int(anchor[d]) if done[d] else int(cons_anchor[d]) if feeder[d] and cons_anchor[d] >= 0 else -2
        cons_anchor[s] = a if cons_anchor[s] in (-1, a) else -2
    for i in np.flatnonzero(feeder & (cons_anchor >= 0)).tolist()[::-1]:
        a = int(cons_anchor[i])
        anchor[i], scopes[i] = anchor[a], scopes[a]
    # variables anchored at themselves: their earliest reader's anchor
    has_in = np.zeros(n, bool)
    has_in[dst] = True
    var = (graph.persistent_bytes > 0) & ~has_in & (anchor == np.arange(n))
    if var.any():
        first_reader = np.full(n, n, np.int64)
        np.minimum.at(first_reader, src, dst)
        for i in np.flatnonzero(var & (first_reader < n)).tolist():
            j = int(first_reader[i])
            anchor[i], scopes[i] = anchor[j], scopes[j]


def default_max_groups(num_devices: int) -> int:
    """The hierarchical placer's default: min(256, 20 × #devices) (devices = the accelerators)."""
    return int(min(256, 20 * max(1, num_devices)))


@dataclass(frozen=True, eq=False)
class Grouping:
    op_group: np.ndarray        # int32[n]: group of each op
    num_groups: int
    features: np.ndarray        # float32[G, F]: normalised per-group features (the policy's input)
    cpu_only: np.ndarray        # bool[G]: the group may only go on the CPU
    adjacency: np.ndarray       # float32[G, G]: log-bytes sent from group i to group j, normalised to [0, 1]
    op_cpu_only: np.ndarray     # bool[n]: per-op CPU-only flag (CPU-only ops always go on the CPU)
    group_cost: np.ndarray      # float64[G]: the compute estimate used for balancing (seconds or proxy)
    feature_names: tuple[str, ...] = ()

    def expand(self, group_devices: np.ndarray, cpu_index: int | None) -> np.ndarray:
        """Group→device array → op→device array (CPU-only ops forced onto `cpu_index`)."""
        group_devices = np.asarray(group_devices)
        op_dev = group_devices[..., self.op_group].astype(np.int32)
        if cpu_index is not None and self.op_cpu_only.any():
            op_dev[..., self.op_cpu_only] = cpu_index
        return op_dev

    def allowed_mask(self, num_devices: int, cpu_index: int | None) -> np.ndarray:
        """bool[G, D]: CPU-only groups may use only the CPU; others any device."""
        m = np.ones((self.num_groups, num_devices), dtype=bool)
        if cpu_index is not None:
            m[self.cpu_only] = False
            m[self.cpu_only, cpu_index] = True
        return m


def proxy_op_costs(graph: OpGraph) -> np.ndarray:
    """A hardware-neutral compute estimate when no cost table is given: FLOPs at 5 TFLOP/s, bytes written
    at 200 GB/s, plus a 5 µs launch overhead per op (roughly one K80-class GPU)."""
    return graph.flops / 5e12 + graph.out_bytes / 2e11 + 5e-6


def group(graph: OpGraph, max_groups: int = 80, op_costs: np.ndarray | None = None,
          split_by: np.ndarray | None = None) -> Grouping:
    """Group `graph`'s ops into at most `max_groups` groups (see module docstring). split_by: an op→device
    placement (e.g. the best baseline's) whose device boundaries the groups respect as they respect name scopes,
    so that placement stays expressible at the group level."""
    n = graph.num_ops
    if n == 0:
        from placer.errors import GraphImportError

        raise GraphImportError(f"graph {graph.name!r} has no ops to group")
    max_groups = max(1, int(max_groups))
    cost = np.asarray(proxy_op_costs(graph) if op_costs is None else op_costs, dtype=np.float64).copy()
    cost[~np.isfinite(cost)] = 0.0
    total = float(cost.sum()) or 1.0
    mean_group = total / max_groups
    cpu = graph.cpu_only.astype(bool)
    anchor, op_scope_parts = anchors(graph)
    scope_of = _choose_scopes(op_scope_parts, cost, max_groups, SCOPE_FRACTION * mean_group)
    if split_by is not None:
        split = np.asarray(split_by, np.int64)
        if split.shape != (n,):
            raise ValueError(f"split_by has shape {split.shape}, expected ({n},)")
        # a co-location group is never split: it follows the device of its first op
        _, first, inv = np.unique(np.asarray(graph.colocation), return_index=True, return_inverse=True)
        split = split[first[inv]]
        _, scope_of = np.unique(scope_of * (int(split.max()) + 1) + split, return_inverse=True)

    # 1. co-location units
    dsu = UnionFind(n)
    coloc = graph.colocation
    first = {}
    for i in range(n):
        c = int(coloc[i])
        if c in first:
            dsu.union(first[c], i)
        else:
            first[c] = i
    ucost = np.zeros(n)
    upersist = np.zeros(n)
    root0 = [dsu.find(i) for i in range(n)]
    np.add.at(ucost, root0, cost)
    np.add.at(upersist, root0, graph.persistent_bytes)
    # a unit's scope while it is homogeneous (-1 once mixed: a co-location group spanning scopes)
    uscope = np.full(n, -2, np.int64)
    for i, r in enumerate(root0):
        uscope[r] = scope_of[i] if uscope[r] in (-2, scope_of[i]) else -1

    def merge(a: int, b: int) -> None:
        ra, rb = dsu.find(a), dsu.find(b)
        if ra == rb:
            return
        r = dsu.union(ra, rb)
        o = rb if r == ra else ra
        ucost[r] += ucost[o]
        upersist[r] += upersist[o]

    def same_scope(a: int, b: int) -> bool:
        """Steps 2-3 merge only units of one (known) scope, so no unit straddles two layers."""
        sa, sb = uscope[dsu.find(a)], uscope[dsu.find(b)]
        return sa == sb and sa >= 0

    # 2. single-consumer chains
    src, dst = graph.edge_src, graph.edge_dst
    cons_count = np.zeros(n, np.int64)
    pair = np.unique(np.stack([src, dst]), axis=1) if len(src) else np.zeros((2, 0), np.int64)
    np.add.at(cons_count, pair[0], 1)
    only = {}
    for s, d in pair.T:
        only[int(s)] = int(d)
    cap = CHAIN_CAP_FRACTION * mean_group
    for s in range(n):  # topological order, so chains grow forward
        if cons_count[s] != 1:
            continue
        d = only[s]
        if cpu[s] != cpu[d] or not same_scope(s, d):
            continue
        rs, rd = dsu.find(s), dsu.find(d)
        if rs != rd and ucost[rs] + ucost[rd] <= cap:
            merge(rs, rd)

    # 3. fold tiny units into their heaviest-traffic neighbour
    ebytes = graph.tensor_bytes[graph.edge_tensor].astype(np.float64) if len(src) else np.zeros(0)
    roots = np.fromiter((dsu.find(i) for i in range(n)), np.int64, n)
    tiny_cut = TINY_FRACTION * mean_group
    tiny = {int(r) for r in np.unique(roots) if ucost[r] < tiny_cut and upersist[r] == 0}
    if tiny:
        best: dict[int, tuple[float, int]] = {}
        rs_, rd_ = roots[src], roots[dst]
        for a, b, w in zip(rs_.tolist(), rd_.tolist(), ebytes.tolist()):
            if a == b:
                continue
            for u, v in ((a, b), (b, a)):
                if (u in tiny and cpu[u] == cpu[v] and same_scope(u, v)
                        and (u not in best or w > best[u][0])):
                    best[u] = (w, v)
        for u in sorted(tiny):
            r = dsu.find(u)
            # a tiny unit that has meanwhile absorbed others into something substantial stays put: folding it
            # now would glue two substantial units together
            if u in best and ucost[r] < tiny_cut and upersist[r] == 0:
                merge(u, best[u][1])

    # 4. per scope, balanced contiguous runs along the anchors' (forward) topological order; CPU-only apart
    roots = np.fromiter((dsu.find(i) for i in range(n)), np.int64, n)
    uniq, unit_of = np.unique(roots, return_inverse=True)
    U = len(uniq)
    w = cost + 1e-12  # op weight (zero-cost ops still vote)
    pos = np.bincount(unit_of, weights=w * anchor, minlength=U) / np.bincount(unit_of, weights=w, minlength=U)
    u_cost = np.bincount(unit_of, weights=cost, minlength=U)
    u_cpu = np.zeros(U, bool)
    u_cpu[unit_of[cpu]] = True
    # a unit's scope: the scope holding most of its weight
    n_scopes = int(scope_of.max()) + 1
    sw = np.zeros((U, n_scopes))
    np.add.at(sw, (unit_of, scope_of), w)
    u_scope = sw.argmax(axis=1)
    n_cpu_units = int(u_cpu.sum())
    budget_cpu = min(n_cpu_units, max(1, max_groups // 16)) if n_cpu_units else 0
    if n_cpu_units == U:
        budget_cpu = min(U, max_groups)
    budget_gpu = max_groups - budget_cpu
    if budget_gpu < 1 and n_cpu_units < U:  # G too small to keep the classes apart: one mixed class
        u_cpu[:] = False                     # (expand() still forces CPU-only ops onto the CPU)
        budget_gpu, budget_cpu = max_groups, 0
    # buckets: (unit indices, budget); GPU-capable units by scope, CPU-only units in one bucket
    buckets: list[tuple[np.ndarray, int]] = []
    gpu_units = np.flatnonzero(~u_cpu)
    if len(gpu_units):
        scopes_here = np.unique(u_scope[gpu_units])
        members = [gpu_units[u_scope[gpu_units] == sc] for sc in scopes_here]
        shares = _apportion(np.array([u_cost[m].sum() for m in members]), max(1, budget_gpu))
        buckets += [(m, k) for m, k in zip(members, shares) if k > 0]
        # scopes apportioned no group (more scopes than groups) join their neighbour in forward order
        left = [m for m, k in zip(members, shares) if k == 0]
        if left:
            buckets = _merge_unbudgeted(buckets, left, pos)
    if n_cpu_units and budget_cpu:
        buckets.append((np.flatnonzero(u_cpu), budget_cpu))
    group_of_unit = np.empty(U, np.int64)
    next_id = 0
    for members, budget in buckets:
        members = members[np.argsort(pos[members], kind="stable")]
        labels = _balanced_runs(u_cost[members], max(1, budget))
        group_of_unit[members] = labels + next_id
        next_id += int(labels.max()) + 1
    # renumber groups by topological position so the policy reads them in order
    G = next_id
    gpos = np.bincount(group_of_unit[unit_of], weights=np.arange(n), minlength=G) / np.maximum(
        np.bincount(group_of_unit[unit_of], minlength=G), 1)
    order = np.argsort(gpos, kind="stable")
    rank = np.empty(G, np.int64)
    rank[order] = np.arange(G)
    op_group = rank[group_of_unit[unit_of]].astype(np.int32)
    if split_by is not None:
        op_group, G = _refine(op_group, split, max_groups)
    return _with_features(graph, op_group, G, cost)


def _refine(op_group: np.ndarray, split: np.ndarray, max_groups: int) -> tuple[np.ndarray, int]:
    """Split every group along `split`'s devices, so that placement is exactly expressible, unless that would
    make more than REFINE_FACTOR × max_groups groups (a placement scattering each group over many devices, as
    list schedulers do: the groups then only follow it scope by scope). Groups are renumbered in order."""
    key = op_group.astype(np.int64) * (int(split.max()) + 1) + split
    uniq, inv = np.unique(key, return_inverse=True)
    if len(uniq) > REFINE_FACTOR * max_groups:
        return op_group, int(op_group.max()) + 1
    n = len(op_group)
    pos = np.bincount(inv, weights=np.arange(n), minlength=len(uniq)) / np.bincount(inv, minlength=len(uniq))
    order = np.argsort(pos, kind="stable")
    rank = np.empty(len(uniq), np.int64)
    rank[order] = np.arange(len(uniq))
    return rank[inv].astype(np.int32), len(uniq)


def _choose_scopes(parts: list[list[str]], cost: np.ndarray, max_groups: int, significant: float) -> np.ndarray:
    """Scope id per op, a tree cut of the name scopes: going one level deeper at a time, an op takes its
    depth-d scope when that scope is significant (cost ≥ `significant`) and otherwise keeps the scope it had at
    depth d - 1, so a layer's small sub-scope (`layer_3/attn_out`) stays with its layer instead of joining the
    other layers' small sub-scopes; deeper only while the scopes number at most max_groups - 1 (one group is kept
    for the rest). Ops in no significant scope at any depth share id 0 ("misc"). Returns int64[n]."""
    n = len(parts)
    best = np.zeros(n, np.int64)
    prev = np.asarray([""] * n, dtype=object)
    max_depth = max((len(p) for p in parts), default=0)
    for d in range(1, max_depth + 1):
        keys = np.asarray(["/".join(p[:d]) if len(p) >= d else "" for p in parts], dtype=object)
        uniq, inv = np.unique(keys, return_inverse=True)
        sc_cost = np.bincount(inv, weights=cost, minlength=len(uniq))
        sig = (sc_cost >= significant) & (uniq != "")
        cand = np.where(sig[inv], keys, prev)
        cu, cinv = np.unique(cand, return_inverse=True)
        if int((cu != "").sum()) > max_groups - 1:
            break
        prev = cand
        ids = np.where(cu == "", 0, np.cumsum(cu != ""))
        best = ids[cinv]
    return best


def _apportion(costs: np.ndarray, k: int) -> np.ndarray:
    """Split k groups over buckets in proportion to cost, at least 1 each while k allows (largest remainder);
    the cheapest buckets get 0 when there are more buckets than groups."""
    m = len(costs)
    out = np.zeros(m, np.int64)
    order = np.argsort(-costs, kind="stable")
    first = order[:min(m, k)]
    out[first] = 1
    rest = k - len(first)
    if rest > 0 and costs.sum() > 0:
        ideal = costs / costs.sum() * k
        extra = np.maximum(ideal - out, 0)
        if extra.sum() > 0:
            add = np.floor(extra / extra.sum() * rest).astype(np.int64)
            out += add
            rem = rest - int(add.sum())
            frac = extra / extra.sum() * rest - add
            out[np.argsort(-frac, kind="stable")[:rem]] += 1
        else:
            out[order[0]] += rest
    return out


def _merge_unbudgeted(buckets, left, pos):
    """Give each unbudgeted scope's units to the budgeted bucket nearest in forward position."""
    centers = np.array([np.median(pos[m]) for m, _ in buckets])
    merged = [list(m) for m, _ in buckets]
    for m in left:
        j = int(np.argmin(np.abs(centers - np.median(pos[m]))))
        merged[j].extend(m.tolist())
    return [(np.asarray(mm, np.int64), k) for mm, (_, k) in zip(merged, buckets)]


def _balanced_runs(costs: np.ndarray, k: int) -> np.ndarray:
    """Cut a sequence into ≤ k contiguous runs, each as close to sum/k as a greedy cut allows: binary search
    on the threshold for the smallest threshold giving ≤ k runs (runs close when adding the next item would
    pass it)."""
    m = len(costs)
    if m <= k:
        return np.arange(m)

    def cut(th: float) -> tuple[int, np.ndarray]:
        lab = np.empty(m, np.int64)
        g, acc = 0, 0.0
        for i, c in enumerate(costs):
            if acc > 0 and acc + c > th:
                g += 1
                acc = 0.0
            acc += c
            lab[i] = g
        return g + 1, lab

    lo, hi = 0.0, float(costs.sum()) + 1e-12  # heavy units may exceed the threshold: they form runs alone
    best = cut(hi)[1]
    for _ in range(40):
        mid = (lo + hi) / 2
        cnt, lab = cut(mid)
        if cnt <= k:
            hi, best = mid, lab
        else:
            lo = mid
    # zero-cost tails can still leave a few extra runs at the exact threshold; cut(hi) is always ≤ k
    return best


def _with_features(graph: OpGraph, op_group: np.ndarray, G: int, cost: np.ndarray) -> Grouping:
    n = graph.num_ops
    types = np.asarray(graph.types, dtype=object)
    top = [t for t, _ in sorted(graph.op_type_counts().items(), key=lambda x: -x[1])[:TOP_TYPES]]
    col = {t: j for j, t in enumerate(top)}
    type_col = np.fromiter((col.get(t, len(top)) for t in types), np.int64, n)
    hist = np.zeros((G, len(top) + 1), np.float64)
    np.add.at(hist, (op_group, type_col), 1.0)
    counts = hist.sum(1, keepdims=True)
    frac = hist / np.maximum(counts, 1)

    def lognorm(x):
        x = np.log1p(np.asarray(x, np.float64))
        mx = x.max() if x.size else 0.0
        return x / mx if mx > 0 else x

    g_cost = np.bincount(op_group, weights=cost, minlength=G)
    out_b = np.bincount(op_group, weights=graph.out_bytes.astype(np.float64), minlength=G)
    pers = np.bincount(op_group, weights=graph.persistent_bytes.astype(np.float64), minlength=G)
    # a group is CPU-only when all its ops are (grouping never mixes them unless G is too small to separate)
    cpu_g = np.bincount(op_group, weights=graph.cpu_only.astype(np.float64), minlength=G) == np.bincount(
        op_group, minlength=G)
    # group-to-group bytes (cross-group data edges only)
    adj = np.zeros((G, G), np.float64)
    if len(graph.edge_src):
        gs, gd = op_group[graph.edge_src], op_group[graph.edge_dst]
        w = graph.tensor_bytes[graph.edge_tensor].astype(np.float64)
        keep = gs != gd
        np.add.at(adj, (gs[keep], gd[keep]), w[keep])
    adj_n = lognorm(adj)
    pos = np.arange(G) / max(1, G - 1)
    scalars = np.stack([lognorm(counts[:, 0]), lognorm(g_cost * 1e6), lognorm(out_b), lognorm(pers),
                        lognorm(adj.sum(1)), lognorm(adj.sum(0)), cpu_g.astype(np.float64), pos], axis=1)
    feats = np.concatenate([frac, scalars, adj_n, adj_n.T], axis=1).astype(np.float32)
    names = tuple([f"type:{t}" for t in top] + ["type:other", "ops", "compute", "out_bytes", "persistent_bytes",
                                                   "bytes_out", "bytes_in", "cpu_only", "position"]
                  + [f"to:{j}" for j in range(G)] + [f"from:{j}" for j in range(G)])
    return Grouping(op_group=op_group, num_groups=G, features=feats, cpu_only=cpu_g,
                    adjacency=adj_n.astype(np.float32), op_cpu_only=graph.cpu_only.astype(bool).copy(),
                    group_cost=g_cost, feature_names=names)
