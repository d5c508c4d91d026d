"""Import time per built-in model, cold (empty cache: trace/build + convert + save) and cached (a fresh process
loading the cached OpGraph), plus grouping time when `placer.graphs.group` exists.

    .venv/bin/python benchmarks/bench_import.py                      # all models, full size
    .venv/bin/python benchmarks/bench_import.py --size tiny --models nmt,rnnlm

Each measurement runs in a fresh Python process (so TensorFlow's import and every cache miss are paid
honestly); times are the wall time of the `build_model` call inside that process (TF is imported lazily by it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
name, size, groups = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
from placer.graphs.models import build_model
g = build_model(name, size=size)
t1 = time.perf_counter()
group_s = None
try:
    from placer.graphs.group import group
except ImportError:
    group = None
if group is not None:
    t2 = time.perf_counter()
    group(g, groups)
    group_s = time.perf_counter() - t2
print(json.dumps({"ops": g.num_ops, "edges": g.num_edges, "colocation_groups": g.num_colocation_groups,
                  "import_s": t1 - t0, "group_s": group_s}))
"""


def run(name: str, size: str, groups: int, cache_dir: str) -> dict:
    env = dict(os.environ, PLACER_CACHE_DIR=cache_dir, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", CHILD, name, size, str(groups)], env=env, capture_output=True,
                         text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"{name}: child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v3,nmt,nmt4,rnnlm")
    ap.add_argument("--size", choices=["tiny", "small", "full"], default="full")
    ap.add_argument("--groups", type=int, default=80, help="group count for the grouping time (default 80)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="placer-bench-import-") as cache:
        for name in args.models.split(","):
            cold = run(name, args.size, args.groups, cache)    # empty cache: build + save
            warm = run(name, args.size, args.groups, cache)    # fresh process, cache hit
            rows.append({"model": name, "size": args.size, "ops": cold["ops"], "edges": cold["edges"],
                         "colocation_groups": cold["colocation_groups"], "cold_import_s": cold["import_s"],
                         "cached_import_s": warm["import_s"], "group_s": warm["group_s"]})
            print(f"done {name}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0

    def f(x):
        return "n/a" if x is None else f"{x:.1f}"

    print("| model | size | ops | edges | co-location groups | cold import (s) | cached import (s) | grouping G=%d (s) |"
          % args.groups)
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['size']} | {r['ops']} | {r['edges']} | {r['colocation_groups']} | "
              f"{f(r['cold_import_s'])} | {f(r['cached_import_s'])} | {f(r['group_s'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
