"""The annealing reference (placer.baselines.anneal): allowed devices, memory, a known optimum, and the
equal-evaluations accounting it shares with the policy's search."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from placer.baselines.anneal import AnnealConfig, anneal
from placer.bench import best_within, policy_curve
from placer.graphs.group import Grouping
from placer.sim.evaluator import Evaluator, Outcome

DEVICES = ["/GPU:0", "/GPU:1", "/GPU:2", "/CPU:0"]
CPU = 3


def _grouping(G: int, ops_per_group: int = 2, cpu_only=()) -> Grouping:
    n = G * ops_per_group
    cpu = np.zeros(G, bool)
    cpu[list(cpu_only)] = True
    # op_cpu_only stays False: only the allowed mask keeps CPU-only groups on the CPU here
    return Grouping(op_group=np.repeat(np.arange(G), ops_per_group).astype(np.int32), num_groups=G,
                    features=np.zeros((G, 1), np.float32), cpu_only=cpu, adjacency=np.zeros((G, G), np.float32),
                    op_cpu_only=np.zeros(n, bool), group_cost=np.ones(G))


class ToyEvaluator(Evaluator):
    """step time = 1 + 0.1 × (ops off their target device); more than `cap` ops on one device = out of memory.
    Records every placement it is given and the size of every batch."""

    def __init__(self, target_ops: np.ndarray, cap: int = 10**9):
        self.devices = DEVICES
        self.target_ops = np.asarray(target_ops)
        self.cap = cap
        self.seen: list[np.ndarray] = []
        self.batches: list[int] = []

    def evaluate(self, placements):
        self.batches.append(len(placements))
        out = []
        for p in placements:
            p = np.asarray(p)
            self.seen.append(p.copy())
            t = 1.0 + 0.1 * float((p != self.target_ops).sum())
            use = np.bincount(p, minlength=len(DEVICES)).astype(np.int64)
            if (use > self.cap).any():
                out.append(Outcome.failure("out of memory", oom=True, step_time=t, peak_memory=use))
            else:
                out.append(Outcome(step_time=t, peak_memory=use))
        return out


def _problem(grouping, allowed, evaluator, baselines, cap=10**9):
    cluster = SimpleNamespace(cpu_index=CPU, devices=[SimpleNamespace(capacity_bytes=cap) for _ in DEVICES])
    return SimpleNamespace(grouping=grouping, allowed=allowed, cluster=cluster, baselines=baselines,
                           simulator=evaluator)


def _toy(G: int):
    """A toy problem of G groups, every device allowed, its optimum all on GPU 1, started from GPU 0."""
    gr = _grouping(G)
    allowed = np.ones((G, 4), bool)
    ev = ToyEvaluator(gr.expand(np.ones(G, int), CPU))
    return gr, allowed, ev, _problem(gr, allowed, ev, {"single_gpu": gr.expand(np.zeros(G, int), CPU)})


def test_anneal_keeps_groups_on_their_allowed_devices():
    """CPU-only groups stay on the CPU and a masked device is never used, although the toy's optimum puts
    every group exactly there (so an annealer that ignored the mask would move them)."""
    G = 12
    gr = _grouping(G, cpu_only=(0, 5))
    allowed = np.ones((G, 4), bool)
    allowed[:, CPU] = False
    allowed[[0, 5]] = False
    allowed[[0, 5], CPU] = True                     # CPU-only groups
    allowed[3:9, 1] = False                         # GPU:1 masked for groups 3..8
    target = gr.expand(np.ones(G, int), CPU)        # the optimum ignoring the mask: everything on GPU:1
    ev = ToyEvaluator(target)
    start = np.where(allowed[:, CPU], CPU, 0)
    prob = _problem(gr, allowed, ev, {"single_gpu": gr.expand(start, CPU)})
    res = anneal(prob, max_evaluations=300, seed=0)
    assert res.evaluations == sum(ev.batches) == 300
    for p in ev.seen[1:] + [res.placement]:          # [0] is the op-level baseline, given as it is
        groups = p[::2]
        assert (p[::2] == p[1::2]).all()             # a group's ops share a device
        assert allowed[np.arange(G), groups].all(), groups
    assert (res.placement[[0, 1, 10, 11]] == CPU).all()
    # ...and it did search: every group that may use GPU:1 ends there
    free = np.flatnonzero(allowed[:, 1])
    assert (res.group_devices[free] == 1).all() and res.step_time < res.start_s


@pytest.mark.parametrize("baselines", ["one_fits", "none_fits"])
def test_anneal_never_returns_an_out_of_memory_placement(baselines):
    """The fastest placements (most groups on GPU:0) do not fit; the result must fit, also when every
    baseline runs out of memory."""
    G = 10
    gr = _grouping(G)
    allowed = np.ones((G, 4), bool)
    allowed[:, CPU] = False
    target = np.zeros(2 * G, int)                   # fastest: everything on GPU:0 ...
    ev = ToyEvaluator(target, cap=8)                # ... but GPU:0 holds 8 of the 20 ops
    base = {"single_gpu": np.zeros(2 * G, int)}     # out of memory
    if baselines == "one_fits":
        base["round_robin"] = np.arange(2 * G) // 2 % 3
    prob = _problem(gr, allowed, ev, base, cap=8)
    res = anneal(prob, max_evaluations=400, seed=1)
    o = ev.evaluate([res.placement])[0]
    assert o.ok and np.isfinite(res.step_time) and res.step_time == pytest.approx(o.step_time)
    assert (np.bincount(res.placement, minlength=4) <= 8).all()
    best_fitting = 1.0 + 0.1 * (2 * G - 8)          # 8 ops on GPU:0, the rest elsewhere
    assert res.step_time == pytest.approx(best_fitting)
    assert res.baselines["single_gpu"] is None


def test_anneal_beats_its_start_and_reaches_a_known_optimum():
    G = 16
    gr = _grouping(G)
    allowed = np.ones((G, 4), bool)
    allowed[:, CPU] = False
    rng = np.random.default_rng(3)
    opt = rng.integers(0, 3, G)
    ev = ToyEvaluator(gr.expand(opt, CPU))
    prob = _problem(gr, allowed, ev, {"single_gpu": np.zeros(2 * G, int), "round_robin": np.arange(2 * G) % 3})
    res = anneal(prob, max_evaluations=600, seed=0)
    assert res.start in ("single_gpu", "round_robin") and res.start_s > 1.5
    assert res.step_time == pytest.approx(1.0)        # the known optimum
    np.testing.assert_array_equal(res.group_devices, opt)
    bests = [h["best_s"] for h in res.history]
    assert bests == sorted(bests, reverse=True) and res.history[-1]["evaluations"] == 600
    # a seconds budget works too, and so does a given start
    res2 = anneal(prob, budget_seconds=0.5, start=np.zeros(G, int), config=AnnealConfig(rule="metropolis"))
    assert res2.stop_reason in ("budget", "no_moves") and res2.start == "given" and res2.step_time < 1.0 + 0.1 * 32


class Counting(Evaluator):
    """Counts what reaches the problem's simulator, batch by batch, and keeps each step time (inf: failed)."""

    def __init__(self, inner):
        self.inner, self.devices, self.batches, self.times = inner, inner.devices, [], []

    def evaluate(self, placements):
        self.batches.append(len(placements))
        out = self.inner.evaluate(placements)
        self.times += [o.step_time if o.ok else float("inf") for o in out]
        return out


