"""`placer inspect` and `placer demo`."""
from __future__ import annotations

import time

from placer.cli import print_json
from placer.errors import fmt_bytes


def run_inspect(args) -> int:
    from placer.cli import load_from_args
    from placer.graphs.group import group

    t0 = time.perf_counter()
    graph = load_from_args(args)
    t1 = time.perf_counter()
    grouping = group(graph, max_groups=args.groups)
    t2 = time.perf_counter()
    types = graph.op_type_counts()
    info = {
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "colocation_groups": graph.num_colocation_groups,
        "groups": grouping.num_groups,
        "tensor_bytes": int(graph.tensor_bytes.sum()),
        "op_types": types,
        "cpu_only_ops": int(graph.cpu_only.sum()),
        "persistent_bytes": int(graph.persistent_bytes.sum()),
        "fingerprint": graph.fingerprint,
        "precision": graph.precision,
        "import_ms": round((t1 - t0) * 1e3, 1),
        "group_ms": round((t2 - t1) * 1e3, 1),
    }
    if args.json:
        print_json(info)
        return 0
    print(f"graph {graph.name} (fingerprint {graph.fingerprint})")
    print(f"  ops                {info['ops']:>12,}")
    print(f"  edges              {info['edges']:>12,}  (data + control)")
    print(f"  tensor bytes       {fmt_bytes(info['tensor_bytes']):>12}")
    print(f"  variable bytes     {fmt_bytes(info['persistent_bytes']):>12}")
    print(f"  co-location groups {info['colocation_groups']:>12,}")
    print(f"  CPU-only ops       {info['cpu_only_ops']:>12,}")
    print(f"  precision          {info['precision']:>12}  (of its matmuls and convolutions)")
    print(f"  groups (G<={args.groups:<4})   {info['groups']:>12,}")
    print(f"  import {info['import_ms']:.0f} ms, grouping {info['group_ms']:.0f} ms")
    print("  top op types:")
    for t, c in list(types.items())[:10]:
        print(f"    {t:<28} {c:>8,}")
    return 0


def run_demo(args) -> int:
    """A short, real search on an embedded default: the paper's NMT (2 layers, full size) on 4 simulated K80s,
    with every baseline beside the learned placement."""
    import argparse

    from placer.cli.search import run_search

    print(f"placer demo: learning a placement of NMT (2-layer, hidden 1024, vocab 32k, 40 steps) on 4xK80 "
          f"for {args.budget:.0f} s (first run imports and costs the graph: about a minute)", flush=True)
    ns = argparse.Namespace(graph=None, model="nmt", size="full", batch_size=None, fetch=[], cluster="4xK80",
                            devices=None, reward="sim", workers=None, token_file=None, costs=None,
                            budget=args.budget, max_updates=None, patience=None, groups=None, seed=0,
                            out=args.out, resume=None, no_progress=False, json=False, debug=False)
    return run_search(ns)
