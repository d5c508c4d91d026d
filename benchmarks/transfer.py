"""Placing unseen graphs (issue 13): the pretrained policy on graphs of families it never saw in pretraining.

    .venv/bin/python benchmarks/transfer.py                           # the shipped policy, the default graphs
    .venv/bin/python benchmarks/transfer.py --policy policy/ --graphs inception_v3@4xK80 --scratch 60

For each held-out graph (`placer.pretrain.HELD_OUT` families: inception_v3, gpt, clip), on one problem built once
(cluster, costs, grouping, baselines), in one run:
- zero-shot: `build_problem(..., baselines=False)` then the policy's zero-shot batches (`search(..., policy=P,
  max_updates=0)`, a batch of 64 (more for `PLACE_SAMPLE_SECONDS`), the best by the simulator, refined by local moves
  from it for `PLACE_REFINE_SECONDS` or `PLACE_REFINE_MOVES` moves, `PLACE_CLUSTER_PROB` of them cluster moves, as
  `placer place` does, `placer.search.place_settings`): `zero_shot_s` (the
  search's own best, the refined one; never a baseline's), `zero_shot_sampled_s` (the best of the policy's samples
  alone), `zero_shot_spread` (its busiest device's share of the op work, devices with >= 5%) and
  `zero_shot_wall_s` (building the problem without baselines + sampling + simulating; what `placer place
  --no-baselines` costs, graph import excluded: cached; the simulator's numba kernels are loaded (compiled once
  per install, ~9 s, then cached on disk) and TensorFlow is imported before the first graph, as the
  `placer` command imports it at start, so that no graph's wall includes it);
- `finetune60_s`: a 60 s search starting from the pretrained policy;
- `scratch60_s` / `scratch300_s`: 60 s and 300 s searches from scratch (the default search: imitate the best
  grouped baseline, then REINFORCE);
- `best_baseline_s`: the fastest of the baselines (op level), and its `best_baseline_spread`;
- at 1,000 and 5,000 evaluations (`*_s_at_evals`): the fine-tune, each search from scratch and the
  annealing reference (`placer.baselines.anneal`, one run per count), counted as `placer bench` counts them.
`--anneal-at-finetune FILE` then runs the annealer once per recorded fine-tune, with that fine-tune's own
evaluation count as its budget (results/transfer_anneal.jsonl; `--seeds-table` compares them).
Every search figure is the policy's own best (`search_best_s`), never the baseline floor. Simulated step times
(preset clusters, analytical costs); wall times measured on this machine. Writes results/transfer.json and the
RESULTS.md section "Placing unseen graphs".
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cluster import RESULTS, config_overrides, machine, now, placer_commit, write_json, write_section  # noqa: E402

GRAPHS = ("inception_v3@4xK80", "gpt@DGX1:fp16", "clip@DGX1:fp16")


def parse_graph(spec: str) -> tuple[str, str, str, str]:
    """model[/size]@cluster[:precision] → (model, size, cluster, precision)."""
    name, _, rest = spec.partition("@")
    cluster, _, precision = rest.partition(":")
    model, _, size = name.partition("/")
    return model, size or "full", cluster, precision or "fp32"


def spread(problem, op_devices) -> dict:
    """How a placement spreads the step's op work (simulated busy time per device): the busiest device's share
    and the number of devices holding at least 5% of it."""
    import numpy as np

    busy = np.asarray(problem.simulator.sim.simulate(np.asarray(op_devices)).busy, np.float64)
    share = busy / max(float(busy.sum()), 1e-30)
    return {"busiest_share": float(share.max()), "devices_used": int((share >= 0.05).sum()),
            "devices": int(len(busy))}


def zero_shot(spec: str, policy: str, seed: int, sample_s: float | None = None, refine_s: float | None = None,
              quiet: bool = False, graph=None, refine_moves: int | None = None,
              overrides: dict | None = None) -> tuple[dict, object]:
    """The zero-shot columns of one graph, as `placer place --no-baselines` computes them (its seconds of sampling
    and of local moves and its cap on the moves: `sample_s`, `refine_s`, `refine_moves`, default `placer
    place`'s); `graph`: the spec's graph when the caller has built it already; `overrides`: other ReinforceConfig
    fields (e.g. `zero_shot_refine_accept0`). Returns (record, graph)."""
    import numpy as np

    from placer.graphs.models import build_model
    from placer.pretrain import HELD_OUT
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import load_policy, place_settings, search

    model, size, cluster, precision = parse_graph(spec)
    if model not in HELD_OUT:
        print(f"warning: {model} is not a held-out family ({', '.join(HELD_OUT)})", file=sys.stderr)
    settings = place_settings(ReinforceConfig.zero_shot_samples, sample_s, refine_s, refine_moves)
    g = graph if graph is not None else build_model(model, size, precision=precision)
    rec = {"graph": spec, "model": model, "size": size, "cluster": cluster, "precision": precision, "ops": g.num_ops}
    t0 = time.perf_counter()
    bare = build_problem(g, cluster, seed=seed, baselines=False)
    r = search(bare, budget_seconds=1.0, max_updates=0, seed=seed, policy=load_policy(policy),
               config=ReinforceConfig(seed=seed, **{**settings, **(overrides or {})}))
    rec["zero_shot_wall_s"] = time.perf_counter() - t0
    rec["zero_shot_s"] = float(r.search_best) if np.isfinite(r.search_best) else None
    rec["zero_shot"] = r.extra.get("zero_shot", {})
    rec["zero_shot_sampled_s"] = rec["zero_shot"].get("sampled_best_s", rec["zero_shot_s"])
    if rec["zero_shot_s"] is not None:     # without baselines the returned placement is the policy's own best
        rec["zero_shot_spread"] = spread(bare, r.placement.to_indices(g, bare.device_names))
    bare.close()
    sp = rec.get("zero_shot_spread")
    if quiet:
        return rec, g
    print(f"{spec}: zero-shot {rec['zero_shot_s']} s (samples alone {rec['zero_shot_sampled_s']} s) in "
          f"{rec['zero_shot_wall_s']:.1f} s (sampling and simulating {rec['zero_shot'].get('wall_s', float('nan')):.1f}"
          f" s, local moves {rec['zero_shot'].get('refine_s', 0.0):.1f} s)"
          + (f"; {100 * sp['busiest_share']:.0f}% of the work on one device, {sp['devices_used']} of "
             f"{sp['devices']} devices with >= 5%" if sp else ""), flush=True)
    return rec, g


def compare_splits(specs: list[str], policy: str, splits: list[tuple], seeds: int,
                   overrides: dict | None = None) -> None:
    """Zero-shot answers with other splits of its seconds between sampling and local moves (and caps on the
    moves: a third field, 0 for none), seeds 0..seeds-1 each: prints each split's mean, per-seed step times, and
    mean evaluations and wall (nothing written)."""
    import numpy as np

    for spec in specs:
        g = None
        for sp in splits:
            sample_s, refine_s = sp[0], sp[1]
            moves = int(sp[2]) if len(sp) > 2 else None
            recs = []
            for seed in range(seeds):
                rec, g = zero_shot(spec, policy, seed, sample_s, refine_s, quiet=True, graph=g, refine_moves=moves,
                                   overrides=overrides)
                recs.append(rec)
            t = np.array([np.nan if r["zero_shot_s"] is None else r["zero_shot_s"] for r in recs])
            cap = f" (at most {moves} moves)" if moves else (" (no cap on moves)" if moves == 0 else "")
            stops = sorted({r["zero_shot"].get("refine_stop", "?") for r in recs})
            print(f"{spec} sampling {sample_s:g} s + local moves {refine_s:g} s{cap}"
                  + (f" with {json.dumps(overrides)}" if overrides else "") + f", stopped by {'/'.join(stops)}: "
                  f"mean {np.nanmean(t):.4f} s over "
                  f"{seeds} seeds ({' '.join(f'{x:.4f}' for x in t)}); samples alone "
                  f"{np.mean([r['zero_shot_sampled_s'] for r in recs]):.4f}; "
                  f"{np.mean([r['zero_shot'].get('samples', 0) for r in recs]):.0f} samples, "
                  f"{np.mean([r['zero_shot'].get('refine_evaluations', 0) for r in recs]):.0f} local moves, wall "
                  f"{np.mean([r['zero_shot_wall_s'] for r in recs]):.1f} s", flush=True)


def json_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def brief(rec: dict) -> dict:
    """A graph's record without its per-baseline times and zero-shot details (printed, and --append's lines)."""
    return {k: v for k, v in rec.items() if k not in ("baselines", "zero_shot")}


def latest(recs: list[dict]) -> dict[str, dict[int, dict]]:
    """graph -> seed -> its record (a record without `seed` is seed 0); a seed recorded twice: the later record's
    figures over the earlier's (a run with `--scratch ''` keeps the earlier searches from scratch)."""
    by: dict[str, dict[int, dict]] = {}
    for r in recs:
        seeds = by.setdefault(r["graph"], {})
        seeds[int(r.get("seed", 0))] = {**seeds.get(int(r.get("seed", 0)), {}), **r}
    return by