def test_policy_and_anneal_count_evaluations_the_same_way():
    """Both evaluate every op-level baseline, then the grouped version of each that worked, then their own
    placements; `evaluations` counts all of them, and `best_within` reads both curves by the same rule."""
    pytest.importorskip("tensorflow")
    from placer.graphs.opgraph import OpGraph
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import search

    n = 24
    ops = [(f"op{i}", "MatMul", 2**20, 0, 1e9 * (1 + i % 5)) for i in range(n)]
    g = OpGraph.build(ops, [(f"op{i}", f"op{i + 1}") for i in range(n - 1)] +
                      [(f"op{i}", f"op{i + 4}") for i in range(0, n - 4, 3)])
    problem = build_problem(g, "2xK80", max_groups=8)
    try:
        pol_ev = Counting(problem.simulator)
        res = search(problem, pol_ev, budget_seconds=120, max_updates=2, remeasure=False,
                     config=ReinforceConfig(hidden_size=16, attn_size=8))
        ann_ev = Counting(problem.simulator)
        ann = anneal(problem, ann_ev, max_evaluations=100)
    finally:
        problem.close()
    nb = len(problem.baselines)
    working = sum(v is not None for k, v in res.baselines.items() if k in problem.baselines)
    assert pol_ev.batches[:2] == ann_ev.batches[:2] == [nb, working]
    new = [int(h["new"]) for h in res.history if "update" in h]     # placements not evaluated before
    assert len(new) == 2 and all(0 < k <= 16 for k in new)
    assert res.evaluations == sum(pol_ev.batches) == nb + working + sum(new)
    assert ann.evaluations == sum(ann_ev.batches) == 100
    assert ann.baselines == {k: v for k, v in res.baselines.items() if k in problem.baselines}
    assert ann.grouped_baselines == res.extra["grouped_baselines"]
    curve = policy_curve(res, nb)
    e0 = nb + working
    assert curve[0]["evaluations"] == ann.history[0]["evaluations"] == e0
    # then a row after each batch that improved the policy's best, and one at the end
    assert {r["evaluations"] for r in curve[1:]} <= {e0 + new[0], e0 + new[0] + new[1]}
    assert curve[-1]["evaluations"] == res.evaluations
    # at e0 evaluations both have exactly the shared start: the best grouped baseline
    start = min(v for v in ann.grouped_baselines.values() if v is not None)
    assert best_within(curve, e0) == best_within(ann.history, e0) == pytest.approx(start) == ann.start_s
    last = e0 + sum(new)
    assert best_within(curve, last) <= start and best_within(curve, last + 1) is None
    assert best_within(ann.history, 100) == pytest.approx(ann.step_time) and ann.step_time <= start


