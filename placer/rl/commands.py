"""`placer search` (CLI.md) and `search_graph`, the engine behind `placer.place()`.

    placer search --model nmt4 --cluster 4xK80 --budget 600 --out runs/nmt4
    placer search --resume runs/nmt4          # continue a killed/finished search (its args are in DIR/args.json)

DIR holds placement.json, placed.meta, summary.json, trace.json, curve.png, tb/, checkpoint/ (and args.json).
With `--devices` and `--reward sim`, the best few placements are re-measured on those devices at the end and
summary.json gains "measured": [{"source", "simulated_s", "measured_s", ...}].
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from placer.errors import PlacerError, SearchError
from placer.rl.search import _fmt_bytes

log = logging.getLogger(__name__)

ARGS_FILE = "args.json"
# args stored for --resume (everything `placer search` reads)
_RESUME_KEYS = ("graph", "model", "size", "batch_size", "fetch", "cluster", "devices", "reward", "workers",
                "token_file", "costs", "budget", "max_updates", "patience", "groups", "seed", "out", "no_progress",
                "json", "remeasure")
REMEASURE_TOP = 3


def _versions() -> dict[str, str]:
    from placer import __version__
    from placer.api import _tf_version

    return {"placer": __version__, "tensorflow": _tf_version()}


def group_allowed(grouping, cost: np.ndarray, cpu_index: int | None) -> np.ndarray:
    """bool[G, D]: CPU-only groups on the CPU only, and no group on a device where one of its ops has no
    kernel (infinite cost)."""
    G, D = grouping.num_groups, cost.shape[1]
    allowed = grouping.allowed_mask(D, cpu_index) if hasattr(grouping, "allowed_mask") else np.ones((G, D), bool)
    runnable = np.ones((G, D), bool)
    bad_op, bad_dev = np.nonzero(~np.isfinite(cost))
    runnable[grouping.op_group[bad_op], bad_dev] = False
    both = allowed & runnable
    empty = ~both.any(axis=1)
    both[empty] = allowed[empty]      # keep the grouping's rule if nothing is left (the simulator will say why)
    return both


def _check_total_memory(graph, cluster, usable: list[int]) -> None:
    """The model's variables must fit in the usable devices' memory taken together (even split): else no
    search, and an error naming the memory needed against what the devices hold."""
    need = float(np.asarray(graph.persistent_bytes, np.float64).sum())
    devs = [cluster.devices[i] for i in usable]
    have = float(sum(d.capacity_bytes for d in devs))
    if need > have:
        raise SearchError(f"graph {graph.name!r} needs at least {_fmt_bytes(need)} for its variables, but the "
                          f"devices it may use on {cluster.name} hold {_fmt_bytes(have)} together "
                          f"({', '.join(f'{d.name} {_fmt_bytes(d.capacity_bytes)}' for d in devs)})")


def _baselines(graph, cluster, costs, seed: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every baseline of placer.baselines that builds (name → op placement) and why the others did not."""
    try:
        from placer.baselines import BASELINES, run_baseline
    except ImportError:  # baselines not installed: the single-device placement only
        from placer.api import single_placement

        return {"single_gpu": single_placement(graph, cluster)}, {}
    out, errors = {}, {}
    for name in BASELINES:
        try:
            out[name] = run_baseline(name, graph, cluster, costs=costs, seed=seed)
        except PlacerError as e:
            errors[name] = str(e)
            log.info("baseline %s cannot be built: %s", name, e)
    return out, errors


