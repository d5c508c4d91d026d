"""Grouped baselines: the group-level versions of op-level placements, and how failed evaluations are charged.
Shared by the policy's warm start (`placer.rl.search`) and the annealer (`placer.baselines.anneal`), which both
start from the best grouped baseline and count its evaluations the same way, and the local moves both make
(`neighbours`, and the parts its cluster moves send, `cluster_levels`). Numpy (and pymetis, for `cluster_levels`),
so that rl/ and baselines/ may both import it (rl/ imports nothing from baselines/ or sim/; baselines/ nothing from
rl/).

    >>> import numpy as np
    >>> op_group = np.array([0, 0, 0, 1, 1])
    >>> group_majority(np.array([1, 1, 0, 2, 2]), op_group, 2, 3).tolist()
    [1, 2]
    >>> names, targets = grouped_baselines({"a": np.array([1, 1, 0, 2, 2]), "b": np.zeros(5, int)},
    ...                                    {"a": 2.0, "b": 1.0}, op_group, 2, np.ones((2, 3), bool))
    >>> names, [t.tolist() for t in targets]
    (['b', 'a'], [[0, 0], [1, 2]])
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from placer._mute import muted

# the failure charge's reference: the single-device step time (simulated even when it runs out of memory)
FAILURE_REFERENCE_BASELINES = ("single_gpu", "single", "single_cpu")
# merge moves (`neighbours`), when their share is left to the device count ("auto", None): this share on
# clusters of at least MERGE_ACCELERATORS accelerators, none on smaller ones (RESULTS.md "Merges by device count")
AUTO_MERGE_PROB = 0.05
MERGE_ACCELERATORS = 8
# cluster moves (`neighbours`, `cluster_levels`), when their share is left to the device count ("auto", None): this
# share from MERGE_ACCELERATORS accelerators on, as merges, none on smaller clusters (RESULTS.md "Cluster moves by
# device count": on a DGX-1 at 25,000 evaluations annealing ends 5.5-9% faster with them, on 8 A100s level, on 8
# K80s mixed; on 2 and 4 K80s at 1,000 evaluations 0.2-1.8% slower)
AUTO_CLUSTER_PROB = 0.1


def group_majority(op_devices: np.ndarray, op_group: np.ndarray, num_groups: int, num_devices: int) -> np.ndarray:
    """The device holding most of each group's ops (group placement closest to an op placement)."""
    counts = np.zeros((num_groups, num_devices), np.int64)
    np.add.at(counts, (np.asarray(op_group), np.asarray(op_devices)), 1)
    return counts.argmax(axis=1).astype(np.int32)