def test_the_policy_curve_counts_local_moves_between_updates_at_their_own_batch():
    """The local moves between two policy updates (here one long time-shared chain after the first update) are
    thousands of evaluations on a real cell; the curve must hold their improvements at the batch that found
    them, not at the next update. At every batch boundary n, `best_within` gives exactly the best the search
    itself evaluated within n (its own placements after the shared start, the start included)."""
    pytest.importorskip("tensorflow")
    from placer.graphs.opgraph import OpGraph
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import search

    n = 24      # four independent chains: spreading them pays, and the policy's first samples do not
    ops = [(f"op{i}", "MatMul", 2**12, 0, 1e10 * (1 + (i * 7) % 5)) for i in range(n)]
    g = OpGraph.build(ops, [(f"op{i}", f"op{i + 4}") for i in range(n - 4)])
    problem = build_problem(g, "4xK80", max_groups=12, baselines=False)   # no baseline start: the search improves
    try:
        ev = Counting(problem.simulator)
        res = search(problem, ev, budget_seconds=120, max_updates=2, remeasure=False,
                     config=ReinforceConfig(hidden_size=16, attn_size=8, local_moves=40, local_batch=4))
    finally:
        problem.close()
    nb = len(problem.baselines)
    curve = policy_curve(res, nb)
    e0 = curve[0]["evaluations"]
    assert len(ev.times) == res.evaluations
    bounds = np.cumsum(ev.batches)
    own = np.minimum.accumulate(np.array(ev.times[e0:]))
    local_batches = [b for b in bounds if b > e0 + 16]  # batches after the first update's samples
    assert len(local_batches) >= 10                      # local moves ran in batches of 4 between updates
    first_row = res.history[0]["evaluations"]           # the first update's row, after its local moves
    assert any(e < first_row for e, _ in res.extra["best_curve"][1:])   # improved by a local batch before it
    for b in bounds[bounds >= e0]:
        want = min(curve[0]["best_s"], own[b - e0 - 1]) if b > e0 else curve[0]["best_s"]
        assert best_within(curve, int(b)) == pytest.approx(want), b
    assert best_within(curve, res.evaluations) == pytest.approx(min(curve[0]["best_s"], res.search_best))
    assert [r["best_s"] for r in curve] == sorted([r["best_s"] for r in curve], reverse=True)


def test_linked_blocks_move_a_layer_that_group_order_splits():
    """With the grouping's links (the default `block="linked"`) a block move takes groups that are linked to each
    other, wherever they sit in group order: here the "layer" 0, 3, 6, which a run in group order never holds
    alone. Every block neighbour moves a connected set of groups."""
    from placer.grouped import group_key, neighbours

    G = 8
    links = np.zeros((G, G))
    links[0, 3] = links[3, 6] = 1.0      # one layer: 0 -> 3 -> 6
    links[1, 2] = links[4, 5] = 0.5
    allowed = np.ones((G, 2), bool)
    cur = np.zeros(G, np.int64)
    nb = neighbours(cur, allowed, np.random.default_rng(0), 40, {group_key(cur)}, block_prob=1.0, block_max=3,
                    links=links)
    moved = [tuple(np.flatnonzero(n != cur)) for n in nb]
    sym = links + links.T
    for m in moved:     # connected in the links graph
        reach = {m[0]}
        for _ in m:
            reach |= {j for i in reach for j in m if sym[i, j] > 0}
        assert reach == set(m), m
    assert (0, 3, 6) in moved
    runs = neighbours(cur, allowed, np.random.default_rng(0), 40, {group_key(cur)}, block_prob=1.0, block_max=3)
    assert (0, 3, 6) not in [tuple(np.flatnonzero(n != cur)) for n in runs]