def search_graph(graph, *, cluster=None, devices=None, reward: str = "sim", budget_seconds: float = 300,
                 seed: int = 0, workers=None, costs=None, max_groups: int | None = None, out_dir=None,
                 progress: bool = False, max_updates: int | None = None, patience: int | None = None,
                 token_file: str | None = None, resume: bool = False, remeasure: bool = True, config=None,
                 model_name: str | None = None, allow_cpu: bool = False):
    """Search a placement for the OpGraph `graph`; returns `placer.api.SearchResult`. Writes the files of
    CLI.md into `out_dir` when given (see the module docstring). allow_cpu: let groups that are not CPU-only
    use the host CPU too (off by default: on GPU clusters the CPU is a slow trap that never runs out of
    memory, and CLI.md's "N devices" are the GPUs)."""
    from placer.api import Placement, SearchResult
    from placer.graphs.group import default_max_groups, group
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.sim.cluster import Cluster, cluster_from_devices, parse_cluster
    from placer.sim.costs import load_or_analytical
    from placer.sim.simulator import SimEvaluator

    if reward not in ("sim", "measure"):
        raise SearchError(f"unknown reward {reward!r}: use sim or measure")
    if budget_seconds is None or not budget_seconds > 0:
        raise SearchError(f"search budget must be positive, got {budget_seconds} s "
                          "(use --max-updates 0 to only evaluate the baselines)")
    t0 = time.perf_counter()
    if cluster is None and devices is None:
        raise SearchError("give a cluster (simulated hardware, e.g. 4xK80) or devices (real, e.g. cpu:2)")
    if cluster is None:
        cluster = cluster_from_devices(devices)
    elif not isinstance(cluster, Cluster):
        cluster = parse_cluster(cluster)
    if costs is None or isinstance(costs, (str, os.PathLike)):
        costs = load_or_analytical(graph, cluster, costs)
    sim = SimEvaluator(graph, cluster, costs)
    cost_source = str(sim.sim.cost_source)
    lower_bound = float(sim.lower_bound())
    gpus = cluster.gpu_indices
    _check_total_memory(graph, cluster, list(range(cluster.num_devices)) if allow_cpu else sorted(set(gpus)))

    G = int(max_groups) if max_groups else default_max_groups(len(gpus))
    grouping = group(graph, max_groups=G, op_costs=np.where(np.isfinite(sim.sim.cost[:, gpus[0]]),
                                                            sim.sim.cost[:, gpus[0]], 0.0))
    allowed = group_allowed(grouping, sim.sim.cost, cluster.cpu_index)
    cpu = cluster.cpu_index
    if not allow_cpu and cpu is not None and cpu not in gpus:
        # "N devices" are the accelerators (CLI.md): only CPU-only groups go to the host CPU, unless asked
        off = allowed.copy()
        off[~np.asarray(grouping.cpu_only, bool), cpu] = False
        keep = off.any(axis=1)
        allowed[keep] = off[keep]
    base_pl, base_err = _baselines(graph, cluster, sim.sim.cost, seed)

    evaluator = sim
    if reward == "measure":
        from placer.runtime import make_evaluator

        names = devices if devices is not None else cluster.device_names
        evaluator = make_evaluator(graph, names, workers=workers, token_file=token_file)
        if list(evaluator.devices) != list(cluster.device_names):
            raise SearchError(f"measuring devices {list(evaluator.devices)} do not match the cluster's "
                              f"{cluster.device_names}")
    try:
        out = Path(out_dir) if out_dir is not None else None
        s = Search(grouping, evaluator, cpu_index=cluster.cpu_index, allowed=allowed, baselines=base_pl,
                   config=config or ReinforceConfig(seed=seed), seed=seed, out_dir=out, progress=progress,
                   device_capacity=[d.capacity_bytes for d in cluster.devices])
        if resume:
            if out is None or not s.load_checkpoint():
                raise SearchError(f"no checkpoint to resume in {out / 'checkpoint' if out else '(no directory)'}")
        res = s.run(budget_seconds, max_updates=max_updates, patience=patience)
    finally:
        if evaluator is not sim:
            evaluator.close()
    baselines: dict[str, float | None] = {k: None for k in base_err}
    baselines.update(res.baselines)
    placement = Placement.from_indices(graph, cluster.device_names, res.placement)
    extra: dict[str, Any] = {
        "source": res.source, "updates": res.updates, "stop_reason": res.stop_reason, "groups": grouping.num_groups,
        "devices": cluster.device_names, "cost_source": cost_source, "baseline_errors": base_err,
        "failure_step_time_s": res.failure_step_time, "search_wall_s": res.wall_s,
        "total_wall_s": time.perf_counter() - t0, "config": s.config.to_dict(),
    }
    measured = None
    if remeasure and reward == "sim" and devices is not None:
        measured = _remeasure(graph, devices, sim, res, base_pl)
        extra["measured"] = measured
    result = SearchResult(placement=placement, step_time=float(res.step_time),
                          search_best=float(res.search_best), baselines=baselines, lower_bound=lower_bound,
                          history=res.history, evaluations=res.evaluations, wall_s=float(res.wall_s), extra=extra)
    if out is not None:
        _write_outputs(out, graph, cluster, sim, res, result, reward=reward, seed=seed,
                       model_name=model_name or graph.name)
    sim.close()
    return result


