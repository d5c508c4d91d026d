"""`search(problem, evaluator, ...) -> SearchResult`: the learned placement search on a `PlacementProblem`, and
the files it writes.

    from placer.problem import build_problem
    from placer.search import search
    problem = build_problem(graph, "4xK80")
    result = search(problem, budget_seconds=60, out_dir="runs/x")     # evaluator: the problem's simulator
    result.placement.save("placement.json"); result.step_time; result.search_best

With `out_dir`, it holds placement.json, placed.meta, summary.json, trace.json, curve.png, tb/ and checkpoint/
(CLI.md). When the problem was built from real devices and the reward is simulated, the best few placements are
re-measured on those devices at the end (`remeasure=True`) and summary.json gains
"measured": [{"source", "simulated_s", "measured_s", "error"}].
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from placer._npz import load_npz
from placer.errors import ClusterError, PlacerError, SearchError
from placer.grouped import first_copies
from placer.placement import Placement, tf_version
from placer.problem import PlacementProblem

log = logging.getLogger(__name__)

REMEASURE_TOP = 3
# `placer place` / `place(policy=...)`: the zero-shot answer samples one batch from the policy (more batches for
# PLACE_SAMPLE_SECONDS, ReinforceConfig.zero_shot_seconds), then refines the best sample by local moves for
# PLACE_REFINE_SECONDS (zero_shot_refine_seconds). Simulated, the held-out graphs, mean of seeds 0-7, 2026-12-05
# 19:10 UTC (`python benchmarks/transfer.py --zero-shot-only --splits 2:5,0:7 --seeds 8`): 2 s of sampling + 5 s
# of local moves gave inception_v3@4xK80 0.3871 s, gpt@DGX1:fp16 0.3106, clip@DGX1:fp16 0.2403; one batch + 7 s
# 0.3866, 0.3094, 0.2337. More samples barely improve the policy's best (one batch of 64: 0.5253 / 0.3913 / 0.3005;
# 2 s, 300-600 samples: 0.5102 / 0.3747 / 0.2991); the chain, at 300-900 evaluations a second, does. The chain
# gets 6.5 s, so that the answer's wall stays where 2 s + 5 s put it (the one batch takes ~0.5 s): the same command
# with `--splits 2:5,0:6.5` (20:07 UTC) gave 0.3854 / 0.3062 / 0.2388 s for 2 s + 5 s and 0.3821 / 0.3067 / 0.2335
# for one batch + 6.5 s, in 7.3-7.6 s of wall each.
# Since 2026-12-07 the chain also stops at PLACE_REFINE_MOVES moves (zero_shot_refine_moves), whichever ends
# first: where the moves end first, the same seed gives the same answer every run (6.5 s made 1,824-5,648 moves,
# by graph and by the VM's hour). The moves, seeds 0-3 (`transfer.py --zero-shot-only --splits
# 0:60:1500,0:60:3000,0:60:4500,0:60:6000 --seeds 4`, 2026-12-07 00:10 UTC; simulated): 1,500 / 3,000 / 4,500 /
# 6,000 moves gave inception_v3 0.3966 / 0.3845 / 0.3836 / 0.3796 s, gpt 0.3023 / 0.2966 / 0.2916 / 0.2946, clip
# 0.2396 / 0.2298 / 0.2173 / 0.2226 (METIS 0.2351): 4,500 is where the gains stop. The seconds went from 6.5 to
# 7.5 so that gpt and clip (~500 moves a second on a fast hour, both cores) get nearer to them within ~9 s of wall.
# Since 2026-12-07 a share PLACE_CLUSTER_PROB of the refinement's moves are cluster moves (a METIS part of the
# groups, at 2, 4, 8... parts, to one device; `ReinforceConfig.local_cluster_prob`, `placer.grouped.cluster_levels`):
# a tower or a layer stack that the policy's sample scattered over devices comes together in one move. Seeds 0-3,
# 4,500 moves (`transfer.py --zero-shot-only --splits 0:60:4500 --seeds 4 --zero-shot-config
# '{"local_cluster_prob": P}'`, 2026-12-07 10:30 UTC; simulated): P = 0 / 0.1 / 0.3 gave inception_v3 0.3836 /
# 0.3785 / 0.3763 s, gpt 0.2916 / 0.2898 / 0.2907, clip 0.2173 / 0.2018 / 0.1990 (RESULTS.md "Cluster moves").
PLACE_SAMPLE_SECONDS = 0.0
PLACE_REFINE_SECONDS = 7.5
PLACE_REFINE_MOVES = 4500
PLACE_CLUSTER_PROB = 0.3
MAX_PLACE_SAMPLES = 4096    # placements per sampled batch (`--samples`); more batches: `--sample-seconds`
# A search started from a pretrained policy (`search(..., policy=P)` with its default config: `placer search
# --policy`, transfer.py's fine-tunes) makes this share of its chain's moves cluster moves: it starts, like the
# refinement, where the policy's samples scattered a graph's branches. At 30,000 evaluations (about a 60 s
# fine-tune; `finetune_start.py --graph G --fits auto --evals 30000 --seeds 0,1 --config '{"local_cluster_prob":
# 0.3}'`, 2026-12-07 10:38 UTC; simulated), seeds 0-1: clip 0.1969 / 0.2038 s against 0.2082 / 0.2045 without,
# gpt 0.2862 / 0.2869 against 0.2916 / 0.2939, inception_v3@4xK80 0.3738 / 0.3761 against 0.3754 / 0.3721
# (RESULTS.md "Cluster moves").
FINETUNE_CLUSTER_PROB = 0.3
DROP_AFTER = 2       # measurements that find a device dead before a measured search drops it and re-places


class LossWatch:
    """Evaluator wrapper of a measured search: counts, per device, the outcomes that found it dead
    (`Outcome.lost_devices`, e.g. its TF cluster task is down). `lost()` names those seen `after` times."""

    def __init__(self, inner, after: int = DROP_AFTER):
        self.inner, self.devices, self.after = inner, inner.devices, int(after)
        self.counts: dict[int, int] = {}
        self.reasons: dict[int, str] = {}

    def evaluate(self, placements):
        outs = self.inner.evaluate(placements)
        for o in outs:
            for i in getattr(o, "lost_devices", ()) or ():
                self.counts[int(i)] = self.counts.get(int(i), 0) + 1
                self.reasons[int(i)] = o.reason or "down"
        return outs

    def lost(self) -> list[int]:
        return sorted(i for i, c in self.counts.items() if c >= self.after)

    def close(self) -> None:      # the inner evaluator belongs to the caller
        pass


def _watched(evaluator, reward: str, search_obj) -> "LossWatch | None":
    """Arm a measured search whose evaluator can continue without lost devices (`without`) to stop when one
    dies; its stop_reason is then "devices_lost"."""
    if reward != "measure" or not hasattr(evaluator, "without"):
        return None
    watch = LossWatch(evaluator)
    search_obj.evaluator = watch
    search_obj.stop_check = lambda: "devices_lost" if watch.lost() else None
    return watch


def _drop_and_replace(problem: PlacementProblem, evaluator, watch: LossWatch, res, result: "SearchResult",
                      t0: float, out: Path | None, budget_seconds: float, seed: int, model_name: str,
                      progress: bool, config, dropped: list | None = None,
                      max_updates: int | None = None, max_evaluations: int | None = None) -> "SearchResult":
    """A device died during a measured search: write what the search has, then re-place on the survivors
    (`replace`, warm from the policy, measured on the surviving devices) for the rest of the budget. The drop is
    logged and listed in summary.json as "dropped"."""
    import tempfile

    lost = watch.lost()
    names = [evaluator.devices[i] for i in lost]
    why = "; ".join(sorted({watch.reasons[i] for i in lost}))
    log.warning("dropping %s after %d failed measurements (%s); re-placing on the survivors",
                ", ".join(names), max(watch.counts[i] for i in lost), why)
    drops = list(dropped or []) + [{"devices": names, "reason": why, "after_evaluations": int(res.evaluations),
                                    "wall_s": round(time.perf_counter() - t0, 3)}]
    run_dir = out if out is not None else Path(tempfile.mkdtemp(prefix="placer-drop-"))
    write_outputs(run_dir, problem, res, result, reward="measure", seed=seed, model_name=model_name,
                  more={"dropped": drops})
    survivors = evaluator.without(lost)
    try:
        left = max(1.0, budget_seconds - (time.perf_counter() - t0))
        after = replace(run_dir, names, budget_seconds=left, out_dir=run_dir if out is not None else None,
                        seed=seed, progress=progress, config=config, evaluator=survivors, reward="measure",
                        dropped=drops, model_name=model_name, max_updates=max_updates,
                        max_evaluations=None if max_evaluations is None else max(0, max_evaluations - res.evaluations))
    finally:
        survivors.close()
    # the whole search, before and after the drop
    after.wall_s = time.perf_counter() - t0
    after.evaluations += int(res.evaluations)
    if out is not None and (out / "summary.json").exists():
        s = json.loads((out / "summary.json").read_text())
        s.update(wall_s=float(after.wall_s), evaluations=int(after.evaluations))
        tmp = out / "summary.json.tmp"
        tmp.write_text(json.dumps(s, indent=1))
        os.replace(tmp, out / "summary.json")
    return after


@dataclass
class SearchResult:
    """What `placer.place()` and `search()` return. Times in seconds."""
    placement: Placement
    step_time: float                  # the returned placement (never worse than the best baseline evaluated)
    search_best: float                # the best step time the policy itself sampled (inf: none worked)
    baselines: dict[str, float | None]   # name → step time; None when it failed or could not be built
    lower_bound: float
    history: list[dict] = field(default_factory=list)
    evaluations: int = 0
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    # what `replace(result, ...)` re-places when the search wrote no directory (in memory only, never saved)
    run: RunMemory | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class RunMemory:
    """A search's problem as `replace` rebuilds it on the survivors (graph, cluster, op×device cost matrix,
    grouping, seed, allow_cpu) and its policy at the end (`placer.rl.search.Search.policy_state`; None: no
    update was made): what the run directory holds, for a search that wrote none."""
    graph: Any
    cluster: Any
    cost: np.ndarray
    grouping: Any
    seed: int
    allow_cpu: bool
    policy: dict | None


def _remember(result: SearchResult, problem: PlacementProblem, seed: int, s) -> SearchResult:
    result.run = RunMemory(problem.graph, problem.cluster, problem.cost, problem.grouping, int(seed),
                           bool(problem.allow_cpu), s.policy_state())
    return result


def policy_inputs(problem: PlacementProblem):
    """`PolicyInputs` for a portable policy: group features (per graph), per group × device the compute load
    (relative to an even split of the graph over the accelerators) and the memory share (the group's variables
    over the device's memory), and per device its properties relative to this cluster and graph:
    speed (the graph's compute on the fastest device over its compute on this one), memory (capacity over the
    graph's variable bytes, at most 4), CPU or not, mean and minimum link bandwidth to the other devices (over
    the cluster's fastest link), the graph's communication-to-computation ratio, and log2(D)/4."""
    from placer.rl.portable import PolicyInputs, group_features

    graph, cluster, cost, grouping = problem.graph, problem.cluster, problem.cost, problem.grouping
    D = cluster.num_devices
    c = np.where(np.isfinite(cost), cost, 0.0)
    gpus = list(cluster.gpu_indices) or list(range(D))
    total = c.sum(axis=0)                                               # [D] the graph's compute per device
    fastest = max(float(total[gpus].min()), 1e-12)
    share = fastest / max(1, len(gpus))
    g_cost = np.zeros((grouping.num_groups, D))
    np.add.at(g_cost, grouping.op_group, c)
    pers = np.bincount(grouping.op_group, weights=np.asarray(graph.persistent_bytes, np.float64),
                       minlength=grouping.num_groups)
    cap = np.array([max(float(d.capacity_bytes), 1.0) for d in cluster.devices])
    bw = np.asarray(cluster.bandwidth, np.float64)
    off = ~np.eye(D, dtype=bool)
    bw_off = np.where(off, bw, np.nan)
    top = float(np.nanmax(bw_off)) if D > 1 else 1.0
    link_mean = np.nan_to_num(np.nanmean(bw_off, axis=1) / top) if D > 1 else np.ones(D)
    link_min = np.nan_to_num(np.nanmin(bw_off, axis=1) / top) if D > 1 else np.ones(D)
    moved = float(np.asarray(graph.tensor_bytes, np.float64)[np.asarray(graph.edge_tensor)].sum()) \
        if len(graph.edge_src) else 0.0
    comm = np.log1p((moved / max(top, 1.0)) / share) / 5.0
    need = max(float(pers.sum()), 1.0)
    dev = np.stack([np.clip(fastest / np.maximum(total, 1e-12), 0, 1), np.minimum(cap / need, 4.0),
                    np.array([float(d.is_cpu) for d in cluster.devices]), link_mean, link_min,
                    np.full(D, comm), np.full(D, np.log2(max(D, 1)) / 4.0)], 1)
    return PolicyInputs(group=group_features(grouping), adjacency=np.asarray(grouping.adjacency, np.float32),
                        load=(g_cost / share).astype(np.float32), mem=(pers[:, None] / cap[None]).astype(np.float32),
                        device=dev.astype(np.float32))


def place_settings(samples: int, sample_seconds: float | None = None, refine_seconds: float | None = None,
                   refine_moves: int | None = None, flag=lambda name: name) -> dict:
    """The zero-shot settings of `placer place` / `place(policy=...)` as ReinforceConfig fields, None taking
    `PLACE_SAMPLE_SECONDS`, `PLACE_REFINE_SECONDS` and `PLACE_REFINE_MOVES` (and the refinement's share of
    cluster moves, `PLACE_CLUSTER_PROB`); a bad value is one SearchError
    naming it by `flag(name)` (the CLI passes its flags, the API its keywords). The budget then counts from the
    zero-shot answer (`budget_after_zero_shot`: `--budget` is seconds of fine-tuning after it).

    >>> place_settings(8, refine_moves=0)["zero_shot_refine_moves"]
    0
    >>> place_settings(8, refine_seconds=-1, flag=lambda n: "--" + n.replace("_", "-"))
    Traceback (most recent call last):
    placer.errors.SearchError: --refine-seconds must be 0 or more, got -1
    """
    if not 1 <= samples <= MAX_PLACE_SAMPLES:
        raise SearchError(f"{flag('samples')} must be 1 to {MAX_PLACE_SAMPLES} (placements per batch; more batches: "
                          f"{flag('sample_seconds')}), got {samples}")
    vals = {"sample_seconds": PLACE_SAMPLE_SECONDS if sample_seconds is None else sample_seconds,
            "refine_seconds": PLACE_REFINE_SECONDS if refine_seconds is None else refine_seconds,
            "refine_moves": PLACE_REFINE_MOVES if refine_moves is None else refine_moves}
    for name, v in vals.items():
        if v < 0:
            raise SearchError(f"{flag(name)} must be 0 or more, got {v}")
    return {"zero_shot_samples": int(samples), "zero_shot_seconds": float(vals["sample_seconds"]),
            "zero_shot_refine_seconds": float(vals["refine_seconds"]),
            "zero_shot_refine_moves": int(vals["refine_moves"]), "budget_after_zero_shot": True,
            "local_cluster_prob": PLACE_CLUSTER_PROB}


def load_policy(policy):
    """A pretrained portable policy: `PortableWeights` as is, "default" (the shipped one) or a directory."""
    from placer.rl.portable import PortableWeights, resolve_policy

    if isinstance(policy, PortableWeights):
        return policy
    d = resolve_policy(policy)
    w = PortableWeights.load(d)
    w.info = {**getattr(w, "info", {}), "path": "default" if str(policy) == "default" else str(d)}
    return w


def versions() -> dict[str, str]:
    from placer._version import __version__

    return {"placer": __version__, "tensorflow": tf_version()}


def new_run_dir(out_dir, name: str = "out_dir") -> Path:
    """Check, before any work, that `out_dir` can hold a new run: created (with its parents) and writable, and not
    already holding a search (its checkpoint/), whose files a new run would silently overwrite. OutputError or
    SearchError naming the directory (the library's counterpart of the CLI's --out checks)."""
    from placer.errors import writable_dir

    out = writable_dir(out_dir, f"{name}={str(out_dir)!r}")
    if (out / "checkpoint").exists():
        raise SearchError(f"{name}={str(out_dir)!r} already holds a search, whose files a new run would overwrite: "
                          f"pick another directory")
    return out


def search_config(reward: str, seed: int, *, fine_tune: bool = False, **overrides) -> "ReinforceConfig":
    """The search's default settings for `reward` ("sim" or "measure": `ReinforceConfig.for_reward`), with
    `overrides` (ReinforceConfig fields). `fine_tune`: the search starts from a pretrained policy, whose chain also
    makes cluster moves (`FINETUNE_CLUSTER_PROB`, as `placer place`'s refinement does) unless `overrides` set
    `local_cluster_prob`.

    >>> search_config("sim", 0, fine_tune=True, local_moves=64).local_cluster_prob
    0.3
    """
    from placer.rl.reinforce import ReinforceConfig

    base = {"local_cluster_prob": FINETUNE_CLUSTER_PROB} if fine_tune else {}
    return ReinforceConfig.for_reward(reward, seed=seed, **{**base, **overrides})


def search(problem: PlacementProblem, evaluator=None, *, reward: str = "sim", budget_seconds: float = 300,
           seed: int | None = None, config=None, out_dir=None, progress: bool = False,
           max_updates: int | None = None, patience: int | None = None, resume: bool = False,
           remeasure: bool = True, model_name: str | None = None, policy=None,
           max_evaluations: int | None = None, screen="auto", measure_settings: dict | None = None) -> SearchResult:
    """Search a placement for `problem`. `evaluator` scores placements (default: the problem's simulator; a
    runtime evaluator for measured rewards, whose devices must be the problem's). `reward` labels the summary
    ("sim" or "measure"). Writes the files of CLI.md into `out_dir` when given; `resume` continues the search
    checkpointed there. `policy`: a pretrained portable policy (`placer pretrain`: a directory, "default" for the
    shipped one, or `PortableWeights`) to start from instead of a baseline's imitation: its zero-shot batch first
    (`extra["zero_shot"]`), then the search fine-tunes it (`max_updates=0`: the zero-shot answer alone).
    `max_evaluations`: stop once this many placements were evaluated (baselines included). `screen`: an Evaluator
    that ranks the chain's candidate moves before `evaluator` evaluates the best of them (`ReinforceConfig.
    local_screen`); "auto": the problem's simulator when `evaluator` is another (a measured reward), else none.
    `measure_settings`: warmup, runs and timeout of the re-measurement of a simulated search on real devices
    (`remeasure`; default `make_evaluator`'s)."""
    from dataclasses import replace as dc_replace

    from placer.rl.search import Interrupted, Search

    if reward not in ("sim", "measure"):
        raise SearchError(f"unknown reward {reward!r}: use sim or measure")
    if budget_seconds is None or not budget_seconds > 0:
        raise SearchError(f"search budget must be positive, got {budget_seconds} s "
                          "(use --max-updates 0 to only evaluate the baselines)")
    seed = problem.seed if seed is None else int(seed)
    evaluator = evaluator if evaluator is not None else problem.simulator
    if list(evaluator.devices) != list(problem.device_names):
        raise SearchError(f"the evaluator's devices {list(evaluator.devices)} are not the problem's "
                          f"{problem.device_names}")
    t0 = time.perf_counter()
    cluster = problem.cluster
    out = Path(out_dir) if out_dir is not None else None
    weights = load_policy(policy) if policy is not None else None
    if config is None:
        config = search_config(reward, seed, fine_tune=weights is not None)
    if weights is not None:
        config = dc_replace(config, portable=True, hidden_size=weights.hidden_size, attn_size=weights.attn_size)
    s = Search(problem.grouping, evaluator, cpu_index=cluster.cpu_index, allowed=problem.allowed,
               baselines=problem.baselines, config=config, seed=seed, out_dir=out,
               progress=progress, device_capacity=[d.capacity_bytes for d in cluster.devices],
               policy_inputs=lambda: policy_inputs(problem), pretrained=weights,
               screen=_screen(problem, evaluator) if screen == "auto" else screen)
    if resume and (out is None or not s.load_checkpoint()):
        raise SearchError(f"no checkpoint to resume in {out / 'checkpoint' if out else '(no directory)'}")
    watch = _watched(evaluator, reward, s)

    def as_result(res) -> SearchResult:
        return _result(problem, res, t0, out, config=s.config.to_dict(), failure_step_time_s=res.failure_step_time,
                       **({"zero_shot": dict(res.zero_shot)} if res.zero_shot else {}),
                       **({"local_moves": dict(res.local)} if res.local else {}),
                       **({"policy": getattr(weights, "info", {}).get("path", str(policy))}
                          if weights is not None else {}))
    try:
        res = s.run(budget_seconds, max_updates=max_updates, patience=patience, max_evaluations=max_evaluations)
    except Interrupted as e:
        if out is not None and e.result is not None:
            # the best so far, usable now (placement.json, summary.json: stop_reason "interrupted"), beside the
            # checkpoint --resume continues from: a library run (no args.json) had nothing it could use
            write_outputs(out, problem, e.result, as_result(e.result), reward=reward, seed=seed,
                          model_name=model_name or problem.graph.name)
        raise
    result = as_result(res)
    if watch is not None and res.stop_reason == "devices_lost":
        return _drop_and_replace(problem, evaluator, watch, res, result, t0, out, budget_seconds, seed,
                                 model_name or problem.graph.name, progress, config, max_updates=max_updates,
                                 max_evaluations=max_evaluations)
    if reward == "measure":
        confirm_best(problem, evaluator, res, result)
        if getattr(evaluator, "events", None):      # measurement workers that went out (and came back)
            result.extra["workers_out"] = list(evaluator.events)
    if remeasure and reward == "sim" and problem.devices is not None:
        result.extra["measured"] = remeasure_best(problem, res, **(measure_settings or {}))
    if out is not None:
        write_outputs(out, problem, res, result, reward=reward, seed=seed, model_name=model_name or problem.graph.name)
    return _remember(result, problem, seed, s)


def _screen(problem: PlacementProblem, evaluator):
    """What screens a search's local moves: the problem's simulator when the evaluator measures, else nothing
    (screening by the evaluator itself would be free evaluations)."""
    return problem.simulator if evaluator is not problem.simulator else None


def _result(problem: PlacementProblem, res, t0: float, out: Path | None, **extra) -> SearchResult:
    """The SearchResult of the rl loop's result `res` on `problem` (`extra` adds keys to `.extra`)."""
    baselines: dict[str, float | None] = {k: None for k in problem.baseline_errors}
    baselines.update(res.baselines)
    info: dict[str, Any] = {
        "source": res.source, "updates": res.updates, "stop_reason": res.stop_reason,
        "groups": problem.grouping.num_groups, "devices": problem.device_names, "cost_source": problem.cost_source,
        "baseline_errors": {**problem.baseline_errors, **res.baseline_failures},
        "grouped_baselines": dict(res.grouped_baselines),
        "search_wall_s": res.wall_s, "total_wall_s": time.perf_counter() - t0,
        # the policy's samples that repeated a placement already evaluated, looked up instead (reuse_evaluations)
        "repeats_looked_up": int(sum(h.get("drawn", 0) - h.get("new", 0) for h in res.history
                                     if isinstance(h, dict) and "drawn" in h)),
        "out_dir": str(out) if out is not None else None,
        # the policy's own best against evaluations, one point per batch that improved it (placer.bench.policy_curve)
        "best_curve": [list(p) for p in res.best_curve], **extra}
    return SearchResult(placement=problem.placement(res.placement), step_time=float(res.step_time),
                        search_best=float(res.search_best), baselines=baselines, lower_bound=problem.lower_bound,
                        history=res.history, evaluations=res.evaluations, wall_s=float(res.wall_s), extra=info)


def _candidates(problem: PlacementProblem, res, top: int = REMEASURE_TOP) -> list[tuple[str, np.ndarray]]:
    """The returned placement, the policy's own best and the best baseline, without repeats."""
    cands: list[tuple[str, np.ndarray]] = [("returned", res.placement)]
    if res.search_best_placement is not None:
        cands.append(("search_best", res.search_best_placement))
    ok = {k: v for k, v in res.baselines.items() if v is not None and k in problem.baselines}
    if ok:
        b = min(ok, key=ok.get)
        cands.append((f"baseline:{b}", problem.baselines[b]))
    first = first_copies([p for _, p in cands])
    return [c for i, c in enumerate(cands) if first[i] == i][:top]


CONFIRM_ROUNDS = 2


def confirm_best(problem: PlacementProblem, evaluator, res, result: SearchResult) -> None:
    """A measured search keeps the placement with the lowest single measurement, which favours a lucky one. So
    the candidates (returned, the policy's best, the best baseline) are measured again, `CONFIRM_ROUNDS`
    interleaved rounds, and the one with the lowest median of these new runs is returned, with that median as
    its step time (`extra["confirmed"]` lists them). With one candidate this re-measures it: the step time
    reported is then not the lucky minimum either."""
    cands = _candidates(problem, res)
    runs: list[list[float]] = [[] for _ in cands]
    for r in range(CONFIRM_ROUNDS):
        order = range(len(cands)) if r % 2 == 0 else reversed(range(len(cands)))
        for i in order:
            o = evaluator.evaluate([cands[i][1]])[0]
            if o.ok:
                runs[i].extend(o.runs or (o.step_time,))
    med = [float(np.median(x)) if x else float("inf") for x in runs]
    k = int(np.argmin(med))
    result.extra["confirmed"] = [{"source": n, "measured_s": m if np.isfinite(m) else None, "runs": len(x)}
                                 for (n, _), m, x in zip(cands, med, runs)]
    if np.isfinite(med[k]):
        result.placement = problem.placement(cands[k][1])
        result.step_time = med[k]
        result.extra["source"] = res.source if cands[k][0] == "returned" else cands[k][0]
        result.evaluations += CONFIRM_ROUNDS * len(cands)


def remeasure_best(problem: PlacementProblem, res, **settings) -> list[dict]:
    """Measure the returned, the policy's best and the best baseline placements on the problem's real devices;
    `settings`: how (`make_evaluator`'s warmup, runs, timeout; its defaults when absent)."""
    uniq = _candidates(problem, res)
    try:
        from placer.runtime import make_evaluator

        with make_evaluator(problem.graph, problem.devices, **settings) as ev:
            outs = ev.evaluate([p for _, p in uniq])
    except PlacerError as e:
        log.warning("re-measuring on %s failed: %s", problem.devices, e)
        return [{"source": n, "error": str(e)} for n, _ in uniq]
    sims = problem.simulator.evaluate([p for _, p in uniq])
    return [{"source": name, "simulated_s": None if s.failed else float(s.step_time),
             "measured_s": None if o.failed or not np.isfinite(o.step_time) else float(o.step_time),
             "error": o.reason if o.failed else None}
            for (name, _), o, s in zip(uniq, outs, sims)]


def _finite(x) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def write_outputs(out: Path, problem: PlacementProblem, res, result: SearchResult, *, reward: str, seed: int,
                  model_name: str, more: dict | None = None) -> None:
    """placement.json, placed.meta, trace.json and summary.json (curve.png, tb/ and checkpoint/ are written by
    the search loop)."""
    from placer.sim.trace import write_trace

    graph, cluster = problem.graph, problem.cluster
    out.mkdir(parents=True, exist_ok=True)
    result.placement.save(out / "placement.json")
    save_run_problem(out, problem)
    try:
        placed = result.placement.apply(graph)
        tmp = out / "placed.meta.tmp"
        tmp.write_bytes(placed.SerializeToString())
        os.replace(tmp, out / "placed.meta")
    except PlacerError as e:
        log.warning("placed.meta not written: %s", e)
        result.extra["placed_meta_error"] = str(e)
    try:
        returned = result.placement.to_indices(graph, cluster.device_names)
        write_trace(out / "trace.json", graph, cluster, problem.simulator.sim.simulate(returned, trace=True))
    except PlacerError as e:
        log.warning("trace.json not written: %s", e)
    x = result.extra
    summary = {
        "model": model_name, "cluster": cluster.name, "step_time_s": float(result.step_time),
        "search_best_s": _finite(result.search_best), "lower_bound_s": float(result.lower_bound),
        "baselines": {k: _finite(v) for k, v in result.baselines.items()}, "evaluations": int(result.evaluations),
        "wall_s": float(result.wall_s), "seed": int(seed), "reward": reward,
        "cost_source": x.get("cost_source", ""), "versions": versions(),
        # extra keys
        "source": x["source"], "updates": int(x["updates"]), "stop_reason": x["stop_reason"],
        "groups": int(x["groups"]), "devices": cluster.device_names,
        "baseline_errors": x.get("baseline_errors", {}),
        "repeats_looked_up": int(x.get("repeats_looked_up", 0)),
        "ratio_to_lower_bound": float(result.step_time / result.lower_bound) if result.lower_bound > 0 else None,
    }
    for key in ("measured", "confirmed", "workers_out", "zero_shot", "policy", "local_moves"):
        if key in x:
            summary[key] = x[key]
    summary.update(more or {})
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, out / "summary.json")


# ---------------------------------------------------------------------------------------------- re-placement
RUN_GRAPH, RUN_CLUSTER, RUN_PROBLEM = "graph.npz", "cluster.json", "problem.npz"


def save_run_problem(out: Path, problem: PlacementProblem) -> None:
    """What `replace` needs to rebuild a run's problem without the user's graph source: the OpGraph
    (`graph.npz`, no pickles), the cluster (`cluster.json`, a cluster JSON) and the cost matrix, grouping and
    settings (`problem.npz` of plain arrays + a JSON header)."""
    from placer.sim.cluster import to_json

    problem.graph.save(out / (RUN_GRAPH + ".tmp.npz"))
    os.replace(out / (RUN_GRAPH + ".tmp.npz"), out / RUN_GRAPH)
    to_json(problem.cluster, out / RUN_CLUSTER)
    gr = problem.grouping
    header = {"format": 1, "fingerprint": problem.graph.fingerprint, "seed": int(problem.seed),
              "allow_cpu": bool(problem.allow_cpu), "cost_source": problem.cost_source,
              "num_groups": int(gr.num_groups), "feature_names": list(gr.feature_names)}
    tmp = out / (RUN_PROBLEM + ".tmp.npz")
    np.savez(tmp, header=np.frombuffer(json.dumps(header).encode(), np.uint8), cost=problem.cost,
             op_group=gr.op_group, features=gr.features, cpu_only=gr.cpu_only, adjacency=gr.adjacency,
             op_cpu_only=gr.op_cpu_only, group_cost=gr.group_cost)
    os.replace(tmp, out / RUN_PROBLEM)


def load_run_problem(run_dir: Path):
    """(graph, cluster, cost matrix, grouping, header) of a run directory written by `search` (SearchError, one
    line, naming what is missing)."""
    from placer.graphs.group import Grouping
    from placer.graphs.opgraph import OpGraph
    from placer.sim.cluster import parse_cluster

    missing = [f for f in (RUN_GRAPH, RUN_CLUSTER, RUN_PROBLEM, "placement.json") if not (run_dir / f).exists()]
    if missing and not run_dir.is_dir():
        raise SearchError(f"run directory {run_dir} does not exist (re-placement needs the directory `placer search "
                          "--out` wrote)")
    if missing and (run_dir / "checkpoint").is_dir():      # killed before it wrote its results
        raise SearchError(f"{run_dir} holds a search that never finished (no {', '.join(missing)}): finish it with "
                          f"`placer search --resume {run_dir}` first")
    if missing:
        raise SearchError(f"{run_dir} is not a search directory of this placer version (no {', '.join(missing)}); "
                          "re-placement needs the directory `placer search --out` wrote")
    try:
        graph = OpGraph.load(run_dir / RUN_GRAPH)
        cluster = parse_cluster(str(run_dir / RUN_CLUSTER))
        with load_npz(run_dir / RUN_PROBLEM) as z:
            h = json.loads(z["header"].tobytes().decode())
            a = {k: z[k] for k in z.files if k != "header"}
    except (PlacerError, OSError, ValueError, KeyError) as e:
        raise SearchError(f"cannot read the run in {run_dir}: {e}") from None
    if not isinstance(h, dict) or h.get("fingerprint") != graph.fingerprint:
        raise SearchError(f"{run_dir / RUN_PROBLEM} is for graph {h.get('fingerprint') if isinstance(h, dict) else '?'}"
                          f", not {graph.fingerprint}")
    try:
        grouping = Grouping(op_group=a["op_group"], num_groups=int(h["num_groups"]), features=a["features"],
                            cpu_only=a["cpu_only"], adjacency=a["adjacency"], op_cpu_only=a["op_cpu_only"],
                            group_cost=a["group_cost"], feature_names=tuple(h.get("feature_names", ())))
        return graph, cluster, a["cost"], grouping, h
    except (KeyError, TypeError, ValueError) as e:      # an array or a header key missing
        raise SearchError(f"{run_dir / RUN_PROBLEM} is incomplete or corrupt ({type(e).__name__}: {e})") from None


def moved_off(problem: PlacementProblem, old: np.ndarray, keep: list[int]) -> np.ndarray:
    """The quick fix of a placement after device loss: every group that had an op on a lost device goes, whole,
    to the least-loaded surviving device it may use whose memory still holds it (by an additive estimate: the
    group's variables and outputs); the other ops keep their devices. Returns an op→device placement over the
    survivors (`problem.cluster`)."""
    gr, cost = problem.grouping, problem.cost
    new_of = {o: k for k, o in enumerate(keep)}
    lost = np.array([int(d) not in new_of for d in old])
    out = np.array([new_of.get(int(d), -1) for d in old], np.int64)
    D = problem.cluster.num_devices
    load = np.zeros(D)
    np.add.at(load, out[~lost], np.where(np.isfinite(cost[np.flatnonzero(~lost), out[~lost]]),
                                         cost[np.flatnonzero(~lost), out[~lost]], 0.0))
    mem_op = np.asarray(problem.graph.persistent_bytes, np.float64) + np.asarray(problem.graph.out_bytes, np.float64)
    used = np.zeros(D)
    np.add.at(used, out[~lost], mem_op[~lost])
    cap = np.array([d.capacity_bytes for d in problem.cluster.devices], np.float64)
    groups = np.unique(gr.op_group[lost])
    gcost = np.bincount(gr.op_group, weights=np.nan_to_num(cost.min(axis=1), posinf=0.0), minlength=gr.num_groups)
    for g in groups[np.argsort(-gcost[groups])]:          # heaviest first
        ops = np.flatnonzero(gr.op_group == g)
        need = float(mem_op[ops].sum())
        allowed = np.flatnonzero(problem.allowed[g])
        fits = [d for d in allowed if used[d] + need <= cap[d]]
        pool = fits or list(allowed)
        d = min(pool, key=lambda j: (load[j], -(cap[j] - used[j])))
        out[ops] = d
        load[d] += float(np.nan_to_num(cost[ops, d], posinf=0.0).sum())
        used[d] += need
    if problem.cluster.cpu_index is not None:
        out[np.asarray(gr.op_cpu_only, bool)] = problem.cluster.cpu_index
    return out


def replace(run, exclude, *, budget_seconds: float = 60, out_dir=None, seed: int | None = None,
            progress: bool = False, config=None, max_updates: int | None = None, evaluator=None,
            reward: str = "sim", dropped: list | None = None, model_name: str | None = None,
            max_evaluations: int | None = None) -> SearchResult:
    """Re-place a finished (or killed) search's graph onto the devices left when `exclude` are lost.

    `run`: the search's output directory, or the SearchResult of a search (of `place()`, `search()` or this
    function; without a directory, its `run` memory: the problem and the final policy). First, before
    any learning, the quick answer: the best (simulated) of the old placement with the lost devices' groups moved
    to the least-loaded survivor that holds them (`moved_off`) and of every baseline recomputed on the
    survivors. Then a search of `budget_seconds` on the survivors starting from the run's policy (its device
    softmax restricted to the survivors; `Search.restore_policy`), or, when the policy cannot be restored, a cold
    search (said in `extra["notice"]`). Returns the SearchResult; `extra` holds `excluded`, `quick_s`,
    `quick_wall_s`, `quick_source`, `restored` and `notice`. Writes the usual files into `out_dir`, with
    "excluded" and "quick_s" in summary.json.

    `evaluator` (with `reward="measure"`): a measured evaluator over the survivors (a measured search that lost a
    device: `_drop_and_replace`); its devices must be the survivors'. The quick answer stays simulated."""
    from placer.problem import build_problem, cluster_without
    from placer.grouped import group_majority
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search

    t0 = time.perf_counter()
    memory = None       # a SearchResult whose search wrote no directory: its problem and policy, in memory
    if isinstance(run, SearchResult) and not run.extra.get("out_dir"):
        if run.run is None:
            raise SearchError("re-placement needs the search's directory or the SearchResult of a search: call "
                              "place(..., out_dir=DIR) or pass DIR")
        memory = run.run
    run_dir = Path(run.extra.get("out_dir") or "") if isinstance(run, SearchResult) else Path(run)
    if isinstance(exclude, str):
        exclude = [x for x in exclude.split(",") if x.strip()]
    if not exclude:
        raise SearchError("name the lost devices to exclude, e.g. --exclude /GPU:3")
    if memory is not None:
        graph, cluster, cost, grouping = memory.graph, memory.cluster, memory.cost, memory.grouping
        h = {"seed": memory.seed, "allow_cpu": memory.allow_cpu}
    else:
        graph, cluster, cost, grouping, h = load_run_problem(run_dir)
    survivors, keep = cluster_without(cluster, exclude)
    if survivors.cpu_index is None and graph.cpu_only.any():    # said first, not as "no placement fits"
        cpu = np.flatnonzero(graph.cpu_only)
        more = f" and {len(cpu) - 1} other op(s)" if len(cpu) > 1 else ""
        raise ClusterError(f"cannot exclude the host CPU ({', '.join(exclude)}): op {graph.names[cpu[0]]!r} "
                           f"({graph.types[cpu[0]]}){more} of {graph.name!r} run only on the CPU")
    seed = int(h.get("seed", 0)) if seed is None else int(seed)
    problem = build_problem(graph, survivors, costs=np.ascontiguousarray(cost[:, keep]), grouping=grouping, seed=seed,
                            allow_cpu=bool(h.get("allow_cpu", False)))
    try:
        from placer.placement import Placement

        old = (run.placement if memory is not None else Placement.load(run_dir / "placement.json")) \
            .to_indices(graph, cluster.device_names)
        cands = {"moved": moved_off(problem, old, keep), **problem.baselines}
        outs = problem.simulator.evaluate(list(cands.values()))
        ok = {k: o.step_time for k, o in zip(cands, outs) if o.ok and np.isfinite(o.step_time)}
        if not ok:
            reasons = "; ".join(f"{k}: {o.reason}" for k, o in list(zip(cands, outs))[:3])
            raise SearchError(f"no placement of {graph.name!r} fits on the survivors "
                              f"({', '.join(survivors.device_names)}): {reasons}")
        quick_source = min(ok, key=ok.get)
        quick_s, quick_wall = float(ok[quick_source]), time.perf_counter() - t0
        log.info("quick answer after losing %s: %s, %.4g s (%.1f s)", exclude, quick_source, quick_s, quick_wall)
        if evaluator is not None and list(evaluator.devices) != list(survivors.device_names):
            raise SearchError(f"the evaluator's devices {list(evaluator.devices)} are not the survivors' "
                              f"{survivors.device_names}")
        ev = evaluator if evaluator is not None else problem.simulator
        s = Search(problem.grouping, ev, cpu_index=survivors.cpu_index, allowed=problem.allowed,
                   baselines=cands, config=config or ReinforceConfig.for_reward(reward, seed=seed), seed=seed,
                   out_dir=Path(out_dir) if out_dir is not None else None, progress=progress,
                   device_capacity=[d.capacity_bytes for d in survivors.devices], screen=_screen(problem, ev))
        if memory is None:
            why = s.restore_policy(run_dir / "checkpoint", keep)
        elif memory.policy is None:
            why = "its search made no update"
        else:
            why = s.restore_policy_state(memory.policy, keep)
        notice = None
        if why is None:
            s.start_groups = group_majority(cands[quick_source], grouping.op_group, grouping.num_groups,
                                            survivors.num_devices)
        else:
            notice = f"the run's policy could not be restored ({why}): searching cold"
            log.warning("re-placement: %s", notice)
        watch = _watched(ev, reward, s) if evaluator is not None else None
        res = s.run(budget_seconds, max_updates=max_updates, max_evaluations=max_evaluations)
        result = _result(problem, res, t0, Path(out_dir) if out_dir is not None else None,
                         excluded=list(exclude), quick_s=quick_s, quick_wall_s=quick_wall, quick_source=quick_source,
                         restored=why is None, notice=notice, **({"dropped": dropped} if dropped else {}))
        extra = result.extra
        if model_name is None and memory is not None:
            model_name = graph.name
        if model_name is None:
            try:
                model_name = json.loads((run_dir / "summary.json").read_text()).get("model") or graph.name
            except (OSError, ValueError):
                model_name = graph.name
        if watch is not None and res.stop_reason == "devices_lost":     # another device died: drop it too
            return _drop_and_replace(problem, evaluator, watch, res, result, t0,
                                     Path(out_dir) if out_dir is not None else None, budget_seconds, seed,
                                     model_name, progress, config, dropped=dropped, max_updates=max_updates)
        if evaluator is not None and reward == "measure":
            confirm_best(problem, evaluator, res, result)
        if out_dir is not None:
            write_outputs(Path(out_dir), problem, res, result, reward=reward, seed=seed, model_name=model_name,
                          more={k: extra[k] for k in ("excluded", "quick_s", "quick_wall_s", "quick_source",
                                                      "restored", "notice", "dropped") if k in extra})
        return _remember(result, problem, seed, s)
    finally:
        problem.close()