@pytest.mark.parametrize("accept0", [0.0, 1.0, 1.5])
def test_an_accept0_outside_zero_one_is_a_clear_error(accept0):
    """The starting temperature accepts a median worsening move with probability accept0: 1 made it divide by
    zero (log 1 = 0); now any value outside (0, 1) is a ValueError naming the value, and the annealer and the
    search refuse such a config, naming the setting, before they evaluate anything."""
    from placer.errors import PlacementError, SearchError
    from placer.grouped import initial_temperature
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search

    assert initial_temperature(np.array([0.1, -0.2]), 0.3) > 0
    with pytest.raises(ValueError, match=f"got {accept0}"):
        initial_temperature(np.array([0.1, -0.2]), accept0)
    gr, allowed, ev, prob = _toy(6)
    with pytest.raises(PlacementError, match=f"AnnealConfig.accept0 .* got {accept0}"):
        anneal(prob, max_evaluations=50, config=AnnealConfig(accept0=accept0))
    for name in ("local_accept0", "zero_shot_refine_accept0"):
        with pytest.raises(SearchError, match=f"ReinforceConfig.{name} .* got {accept0}"):
            Search(gr, ev, cpu_index=CPU, allowed=allowed, config=ReinforceConfig(**{name: accept0}),
                   progress=False, tensorboard=False)
    assert ev.batches == []


@pytest.mark.parametrize("screen", [0, -2, 2.5, True])
def test_a_screen_that_is_no_whole_number_of_at_least_one_is_a_clear_error(screen):
    """AnnealConfig.screen / ReinforceConfig.local_screen: draw that many times a batch's moves for the screen to
    pick from. 0 or less drew no moves at all (or was silently taken for 1), 2.5 was silently cut to 2: now the
    annealer and the search refuse the config, naming the setting and the value, before any evaluation."""
    from placer.errors import PlacementError, SearchError
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search

    gr, allowed, ev, prob = _toy(6)
    with pytest.raises(PlacementError, match=rf"AnnealConfig.screen .* got {screen!r}"):
        anneal(prob, max_evaluations=50, config=AnnealConfig(screen=screen), screen_by=ev)
    for name in ("local_screen", "sample_screen"):
        with pytest.raises(SearchError, match=rf"ReinforceConfig.{name} .* got {screen!r}"):
            Search(gr, ev, cpu_index=CPU, allowed=allowed, config=ReinforceConfig(**{name: screen}),
                   progress=False, tensorboard=False)
    assert ev.batches == []


def test_merge_moves_empty_a_device_and_attractions_follow_links():
    """A merge moves every group on one device that may use another device there (one device emptied in one
    move); an attraction moves one group to a device holding a group it is linked to. Both keep each group on
    its allowed devices; without links an attraction is a plain single move."""
    from placer.grouped import group_key, neighbours

    G, D = 6, 4
    cur = np.array([0, 0, 1, 1, 2, 2])
    allowed = np.ones((G, D), bool)
    allowed[5, 0] = False                  # group 5 may not go to device 0: a merge of device 2 there leaves it
    nb = neighbours(cur, allowed, np.random.default_rng(0), 12, {group_key(cur)}, merge_prob=1.0)
    assert nb
    emptied = 0
    for n in nb:
        assert allowed[np.arange(G), n].all()
        moved = np.flatnonzero(n != cur)
        src, dst = set(cur[moved].tolist()), set(n[moved].tolist())
        assert len(src) == 1 and len(dst) == 1, (cur, n)
        s, d = src.pop(), dst.pop()
        assert set(moved.tolist()) == {g for g in range(G) if cur[g] == s and allowed[g, d]}
        emptied += int(not (n == s).any())
    assert emptied > 0
    assert any(n[4] == 0 and n[5] == 2 for n in nb)      # device 2 merged into 0: group 5 stays

    links = np.zeros((G, G))
    links[0, 4] = 3.0                      # group 0 (device 0) sends to group 4 (device 2)
    links[3, 1] = 1.0                      # group 3 (device 1) receives from group 1 (device 0)
    nb = neighbours(cur, allowed, np.random.default_rng(0), 4, {group_key(cur)}, attract_prob=1.0, links=links)
    sym = links + links.T
    assert nb
    for n in nb:
        (g,) = np.flatnonzero(n != cur)
        assert sym[g, cur == n[g]].sum() > 0, (g, n)     # it went where a linked group is
    assert {tuple(np.flatnonzero(n != cur)) for n in nb} <= {(0,), (1,), (3,), (4,)}
    plain = neighbours(cur, allowed, np.random.default_rng(0), 12, {group_key(cur)}, attract_prob=1.0,
                       block_prob=0.0)
    assert all(len(np.flatnonzero(n != cur)) == 1 for n in plain)


