"""How much better than annealing at 1,000 evaluations any method has been in each K80 cell (issue 13).

    .venv/bin/python benchmarks/headroom.py            # prints a Markdown table
    .venv/bin/python benchmarks/headroom.py --policy-config '{"elite_size": 4, ...}'   # + one policy setting
    .venv/bin/python benchmarks/headroom.py --anneal-block run      # annealing as it was before linked blocks
    .venv/bin/python benchmarks/headroom.py --anneal-attract 0      # ...before attraction moves (2026-12-06)

With --policy-config, the table adds the policy runs at 1,000 evaluations whose `policy_config` is exactly that
object (not pretrained, or with --pretrained NAME only those started from that pretrained policy, e.g. `default`;
`reuse_evaluations` is read from the record, false if absent), every policy seed recorded
(`--first-policy-seed` adds seeds on the same problem), their mean against annealing's 5-seed mean; `--since DATE`
keeps only the policy runs recorded on or after DATE.

Reads only recorded runs (all simulated):
  * annealing at 1,000 evaluations, seeds 0-4: the first five `anneal_s_seeds` of the latest `anneal_vs_policy` record in
    results/bench_anneal.jsonl whose annealer made --anneal-block's block moves (`anneal_config.block`; records
    without it made "run" moves) and --anneal-attract's share of attraction moves (`anneal_config.attract_prob`;
    0 in records without it); the annealer is deterministic per seed and setting; a cell with no such record
    is left out;
  * annealing at 20,000 evaluations, seeds 0-2: the `anneal_tune` records of results/bench_anneal_tune.jsonl with
    default settings, from `bench_anneal.py --model M --cluster C --evals 20000 --anneal-seeds 3 --tune '[{}]'`;
  * the policy's 300 s searches of the K80 table: `search_best_s` in results/results.json;
  * the 120 s equal-wall cells in results/wall120/*results.json (`placer bench ... --budget 120`, annealing on):
    the policy's `search_best_s` and annealing's `anneal_s`;
  * the other `placer bench` tables, results/*/results.json (e.g. k80_local, k80_attract: 300 s searches with
    later settings): their K80 cells' `search_best_s` and `anneal_s`, counted in "best known" only;
  * every equal-wall run of results/bench_wall.jsonl (`bench_wall.py`, any tag: annealing and the search, several
    seeds; `best_s`), counted in "best known" only;
  * every policy run at 1,000 evaluations in results/bench_anneal.jsonl (`policy_s_seeds`).
"Best known" is the fastest placement any of these found. If it is within x% of annealing's mean at 1,000
evaluations, no method can beat that mean by more than x% in the cell (on what is known): the ceiling.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CELLS = [("rnnlm", 2), ("rnnlm", 4), ("nmt", 2), ("nmt", 4), ("nmt4", 2), ("nmt4", 4), ("inception_v3", 2),
         ("inception_v3", 4)]


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def table(policy_config: dict | None = None, anneal_block: str = "linked", since: str | None = None,
          anneal_attract: float | None = None, pretrained: str | None = None) -> list[dict]:
    if anneal_attract is None:
        from placer.baselines.anneal import AnnealConfig

        anneal_attract = AnnealConfig().attract_prob
    runs = _lines(RESULTS / "bench_anneal.jsonl")
    tune = _lines(RESULTS / "bench_anneal_tune.jsonl")
    bench = json.loads((RESULTS / "results.json").read_text()) if (RESULTS / "results.json").exists() else []
    wall = [c for f in sorted((RESULTS / "wall120").glob("*results.json")) for c in json.loads(f.read_text())]
    others = [c for f in sorted(RESULTS.glob("*/results.json")) for c in json.loads(f.read_text())]
    wall_runs = [r for r in _lines(RESULTS / "bench_wall.jsonl") if r.get("bench") == "wall"
                 and r.get("best_s") is not None and r.get("size", "full") == "full" and r.get("problem_seed", 0) == 0]
    rows = []
    for model, gpus in CELLS:
        cluster = f"{gpus}xK80"
        cell = [r for r in runs if r.get("bench") == "anneal_vs_policy" and r["model"] == model
                and r["cluster"] == cluster and r["evaluations"] == 1000 and r.get("size", "full") == "full"]
        ann = next((r["anneal_s_seeds"][:5] for r in reversed(cell) if len(r.get("anneal_s_seeds", [])) >= 5
                    and r.get("anneal_config", {}).get("block", "run") == anneal_block
                    and r.get("anneal_config", {}).get("attract_prob", 0.0) == anneal_attract), None)
        long = [v for r in tune if r["model"] == model and r["cluster"] == cluster and r["evaluations"] == 20000
                and not r.get("settings") for v in r["values_s"]]
        b300 = [r["search_best_s"] for r in bench if r["model"] == model and r["gpus"] == gpus
                and r["kind"] == "K80" and r.get("search_best_s") is not None]
        pol = [v for r in cell if not r.get("pretrained") for v in r.get("policy_s_seeds", []) if v is not None]
        w120 = [c for c in wall if c["model"] == model and c["gpus"] == gpus and c["kind"] == "K80"]
        wall_ann = [c["anneal_s"] for c in w120 if c.get("anneal_s") is not None]
        wall_pol = [c["search_best_s"] for c in w120 if c.get("search_best_s") is not None]
        if ann is None:
            continue
        seeds_wall = [r["best_s"] for r in wall_runs if r["model"] == model and r["cluster"] == cluster]
        tables = [c.get(k) for c in others if c["model"] == model and c["gpus"] == gpus and c["kind"] == "K80"
                  for k in ("search_best_s", "anneal_s")]
        found = [v for v in [*ann, *long, *b300, *pol, *wall_ann, *wall_pol, *seeds_wall, *tables] if v is not None]
        best = min(found)
        mean = statistics.mean(ann)
        row = {"model": model, "gpus": gpus, "anneal_1000_mean_s": mean, "anneal_20000_s": long,
               "policy_300s_s": b300[-1] if b300 else None, "best_known_s": best,
               "anneal_120s_s": wall_ann[-1] if wall_ann else None, "policy_120s_s": wall_pol[-1] if wall_pol else None,
               "ceiling_pct": 100.0 * (1.0 - best / mean)}
        if policy_config is not None:
            want = {"reuse_evaluations": False, **policy_config}
            mine = [r for r in cell if r.get("pretrained") == pretrained and want == {
                **r.get("policy_config", {}), "reuse_evaluations": bool(r.get("reuse_evaluations", False))}
                and (since is None or r.get("date", "") >= since)]
            by_seed = {}                 # policy seed → its best within 1,000 (the latest record wins)
            for r in mine:
                ps = r.get("policy_seeds") or [r.get("policy_seed", 0) + i for i in range(len(r["policy_s_seeds"]))]
                by_seed.update({p: v for p, v in zip(ps, r["policy_s_seeds"]) if v is not None})
            if by_seed:
                seeds = [by_seed[p] for p in sorted(by_seed)]
                first = next(r for r in reversed(mine) if (r.get("policy_seeds") or [0])[0] == min(by_seed))
                row.update(policy_s_seeds=seeds, policy_seeds=sorted(by_seed), policy_mean_s=statistics.mean(seeds),
                           policy_vs_anneal_pct=100.0 * (1.0 - statistics.mean(seeds) / mean),
                           policy_gap_ci95=welch_gap(seeds, ann),
                           policy_drawn=first.get("policy_drawn"), policy_wall_s=first.get("policy_wall_s_at_n"))
        rows.append(row)
    return rows


def welch_gap(policy: list[float], anneal: list[float]) -> tuple[float, float, float] | None:
    """The policy's mean against annealing's, (policy mean / anneal mean - 1), with the 95% interval of the
    difference of the means (Welch: two independent samples of unequal variance), relative to annealing's mean.
    None with fewer than 2 runs of either."""
    if len(policy) < 2 or len(anneal) < 2:
        return None
    from scipy import stats

    mp, ma = statistics.mean(policy), statistics.mean(anneal)
    vp, va = statistics.variance(policy) / len(policy), statistics.variance(anneal) / len(anneal)
    if vp + va == 0:
        return mp / ma - 1.0, mp / ma - 1.0, mp / ma - 1.0
    dof = (vp + va) ** 2 / (vp ** 2 / (len(policy) - 1) + va ** 2 / (len(anneal) - 1))
    half = float(stats.t.ppf(0.975, dof)) * (vp + va) ** 0.5
    return mp / ma - 1.0, (mp - ma - half) / ma, (mp - ma + half) / ma


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy-config", metavar="JSON", help="also compare the policy runs with this policy_config")
    ap.add_argument("--anneal-block", default="linked", choices=("linked", "run"),
                    help="the annealer's block moves to compare against (AnnealConfig.block; default the current)")
    ap.add_argument("--anneal-attract", type=float, metavar="P",
                    help="the annealer's share of attraction moves to compare against (AnnealConfig.attract_prob; "
                         "default the current; 0: as before 2026-12-06)")
    ap.add_argument("--since", metavar="DATE", help="with --policy-config: only policy runs recorded on or after DATE "
                    "(the records' `date`, e.g. '2026-12-05 05:00'), so that runs of older code are left out")
    ap.add_argument("--pretrained", metavar="NAME", help="with --policy-config: the runs started from this pretrained "
                    "policy (the records' `pretrained`, e.g. default) instead of those from scratch")
    a = ap.parse_args(argv)
    rows = table(json.loads(a.policy_config) if a.policy_config else None, a.anneal_block, a.since, a.anneal_attract,
                 a.pretrained)
    print("| model | K80s | anneal at 1,000: mean of seeds 0-4 (s) | anneal at 20,000: seeds 0-2 (s) | "
          "policy, 300 s search (s) | anneal, 120 s (s) | policy, 120 s (s) | best known (s) | "
          "ceiling: best known vs anneal's 1,000 mean |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        long = ", ".join(f"{v:.3f}" for v in r["anneal_20000_s"]) or "n/a"
        p300 = f"{r['policy_300s_s']:.3f}" if r["policy_300s_s"] is not None else "n/a"
        a120, p120 = (f"{r[k]:.3f}" if r[k] is not None else "n/a" for k in ("anneal_120s_s", "policy_120s_s"))
        print(f"| {r['model']} | {r['gpus']} | {r['anneal_1000_mean_s']:.3f} | {long} | {p300} | {a120} | {p120} | "
              f"{r['best_known_s']:.3f} | {r['ceiling_pct']:.1f}% |")
    n5 = sum(r["ceiling_pct"] >= 5.0 for r in rows)
    print(f"\ncells where a placement >= 5% faster than annealing's 1,000-evaluation mean is known: {n5} of {len(rows)}")
    if a.policy_config:
        print(f"\npolicy_config {a.policy_config}, 1,000 evaluations (simulated):\n")
        print("| model | K80s | anneal: mean of seeds 0-4 (s) | policy seeds | policy: mean (range) (s) | policy vs anneal | "
              "ceiling | drawn (seed 0) | wall to 1,000 (s, seed 0) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            if "policy_mean_s" not in r:
                continue
            v = r["policy_vs_anneal_pct"]
            ps = r["policy_seeds"]
            print(f"| {r['model']} | {r['gpus']} | {r['anneal_1000_mean_s']:.3f} | {ps[0]}-{ps[-1]} | {r['policy_mean_s']:.3f} "
                  f"({min(r['policy_s_seeds']):.3f}-{max(r['policy_s_seeds']):.3f}) | "
                  f"{abs(v):.1f}% {'faster' if v >= 0 else 'slower'} | {r['ceiling_pct']:.1f}% | "
                  f"{r['policy_drawn']:,} | {r['policy_wall_s']:.0f} |")
        ahead = sum(r.get("policy_vs_anneal_pct", -1) > 0 for r in rows)
        print(f"\npolicy ahead of annealing's mean in {ahead} of {sum('policy_mean_s' in r for r in rows)} cells")
        gaps = [(r, r["policy_gap_ci95"]) for r in rows if r.get("policy_gap_ci95")]
        if gaps:
            print("policy mean vs annealing's (+: slower), 95% interval (Welch, the seeds above): " + "; ".join(
                f"{r['model']} {r['gpus']} {g[0] * 100:+.1f}% ({g[1] * 100:+.1f}% to {g[2] * 100:+.1f}%)"
                for r, g in gaps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
