"""Simulated annealing over group placements: the local-search reference the learned policy is measured against
(issue 13), at the same evaluations and from the same start.

Not one of the `BASELINES` functions (`fn(graph, cluster, costs)`): it needs an Evaluator. In bench output it is
the baseline `anneal` (CLI.md).

State: a group→device array over the problem's grouping (ops expand with `grouping.expand(groups, cpu_index)`),
every group on a device its `allowed` row permits (CPU-only groups on the CPU, masked devices never used).

Start (as the policy's warm start, `placer.grouped.grouped_baselines`): evaluate every op-level baseline of the
problem in one batch, then the group-level version (majority device per group) of each that worked, in one
batch; the fastest that works is the start. Both batches count as evaluations, exactly as `placer.rl.search`
counts them, so at N evaluations both methods have had the same N simulator calls. (When no baseline works, the
grouped version of the one whose failure is charged least is the start, one more evaluation; the policy then
starts cold.)

Moves, all neighbours of the current placement: a single group to another allowed device, or a block of
2..`block_max` groups to one device (each group of the block that may use it). A block is grown from a random
group by the grouping's heaviest links (`placer.grouped.linked_block`; `block="linked"`, the default), so a
layer whose groups group order does not keep together (an LSTM layer's forward, backward and weight groups)
moves as one; `block="run"` takes a contiguous run in group order (topological order), as before 2026-12-04.
With `attract_prob` > 0 that share of the moves are attractions: a group to a device drawn in proportion to its
links to the groups there (to its producers' or consumers' device, cutting a transfer); with `merge_prob` > 0
that share empties a device into another (`placer.grouped.neighbours`).
A batch of `batch` distinct moves is evaluated in one Evaluator call (the simulator
runs it on 2 threads); placements already evaluated are not evaluated again. A failed placement (out of memory)
is charged as the policy's search charges it (`placer.grouped.charged_step_times`: 10 × the single-GPU step
time, times the memory overflow: Δ ≈ +900% against a T0 of a few %), so it is practically never accepted, and
it is never returned.

Acceptance (Metropolis on the relative change Δ = c_new / c_cur − 1, temperature T): "greedy" takes the best
improving move of the batch if any, else tries the worsening ones in random order (the first with
u < exp(−Δ/T) is taken); "metropolis" tries all in random order. T falls geometrically from T0 to `t_final`
over the budget (evaluations or seconds, whichever runs out first). T0 is set from the first batch from the
start: a median worsening move is accepted with probability `accept0`. With `restarts` = R the budget is cut
into R + 1 equal schedules, each reheated to T0 from the best placement so far.

    from placer.baselines.anneal import anneal
    res = anneal(problem, max_evaluations=1000)          # problem: a placer.problem.PlacementProblem
    res.step_time, res.placement, res.evaluations, res.history[-1]
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from placer.errors import PlacementError
from placer.grouped import (accept0_error, accept_move, auto_shares, charged_step_times, cluster_levels,
                            failure_reference, group_key, grouped_baselines, initial_temperature,
                            move_shares_error, neighbours, screen_error, screened)

log = logging.getLogger(__name__)


@dataclass
class AnnealConfig:
    """The annealer's settings, tuned on nmt4 and inception_v3 (4xK80, simulated) at 1,000 evaluations; the
    settings tried and their figures: benchmarks/RESULTS.md, "Annealing reference"."""
    batch: int = 8                # moves per Evaluator call (4 and 16 worse with the greedy rule)
    block_prob: float = 0.1       # share of block moves, the rest move one group (0 and 0.3 no better)
    block_max: int = 8            # longest block, in groups (4 and 16 no better)
    block: str = "linked"         # "linked": a block grown by the grouping's links; "run": a run in group order
    attract_prob: float = 0.2     # share of attraction moves (a group to a device its links pull it to); 0.2:
                                  # better in 6 of the 8 K80 cells, mean -1.1% (RESULTS.md "Attraction moves")
    merge_prob: float | None = None  # share of merge moves (a device's groups all to another); None: by the
                                  # device count (placer.grouped.auto_merge_prob: 0.05 from 8 accelerators on,
                                  # else 0; RESULTS.md "Merges by device count"); the result's config records it
    accept0: float = 0.3          # at T0 a median worsening move of the first batch is accepted with this probability
    t_final: float = 1e-4         # final temperature, in relative step-time change (1e-3, 1e-5 no better)
    cluster_prob: float | None = None  # share of cluster moves (a METIS part of the groups to one device;
                                  # placer.grouped.cluster_levels); None: by the device count, as merge_prob
                                  # (placer.grouped.auto_cluster_prob: 0.1 from 8 accelerators on, else 0)
    screen: int = 1               # with anneal(screen_by=...): draw this many x batch moves, evaluate the batch
                                  # best by that cheaper Evaluator (placer.grouped.screened); 1: off
    restarts: int = 0             # reheats from the best so far, the budget split into restarts + 1 schedules
    rule: str = "greedy"          # "greedy" or "metropolis" (module docstring); metropolis worse on both models
    failure_factor: float = 10.0  # a failure costs this × the single-GPU step time (as ReinforceConfig's)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AnnealResult:
    """What `anneal` returns. Times in seconds; placements are index arrays."""
    placement: np.ndarray | None          # op→device of the best working placement evaluated (None: none worked)
    group_devices: np.ndarray | None      # its group→device array
    step_time: float                      # its step time (inf: none worked); the start counts, op-level baselines not
    start: str                            # the grouped baseline it started from ("given": the caller's start)
    start_s: float                        # the start's step time (inf when it failed)
    baselines: dict[str, float | None]    # op-level baselines evaluated: name → step time (None: failed)
    grouped_baselines: dict[str, float | None]   # their group-level versions
    history: list[dict[str, float]]       # after the start and after each batch: evaluations, wall_s, best_s, ...
    evaluations: int                      # evaluator calls' placements: baselines + grouped baselines + moves
    wall_s: float
    stop_reason: str                      # "max_evaluations" or "budget"
    accepted: int = 0
    restarts: int = 0
    config: dict[str, Any] = field(default_factory=dict)


def anneal(problem, evaluator=None, *, start: np.ndarray | None = None, max_evaluations: int | None = None,
           budget_seconds: float | None = None, seed: int = 0, config: AnnealConfig | None = None,
           screen_by=None) -> AnnealResult:
    """Simulated annealing over `problem`'s group placements (see the module docstring).

    problem: anything with `grouping`, `allowed` (bool[G, D]), `cluster` (`cpu_index`, `devices` with
    `capacity_bytes`), `baselines` (name → op placement) and `simulator` (the default evaluator), e.g. a
    `placer.problem.PlacementProblem`. start: a group→device array to start from instead of the best grouped
    baseline (then no baseline is evaluated). Stops after `max_evaluations` evaluations (the baselines and
    grouped baselines included) or `budget_seconds`, whichever comes first; at least one must be given.
    screen_by: an Evaluator cheaper than `evaluator` (the simulator, when `evaluator` measures): with
    `config.screen` > 1 each batch draws that many times its moves and evaluates those it scores fastest (its
    scoring is not counted in `max_evaluations`).

    >>> import numpy as np
    >>> from placer.graphs.opgraph import OpGraph
    >>> from placer.problem import build_problem                     # doctest: +SKIP
    >>> p = build_problem(OpGraph.build([("a", "X", 4), ("b", "X", 4)], [("a", "b")]), "2xK80",
    ...                   costs=np.ones((2, 3)))                     # doctest: +SKIP
    >>> anneal(p, max_evaluations=50).evaluations <= 50              # doctest: +SKIP
    True
    """
    cfg = config or AnnealConfig()
    cfg = auto_shares(cfg, len(problem.cluster.devices), problem.cluster.cpu_index)   # "auto": by the accelerators
    if max_evaluations is None and budget_seconds is None:
        raise PlacementError("anneal needs a budget: max_evaluations or budget_seconds")
    if cfg.rule not in ("greedy", "metropolis"):
        raise PlacementError(f"unknown anneal rule {cfg.rule!r}: use greedy or metropolis")
    if cfg.block not in ("run", "linked"):
        raise PlacementError(f"unknown anneal block {cfg.block!r}: use run or linked")
    if (msg := accept0_error(cfg.accept0, "AnnealConfig.accept0")) is not None:
        raise PlacementError(msg)
    if (msg := screen_error(cfg.screen, "AnnealConfig.screen")) is not None:
        raise PlacementError(msg)
    if (msg := move_shares_error(cfg.merge_prob, cfg.attract_prob, "AnnealConfig.",
                                 cluster_prob=cfg.cluster_prob)) is not None:
        raise PlacementError(msg)
    evaluator = evaluator if evaluator is not None else problem.simulator
    grouping, cluster = problem.grouping, problem.cluster
    allowed = np.asarray(problem.allowed, bool)
    G = allowed.shape[0]
    if not allowed.any(axis=1).all():
        raise PlacementError(f"group {int(np.flatnonzero(~allowed.any(axis=1))[0])} may not use any device")
    cpu = cluster.cpu_index
    cap = np.array([d.capacity_bytes for d in cluster.devices], np.float64)
    rng = np.random.default_rng(seed)
    t_start = time.perf_counter()
    run = _Run(grouping, evaluator, cpu, cap, t_start)

    # ---- the start: the best grouped baseline (the policy's warm start), or the caller's
    baselines: dict[str, float | None] = {}
    grouped: dict[str, float | None] = {}
    if start is None:
        names = list(problem.baselines)
        if not names:
            raise PlacementError("anneal needs a start: the problem has no baselines and no start was given")
        outs = run.evaluate_ops([problem.baselines[n] for n in names])
        baselines = {n: float(o.step_time) if o.ok else None for n, o in zip(names, outs)}
        ref = failure_reference(names, outs)
        run.failure_s = cfg.failure_factor * (ref if ref is not None else 10.0)
        gnames, targets = grouped_baselines(problem.baselines, baselines, grouping.op_group, G, allowed)
        if not gnames:   # no baseline works: start from the one charged least (memory overflow decides)
            k = int(np.argmin(run.charge(outs)))
            gnames, targets = grouped_baselines(problem.baselines, {names[k]: 0.0}, grouping.op_group, G, allowed)
        costs, outs = run.evaluate(targets)
        grouped = {n: float(o.step_time) if o.ok else None for n, o in zip(gnames, outs)}
        k = int(np.argmin(costs))
        cur, cur_c, start_name = targets[k].copy(), float(costs[k]), gnames[k]
    else:
        cur = np.asarray(start, np.int64).copy()
        if cur.shape != (G,) or not allowed[np.arange(G), cur].all():
            raise PlacementError(f"anneal start must be {G} group devices, each allowed for its group")
        o = run.evaluate_ops([grouping.expand(cur, cpu)])[0]
        run.failure_s = cfg.failure_factor * (o.step_time if np.isfinite(o.step_time) else 10.0)
        cur_c = float(run.charge([o])[0])
        run.note(cur, cur_c, o)
        start_name = "given"
    start_s = run.best_s
    run.record(cur_c, float("nan"))

    # ---- the schedule
    movable = np.flatnonzero(allowed.sum(axis=1) > 1)
    links = np.asarray(grouping.adjacency, float) if cfg.block == "linked" else None
    clusters = cluster_levels(grouping.adjacency, grouping.group_cost) if cfg.cluster_prob > 0 else []
    t0 = t_fin = float("nan")
    move_evals0, move_t0 = run.evaluations, time.perf_counter()
    seg_prev, restarts, accepted = 0, 0, 0
    stop = "max_evaluations"
    while True:
        left = None if max_evaluations is None else max_evaluations - run.evaluations
        if left is not None and left <= 0:
            stop = "max_evaluations"
            break
        if budget_seconds is not None and time.perf_counter() - t_start >= budget_seconds:
            stop = "budget"
            break
        if movable.size == 0:
            stop = "no_moves"
            break
        p = 0.0
        if max_evaluations is not None:
            p = (run.evaluations - move_evals0) / max(1, max_evaluations - move_evals0)
        if budget_seconds is not None:
            p = max(p, (time.perf_counter() - move_t0) / max(1e-9, budget_seconds - (move_t0 - t_start)))
        seg = min(int(p * (cfg.restarts + 1)), cfg.restarts)
        if seg != seg_prev and run.best_groups is not None:    # reheat from the best so far
            cur, cur_c, seg_prev, restarts = run.best_groups.copy(), run.best_c, seg, restarts + 1
        q = min(1.0, p * (cfg.restarts + 1) - seg)
        temp = t0 * (t_fin / t0) ** q if np.isfinite(t0) else float("inf")

        n = min(cfg.batch, left or cfg.batch)
        scr = cfg.screen if screen_by is not None else 1
        cands = neighbours(cur, allowed, rng, n * scr, run.seen, block_prob=cfg.block_prob,
                           block_max=cfg.block_max, movable=movable, links=links, merge_prob=cfg.merge_prob,
                           attract_prob=cfg.attract_prob, clusters=clusters, cluster_prob=cfg.cluster_prob)
        if not cands:
            stop = "no_moves"
            break
        if len(cands) > n:
            cands = screened(cands, n, screen_by, lambda g: grouping.expand(g, cpu))
        costs, _ = run.evaluate(cands)
        delta = costs / max(cur_c, 1e-30) - 1.0
        if not np.isfinite(t0):     # T0 from the first batch's worsening moves
            t0 = initial_temperature(delta, cfg.accept0)
            t_fin = min(cfg.t_final, t0)
            temp = t0
        k = accept_move(delta, temp, cfg.rule, rng)
        if k is not None:
            cur, cur_c = cands[k], float(costs[k])
            accepted += 1
        run.record(cur_c, temp)

    res = AnnealResult(
        placement=run.best_placement, group_devices=run.best_groups, step_time=run.best_s, start=start_name,
        start_s=start_s, baselines=baselines, grouped_baselines=grouped, history=run.history,
        evaluations=run.evaluations, wall_s=time.perf_counter() - t_start, stop_reason=stop, accepted=accepted,
        restarts=restarts, config=cfg.to_dict())
    log.info("anneal: %.4g s from %s (%.4g s) in %d evaluations, %.1f s (%s)", res.step_time, start_name, start_s,
             res.evaluations, res.wall_s, stop)
    return res


class _Run:
    """Evaluation bookkeeping: counts, the charge of failures, the best working placement, the cache of
    evaluated group placements and the history rows."""

    def __init__(self, grouping, evaluator, cpu, cap, t_start):
        self.grouping, self.evaluator, self.cpu, self.cap, self.t_start = grouping, evaluator, cpu, cap, t_start
        self.evaluations = 0
        self.failure_s = 100.0
        self.best_s = self.best_c = float("inf")
        self.best_groups: np.ndarray | None = None
        self.best_placement: np.ndarray | None = None
        self.seen: set[bytes] = set()
        self.history: list[dict[str, float]] = []

    def charge(self, outcomes) -> np.ndarray:
        return charged_step_times(outcomes, self.failure_s, self.cap)

    def evaluate_ops(self, placements):
        outs = self.evaluator.evaluate(placements)
        self.evaluations += len(placements)
        return outs

    def evaluate(self, groups: list[np.ndarray]):
        """Evaluate group placements in one batch: (charged step times, outcomes)."""
        outs = self.evaluate_ops([self.grouping.expand(g, self.cpu) for g in groups])
        costs = self.charge(outs)
        for g, c, o in zip(groups, costs, outs):
            self.note(g, float(c), o)
        return costs, outs

    def note(self, groups: np.ndarray, charged: float, o) -> None:
        self.seen.add(group_key(groups))
        if o.ok and np.isfinite(o.step_time) and o.step_time < self.best_s:
            self.best_s, self.best_c = float(o.step_time), charged
            self.best_groups = np.asarray(groups).copy()
            self.best_placement = self.grouping.expand(self.best_groups, self.cpu)

    def record(self, current: float, temp: float) -> None:
        self.history.append({"evaluations": self.evaluations, "wall_s": time.perf_counter() - self.t_start,
                             "best_s": self.best_s, "current_s": current, "temperature": temp})