def test_preferred_moves_go_where_the_preference_disagrees_with_the_point():
    """A preferred move (`prefer`, e.g. where a policy's samples put each group) moves one group, to a device the
    preference gives weight to, among its allowed devices; only groups whose preference lies partly elsewhere
    move; without any such weight it is a plain single move; the shares' check counts it."""
    from placer.grouped import group_key, move_shares_error, neighbours

    G, D = 5, 3
    cur = np.array([0, 0, 1, 1, 2])
    allowed = np.ones((G, D), bool)
    allowed[1, 2] = False
    prefer = np.zeros((G, D))
    prefer[np.arange(G), cur] = 1.0          # agrees with cur everywhere...
    prefer[1] = [0.5, 0.0, 0.5]              # ...but group 1 half on device 2 (not allowed to it) and
    prefer[3] = [0.25, 0.5, 0.25]            # group 3 on devices 0 and 2 a quarter each
    nb = neighbours(cur, allowed, np.random.default_rng(0), 2, {group_key(cur)}, prefer=prefer, prefer_prob=1.0,
                    block_prob=0.0)
    assert sorted(tuple(n) for n in nb) == [(0, 0, 1, 0, 2), (0, 0, 1, 2, 2)]    # only group 3, to 0 or 2
    agree = np.eye(D)[cur]
    plain = neighbours(cur, allowed, np.random.default_rng(0), 6, {group_key(cur)}, prefer=agree, prefer_prob=1.0,
                       block_prob=0.0)
    assert len(plain) == 6 and all(len(np.flatnonzero(n != cur)) == 1 for n in plain)
    assert all(allowed[np.arange(G), n].all() for n in plain)
    # the draws are those of before when the share is 0 (results of earlier runs stay reproducible)
    a = neighbours(cur, allowed, np.random.default_rng(3), 6, {group_key(cur)}, attract_prob=0.2,
                   links=np.ones((G, G)))
    b = neighbours(cur, allowed, np.random.default_rng(3), 6, {group_key(cur)}, attract_prob=0.2,
                   links=np.ones((G, G)), prefer=prefer, prefer_prob=0.0)
    assert [n.tolist() for n in a] == [n.tolist() for n in b]
    assert "policy_prob" in move_shares_error(0.1, 0.5, "ReinforceConfig.local_", 0.6, "policy_prob")
    assert move_shares_error(0.1, 0.5, "", 0.4) is None


def _linked_toy(G: int):
    """A toy problem of G groups with a known optimum, one disallowed device, and three links."""
    gr = _grouping(G)
    allowed = np.ones((G, 4), bool)
    allowed[:, CPU] = False
    allowed[2, 1] = False
    target = np.array([1, 1, 0, 2, 2, 2, 0, 1])
    ev = ToyEvaluator(gr.expand(target, CPU))
    prob = _problem(gr, allowed, ev, {"single_gpu": gr.expand(np.zeros(G, int), CPU)})
    gr.adjacency[:] = 0.0
    gr.adjacency[0, 1] = gr.adjacency[3, 4] = gr.adjacency[4, 5] = 1.0
    return gr, allowed, ev, prob


def test_anneal_with_merges_and_attractions_keeps_allowed_devices_and_counts():
    """The annealer with the new move kinds: allowed devices kept, the budget in evaluations kept, the optimum of
    the toy reached; move shares outside [0, 1] or summing over 1 are refused, naming the setting, before any
    evaluation (the annealer's and the search's settings)."""
    from placer.errors import PlacementError, SearchError
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search

    G = 8
    gr, allowed, ev, prob = _linked_toy(G)
    r = anneal(prob, max_evaluations=400, seed=0, config=AnnealConfig(merge_prob=0.1, attract_prob=0.3))
    assert r.evaluations <= 400 and r.step_time == pytest.approx(1.0)
    for p in ev.seen:
        g = p[::2]
        assert allowed[np.arange(G), g].all()
    n = len(ev.batches)
    with pytest.raises(PlacementError, match=r"AnnealConfig.merge_prob \+ AnnealConfig.attract_prob .* 0.7 \+ 0.5"):
        anneal(prob, max_evaluations=50, config=AnnealConfig(merge_prob=0.7, attract_prob=0.5))
    with pytest.raises(SearchError, match="ReinforceConfig.local_attract_prob .* got -0.1"):
        Search(gr, ev, cpu_index=CPU, allowed=allowed, config=ReinforceConfig(local_attract_prob=-0.1),
               progress=False, tensorboard=False)
    assert len(ev.batches) == n


