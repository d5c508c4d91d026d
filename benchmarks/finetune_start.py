"""How a fine-tune from the pretrained policy starts (issue 13): fit the policy to its start or keep it as
pretrained, at equal evaluations, against the search from scratch, on the held-out graphs.

    .venv/bin/python benchmarks/finetune_start.py --graph inception_v3@4xK80 --fits never,always --evals 14000 \
        --seeds 0,1,2 [--scratch] [--config '{"local_accept0": 0.05}']
    .venv/bin/python benchmarks/finetune_start.py --table        # the means of the kept records

One problem is built per graph (cluster, costs, grouping, baselines); each run is `placer.search.search(problem,
policy=P, max_evaluations=N)` with `ReinforceConfig.pretrained_fit` set (`never`: the policy as pretrained; `always`:
fitted to the start, as the warm start fits a fresh policy to its baseline; `auto`: fitted unless its zero-shot best
beats every baseline), or a search from scratch (`--scratch`). The budget is in evaluations, so the figures do not
depend on the machine's load; each is the policy's own best (`search_best_s`) within 1,000, 5,000 and N evaluations
(`placer.bench.best_within`). Simulated step times (preset clusters, analytical costs). Appends one JSON line per
run to results/finetune_start.jsonl, with the commit of the `placer` code it ran.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cluster import RESULTS, config_overrides, machine, now, placer_commit  # noqa: E402

OUT = RESULTS / "finetune_start.jsonl"


def run(spec: str, methods: list[str], evals: int, seeds: list[int], policy: str,
        overrides: dict | None = None, split_groups: str | None = None) -> list[dict]:
    import numpy as np

    from placer.bench import best_within, policy_curve
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import load_policy, search
    from transfer import parse_graph

    model, size, cluster, precision = parse_graph(spec)
    problem = build_problem(build_model(model, size, precision=precision), cluster, seed=0, split_groups=split_groups)
    stamp = {"date": now(), "commit": placer_commit(), "machine": machine()}
    recs = []
    try:
        for seed in seeds:
            for m in methods:
                cfg, kw = ReinforceConfig.for_reward("sim", **{**(overrides or {}), "seed": seed}), {}
                if m != "scratch":
                    w = load_policy(policy)
                    cfg = replace(cfg, portable=True, hidden_size=w.hidden_size, attn_size=w.attn_size,
                                  pretrained_fit=m)
                    kw["policy"] = w
                t0 = time.perf_counter()
                res = search(problem, budget_seconds=1e6, seed=seed, max_evaluations=evals, config=cfg, **kw)
                curve = policy_curve(res, len(problem.baselines))
                zs = res.extra.get("zero_shot", {})
                rec = {"bench": "finetune_start", "graph": spec, "method": m, "seed": seed, "evals": evals,
                       "policy": None if m == "scratch" else policy, **({"config": overrides} if overrides else {}),
                       **({"split_groups": split_groups, "groups": problem.grouping.num_groups}
                          if split_groups else {}),
                       "best_s": float(res.search_best) if np.isfinite(res.search_best) else None,
                       "s_at_evals": {str(n): best_within(curve, n) for n in (1000, 5000, evals)},
                       "evaluations": res.evaluations, "wall_s": time.perf_counter() - t0,
                       "zero_shot_s": zs.get("best_s"), "start": zs.get("start"),
                       "imitation_steps": zs.get("imitation_steps"), **stamp, "simulated": True}
                print(json.dumps(rec), flush=True)
                with open(OUT, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                recs.append(rec)
    finally:
        problem.close()
    return recs


def table(path: Path = OUT) -> str:
    """Per graph and method: the mean over seeds of the best within 1,000, 5,000 and N evaluations."""
    import numpy as np

    groups: dict[tuple, list[dict]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        conf = json.dumps(r["config"], sort_keys=True) if r.get("config") else ""
        if r.get("split_groups"):     # the groups a split makes depend on the code's refinement limit: named
            conf = (conf + " " if conf else "") + f"--split-groups {r['split_groups']} ({r['groups']} groups)"
        groups.setdefault((r["graph"], r["evals"], r["method"], conf), []).append(r)
    rows = ["| graph | method | seeds | best at 1,000 (s) | at 5,000 (s) | at N (s) | N |",
            "|---|---|---|---:|---:|---:|---:|"]
    for (g, n, m, conf), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["seed"])

        def mean(k: str) -> str:
            v = [r["s_at_evals"][k] for r in rs if r["s_at_evals"].get(k) is not None]
            return f"{np.mean(v):.4f}" if len(v) == len(rs) else "n/a"

        seeds = ",".join(str(r["seed"]) for r in rs)
        rows.append(f"| {g} | {m}{' ' + conf if conf else ''} | {seeds} | {mean('1000')} | {mean('5000')} | "
                    f"{mean(str(n))} | {n:,} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default="inception_v3@4xK80")
    ap.add_argument("--fits", default="never,always", help="comma list of never, always, auto")
    ap.add_argument("--scratch", action="store_true", help="also a search from scratch per seed")
    ap.add_argument("--evals", type=int, default=14000)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--config", default="", metavar="JSON",
                    help="ReinforceConfig overrides for every run (a JSON object; recorded, and a row of its own)")
    ap.add_argument("--split-groups", default=None, metavar="BASELINE",
                    help="groups that follow a baseline's devices (`build_problem(split_groups=...)`, e.g. best)")
    ap.add_argument("--table", action="store_true", help="print the table of the kept records and exit")
    a = ap.parse_args(argv)
    if a.table:
        print(table())
        return 0
    methods = [m for m in a.fits.split(",") if m] + (["scratch"] if a.scratch else [])
    bad = [m for m in methods if m not in ("never", "always", "auto", "scratch")]
    if bad:
        ap.error(f"unknown fit {bad[0]!r} (never, always, auto)")
    overrides = config_overrides(ap, "--config", a.config)
    run(a.graph, methods, a.evals, [int(s) for s in a.seeds.split(",")], a.policy, overrides, a.split_groups)
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