def grouped_baselines(placements: Mapping[str, np.ndarray], times: Mapping[str, float | None],
                      op_group: np.ndarray, num_groups: int, allowed: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """The group-level version of every baseline that worked (`times[name]` not None), fastest first: the
    majority device of each group's ops, a group whose majority device it may not use going to its first allowed
    device. Returns (names, group→device arrays)."""
    allowed = np.asarray(allowed, bool)
    names = [n for n, t in sorted(times.items(), key=lambda kv: kv[1] if kv[1] is not None else np.inf)
             if t is not None and n in placements]
    targets = []
    for n in names:
        t = group_majority(placements[n], op_group, num_groups, allowed.shape[1])
        bad = ~allowed[np.arange(len(t)), t]
        t[bad] = allowed[bad].argmax(axis=1)
        targets.append(t)
    return names, targets


def failure_reference(names: Sequence[str], outcomes: Sequence) -> float | None:
    """The step time a failure is charged a multiple of: the single-device baseline's (simulated even when it
    runs out of memory), else the slowest finite one among `outcomes`, else None."""
    for key in FAILURE_REFERENCE_BASELINES:
        if key in names:
            t = outcomes[list(names).index(key)].step_time
            if np.isfinite(t):
                return float(t)
    finite = [o.step_time for o in outcomes if np.isfinite(o.step_time)]
    return float(max(finite)) if finite else None


def charged_step_times(outcomes, failure_step_time: float, capacity: np.ndarray | None = None) -> np.ndarray:
    """The step time each outcome is charged: its own when it worked; `failure_step_time` when it failed,
    scaled by how far an OOM placement overflows its fullest device (peak / capacity ≥ 1), so a search is
    pushed toward placements that need less memory even while every one it tries still runs out of it."""
    t = np.array([o.step_time if o.ok else failure_step_time for o in outcomes], np.float64)
    t[~np.isfinite(t)] = failure_step_time
    if capacity is not None:
        cap = np.maximum(np.asarray(capacity, np.float64), 1.0)
        for i, o in enumerate(outcomes):
            if o.failed and o.oom and len(o.peak_memory) == len(cap):
                t[i] = failure_step_time * max(1.0, float((np.asarray(o.peak_memory, np.float64) / cap).max()))
    return t


def first_copies(placements: Sequence[np.ndarray]) -> list[int]:
    """For each placement, the index of the first one equal to it (its own index when it is the first): copies
    of one placement are evaluated once and share the outcome (baseline rounds, re-measured candidates, the
    measured table).

    >>> first_copies([np.array([0, 1]), np.array([1, 1]), np.array([0, 1])])
    [0, 1, 0]
    """
    seen: dict[tuple, int] = {}
    out = []
    for i, p in enumerate(placements):
        a = np.asarray(p, np.int64)
        out.append(seen.setdefault((a.shape, a.tobytes()), i))
    return out


def group_key(groups: np.ndarray) -> bytes:
    """A hashable key of a group→device array (int16 bytes), for the sets of placements already evaluated."""
    return np.asarray(groups, np.int16).tobytes()


def screened(cands: list[np.ndarray], k: int, screen, expand) -> list[np.ndarray]:
    """The `k` of the group placements `cands` that the Evaluator `screen` scores fastest (failures last; ties in
    draw order): a cheap model (the simulator) choosing which moves a costly one (a measurement) evaluates.
    `expand`: group placement -> op placement.

    >>> class Sim:
    ...     def evaluate(self, ps): return [type("O", (), {"ok": True, "step_time": float(p.sum())})() for p in ps]
    >>> [int(c.sum()) for c in screened([np.array([3]), np.array([1]), np.array([2])], 2, Sim(), lambda g: g)]
    [1, 2]
    """
    outs = screen.evaluate([expand(g) for g in cands])
    score = np.array([o.step_time if o.ok and np.isfinite(o.step_time) else np.inf for o in outs])
    return [cands[i] for i in np.argsort(score, kind="stable")[:k]]


def neighbours(cur: np.ndarray, allowed: np.ndarray, rng: np.random.Generator, k: int, seen: set[bytes], *,
               block_prob: float = 0.1, block_max: int = 8, movable: np.ndarray | None = None, tries: int = 20,
               max_depth: int = 4, links: np.ndarray | None = None, merge_prob: float = 0.0,
               attract_prob: float = 0.0, prefer: np.ndarray | None = None,
               prefer_prob: float = 0.0, clusters: Sequence[np.ndarray] | None = None,
               cluster_prob: float = 0.0) -> list[np.ndarray]:
    """Up to `k` distinct neighbours of the group placement `cur` whose `group_key` is not in `seen`: a single
    movable group (`movable`: default, the groups with more than one allowed device) to another allowed device,
    or, with probability `block_prob`, a block (a contiguous run of 2..`block_max` groups, in group order, which is
    topological order) to one device, each group of the run that may use it. With `links` (float[G, G], the bytes
    or a monotone score of them sent from group i to group j, e.g. `Grouping.adjacency`) a block is instead grown
    from a random movable group by its heaviest links (`linked_block`): a layer's groups, which group order need
    not keep together, move as one. Two more kinds of move, drawn first: with probability `merge_prob` a
    merge (every movable group on one device that may use another goes there: a device is emptied, so a
    placement spread over many devices consolidates in one move where single moves would each have to pay off
    alone), and with probability `attract_prob` an attraction (a movable group goes to a device drawn in
    proportion to its links, both directions, to the groups there; needs `links`, else it is a single move).
    With `prefer` (float[G, D] >= 0, e.g. how often a policy's recent samples put each group on each device),
    a share `prefer_prob` are preferred moves: a movable group goes to a device drawn in proportion to
    `prefer[g]` (its own device and disallowed ones excluded), the group drawn in proportion to the weight it
    has elsewhere (where the preference disagrees with `cur`); without such weight it is a single move; without
    `prefer` there are none (`prefer_prob` counts as 0). With `clusters` (label arrays int[G], e.g.
    `cluster_levels`: the grouping cut into 2, 4, 8... compute-balanced parts of few links between them), a share
    `cluster_prob` are cluster moves: every movable group of one cluster (a level drawn at random, the cluster
    of a random movable group) to one device, each that may use it: a branch of the graph (a tower, a layer
    stack) moves as one, where single and block moves would have to consolidate it piece by piece.
    The rest, 1 - `merge_prob` - `attract_prob` - `prefer_prob` - `cluster_prob`, are block moves (with probability
    `block_prob`) and single moves as above. When random draws find none (the neighbourhood is used up),
    neighbours two, three... moves away are drawn instead. A block move may leave `cur` as it is: put `cur`'s
    key in `seen` to exclude it. The annealer's moves (`placer.baselines.anneal`) and the search's local moves
    (`placer.rl.search`, `ReinforceConfig.local_moves`).

    >>> allowed = np.ones((4, 2), bool)
    >>> cur = np.zeros(4, int)
    >>> nb = neighbours(cur, allowed, np.random.default_rng(0), 3, {group_key(cur)})
    >>> len(nb), all(allowed[np.arange(4), n].all() and (n != 0).any() for n in nb)
    (3, True)
    """
    allowed = np.asarray(allowed, bool)
    movable = np.flatnonzero(allowed.sum(axis=1) > 1) if movable is None else movable
    G = len(cur)
    out: list[np.ndarray] = []
    keys: set[bytes] = set()
    if movable.size == 0:
        return out
    if not clusters:
        cluster_prob = 0.0
    if prefer is None:
        prefer_prob = 0.0
    else:       # each movable group's preference over the devices it may use
        pref = np.asarray(prefer, float)[movable] * allowed[movable]
    for depth in range(1, max_depth + 1):
        for _ in range(k * tries):
            if len(out) >= k:
                return out
            new = cur.copy()
            for _ in range(depth):
                u = rng.random() if merge_prob > 0 or attract_prob > 0 or prefer_prob > 0 or cluster_prob > 0 \
                    else 1.0
                if u < merge_prob:
                    src = int(rng.choice(np.unique(new[movable])))
                    d = int(rng.integers(allowed.shape[1]))
                    new[(new == src) & allowed[:, d]] = d       # d == src: no move (in `seen`, skipped)
                    continue
                if u < merge_prob + attract_prob and links is not None:
                    g = int(rng.choice(movable))
                    w = np.asarray(links[g], float) + np.asarray(links[:, g], float)
                    pull = np.bincount(new, weights=w, minlength=allowed.shape[1]) * allowed[g]
                    pull[new[g]] = 0.0
                    if pull.sum() > 0:
                        new[g] = int(rng.choice(len(pull), p=pull / pull.sum()))
                        continue
                if merge_prob + attract_prob <= u < merge_prob + attract_prob + prefer_prob:
                    w = pref.copy()
                    w[np.arange(len(movable)), new[movable]] = 0.0
                    tot = w.sum(axis=1)
                    if tot.sum() > 0:
                        i = int(rng.choice(len(movable), p=tot / tot.sum()))
                        new[movable[i]] = int(rng.choice(w.shape[1], p=w[i] / tot[i]))
                        continue
                lo = merge_prob + attract_prob + prefer_prob
                if lo <= u < lo + cluster_prob:
                    labels = clusters[int(rng.integers(len(clusters)))]
                    g = int(rng.choice(movable))
                    _to_one_device(new, movable[labels[movable] == labels[g]], allowed, rng)
                    continue
                if rng.random() < block_prob and G >= 2:
                    length = int(rng.integers(2, min(block_max, G) + 1))
                    if links is None:
                        i = int(rng.integers(0, G - length + 1))
                        run = np.arange(i, i + length)
                    else:
                        run = linked_block(links, int(rng.choice(movable)), length)
                    _to_one_device(new, run, allowed, rng)
                else:
                    g = int(rng.choice(movable))
                    choices = np.flatnonzero(allowed[g])
                    choices = choices[choices != new[g]]
                    new[g] = int(rng.choice(choices))
            key = group_key(new)
            if key in seen or key in keys:
                continue
            keys.add(key)
            out.append(new)
        if out:
            break
    return out


def _to_one_device(new: np.ndarray, run: np.ndarray, allowed: np.ndarray, rng: np.random.Generator) -> None:
    """A block or cluster move, in place: the groups `run` to one device drawn among those any of them may use,
    each group that may use it."""
    d = int(rng.choice(np.flatnonzero(allowed[run].any(axis=0))))
    new[run] = np.where(allowed[run, d], d, new[run])


def cluster_levels(links: np.ndarray, weights: np.ndarray, min_size: int = 4, seed: int = 0) -> list[np.ndarray]:
    """The groups cut into k = 2, 4, 8... parts (while a part averages at least `min_size` groups) by METIS
    (`pymetis.part_graph`: parts of about equal `weights`, e.g. `Grouping.group_cost`, with few `links` between
    them, both directions): one label array int[G] per k, for `neighbours`' cluster moves. Empty when there are
    fewer than 2 * `min_size` groups. Deterministic for a seed.

    >>> links = np.zeros((8, 8)); links[[0, 1, 2, 4, 5, 6], [1, 2, 3, 5, 6, 7]] = 1.0   # two chains of 4
    >>> (lv,) = cluster_levels(links, np.ones(8))
    >>> sorted(set(lv[:4].tolist())) != sorted(set(lv[4:].tolist())), len(set(lv[:4].tolist()))
    (True, 1)
    """
    import pymetis

    w = np.asarray(links, np.float64)
    w = w + w.T
    np.fill_diagonal(w, 0.0)
    G = w.shape[0]
    vw = np.asarray(weights, np.float64)
    vw = np.maximum(1, np.round(vw / max(float(vw.sum()), 1e-30) * 2**20)).astype(np.int64)
    xadj, adjncy, ew = [0], [], []
    scale = 2**20 / max(float(w.sum()), 1e-30)
    for i in range(G):
        nz = np.flatnonzero(w[i] > 0)
        adjncy.extend(nz.tolist())
        ew.extend(np.maximum(1, np.round(w[i, nz] * scale)).astype(np.int64).tolist())
        xadj.append(len(adjncy))
    out = []
    k = 2
    while G >= k * min_size:
        with muted(1):          # METIS prints to stdout when a level has more parts than it can fill
            _, parts = pymetis.part_graph(k, xadj=xadj, adjncy=adjncy, vweights=vw.tolist(),
                                          eweights=ew if adjncy else None, options=pymetis.Options(seed=int(seed)))
        out.append(np.asarray(parts, np.int64))
        k *= 2
    return out


def linked_block(links: np.ndarray, start: int, length: int) -> np.ndarray:
    """Up to `length` groups grown from `start`: each step adds the group with the heaviest links (both
    directions) to the groups taken so far; stops early when no group is linked to them.

    >>> links = np.array([[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 5, 0]], float)
    >>> linked_block(links, 0, 3).tolist(), linked_block(links, 2, 3).tolist()
    ([0, 1], [2, 3])
    """
    w = np.asarray(links, float)
    w = w + w.T
    score = w[start].copy()
    taken = [start]
    score[start] = -np.inf
    while len(taken) < length:
        j = int(np.argmax(score))
        if not score[j] > 0:
            break
        taken.append(j)
        score += w[j]
        score[taken] = -np.inf
    return np.asarray(taken)


def accept_move(delta: np.ndarray, temp: float, rule: str, rng: np.random.Generator) -> int | None:
    """The index of the accepted move of a batch, or None. `delta`: each move's relative change of the charged step
    time (c_new / c_cur - 1). "greedy" takes the best improving move if any, else tries the worsening ones in random
    order, the first with u < exp(-delta / temp) taken; "metropolis" tries all in random order (the annealer's
    rule, `placer.baselines.anneal`, and the search's local moves)."""
    if rule == "greedy" and (delta < 0).any():
        return int(np.argmin(delta))
    for i in rng.permutation(len(delta)):
        d = float(delta[i])
        if d <= 0 or (temp > 0 and np.isfinite(d) and rng.random() < math.exp(-d / temp)):
            return int(i)
    return None


def accept0_error(accept0: float, name: str = "accept0") -> str | None:
    """Why `accept0` (`name`: the setting it came from) cannot set a starting temperature, or None when it can:
    it is a probability strictly between 0 and 1. Configs are checked with it before any work
    (`placer.baselines.anneal`, `placer.rl.search.Search`), and `initial_temperature` raises it.

    >>> accept0_error(0.3) is None, accept0_error(1.0, "AnnealConfig.accept0")[:24]
    (True, 'AnnealConfig.accept0 (th')
    """
    if 0.0 < accept0 < 1.0:
        return None
    return (f"{name} (the probability of accepting a median worsening move at the start) must be between 0 and 1, "
            f"exclusive: got {accept0}")


def screen_error(screen, name: str = "screen") -> str | None:
    """Why `screen` (`name`: the setting it came from) cannot say how many times a batch's moves are drawn for a
    screen to pick the batch from (`screened`), or None when it can: a whole number, at least 1 (1: no screening).
    Configs are checked with it before any work (`placer.baselines.anneal`, `placer.rl.search.Search`).

    >>> screen_error(4) is None, screen_error(0, "AnnealConfig.screen")[:26]
    (True, 'AnnealConfig.screen (how m')
    """
    if isinstance(screen, (int, np.integer)) and not isinstance(screen, bool) and screen >= 1:
        return None
    return (f"{name} (how many times the batch's moves are drawn for the screen to pick from; 1: no screening) must "
            f"be a whole number of at least 1: got {screen!r}")


def auto_merge_prob(merge_prob: float | None, num_devices: int, cpu_index: int | None) -> float:
    """The share of merge moves on `num_devices` devices (the host CPU at `cpu_index`, if any): `merge_prob`
    when given; when None ("auto", the default of `AnnealConfig.merge_prob` and `ReinforceConfig.local_merge_prob`)
    AUTO_MERGE_PROB from MERGE_ACCELERATORS accelerators (the devices but the host CPU) on, else 0.

    >>> auto_merge_prob(None, 5, 4), auto_merge_prob(None, 9, 8), auto_merge_prob(0.0, 9, 8), auto_merge_prob(0.2, 3, 2)
    (0.0, 0.05, 0.0, 0.2)
    """
    return auto_share(merge_prob, AUTO_MERGE_PROB, num_devices, cpu_index)


def auto_cluster_prob(cluster_prob: float | None, num_devices: int, cpu_index: int | None) -> float:
    """The share of cluster moves, as `auto_merge_prob` (AUTO_CLUSTER_PROB from MERGE_ACCELERATORS accelerators on
    when None, the default of `AnnealConfig.cluster_prob` and `ReinforceConfig.local_cluster_prob`).

    >>> auto_cluster_prob(None, 5, 4), auto_cluster_prob(None, 8, None), auto_cluster_prob(0.3, 3, 2)
    (0.0, 0.1, 0.3)
    """
    return auto_share(cluster_prob, AUTO_CLUSTER_PROB, num_devices, cpu_index)


def auto_shares(config, num_devices: int, cpu_index: int | None, prefix: str = ""):
    """`config` (a dataclass: `AnnealConfig`, or `ReinforceConfig` with `prefix` "local_") with its "auto" move
    shares (None) resolved for the device count: merges (`auto_merge_prob`) and cluster moves (`auto_cluster_prob`).
    Every place that reads a config's shares for a cluster resolves them here, so a new automatic share is added
    once."""
    from dataclasses import replace

    m, c = f"{prefix}merge_prob", f"{prefix}cluster_prob"
    return replace(config, **{m: auto_merge_prob(getattr(config, m), num_devices, cpu_index),
                              c: auto_cluster_prob(getattr(config, c), num_devices, cpu_index)})


def auto_share(share: float | None, auto: float, num_devices: int, cpu_index: int | None) -> float:
    """`share` when given, else `auto` on clusters of at least MERGE_ACCELERATORS accelerators (the devices but
    the host CPU at `cpu_index`, if any) and 0 on smaller ones."""
    if share is not None:
        return float(share)
    return auto if num_devices - (cpu_index is not None) >= MERGE_ACCELERATORS else 0.0


def move_shares_error(merge_prob: float, attract_prob: float, prefix: str = "", prefer_prob: float = 0.0,
                      prefer_name: str = "prefer_prob", cluster_prob: float = 0.0) -> str | None:
    """Why the shares of merge, attraction, preferred and cluster moves (`neighbours`; `prefix`: the settings'
    owner, e.g. "AnnealConfig."; `prefer_name`: the preferred share's setting) cannot be used, or None when they
    can: each in [0, 1], their sum at most 1.

    >>> move_shares_error(0.05, 0.2) is None, move_shares_error(0.6, 0.6, "AnnealConfig.")[:36]
    (True, 'AnnealConfig.merge_prob + AnnealConf')
    >>> move_shares_error(0.05, 0.2, "X.", cluster_prob=0.8)
    'X.merge_prob + X.attract_prob + X.cluster_prob (shares of the local moves) must be at most 1: got 0.05 + 0.2 + 0.8'
    """
    shares = [("merge_prob", merge_prob), ("attract_prob", attract_prob), (prefer_name, prefer_prob),
              ("cluster_prob", cluster_prob)]
    for name, v in shares:
        if not 0.0 <= v <= 1.0:
            return f"{prefix}{name} (a share of the local moves) must be between 0 and 1: got {v}"
    if sum(v for _, v in shares) > 1.0:
        used = [(n, v) for i, (n, v) in enumerate(shares) if i < 2 or v]
        return (f"{' + '.join(prefix + n for n, _ in used)} (shares of the local moves) must be at most 1: "
                f"got {' + '.join(str(v) for _, v in used)}")
    return None


def initial_temperature(delta: np.ndarray, accept0: float) -> float:
    """T0 from a first batch of moves' relative changes `delta`: a median worsening move is accepted with
    probability `accept0` (1e-2 stands in for the median when no move of the batch worsened), 0 < accept0 < 1."""
    if (msg := accept0_error(accept0)) is not None:
        raise ValueError(msg)
    worse = delta[(delta > 0) & np.isfinite(delta)]
    med = float(np.median(worse)) if worse.size else 1e-2
    return max(med / -math.log(accept0), 1e-12)