def _remeasure(graph, devices, sim, res, base_pl) -> list[dict]:
    """Measure the returned, the policy's best and the best baseline placements on the real devices."""
    cands: list[tuple[str, np.ndarray]] = [("returned", res.placement)]
    if res.search_best_placement is not None:
        cands.append(("search_best", res.search_best_placement))
    ok = {k: v for k, v in res.baselines.items() if v is not None and k in base_pl}
    if ok:
        b = min(ok, key=ok.get)
        cands.append((f"baseline:{b}", base_pl[b]))
    uniq: list[tuple[str, np.ndarray]] = []
    for name, p in cands:
        if not any(np.array_equal(p, q) for _, q in uniq):
            uniq.append((name, p))
    uniq = uniq[:REMEASURE_TOP]
    try:
        from placer.runtime import make_evaluator

        with make_evaluator(graph, devices) as ev:
            outs = ev.evaluate([p for _, p in uniq])
    except PlacerError as e:
        log.warning("re-measuring on %s failed: %s", devices, e)
        return [{"source": n, "error": str(e)} for n, _ in uniq]
    rows = []
    for (name, p), o in zip(uniq, outs):
        s = sim.evaluate([p])[0]
        rows.append({"source": name, "simulated_s": None if s.failed else float(s.step_time),
                     "measured_s": None if o.failed or not np.isfinite(o.step_time) else float(o.step_time),
                     "error": o.reason if o.failed else None})
    return rows


def _write_outputs(out: Path, graph, cluster, sim, res, result, *, reward: str, seed: int, model_name: str) -> None:
    from placer.sim.trace import write_trace

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
        write_trace(out / "trace.json", graph, cluster, sim.sim.simulate(res.placement, trace=True))
    except PlacerError as e:
        log.warning("trace.json not written: %s", e)
    fin = lambda x: None if x is None or not np.isfinite(x) else float(x)  # noqa: E731
    summary = {
        "model": model_name, "cluster": cluster.name, "step_time_s": float(result.step_time),
        "search_best_s": fin(result.search_best), "lower_bound_s": float(result.lower_bound),
        "baselines": {k: fin(v) for k, v in result.baselines.items()}, "evaluations": int(result.evaluations),
        "wall_s": float(result.wall_s), "seed": int(seed), "reward": reward,
        "cost_source": result.extra.get("cost_source", ""), "versions": _versions(),
        # extra keys
        "source": result.extra["source"], "updates": int(result.extra["updates"]),
        "stop_reason": result.extra["stop_reason"], "groups": int(result.extra["groups"]),
        "devices": cluster.device_names, "ratio_to_lower_bound": float(result.step_time / result.lower_bound)
        if result.lower_bound > 0 else None,
    }
    if "measured" in result.extra:
        summary["measured"] = result.extra["measured"]
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, out / "summary.json")