def seeds_table(recs: list[dict], finetune: str = "finetune60_s", scratch: str = "scratch300_s") -> str:
    """Per graph, over the seeds recorded (a record without `seed` is seed 0: results/transfer.json): the
    zero-shot answer (its slowest wall; against the best baseline), the fine-tune and the longest search from
    scratch (their means, and each seed's), and the two targets' gaps: zero-shot and fine-tune against the search
    from scratch of the same seed (+: slower)."""
    import numpy as np

    by = latest(recs)
    rows = [f"| graph | seeds | zero-shot (s) | zero-shot wall, max (s) | zero-shot vs best baseline | "
            f"{finetune[:-2]} (s) | {scratch[:-2]} (s) | zero-shot vs {scratch[:-2]} | {finetune[:-2]} vs "
            f"{scratch[:-2]} |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(vals: list) -> str:
        v = [x for x in vals if x is not None]
        return f"{np.mean(v):.4f} ({' / '.join(f'{x:.4f}' for x in v)})" if len(v) == len(vals) and v else "n/a"

    def gap(a: list, b: list) -> str:
        if any(x is None for x in a + b) or not a:
            return "n/a"
        g = [100 * (x / y - 1) for x, y in zip(a, b)]
        return f"{np.mean(g):+.1f}% ({' / '.join(f'{x:+.1f}%' for x in g)})"

    for graph, seeds in by.items():
        rs = [seeds[k] for k in sorted(seeds)]
        zs, ft, sc, bb, wall = ([r.get(k) for r in rs] for k in ("zero_shot_s", finetune, scratch, "best_baseline_s",
                                                                  "zero_shot_wall_s"))
        w = f"{max(wall):.1f}" if wall and all(x is not None for x in wall) else "n/a"
        rows.append(f"| {graph} | {','.join(str(int(r.get('seed', 0))) for r in rs)} | {cell(zs)} | {w} | "
                    f"{gap(zs, bb)} | {cell(ft)} | {cell(sc)} | {gap(zs, sc)} | {gap(ft, sc)} |")
    return "\n".join(rows)


def anneal_table(recs: list[dict], anneal: list[dict], finetune: str = "finetune60") -> str:
    """Per graph, the fine-tune against annealing at the fine-tune's own evaluation count (`anneal` lines of
    --anneal-at-finetune, matched to `recs` by graph, seed and that count; a seed's latest fine-tune with an
    annealing run for it): means, each seed's, and the gap (+: the fine-tune slower)."""
    import numpy as np

    ann = {(a["graph"], int(a["seed"]), int(a["evaluations"])): a for a in anneal}   # run twice: the latest line
    by: dict[str, dict[int, tuple]] = {}
    for graph, seeds in latest(recs).items():
        for seed, r in seeds.items():
            a = ann.get((graph, seed, int(r.get(f"{finetune}_evaluations") or 0)))
            if a is not None and r.get(f"{finetune}_s") is not None and a.get("anneal_s") is not None:
                by.setdefault(graph, {})[seed] = (r[f"{finetune}_s"], a["anneal_s"], int(a["evaluations"]))
    rows = [f"| graph | seeds | {finetune} evaluations | {finetune} (s) | anneal at them (s) | {finetune} vs anneal |",
            "|---|---|---|---:|---:|---:|"]
    for graph, seeds in by.items():
        ks = sorted(seeds)
        ft, an, ev = ([seeds[k][j] for k in ks] for j in range(3))
        g = [100 * (x / y - 1) for x, y in zip(ft, an)]
        rows.append(f"| {graph} | {','.join(map(str, ks))} | {' / '.join(f'{n:,}' for n in ev)} | "
                    f"{np.mean(ft):.4f} ({' / '.join(f'{x:.4f}' for x in ft)}) | "
                    f"{np.mean(an):.4f} ({' / '.join(f'{x:.4f}' for x in an)}) | "
                    f"{np.mean(g):+.1f}% ({' / '.join(f'{x:+.1f}%' for x in g)}) |")
    return "\n".join(rows)


def anneal_at_finetune(recs: list[dict], specs: list[str], out: Path, command: str,
                       finetune: str = "finetune60", settings: dict | None = None) -> None:
    """For each seed's latest record (`latest`) of a graph in `specs`: the annealer (`placer.baselines.anneal`;
    its defaults, or `settings`: AnnealConfig fields) on the record's problem (same graph, cluster and seed, so
    the same baselines and groups), given the fine-tune's own evaluation count as its budget, counted the same
    way (baselines and grouped baselines included). One JSON line per record appended to `out`, after each run."""
    import numpy as np

    from placer.baselines.anneal import AnnealConfig, anneal
    from placer.graphs.models import build_model
    from placer.problem import build_problem

    date, mach, commit = now(), machine(), placer_commit()
    cfg = AnnealConfig(**(settings or {}))
    graphs: dict[str, object] = {}
    for r in (r for seeds in latest(recs).values() for r in seeds.values()):   # each seed's latest fine-tune
        n = r.get(f"{finetune}_evaluations")
        if r["graph"] not in specs or not n:
            continue
        model, size, cluster, precision = parse_graph(r["graph"])
        g = graphs.get(r["graph"]) or graphs.setdefault(r["graph"], build_model(model, size, precision=precision))
        seed = int(r.get("seed", 0))
        problem = build_problem(g, cluster, seed=seed)
        try:
            res = anneal(problem, max_evaluations=int(n), seed=seed, config=cfg)
        finally:
            problem.close()
        line = {"graph": r["graph"], "seed": seed, "evaluations": int(n), "anneal_evaluations": res.evaluations,
                "anneal_s": float(res.step_time) if np.isfinite(res.step_time) else None, "anneal_wall_s": res.wall_s,
                "anneal_start": res.start, **({"anneal_settings": settings} if settings else {}),
                f"{finetune}_s": r.get(f"{finetune}_s"), "date": date, "commit": commit,
                "machine": mach, "command": command, "simulated": True}
        with open(out, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)


def run_graph(spec: str, policy: str, finetune: float, scratch: list[float], seed: int) -> dict:
    import numpy as np

    from placer.bench import EVAL_POINTS, anneal_record, best_within, evaluate_baselines, policy_curve
    from placer.problem import build_problem
    from placer.search import load_policy, search

    rec, g = zero_shot(spec, policy, seed)
    cluster = rec["cluster"]
    # one problem with baselines for the searches
    t0 = time.perf_counter()
    problem = build_problem(g, cluster, seed=seed)
    rec["build_problem_s"] = time.perf_counter() - t0
    rec["groups"] = problem.grouping.num_groups
    times, _ = evaluate_baselines(problem)
    ok = {k: v for k, v in times.items() if v is not None and k not in ("random", "round_robin")}
    rec["baselines"] = times
    rec["best_baseline"] = min(ok, key=ok.get) if ok else None
    rec["best_baseline_s"] = ok[rec["best_baseline"]] if ok else None
    rec["lower_bound_s"] = problem.lower_bound
    if rec["best_baseline"] in problem.baselines:
        rec["best_baseline_spread"] = spread(problem, problem.baselines[rec["best_baseline"]])

    def own(res) -> float | None:
        return float(res.search_best) if np.isfinite(res.search_best) else None

    def at_evals(res) -> dict:
        curve = policy_curve(res, len(problem.baselines))
        return {str(n): best_within(curve, n) for n in EVAL_POINTS}

    try:
        t0 = time.perf_counter()
        res = search(problem, budget_seconds=finetune, seed=seed, policy=load_policy(policy))
        rec[f"finetune{int(finetune)}_s"] = own(res)
        rec[f"finetune{int(finetune)}_wall_s"] = time.perf_counter() - t0
        rec[f"finetune{int(finetune)}_evaluations"] = res.evaluations
        rec["finetune_s_at_evals"] = at_evals(res)
        print(f"{spec}: fine-tune {finetune:.0f} s → {rec[f'finetune{int(finetune)}_s']}", flush=True)
        for b in scratch:
            t0 = time.perf_counter()
            res = search(problem, budget_seconds=b, seed=seed)
            rec[f"scratch{int(b)}_s"] = own(res)
            rec[f"scratch{int(b)}_wall_s"] = time.perf_counter() - t0
            rec[f"scratch{int(b)}_evaluations"] = res.evaluations
            rec[f"scratch{int(b)}_s_at_evals"] = at_evals(res)
            print(f"{spec}: scratch {b:.0f} s → {rec[f'scratch{int(b)}_s']}", flush=True)
        # the local-search reference at equal evaluations (its start: the best grouped baseline)
        ann = anneal_record(problem, 1.0, seed)
        rec["anneal_s_at_evals"] = ann["anneal_s_at_evals"]
    finally:
        problem.close()
    return rec


def section(recs: list[dict], info: dict, command: str, date: str, mach: str, finetune: float,
            scratch: list[float], warm_s: float | None = None) -> str:
    from placer.search import PLACE_CLUSTER_PROB, PLACE_REFINE_MOVES, PLACE_REFINE_SECONDS, PLACE_SAMPLE_SECONDS

    f = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
    ft = f"finetune{int(finetune)}_s"
    sc = [f"scratch{int(b)}_s" for b in scratch]
    head = ("| graph | ops | groups | best baseline (s) | zero-shot: samples alone (s) | zero-shot (s) | "
            f"zero-shot wall (s) | fine-tune {finetune:.0f} s (s) | "
            + " | ".join(f"scratch {b:.0f} s (s)" for b in scratch) + " |")
    rows = [head, "|" + "---|" * (7 + 1 + len(scratch))]
    for r in recs:
        rows.append(f"| {r['graph']} | {r['ops']:,} | {r['groups']} | {f(r['best_baseline_s'])} ({r['best_baseline']}) "
                    f"| {f(r.get('zero_shot_sampled_s'))} | {f(r['zero_shot_s'])} | {r['zero_shot_wall_s']:.1f} "
                    f"| {f(r.get(ft))} | "
                    + " | ".join(f(r.get(k)) for k in sc) + " |")
    lines = ["## Placing unseen graphs (issue 13)", "",
             f"Written by `benchmarks/transfer.py` ({date}; {mach}). Command: `{command}`. Policy: "
             f"`{info.get('path', '?')}`, pretrained {info.get('date', '?')} on the {info.get('corpus', '?')} corpus "
             f"({len(info.get('problems', []))} problems, {info.get('train_wall_s', 0):.0f} s of training); the "
             f"families {', '.join(info.get('held_out_families', []))} were never in it. Step times simulated "
             "(preset clusters, analytical costs), every search figure the policy's own best (`search_best_s`); "
             "walls measured on this 2-core machine. Zero-shot: the best of the policy's samples "
             + ("(one batch of 64)" if PLACE_SAMPLE_SECONDS <= 0 else f"({PLACE_SAMPLE_SECONDS:g} s of batches of 64)")
             + f", then local moves from it ({PLACE_CLUSTER_PROB:g} of them cluster moves) for {PLACE_REFINE_MOVES:,} "
             f"moves or {PLACE_REFINE_SECONDS:g} s, whichever ends first "
             "(`placer place`'s answer; never from a baseline); the wall includes building the problem"
             + ("" if warm_s is None else f", not the one-time load of the simulator's numba kernels before the first "
                f"graph ({warm_s:.1f} s here; ~9 s when a fresh install compiles them, cached on disk after)") + ".", "", *rows,
             ""]
    lines += ["At equal evaluations (`placer.bench.best_within`: every placement a method evaluated counts, the "
              "op-level baselines included; the best of the method's own placements, and for the searches from "
              "scratch and annealing their shared start, the best grouped baseline; n/a: the search stopped "
              "before N). Each search's local moves cool over its own budget, so a 300 s search is still "
              "exploring at 5,000 evaluations where a 60 s one is not; annealing cools over N:", "",
              f"| graph | N | fine-tuned {finetune:.0f} s from the policy (s) | "
              + " | ".join(f"from scratch {b:.0f} s (s)" for b in scratch) + " | anneal (s) |",
              "|---|---:|---:|" + "---:|" * len(scratch) + "---:|"]
    for r in recs:
        for n in ("1000", "5000"):
            lines.append(f"| {r['graph']} | {int(n):,} | {f(r.get('finetune_s_at_evals', {}).get(n))} | "
                         + " | ".join(f(r.get(f'scratch{int(b)}_s_at_evals', {}).get(n)) for b in scratch)
                         + f" | {f(r.get('anneal_s_at_evals', {}).get(n))} |")
    lines.append("")
    for r in recs:
        zs, bb = r["zero_shot_s"], r["best_baseline_s"]
        notes = []
        if zs is not None and bb is not None:
            z = r.get("zero_shot", {})
            moves = (f"; {z['refine_evaluations']:,} local moves in {z.get('refine_s', 0):.1f} s, ended by the "
                     f"{z.get('refine_stop', 'seconds')}" if "refine_evaluations" in z else "")
            notes.append(f"zero-shot {'≤' if zs <= bb else '>'} best baseline ({100 * (zs / bb - 1):+.1f}%), "
                         f"in {r['zero_shot_wall_s']:.1f} s ({'≤' if r['zero_shot_wall_s'] <= 10 else '>'} 10 s"
                         f"{moves})")
        if zs is not None and sc and r.get(sc[-1]) is not None:
            notes.append(f"zero-shot vs scratch {scratch[-1]:.0f} s: {100 * (zs / r[sc[-1]] - 1):+.1f}% "
                         f"({'within' if zs <= 1.05 * r[sc[-1]] else 'not within'} 5%)")
        if r.get(ft) is not None and sc and r.get(sc[-1]) is not None:
            notes.append(f"fine-tune {finetune:.0f} s vs scratch {scratch[-1]:.0f} s: "
                         f"{100 * (r[ft] / r[sc[-1]] - 1):+.1f}%")
        if r.get(ft) is not None and r.get(sc[0]) is not None:
            notes.append(f"vs scratch {scratch[0]:.0f} s: {100 * (r[ft] / r[sc[0]] - 1):+.1f}%")
        lines.append(f"- {r['graph']}: " + "; ".join(notes) + ".")
    sp = [r for r in recs if r.get("zero_shot_spread") and r.get("best_baseline_spread")]
    if sp:
        lines += ["", "How the zero-shot answer and the best baseline spread the op work (simulated busy time per "
                  "device; `zero_shot_spread`, `best_baseline_spread`):", ""]
        for r in sp:
            z, b = r["zero_shot_spread"], r["best_baseline_spread"]
            lines.append(f"- {r['graph']}: zero-shot {100 * z['busiest_share']:.0f}% of the work on its busiest "
                         f"device, {z['devices_used']} of {z['devices']} devices with ≥ 5%; {r['best_baseline']} "
                         f"{100 * b['busiest_share']:.0f}%, {b['devices_used']} devices.")
    return "\n".join(lines)


def warm_simulator() -> float:
    """Load the simulator's numba kernels on a two-op graph before the first graph, so that no graph's zero-shot
    wall includes compiling them: numba compiles them once per install and caches them on disk
    (`placer/sim/__pycache__`), ~9 s on this machine; every later process only loads them. Returns the seconds
    it took (the compile on a fresh install or checkout, well under a second after)."""
    import numpy as np

    from placer.graphs.opgraph import OpGraph
    from placer.problem import build_problem

    t0 = time.perf_counter()
    g = OpGraph.build([("a", "MatMul", 2**10, 0, 1e6), ("b", "MatMul", 2**10, 0, 1e6)], [("a", "b")])
    p = build_problem(g, "2xK80", baselines=False)
    try:
        p.simulator.evaluate([np.zeros(2, np.int64), np.array([0, 1], np.int64)])
    finally:
        p.close()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--graphs", default=",".join(GRAPHS), help="comma list of model[/size]@cluster[:precision]")
    ap.add_argument("--finetune", type=float, default=60.0)
    ap.add_argument("--scratch", default="60,300", help="budgets of the searches from scratch (seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--append", default="", metavar="FILE",
                    help="append each graph's record (with its seed, date and commit) as a JSON line to FILE "
                         "instead of writing results/transfer.json and the RESULTS.md section: more seeds")
    ap.add_argument("--seeds-table", default="", metavar="FILE",
                    help="print, per graph, the targets over the seeds of results/transfer.json (seed 0) and of "
                         "FILE's lines (from --append), and exit")
    ap.add_argument("--anneal-at-finetune", default="", metavar="FILE",
                    help="for each fine-tune of results/transfer.json and FILE's lines (of --graphs' graphs), run "
                         "annealing with the fine-tune's evaluation count as its budget; append a line each to "
                         "results/transfer_anneal.jsonl (which --seeds-table then compares), and exit")
    ap.add_argument("--anneal-config", default="", metavar="JSON",
                    help="with --anneal-at-finetune: AnnealConfig fields for the annealer, e.g. "
                         "'{\"cluster_prob\": 0.3}'")
    ap.add_argument("--zero-shot-only", action="store_true",
                    help="only the zero-shot answers (step time and wall), printed; writes nothing")
    ap.add_argument("--splits", default="", metavar="S:R[:M],...",
                    help="with --zero-shot-only: compare splits of the zero-shot's time, S seconds of sampling "
                         "and R of local moves each (at most M moves; 0: no cap; default placer place's), over "
                         "--seeds seeds")
    ap.add_argument("--seeds", type=int, default=1, help="with --splits: seeds 0..N-1")
    ap.add_argument("--zero-shot-config", default="", metavar="JSON",
                    help="with --splits: other ReinforceConfig fields for the zero-shot answer, e.g. "
                         "'{\"zero_shot_refine_accept0\": 0.2}'")
    a = ap.parse_args(argv)
    if a.seeds_table or a.anneal_at_finetune:
        flag, path = ("--seeds-table", Path(a.seeds_table)) if a.seeds_table else \
            ("--anneal-at-finetune", Path(a.anneal_at_finetune))
        if not path.is_file():
            ap.error(f"{flag}: no file {path}")
        recs = [*json.loads((RESULTS / "transfer.json").read_text()), *json_lines(path)]
        if a.anneal_at_finetune:
            command = "python benchmarks/transfer.py " + " ".join(argv if argv is not None else sys.argv[1:])
            from placer.baselines.anneal import AnnealConfig

            anneal_at_finetune(recs, [s for s in a.graphs.split(",") if s], RESULTS / "transfer_anneal.jsonl",
                               command.strip(),
                               settings=config_overrides(ap, "--anneal-config", a.anneal_config, AnnealConfig))
            return 0
        print(seeds_table(recs))
        if (RESULTS / "transfer_anneal.jsonl").is_file():
            print("\n" + anneal_table(recs, json_lines(RESULTS / "transfer_anneal.jsonl")))
        return 0
    overrides = config_overrides(ap, "--zero-shot-config", a.zero_shot_config)
    if a.zero_shot_config and not a.splits:
        ap.error("--zero-shot-config goes with --splits")
    specs = [s for s in a.graphs.split(",") if s]
    if a.splits and not a.zero_shot_only:
        ap.error("--splits compares zero-shot answers: give it with --zero-shot-only")
    splits = []
    if a.splits:
        try:
            splits = [tuple(float(x) for x in sp.split(":")) for sp in a.splits.split(",")]
        except ValueError:
            splits = []
        if not splits or any(len(sp) not in (2, 3) or min(sp) < 0 for sp in splits) or a.seeds < 1:
            ap.error(f"--splits wants S:R[:M],... (seconds of sampling and of local moves, the moves' cap, each >= 0) "
                     f"and --seeds >= 1; "
                     f"got {a.splits!r}, {a.seeds}")
    from placer._tf import hide_gpus

    hide_gpus()       # imports TensorFlow first, so no graph's zero-shot wall includes it (nor does `placer place`'s
    #                   place_wall_s: its imports load TensorFlow before the timed part)
    warm_s = warm_simulator()
    print(f"simulator kernels loaded in {warm_s:.1f} s (compiled, when this is the install's first run)", flush=True)
    if a.splits:
        compare_splits(specs, a.policy, splits, a.seeds, overrides)
        return 0
    if a.zero_shot_only:
        for spec in specs:
            zero_shot(spec, a.policy, a.seed)
        return 0
    command = "python benchmarks/transfer.py " + " ".join(argv if argv is not None else sys.argv[1:])
    date, mach = now(), machine()
    from placer.search import load_policy

    info = load_policy(a.policy).info
    scratch = [float(x) for x in a.scratch.split(",") if x]
    recs = []
    for spec in specs:
        recs.append(run_graph(spec, a.policy, a.finetune, scratch, a.seed))
        if a.append:             # after every graph: a killed run keeps what it measured
            line = {**brief(recs[-1]), "seed": a.seed, "date": date, "commit": placer_commit(), "machine": mach,
                    "command": command.strip()}
            with open(a.append, "a") as f:
                f.write(json.dumps(line) + "\n")
        elif not a.no_write:
            write_json(RESULTS / "transfer.json", recs)
    print(json.dumps([brief(r) for r in recs], indent=1))
    if not a.no_write and not a.append:
        write_section("transfer", section(recs, info, command.strip(), date, mach, a.finetune, scratch,
                                                  warm_s))
        print(f"wrote {RESULTS / 'transfer.json'} and the RESULTS.md section")
    return 0


if __name__ == "__main__":
    sys.exit(main())