@pytest.mark.parametrize("gpus, share, cshare", [(3, 0.0, 0.0), (8, 0.05, 0.1)])
def test_merge_moves_by_default_follow_the_accelerator_count(gpus, share, cshare, monkeypatch):
    """merge_prob and cluster_prob None (the defaults, "auto"): merge and cluster moves from 8 accelerators on
    (placer.grouped.auto_merge_prob, auto_cluster_prob), none below. The annealer's and the search chain's
    neighbours are drawn with those shares, both record them, and a share given explicitly wins."""
    import placer.baselines.anneal as anneal_mod
    import placer.rl.search as search_mod
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search

    shares = []
    for mod in (anneal_mod, search_mod):
        real = mod.neighbours
        monkeypatch.setattr(mod, "neighbours", lambda *a, _real=real, **k: (
            shares.append((k["merge_prob"], k["cluster_prob"], len(k["clusters"]) > 0)), _real(*a, **k))[1])
    G, cpu = 8, gpus
    gr = _grouping(G)
    allowed = np.ones((G, gpus + 1), bool)
    allowed[:, cpu] = False
    ev = ToyEvaluator(gr.expand(np.arange(G) % gpus, cpu))
    ev.devices = [f"/GPU:{i}" for i in range(gpus)] + ["/CPU:0"]
    prob = SimpleNamespace(grouping=gr, allowed=allowed, baselines={"single_gpu": gr.expand(np.zeros(G, int), cpu)},
                           cluster=SimpleNamespace(cpu_index=cpu, devices=[SimpleNamespace(capacity_bytes=10**9)]
                                                   * (gpus + 1)), simulator=ev)
    r = anneal(prob, max_evaluations=60, seed=0)
    assert (r.config["merge_prob"], r.config["cluster_prob"]) == (share, cshare)
    assert shares and set(shares) == {(share, cshare, cshare > 0)}     # the METIS parts cut when the share asks
    shares.clear()
    r = anneal(prob, max_evaluations=60, config=AnnealConfig(merge_prob=0.2, cluster_prob=0.3))
    assert (r.config["merge_prob"], r.config["cluster_prob"]) == (0.2, 0.3) and set(shares) == {(0.2, 0.3, True)}

    shares.clear()
    s = Search(gr, ev, cpu_index=cpu, allowed=allowed, baselines=prob.baselines, progress=False, tensorboard=False,
               config=ReinforceConfig(seed=0, local_moves=8, hidden_size=32, attn_size=16))
    assert (s.config.local_merge_prob, s.config.local_cluster_prob) == (share, cshare)
    s.run(60, max_updates=1)
    assert shares and set(shares) == {(share, cshare, cshare > 0)}
    given = Search(gr, ev, cpu_index=cpu, allowed=allowed, progress=False, tensorboard=False,
                   config=ReinforceConfig(seed=0, local_merge_prob=0.0, local_cluster_prob=0.2))
    assert (given.config.local_merge_prob, given.config.local_cluster_prob) == (0.0, 0.2)


def test_cluster_moves_move_a_whole_metis_part_to_one_device():
    """cluster_levels cuts the groups into 2, 4... parts of few links between them (two chains: one part each);
    a cluster move sends every movable group of one part to one device, each that may use it; the shares' check
    counts the cluster share; with the share 0 the draws are those of before."""
    from placer.grouped import cluster_levels, group_key, move_shares_error, neighbours

    G, D = 8, 3
    links = np.zeros((G, G))
    links[[0, 1, 2, 4, 5, 6], [1, 2, 3, 5, 6, 7]] = 1.0          # two chains of four groups
    levels = cluster_levels(links, np.ones(G))
    assert len(levels) == 1 and len(set(levels[0][:4])) == 1 and len(set(levels[0][4:])) == 1
    assert levels[0][0] != levels[0][4]
    assert cluster_levels(links, np.ones(G), min_size=5) == []
    cur = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    allowed = np.ones((G, D), bool)
    allowed[2, 1] = False                                          # group 2 may not go to device 1
    nb = neighbours(cur, allowed, np.random.default_rng(0), 6, {group_key(cur)}, clusters=levels, cluster_prob=1.0)
    assert nb
    for n in nb:
        assert allowed[np.arange(G), n].all()
        moved = np.flatnonzero(n != cur)
        part = levels[0][moved[0]]
        assert (levels[0][moved] == part).all() and len(set(n[moved].tolist())) == 1
        d = int(n[moved[0]])
        members = np.flatnonzero(levels[0] == part)
        assert all(n[g] == d for g in members if allowed[g, d])     # the whole part went, but where it may not
    a = neighbours(cur, allowed, np.random.default_rng(3), 6, {group_key(cur)}, attract_prob=0.2, links=links)
    b = neighbours(cur, allowed, np.random.default_rng(3), 6, {group_key(cur)}, attract_prob=0.2, links=links,
                   clusters=levels, cluster_prob=0.0)
    assert [n.tolist() for n in a] == [n.tolist() for n in b]
    assert "cluster_prob" in move_shares_error(0.1, 0.5, "AnnealConfig.", cluster_prob=0.6)


