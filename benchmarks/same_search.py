"""Does a refactor change the search? Runs the same search (same model, cluster, seed and number of updates) at
an older commit and at this working tree, and compares them update by update.

    .venv/bin/python benchmarks/same_search.py --rev 9227e5f --models nmt,inception_v3 --updates 60

The older commit is checked out with `git worktree add` into a temporary directory and run with this venv; a
search that takes a fixed number of updates is deterministic, so identical histories mean the refactor left the
search's behaviour unchanged (what a wall-time budget buys then depends only on speed). Prints one JSON line per
model and appends it to results/same_search.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "same_search.jsonl"

CHILD = r"""
import json, sys, time
model, cluster, updates, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
from placer.graphs.models import build_model
g = build_model(model, "full")
t0 = time.time()
try:
    from placer.problem import build_problem
    from placer.search import search
    res = search(build_problem(g, cluster, seed=0), budget_seconds=1e6, seed=0, max_updates=updates)
except ImportError:                      # before placer.problem existed
    from placer.rl.commands import search_graph
    res = search_graph(g, cluster=cluster, budget_seconds=1e6, seed=0, max_updates=updates)
rows = [[r["update"], r["evaluations"], r["search_best_s"], r["best_s"], r["min_s"]] for r in res.history]
json.dump({"fingerprint": g.fingerprint, "baselines": res.baselines, "rows": rows, "step_s": res.step_time,
           "search_best_s": res.search_best, "wall_s": time.time() - t0}, open(out, "w"))
"""


def run(tree: Path, model: str, cluster: str, updates: int, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", CHILD, model, cluster, str(updates), str(out)], cwd=tempfile.gettempdir(),
                       env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{tree}: {model} failed: {r.stderr.strip()[-1500:]}")
    return json.loads(out.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="the older commit")
    ap.add_argument("--models", default="nmt,inception_v3")
    ap.add_argument("--cluster", default="4xK80")
    ap.add_argument("--updates", type=int, default=60)
    a = ap.parse_args(argv)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old), a.rev], check=True)
        try:
            for m in [x.strip() for x in a.models.split(",") if x.strip()]:
                before = run(old, m, a.cluster, a.updates, Path(tmp) / f"old_{m}.json")
                after = run(ROOT, m, a.cluster, a.updates, Path(tmp) / f"new_{m}.json")
                rec = {"model": m, "cluster": a.cluster, "updates": a.updates, "rev": a.rev, "head": head,
                       "same_fingerprint": before["fingerprint"] == after["fingerprint"],
                       "same_baselines": before["baselines"] == after["baselines"],
                       "same_history": before["rows"] == after["rows"],
                       "search_best_s": [before["search_best_s"], after["search_best_s"]],
                       "returned_s": [before["step_s"], after["step_s"]],
                       "wall_s": [round(before["wall_s"], 1), round(after["wall_s"], 1)],
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
                print(json.dumps(rec), flush=True)
                with open(OUT, "a") as f:
                    f.write(json.dumps(rec) + "\n")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
