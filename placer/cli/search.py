"""`placer search` (CLI.md): the command-line glue over `placer.problem.build_problem` and `placer.search.search`.

    placer search --model nmt4 --cluster 4xK80 --budget 600 --out runs/nmt4
    placer search --resume runs/nmt4          # continue a killed/finished search (its args are in DIR/args.json)

DIR holds placement.json, placed.meta, summary.json, trace.json, curve.png, tb/, checkpoint/ (and args.json).
With `--devices` and `--reward sim`, the best few placements are re-measured on those devices at the end and
summary.json gains "measured": [{"source", "simulated_s", "measured_s", ...}].
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from placer.errors import SearchError

ARGS_FILE = "args.json"
DEFAULT_BUDGET = 300.0      # `placer search --budget` (CLI.md)
# args stored for --resume (everything `placer search` reads)
_RESUME_KEYS = ("graph", "model", "size", "batch_size", "fetch", "cluster", "devices", "reward", "workers",
                "token_file", "tls_ca", "costs", "budget", "max_updates", "max_evaluations", "patience", "groups",
                "seed", "out", "no_progress", "json", "remeasure", "warmup", "runs", "timeout", "policy",
                "split_groups", "precision", "layers", "local_moves", "merge_share", "cluster_share")
# what `--resume DIR` may change; every other stored flag given again must match the stored search
_RESUME_OVERRIDES = ("budget", "max_updates", "max_evaluations", "patience", "json", "no_progress", "out")


def _save_args(out: Path, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    d = {k: getattr(args, k, None) for k in _RESUME_KEYS}
    (out / ARGS_FILE).write_text(json.dumps(d, indent=1))


def _load_args(out: Path, args):
    p = out / ARGS_FILE
    if not p.exists() and (out / "checkpoint").is_dir():     # placer.place(out_dir=...) writes no args.json
        raise SearchError(f"{out} holds a checkpoint but no {ARGS_FILE} (the flags `placer search --out` stores; "
                          f"the library's place(out_dir=...) writes none), so --resume cannot rebuild its search")
    if not p.exists():
        raise SearchError(f"{out} is not a search directory (no {ARGS_FILE}); start one with --out DIR")
    try:
        d = json.loads(p.read_text())
    except ValueError as e:
        raise SearchError(f"{p} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise SearchError(f"{p} is not the {ARGS_FILE} of a search (expected a JSON object of its flags)")
    _check_stored_values(p, d)
    _check_resume_flags(out, args, d)
    for k, v in d.items():
        setattr(args, k, v)
    args.out = str(out)
    return args


def _check_stored_values(path: Path, stored: dict) -> None:
    """Each flag stored in an args.json must be a value `placer search` could have parsed for it (a damaged or
    hand-edited file made --resume fail later with a traceback, e.g. float("abc") for the budget): SearchError
    naming the file, the key and the flag."""
    import argparse

    from placer.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["search"]
    for a in sub._actions:
        v = stored.get(a.dest)
        if v is None or a.dest == "help":
            continue
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            ok = isinstance(v, bool)
        elif isinstance(a, argparse._AppendAction):
            ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
        else:
            ok = isinstance(v, (str, int, float)) and not isinstance(v, bool) and (a.type is not None or
                                                                                  isinstance(v, str))
            try:
                ok = ok and (a.type is None or a.type(str(v)) is not None) and (not a.choices or v in a.choices)
            except (argparse.ArgumentTypeError, ValueError, TypeError):
                ok = False
        if not ok:
            flag = a.option_strings[0] if a.option_strings else a.dest.upper()
            raise SearchError(f"{path}: \"{a.dest}\": {json.dumps(v)} is no value of {flag}: the file is damaged; "
                              f"start a new search with --out")


def _check_resume_flags(out: Path, args, stored: dict) -> None:
    """A flag given with `--resume DIR` that the stored search fixes (the graph, the cluster, the seed...) and
    that differs from it is an error naming the flag (it was silently ignored): the resumed search is the one in
    DIR. `--out` may only name DIR itself."""
    from placer.cli import build_parser

    given_out = getattr(args, "out", None)
    if given_out and Path(given_out).resolve() != out.resolve():
        raise SearchError(f"--out {given_out}: --resume {out} writes its files in {out}; to search again "
                          f"elsewhere, start a new search with --out")
    defaults = vars(build_parser().parse_args(["search"]))
    explicit = getattr(args, "given", None)      # `main` records the flags given (None: args built in code)
    for k, v in stored.items():
        if k in _RESUME_OVERRIDES or k not in defaults or not hasattr(args, k):
            continue
        given = getattr(args, k)
        if (k in explicit if explicit is not None else given != defaults[k]) and given != v:
            flag = "GRAPH" if k == "graph" else "--" + k.replace("_", "-")
            raise SearchError(f"{flag} {given}: the search in {out} ran with {v!r}; --resume continues it as it "
                              f"was (only --budget, --max-updates, --max-evaluations and --patience change): start a "
                              f"new search with --out for other settings")


def _need_hardware(args) -> None:
    if not (getattr(args, "cluster", None) or getattr(args, "devices", None)):
        raise SearchError("give --cluster SPEC (simulated hardware, e.g. 4xK80) or --devices LIST (e.g. cpu:2)")


def run_search(args) -> int:
    """`placer search` (see CLI.md)."""
    from placer.cli import flag_or, load_from_args, out_dir

    resume = bool(getattr(args, "resume", None))
    if resume:
        # flags without a default given with --resume override the stored ones (e.g. --max-updates 100)
        override = {k: getattr(args, k, None) for k in ("budget", "max_updates", "max_evaluations", "patience")}
        override.update({k: True for k in ("json", "no_progress") if getattr(args, k, False)})
        args = _load_args(Path(args.resume), args)
        for k, v in override.items():
            if v is not None:
                setattr(args, k, v)
    if not getattr(args, "out", None):
        raise SearchError("give --out DIR for the search's files (or --resume DIR)")
    if args.budget is None:
        args.budget = DEFAULT_BUDGET
    _need_hardware(args)
    timing = sorted({"warmup", "runs", "timeout"} & getattr(args, "given", set()))
    if timing and args.reward != "measure" and not args.devices:      # they would be silently unused
        raise SearchError(f"--{timing[0]} sets how placements are measured (--reward measure): a search on "
                          f"--cluster {args.cluster} only simulates them")
    from placer.runtime import no_auth_without_workers

    tls_ca = getattr(args, "tls_ca", None)
    no_auth_without_workers(args.workers, token_file=args.token_file, tls_ca=tls_ca)
    if args.reward == "measure" and not (args.devices or args.workers):
        raise SearchError("--reward measure needs real devices: --devices LIST (local) or --workers ADDR,...")
    budget = float(args.budget)
    if not budget > 0:
        raise SearchError(f"--budget must be positive, got {args.budget} (use --max-updates 0 to only "
                          "evaluate the baselines)")
    if getattr(args, "local_moves", None) is not None and args.local_moves < 0:
        raise SearchError(f"--local-moves must be 0 or more, got {args.local_moves}")
    from placer.rl.reinforce import ReinforceConfig

    merge, clus = getattr(args, "merge_share", None), getattr(args, "cluster_share", None)
    top = 1.0 - ReinforceConfig().local_attract_prob
    for flag, v in (("--merge-share", merge), ("--cluster-share", clus)):
        if v is not None and not 0.0 <= v <= top:
            raise SearchError(f"{flag} must be between 0 and {top:g} (the chain's moves left after its "
                              f"attraction moves), got {v}")
    if merge is not None and clus is not None and merge + clus > top:
        raise SearchError(f"--merge-share + --cluster-share must be at most {top:g} (the chain's moves left after "
                          f"its attraction moves), got {merge:g} + {clus:g}")
    weights = None
    if getattr(args, "policy", None):
        from placer.search import load_policy

        weights = load_policy(args.policy)     # a bad --policy fails now, not after the graph and the baselines
    out = out_dir(args.out)
    restart = False     # --resume of a search that stopped before its first checkpoint
    if resume:
        from placer.rl.search import CHECKPOINT_FILE, OLD_CHECKPOINT_FILE

        if not any((out / "checkpoint" / f).is_file() for f in (CHECKPOINT_FILE, OLD_CHECKPOINT_FILE)):
            # stopped before its first checkpoint (while importing the graph or evaluating the baselines): there
            # is nothing to continue from, so the search starts over with its stored flags
            print(f"placer search: notice: {out} holds no checkpoint yet (the search stopped before its first "
                  f"one): starting it over", file=sys.stderr)
            resume, restart = False, True
    if not resume:
        if not restart and (out / "checkpoint").exists():
            raise SearchError(f"{out} already holds a search; continue it with --resume {out} or pick another --out")
        _save_args(out, args)
    before = _last_summary(out) if resume else None
    graph = load_from_args(args)
    cluster = args.cluster if args.cluster else None
    devices = args.devices if args.devices else None
    from placer.problem import build_problem
    from placer.search import search

    from placer.runtime import workers_problem_target

    cluster, devices = workers_problem_target(graph, cluster, devices, workers=args.workers,
                                              token_file=args.token_file, tls_ca=tls_ca)
    problem = build_problem(graph, cluster, devices=devices, costs=getattr(args, "costs", None),
                            max_groups=args.groups, seed=int(args.seed or 0),
                            split_groups=getattr(args, "split_groups", None) or None)
    evaluator = None
    # how placements are measured: by a measured search, or after a simulated one on --devices (the re-measurement)
    measure_kw = {"warmup": int(flag_or(args, "warmup", 2)), "runs": int(flag_or(args, "runs", 5)),
              "timeout": float(flag_or(args, "timeout", 600.0))}
    try:
        if args.reward == "measure":
            from placer.runtime import make_evaluator

            evaluator = make_evaluator(graph, args.devices if args.devices else problem.device_names,
                                       workers=args.workers, token_file=args.token_file, tls_ca=tls_ca,
                                       **measure_kw)
        config = None
        overrides = {**({} if getattr(args, "local_moves", None) is None else {"local_moves": int(args.local_moves)}),
                     **({} if merge is None else {"local_merge_prob": float(merge)}),
                     **({} if clus is None else {"local_cluster_prob": float(clus)})}
        if overrides and not resume:     # on the defaults a search() of this kind takes (a fine-tune's with --policy)
            from placer.search import search_config

            config = search_config(args.reward, int(args.seed or 0), fine_tune=bool(getattr(args, "policy", None)),
                                   **overrides)
        search(problem, evaluator, reward=args.reward, budget_seconds=budget, seed=int(args.seed or 0), config=config,
               out_dir=out, progress=not args.no_progress, max_updates=args.max_updates, patience=args.patience,
               resume=resume, remeasure=getattr(args, "remeasure", True) is not False,
               model_name=args.model or graph.name, policy=weights,
               max_evaluations=getattr(args, "max_evaluations", None), measure_settings=measure_kw)
    finally:
        if evaluator is not None:
            evaluator.close()
        problem.close()
    summary = json.loads((out / "summary.json").read_text())
    if before is not None and summary["evaluations"] == before.get("evaluations"):
        print(f"placer search: notice: {_why_no_more(summary, args, out)}", file=sys.stderr)
    if getattr(args, "json", False):
        from placer.cli import print_json

        print_json(summary)
        return 0
    _print_summary(summary, out)
    return 0


def _last_summary(out: Path) -> dict | None:
    """The summary.json a finished run left in `out` (None: none, or unreadable)."""
    try:
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _why_no_more(summary: dict, args, out: Path) -> str:
    """One line: why `--resume` evaluated nothing more (the limit the run had already reached)."""
    reason = summary.get("stop_reason")
    flag = {"budget": "--budget", "max_updates": "--max-updates", "max_evaluations": "--max-evaluations",
            "patience": "--patience"}.get(reason)
    if flag is None:
        return f"the search in {out} has nothing more to search (stop: {reason})"
    spent = f" ({summary['wall_s']:.0f} s spent)" if reason == "budget" else ""
    return (f"the search in {out} had already reached {flag} {getattr(args, reason):g}{spent}, counted over its "
            f"runs: give a larger {flag} to continue it")


def run_replace(args) -> int:
    """`placer replace RUN_DIR --exclude DEV[,DEV...] --out DIR` (CLI.md)."""
    from placer.cli import out_dir
    from placer.search import replace

    out = out_dir(args.out)
    if (out / "checkpoint").exists():
        raise SearchError(f"{out} already holds a search; pick another --out")
    res = replace(args.run_dir, args.exclude, budget_seconds=float(args.budget), out_dir=out, seed=args.seed,
                  progress=not args.no_progress, max_updates=args.max_updates)
    summary = json.loads((out / "summary.json").read_text())
    if getattr(args, "json", False):
        from placer.cli import print_json

        print_json(summary)
        return 0
    if res.extra.get("notice"):
        print(f"notice: {res.extra['notice']}")
    print(f"quick answer after losing {', '.join(summary['excluded'])}: {summary['quick_s'] * 1e3:.3f} ms "
          f"({summary['quick_source']}, {summary['quick_wall_s']:.1f} s)")
    _print_summary(summary, out)
    return 0


def run_place(args) -> int:
    """`placer place --policy P (GRAPH | --model M) (--cluster C | --devices LIST) --out DIR`: the pretrained
    policy's zero-shot answer (the best of the placements it samples, batches of --samples for --sample-seconds, by
    the simulator, refined by local moves from it for --refine-seconds or --refine-moves, against the baselines),
    then --budget seconds of fine-tuning if asked. Writes placement.json and summary.json as `placer search` does
    (+ "zero_shot"). With --devices the cluster is built from those devices (as `placer search --devices`)."""
    import time

    from placer.cli import load_from_args, out_dir
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import load_policy, place_settings, search

    t0 = time.perf_counter()
    zero_shot = place_settings(args.samples, getattr(args, "sample_seconds", None),
                               getattr(args, "refine_seconds", None), getattr(args, "refine_moves", None),
                               flag=lambda name: "--" + name.replace("_", "-"))
    if args.budget < 0:
        raise SearchError(f"--budget must be 0 or more, got {args.budget}")
    _need_hardware(args)
    out = out_dir(args.out)
    if (out / "checkpoint").exists():
        raise SearchError(f"{out} already holds a search; pick another --out")
    weights = load_policy(args.policy)         # a bad policy fails before the graph is read
    graph = load_from_args(args)
    problem = build_problem(graph, args.cluster or None, devices=args.devices or None, costs=args.costs,
                            max_groups=args.groups, seed=args.seed, baselines=not args.no_baselines)
    try:
        res = search(problem, budget_seconds=args.budget if args.budget > 0 else 1.0, seed=args.seed,
                     config=ReinforceConfig(seed=args.seed, **zero_shot),
                     out_dir=out,
                     progress=not args.no_progress, max_updates=None if args.budget > 0 else 0, policy=weights,
                     model_name=args.model or graph.name)
    finally:
        problem.close()
    summary = json.loads((out / "summary.json").read_text())
    summary["place_wall_s"] = time.perf_counter() - t0
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if getattr(args, "json", False):
        from placer.cli import print_json

        print_json(summary)
        return 0
    z = res.extra.get("zero_shot", {})
    best, sampled = z.get("best_s"), z.get("sampled_best_s")
    refined = (f"; refined by {z.get('refine_evaluations', 0)} local moves to {best * 1e3:.3f} ms "
               f"({z.get('refine_s', 0):.1f} s)" if sampled is not None and best is not None else "")
    first = sampled if sampled is not None else best
    print(f"zero-shot: {z.get('samples', 0)} placements from {summary.get('policy')} "
          f"({z.get('evaluated', z.get('samples', 0))} distinct), {z.get('fits', 0)} fit, "
          f"best {'none' if first is None else f'{first * 1e3:.3f} ms'} ({z.get('wall_s', 0):.1f} s){refined}; "
          f"total {summary['place_wall_s']:.1f} s")
    _print_summary(summary, out)
    return 0


def run_pretrain(args) -> int:
    """`placer pretrain --out DIR [--budget S] [--corpus default|wide|parallel|quick]`."""
    from placer.cli import out_dir
    from placer.pretrain import pretrain

    share = float(getattr(args, "imitation_share", 0.3))
    if not 0.0 <= share < 1.0:
        raise SearchError(f"--imitation-share must be in [0, 1), got {share}")
    force = bool(getattr(args, "force", False))    # without it, pretrain() refuses a DIR holding a policy
    out_dir(args.out)
    info = pretrain(args.out, budget_seconds=float(args.budget), corpus=args.corpus, seed=int(args.seed),
                    progress=not args.no_progress, init=getattr(args, "init", None), imitation_share=share,
                    split_groups=getattr(args, "split_groups", None) or None,
                    teacher_seconds=float(getattr(args, "teacher_seconds", 0.0)), overwrite=force)
    if getattr(args, "json", False):
        from placer.cli import print_json

        print_json(info)
        return 0
    print(f"pretrained on {len(info['problems'])} problems ({info['corpus']} corpus, {len(info['skipped'])} skipped) "
          f"for {info['train_wall_s']:.0f} s ({info['updates']} updates; corpus built in {info['build_wall_s']:.0f} s)"
          f": {args.out}")
    for name, r in info["per_problem"].items():
        g = r["greedy_over_best_baseline"]
        print(f"  {name:34s} greedy / best baseline {g:.3f}" if np.isfinite(g) else f"  {name:34s} greedy fails")
    return 0


def _print_summary(s: dict, out: Path) -> None:
    ms = lambda x: "   n/a" if x is None else f"{x * 1e3:10.3f} ms"  # noqa: E731
    reused = f" ({s['repeats_looked_up']} repeated samples looked up)" if s.get("repeats_looked_up") else ""
    print(f"search {s['model']} on {s['cluster']}: {s['updates']} updates, {s['evaluations']} evaluations{reused}, "
          f"{s['wall_s']:.0f} s ({s['stop_reason']}), reward {s['reward']}, costs {s['cost_source']}")
    print(f"  returned placement {ms(s['step_time_s'])}   (from {s['source']})")
    print(f"  policy's own best  {ms(s['search_best_s'])}")
    print(f"  lower bound        {ms(s['lower_bound_s'])}")
    errors = s.get("baseline_errors", {})
    for k, v in sorted(s["baselines"].items(), key=lambda kv: (kv[1] is None, kv[1] or 0)):
        why = errors.get(k, "failed") if v is None else ""
        print(f"  {k:<18} {ms(v)}" + (f"   ({_first_line(why)})" if why else ""))
    for m in s.get("measured", []):
        print(f"  measured {m['source']:<14} simulated {ms(m.get('simulated_s'))}   measured {ms(m.get('measured_s'))}")
    for d in s.get("dropped", []):
        print(f"  dropped {', '.join(d['devices'])} after {d['after_evaluations']} evaluations "
              f"({_first_line(d['reason'])}): re-placed on {', '.join(s['devices'])}")
    print(f"  files in {out}/: placement.json placed.meta summary.json trace.json curve.png tb/ checkpoint/")


def _first_line(text: str, width: int = 100) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"