def test_anneal_and_search_with_cluster_moves_keep_allowed_devices_and_refuse_bad_shares():
    """The annealer with cluster moves reaches the toy's optimum within its evaluations on allowed devices; a
    cluster share that makes the shares sum over 1 is refused before any evaluation, by the annealer and the
    search."""
    from placer.errors import PlacementError, SearchError
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search

    G = 8
    gr, allowed, ev, prob = _linked_toy(G)
    r = anneal(prob, max_evaluations=400, seed=0, config=AnnealConfig(cluster_prob=0.3))
    assert r.evaluations <= 400 and r.step_time == pytest.approx(1.0)
    assert all(allowed[np.arange(G), p[::2]].all() for p in ev.seen)
    n = len(ev.batches)
    with pytest.raises(PlacementError, match=r"AnnealConfig.cluster_prob .* 0.05 \+ 0.2 \+ 0.9"):
        anneal(prob, max_evaluations=50, config=AnnealConfig(merge_prob=0.05, cluster_prob=0.9))
    with pytest.raises(SearchError, match="ReinforceConfig.local_cluster_prob"):
        Search(gr, ev, cpu_index=CPU, allowed=allowed, config=ReinforceConfig(local_cluster_prob=0.9),
               progress=False, tensorboard=False)
    assert len(ev.batches) == n


def test_metis_chatter_never_reaches_stdout_and_a_failure_keeps_it(capfd):
    """METIS prints "***Cannot bisect a graph with 0 vertices!" to fd 1 when a level of `cluster_levels` has more
    parts than its weights can fill (a DGX cell's groups): a command's stdout (its JSON) stays clean, the levels
    are still made. A block that fails under `muted` gives its chatter back, so the failure keeps its reason."""
    import os

    from placer._mute import muted
    from placer.grouped import cluster_levels

    G = 200
    links = np.zeros((G, G))
    links[np.arange(G - 1), np.arange(1, G)] = 1.0
    weights = np.ones(G)
    weights[:3] = 1e6                 # three groups hold nearly all the work: the deep levels cannot be filled
    levels = cluster_levels(links, weights)
    assert len(levels) == 5 and all(lv.shape == (G,) for lv in levels)
    assert capfd.readouterr().out == ""
    with pytest.raises(RuntimeError, match="boom"):
        with muted(1):
            os.write(1, b"the C library's reason\n")
            raise RuntimeError("boom")
    assert "the C library's reason" in capfd.readouterr().out


def test_the_chains_placements_count_for_the_search_best_when_the_start_is_a_local_optimum():
    """Started from the optimum itself (a baseline), no local move beats the run's best, but the moves are the
    search's own placements: the search's best is the best of them (one group off the optimum: 1 + 0.1 x 2 ops),
    not the best of the policy's few random samples."""
    pytest.importorskip("tensorflow")
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import run_loop

    G = 8
    gr, allowed, ev, _ = _linked_toy(G)
    target = np.array([1, 1, 0, 2, 2, 2, 0, 1])
    cfg = ReinforceConfig(hidden_size=16, attn_size=8, num_samples=4, imitation_steps=1, local_moves=32,
                          local_attract_prob=0.0)
    res = run_loop(gr, ev, budget_seconds=120, max_updates=1, baselines={"target": gr.expand(target, CPU)},
                   cpu_index=CPU, allowed=allowed, progress=False, config=cfg)
    assert res.step_time == pytest.approx(1.0) and res.source == "target"
    assert res.local["improvements"] == 0 and res.local["evaluations"] > 0
    assert res.search_best == pytest.approx(1.2)



class Logged(Evaluator):
    """Passes placements to `inner`, logging each batch as (tag, {placement bytes: step time}) in `log`."""

    def __init__(self, inner, log: list, tag: str):
        self.inner, self.devices, self.log, self.tag = inner, inner.devices, log, tag

    def evaluate(self, placements):
        out = self.inner.evaluate(placements)
        self.log.append((self.tag, {np.asarray(p).tobytes(): o.step_time for p, o in zip(placements, out)}))
        return out


