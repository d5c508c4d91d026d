"""Is the 2-task cluster a real 2-device system? Two independent chains of MatMul + tanh, measured with both
chains on task 0 and with one chain per task (`placer cluster up --tasks 2`, one core per task): the measurement
`placer calibrate` makes to find out whether the tasks' cores share one physical core
(`placer.runtime.calibrate.compute_sharing`).

    .venv/bin/python benchmarks/chains.py [--rounds 5] [--runs 3]

Prints one JSON line (medians over all runs of interleaved rounds, the speedup, and the speed of each task when
both compute) and appends it to results/chains.jsonl. Keep the machine otherwise idle while it runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _cluster import RESULTS, machine, now, tf_cluster  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/placer-chains")
    a = ap.parse_args(argv)
    from placer.runtime.calibrate import compute_sharing

    started, mach = now(), machine()
    with tf_cluster(Path(a.workdir)) as tasks:
        rec = compute_sharing(str(tasks), rounds=a.rounds, runs=a.runs)
    rec = {"bench": "chains", "n": 512, "length": 20, **rec, "date": started, "machine": mach}
    print(json.dumps(rec), flush=True)
    with open(RESULTS / "chains.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
