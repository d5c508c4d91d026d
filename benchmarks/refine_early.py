"""What `placer place`'s zero-shot answer is when its seconds stop the refinement before its moves (issue 13).

    .venv/bin/python benchmarks/refine_early.py --graph clip@DGX1:fp16 [--moves 4500] [--stops 1500,2000,3000]
        [--seeds 4] [--policy default]

Per seed: one zero-shot answer of the policy (one batch of 64, then a refinement of `--moves` local moves whose
temperature falls over those moves, `ReinforceConfig.zero_shot_refine_moves`, with seconds to spare), and from its
`best_curve` the best placement found within the first N moves of the refinement for each N of `--stops`: what a
machine too slow for the moves returns when the seconds end the chain after N moves. The budget is in moves, so
the figures do not depend on the machine's speed. Prints the means and per-seed step times (simulated); writes
nothing. Compare with a refinement cooled over N moves: `transfer.py --zero-shot-only --splits 0:60:N --seeds K`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", required=True, help="model[/size]@cluster[:precision], e.g. clip@DGX1:fp16")
    ap.add_argument("--moves", type=int, default=4500, help="the refinement's moves (default 4500)")
    ap.add_argument("--stops", default="1500,2000,3000", help="comma list of move counts to read the best at")
    ap.add_argument("--seeds", type=int, default=4, help="seeds 0..N-1")
    ap.add_argument("--policy", default="default")
    a = ap.parse_args(argv)
    try:
        stops = sorted({int(x) for x in a.stops.split(",") if x})
    except ValueError:
        ap.error(f"--stops wants a comma list of move counts, got {a.stops!r}")
    if a.moves < 1 or a.seeds < 1 or not stops or min(stops) < 1 or max(stops) > a.moves:
        ap.error(f"--moves and --seeds must be at least 1 and every stop in 1..{a.moves}")
    stops.append(a.moves)

    import numpy as np

    from placer._tf import hide_gpus

    hide_gpus()
    from transfer import parse_graph

    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import load_policy, search

    model, size, cluster, precision = parse_graph(a.graph)
    g = build_model(model, size, precision=precision)
    weights = load_policy(a.policy)
    best = {n: [] for n in stops}
    for seed in range(a.seeds):
        p = build_problem(g, cluster, seed=seed, baselines=False)
        try:
            r = search(p, budget_seconds=1.0, max_updates=0, seed=seed, policy=weights,
                       config=ReinforceConfig(seed=seed, zero_shot_seconds=0.0, zero_shot_refine_seconds=3600.0,
                                              zero_shot_refine_moves=a.moves))
        finally:
            p.close()
        z = r.extra["zero_shot"]
        start = r.evaluations - z["refine_evaluations"]    # evaluations before the refinement's first move
        curve = r.extra["best_curve"]
        for n in stops:
            best[n].append(min([t for e, t in curve if e <= start + n] or [float("nan")]))
    for n in stops:
        print(f"{a.graph}: best of the first {n} moves of {a.moves} (the schedule over the moves): mean "
              f"{np.mean(best[n]):.4f} s over {a.seeds} seeds ({' '.join(f'{x:.4f}' for x in best[n])})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