def _check_screened(log: list, k: int) -> int:
    """Each batch the screen scored is followed by one evaluated batch: at most `k` of the screened placements,
    none of them scored worse than one left out (ties aside). Returns how many batches were screened."""
    pairs = [(a[1], b[1]) for a, b in zip(log, log[1:]) if a[0] == "screen"]
    assert all(b[0] == "eval" for a, b in zip(log, log[1:]) if a[0] == "screen")
    for scored, evaluated in pairs:
        assert set(evaluated) <= set(scored) and 0 < len(evaluated) <= k
        worst = max(scored[b] for b in evaluated)
        assert sum(v < worst for v in scored.values()) < len(evaluated)   # nothing better was left out
    return len(pairs)


def test_moves_screened_by_a_cheaper_model_evaluate_only_its_best_and_count_as_before():
    """`anneal(screen_by=..., config=AnnealConfig(screen=4))` and a Search with `screen=` and `local_screen=4`
    draw 4x their batch of moves, score them all with the screen (the simulator, when the evaluator measures)
    and evaluate only the batch best by that score; the screen's scoring is no evaluation (max_evaluations
    holds); without a screen `local_screen` changes nothing. A perfect screen reaches the toy's optimum."""
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.search import _screen

    G = 16
    gr = _grouping(G)
    allowed = np.ones((G, 4), bool)
    allowed[:, CPU] = False
    opt = np.random.default_rng(3).integers(0, 3, G)
    log: list = []
    ev = ToyEvaluator(gr.expand(opt, CPU))
    prob = _problem(gr, allowed, Logged(ev, log, "eval"), {"single_gpu": np.zeros(2 * G, int)})
    screen = Logged(ToyEvaluator(gr.expand(opt, CPU)), log, "screen")
    r = anneal(prob, max_evaluations=200, seed=0, config=AnnealConfig(screen=4, batch=8), screen_by=screen)
    assert r.evaluations == 200 == len(ev.seen) and r.step_time == pytest.approx(1.0)
    assert _check_screened(log, 8) >= 20
    assert sum(len(b) for t, b in log if t == "screen") > 3 * (200 - 2)
    # the search's chain: the same rule; screen=None (a simulated reward) leaves local_screen without effect
    for screened in (True, False):
        log = []
        ev2 = ToyEvaluator(gr.expand(opt, CPU))
        scr = Logged(ToyEvaluator(gr.expand(opt, CPU)), log, "screen") if screened else None
        s = Search(gr, Logged(ev2, log, "eval"), cpu_index=CPU, allowed=allowed,
                   baselines={"single_gpu": np.zeros(2 * G, int)}, screen=scr, progress=False, tensorboard=False,
                   config=ReinforceConfig(seed=0, hidden_size=32, attn_size=16, local_moves=32, local_batch=8,
                                          local_screen=4))
        res = s.run(60, max_updates=3, max_evaluations=150)
        assert res.evaluations == len(ev2.seen) <= 150 and s.local_evaluations > 0
        n = _check_screened(log, 8)
        assert n >= s.local_evaluations // 8 if screened else n == 0
    # search(): the problem's simulator screens a measured search's moves, nothing screens a simulated one
    sim, measured = object(), object()
    assert _screen(SimpleNamespace(simulator=sim), sim) is None
    assert _screen(SimpleNamespace(simulator=sim), measured) is sim


def test_the_policy_samples_screened_by_a_cheaper_model_evaluate_only_its_best():
    """`ReinforceConfig.sample_screen` 4 with a screen: each update draws 4x its samples, the screen scores the new
    ones and only the `num_samples` it scores fastest are evaluated (repeats looked up); the search learns on
    those rows; without a screen, or with 1, the evaluator sees every new sample as before."""
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search

    G = 16
    gr = _grouping(G)
    allowed = np.ones((G, 4), bool)
    allowed[:, CPU] = False
    opt = np.random.default_rng(3).integers(0, 3, G)
    for factor, screened in ((4, True), (4, False), (1, True)):
        log: list = []
        ev = ToyEvaluator(gr.expand(opt, CPU))
        scr = Logged(ToyEvaluator(gr.expand(opt, CPU)), log, "screen") if screened else None
        s = Search(gr, Logged(ev, log, "eval"), cpu_index=CPU, allowed=allowed,
                   baselines={"single_gpu": np.zeros(2 * G, int)}, screen=scr, progress=False, tensorboard=False,
                   config=ReinforceConfig(seed=0, hidden_size=32, attn_size=16, num_samples=8, local_moves=0,
                                          reuse_evaluations=True, sample_screen=factor))
        res = s.run(60, max_updates=4, max_evaluations=200)
        assert res.evaluations == len(ev.seen) <= 200 and s.updates == 4
        n = _check_screened(log, 8)
        scored = [len(b) for t, b in log if t == "screen"]
        if factor > 1 and screened:
            assert n == 4 and min(scored) > 8           # each update: more new samples scored than evaluated
        else:
            assert n == 0 and scored == []
