"""`placer bench` (CLI.md): the command-line glue over `placer.bench` (cells, results.json, RESULTS.md)."""
from __future__ import annotations

import logging

from placer.bench import CellSettings, load_results, run_cell, write_json, write_report
from placer.cli import out_dir
from placer.errors import ClusterError, SearchError

log = logging.getLogger(__name__)


def run_bench(args) -> int:
    """`placer bench` (CLI.md). Returns the exit code."""
    models = [m.strip() for m in str(args.models).split(",") if m.strip()]
    try:
        gpus = [int(x) for x in str(args.gpus).split(",") if x.strip()]
    except ValueError:
        raise SearchError(f"--gpus {args.gpus!r}: expected a comma list of GPU counts, e.g. 2,4") from None
    if not models or not gpus or min(gpus) < 1:
        raise SearchError("bench needs at least one model (--models) and GPU counts >= 1 (--gpus)")
    if args.reward != "sim":
        raise SearchError("bench --reward measure needs the cells' real GPUs (NxKIND); run `placer search "
                          "--reward measure` on the machine that has them. bench simulates (--reward sim).")
    if args.budget <= 0:
        raise SearchError(f"--budget must be positive seconds per cell, got {args.budget}")
    if getattr(args, "local_moves", None) is not None and args.local_moves < 0:
        raise SearchError(f"--local-moves must be 0 or more, got {args.local_moves}")
    from placer.sim.cluster import parse_cluster

    from placer.graphs.models import MODELS, PRECISIONS

    unknown = [m for m in models if m not in MODELS]
    if unknown:      # before any cell (it was found in the first cell's build, under the progress bar)
        raise SearchError(f"--models: unknown model {unknown[0]!r}; valid models: {', '.join(MODELS)}")
    precision = getattr(args, "precision", None) or "fp32"
    if precision not in PRECISIONS:
        raise SearchError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    try:                                                                    # validates the kind early
        kind = parse_cluster(f"1x{args.kind}").meta.get("gpu_kind", args.kind)
    except ClusterError as e:
        raise ClusterError(f"--kind {args.kind}: {e}") from None
    out = out_dir(args.out)
    path = out / "results.json"
    results = load_results(path)
    if getattr(args, "cluster", None):      # topology presets (DGX1, DGX-A100, ...): one cell per model x cluster
        cells = []
        for spec in (x.strip() for x in str(args.cluster).split(",") if x.strip()):
            c = parse_cluster(spec)
            cells += [CellSettings(m, len(c.gpu_indices), c.meta.get("gpu_kind", c.devices[0].kind), args.size,
                                   args.reward, float(args.budget), int(args.seed), cluster=c.name,
                                   precision=precision, anneal=not getattr(args, "no_anneal", False),
                                   split_groups=getattr(args, "split_groups", None),
                                   local_moves=getattr(args, "local_moves", None)) for m in models]
    else:
        cells = [CellSettings(m, n, kind, args.size, args.reward, float(args.budget), int(args.seed),
                              precision=precision, anneal=not getattr(args, "no_anneal", False),
                              split_groups=getattr(args, "split_groups", None),
                              local_moves=getattr(args, "local_moves", None)) for m in models for n in gpus]
    bar = None
    if not getattr(args, "no_progress", False):
        from tqdm import tqdm

        bar = tqdm(total=len(cells), desc="bench", unit="cell")
    try:
        for s in cells:
            idx = next((i for i, c in enumerate(results) if c.get("model") == s.model and c.get("gpus") == s.gpus
                        and c.get("kind") == s.kind and c.get("cluster") == (s.cluster or c.get("cluster"))
                        and c.get("precision", "fp32") == s.precision), None)
            if idx is not None and results[idx].get("settings") == s.key():
                log.info("bench: %s already in %s, skipped", s.label, path)
            else:
                if bar is not None:
                    bar.set_postfix_str(s.label)
                cell = run_cell(s, out, progress=False)
                if idx is None:
                    results.append(cell)
                else:
                    results[idx] = cell
                write_json(path, results)
                write_report(results, out, command=_command(args))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    write_report(results, out, command=_command(args))
    print(f"wrote {path} and {out / 'RESULTS.md'} ({len(results)} cells)")
    return 0


def _command(args) -> str:
    where = (f"--cluster {args.cluster}" if getattr(args, "cluster", None) else f"--gpus {args.gpus} --kind {args.kind}")
    prec = getattr(args, "precision", None) or "fp32"
    return (f"placer bench --models {args.models} {where} --size {args.size} "
            + ("" if prec == "fp32" else f"--precision {prec} ")
            + f"--reward {args.reward} --budget {args.budget:g} --seed {args.seed}"
            + (f" --split-groups {args.split_groups}" if getattr(args, "split_groups", None) else "")
            + (" --no-anneal" if getattr(args, "no_anneal", False) else "")
            + (f" --local-moves {args.local_moves}" if getattr(args, "local_moves", None) is not None else "")
            + f" --out {args.out}")