# ---------------------------------------------------------------------------------------------- CLI
def _save_args(out: Path, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    d = {k: getattr(args, k, None) for k in _RESUME_KEYS}
    (out / ARGS_FILE).write_text(json.dumps(d, indent=1))


def _load_args(out: Path, args):
    p = out / ARGS_FILE
    if not p.exists():
        raise SearchError(f"{out} is not a search directory (no {ARGS_FILE}); start one with --out DIR")
    try:
        d = json.loads(p.read_text())
    except ValueError as e:
        raise SearchError(f"{p} is not valid JSON: {e}") from None
    for k, v in d.items():
        setattr(args, k, v)
    args.out = str(out)
    return args


def run_search(args) -> int:
    """`placer search` (see CLI.md)."""
    from placer.graphs import load_from_args

    resume = bool(getattr(args, "resume", None))
    if resume:
        # flags without a default given with --resume override the stored ones (e.g. --max-updates 100)
        override = {k: getattr(args, k, None) for k in ("max_updates", "patience")}
        override.update({k: True for k in ("json", "no_progress") if getattr(args, k, False)})
        args = _load_args(Path(args.resume), args)
        for k, v in override.items():
            if v is not None:
                setattr(args, k, v)
    if not getattr(args, "out", None):
        raise SearchError("give --out DIR for the search's files (or --resume DIR)")
    if not (getattr(args, "cluster", None) or getattr(args, "devices", None)):
        raise SearchError("give --cluster SPEC (simulated hardware, e.g. 4xK80) or --devices LIST (e.g. cpu:2)")
    if args.reward == "measure" and not (args.devices or args.workers):
        raise SearchError("--reward measure needs real devices: --devices LIST (local) or --workers ADDR,...")
    budget = float(args.budget)
    if not budget > 0:
        raise SearchError(f"--budget must be positive, got {args.budget} (use --max-updates 0 to only "
                          "evaluate the baselines)")
    out = Path(args.out)
    if not resume:
        if (out / "checkpoint").exists():
            raise SearchError(f"{out} already holds a search; continue it with --resume {out} or pick another --out")
        _save_args(out, args)
    graph = load_from_args(args)
    cluster = args.cluster if args.cluster else None
    devices = None if args.cluster else args.devices
    if args.cluster and args.reward == "measure" and args.devices:
        devices = args.devices
    res = search_graph(graph, cluster=cluster, devices=devices, reward=args.reward, budget_seconds=budget,
                       seed=int(args.seed or 0), workers=args.workers, costs=getattr(args, "costs", None),
                       max_groups=args.groups, out_dir=out, progress=not args.no_progress,
                       max_updates=args.max_updates, patience=args.patience, token_file=args.token_file,
                       resume=resume, remeasure=getattr(args, "remeasure", True) is not False,
                       model_name=args.model or graph.name)
    summary = json.loads((out / "summary.json").read_text())
    if getattr(args, "json", False):
        from placer.cli import print_json

        print_json(summary)
        return 0
    _print_summary(summary, out)
    return 0


def _print_summary(s: dict, out: Path) -> None:
    ms = lambda x: "   n/a" if x is None else f"{x * 1e3:10.3f} ms"  # noqa: E731
    print(f"search {s['model']} on {s['cluster']}: {s['updates']} updates, {s['evaluations']} evaluations, "
          f"{s['wall_s']:.0f} s ({s['stop_reason']}), reward {s['reward']}, costs {s['cost_source']}")
    print(f"  returned placement {ms(s['step_time_s'])}   (from {s['source']})")
    print(f"  policy's own best  {ms(s['search_best_s'])}")
    print(f"  lower bound        {ms(s['lower_bound_s'])}")
    for k, v in sorted(s["baselines"].items(), key=lambda kv: (kv[1] is None, kv[1] or 0)):
        print(f"  {k:<18} {ms(v)}" + ("   (out of memory / not built)" if v is None else ""))
    for m in s.get("measured", []):
        print(f"  measured {m['source']:<14} simulated {ms(m.get('simulated_s'))}   measured {ms(m.get('measured_s'))}")
    print(f"  files in {out}/: placement.json placed.meta summary.json trace.json curve.png tb/ checkpoint/")
