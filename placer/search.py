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

from placer.errors import PlacerError, SearchError
from placer.placement import Placement, tf_version
from placer.problem import PlacementProblem

log = logging.getLogger(__name__)

REMEASURE_TOP = 3


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


def versions() -> dict[str, str]:
    from placer._version import __version__

    return {"placer": __version__, "tensorflow": tf_version()}


def search(problem: PlacementProblem, evaluator=None, *, reward: str = "sim", budget_seconds: float = 300,
           seed: int | None = None, config=None, out_dir=None, progress: bool = False,
           max_updates: int | None = None, patience: int | None = None, resume: bool = False,
           remeasure: bool = True, model_name: str | None = None) -> SearchResult:
    """Search a placement for `problem`. `evaluator` scores placements (default: the problem's simulator; a
    runtime evaluator for measured rewards, whose devices must be the problem's). `reward` labels the summary
    ("sim" or "measure"). Writes the files of CLI.md into `out_dir` when given; `resume` continues the search
    checkpointed there."""
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search

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
    cluster, grouping = problem.cluster, problem.grouping
    out = Path(out_dir) if out_dir is not None else None
    s = Search(grouping, evaluator, cpu_index=cluster.cpu_index, allowed=problem.allowed,
               baselines=problem.baselines, config=config or ReinforceConfig(seed=seed), seed=seed, out_dir=out,
               progress=progress, device_capacity=[d.capacity_bytes for d in cluster.devices])
    if resume and (out is None or not s.load_checkpoint()):
        raise SearchError(f"no checkpoint to resume in {out / 'checkpoint' if out else '(no directory)'}")
    res = s.run(budget_seconds, max_updates=max_updates, patience=patience)
    baselines: dict[str, float | None] = {k: None for k in problem.baseline_errors}
    baselines.update(res.baselines)
    extra: dict[str, Any] = {
        "source": res.source, "updates": res.updates, "stop_reason": res.stop_reason, "groups": grouping.num_groups,
        "devices": cluster.device_names, "cost_source": problem.cost_source,
        "baseline_errors": {**problem.baseline_errors, **res.baseline_failures}, "failure_step_time_s": res.failure_step_time,
        "search_wall_s": res.wall_s, "total_wall_s": time.perf_counter() - t0, "config": s.config.to_dict(),
    }
    if remeasure and reward == "sim" and problem.devices is not None:
        extra["measured"] = remeasure_best(problem, res)
    result = SearchResult(placement=problem.placement(res.placement), step_time=float(res.step_time),
                          search_best=float(res.search_best), baselines=baselines, lower_bound=problem.lower_bound,
                          history=res.history, evaluations=res.evaluations, wall_s=float(res.wall_s), extra=extra)
    if out is not None:
        write_outputs(out, problem, res, result, reward=reward, seed=seed, model_name=model_name or problem.graph.name)
    return result


def remeasure_best(problem: PlacementProblem, res) -> list[dict]:
    """Measure the returned, the policy's best and the best baseline placements on the problem's real devices."""
    cands: list[tuple[str, np.ndarray]] = [("returned", res.placement)]
    if res.search_best_placement is not None:
        cands.append(("search_best", res.search_best_placement))
    ok = {k: v for k, v in res.baselines.items() if v is not None and k in problem.baselines}
    if ok:
        b = min(ok, key=ok.get)
        cands.append((f"baseline:{b}", problem.baselines[b]))
    uniq: list[tuple[str, np.ndarray]] = []
    for name, p in cands:
        if not any(np.array_equal(p, q) for _, q in uniq):
            uniq.append((name, p))
    uniq = uniq[:REMEASURE_TOP]
    try:
        from placer.runtime import make_evaluator

        with make_evaluator(problem.graph, problem.devices) as ev:
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
                  model_name: str) -> None:
    """placement.json, placed.meta, trace.json and summary.json (curve.png, tb/ and checkpoint/ are written by
    the search loop)."""
    from placer.sim.trace import write_trace

    graph, cluster = problem.graph, problem.cluster
    out.mkdir(parents=True, exist_ok=True)
    result.placement.save(out / "placement.json")
    try:
        placed = result.placement.apply(graph)
        tmp = out / "placed.meta.tmp"
        tmp.write_bytes(placed.SerializeToString())
        os.replace(tmp, out / "placed.meta")
    except PlacerError as e:
        log.warning("placed.meta not written: %s", e)
        result.extra["placed_meta_error"] = str(e)
    try:
        write_trace(out / "trace.json", graph, cluster, problem.simulator.sim.simulate(res.placement, trace=True))
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
        "ratio_to_lower_bound": float(result.step_time / result.lower_bound) if result.lower_bound > 0 else None,
    }
    if "measured" in x:
        summary["measured"] = x["measured"]
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, out / "summary.json")
