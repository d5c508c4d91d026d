"""How a pretrained policy was trained, as benchmarks/README.md records it (issue 13): its policy.json's record
(corpus, budget, rounds, updates, date) and, per corpus problem, the greedy placement at the end of training
against that problem's best baseline (`per_problem`, written by `placer pretrain`; simulated step times).

    .venv/bin/python benchmarks/policy_table.py                  # the shipped policy (placer/data/policy)
    .venv/bin/python benchmarks/policy_table.py /tmp/pretrain/policy
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policy", nargs="?", help="a `placer pretrain` directory (default: the shipped policy)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if a.policy:
        path = Path(a.policy)
    else:
        import placer                    # (not placer.rl.portable: it imports TensorFlow)

        path = Path(placer.__file__).resolve().parent / "data" / "policy"
    try:
        info = json.loads((path / "policy.json").read_text())
    except (OSError, ValueError) as e:
        ap.error(f"cannot read {path / 'policy.json'}: {e}")
    print(f"{path}: corpus {info['corpus']} ({len(info['problems'])} problems, {len(info['skipped'])} skipped), "
          f"trained {info['date']} on {info['machine']}: {info['train_wall_s']:.0f} s ({info['imitation_rounds']} "
          f"imitation rounds, then {info['rounds']} REINFORCE rounds, {info['updates']:,} policy updates), corpus "
          f"built in {info['build_wall_s']:.0f} s; hidden {info['hidden_size']}, attention {info['attn_size']}")
    print()
    print("| problem | ops | groups | best baseline (s) | greedy / best baseline |")
    print("|---|---:|---:|---:|---:|")
    ratios = []
    for name, r in info["per_problem"].items():
        ratio = r["greedy_over_best_baseline"]
        ratios.append(ratio)
        print(f"| {name} | {r['ops']:,} | {r['groups']} | {r['best_baseline_s']:.4g} | {ratio:.3f} |")
    finite = [x for x in ratios if x == x and x != float("inf")]
    print()
    print(f"greedy / best baseline: median {statistics.median(finite):.3f}, below 1 on {sum(x < 1 for x in finite)} "
          f"of {len(ratios)} problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
