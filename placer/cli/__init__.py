"""The `placer` command. Flags, names and JSON keys follow ../shared/CLI.md (a contract: extend, never rename).

Each subcommand's work lives in its room; this module only parses and dispatches, so `placer --help`
never imports TensorFlow.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Callable

from placer._version import __version__

# subcommand -> "module:function(args) -> int"
COMMANDS = {
    "inspect": "placer.cli.inspect:run_inspect",
    "simulate": "placer.cli.simulate:run_simulate",
    "search": "placer.cli.search:run_search",
    "replace": "placer.cli.search:run_replace",
    "measure": "placer.cli.runtime:run_measure",
    "profile": "placer.cli.runtime:run_profile",
    "worker": "placer.cli.runtime:run_worker",
    "bench": "placer.cli.bench:run_bench",
    "demo": "placer.cli.inspect:run_demo",
    # ---- TF cluster devices and calibration (second wave; parser block: _add_cluster_commands) ----
    "cluster": "placer.cli.runtime:run_cluster",
    "calibrate": "placer.cli.runtime:run_calibrate",
    # ---- pretrained policies (issue 13) ----
    "place": "placer.cli.search:run_place",
    "pretrain": "placer.cli.search:run_pretrain",
}


def _graph_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("graph", nargs="?", metavar="GRAPH",
                   help="graph file: .pb, .pbtxt, .meta, SavedModel dir, .keras (or use --model)")
    p.add_argument("--model", help="built-in model: inception_v3, nmt, nmt4, rnnlm, clip, gpt")
    p.add_argument("--size", choices=["tiny", "small", "full"], default="full", help="built-in model size (default full)")
    p.add_argument("--batch-size", type=int, help="fixes an unknown batch dimension")
    p.add_argument("--precision", default="fp32",
                   help="built-in model precision: fp32 (default), fp16 (mixed, loss scaling), bf16 (mixed)")
    p.add_argument("--layers", type=int, help="--model gpt: number of transformer layers (default 24)")
    p.add_argument("--fetch", action="append", default=[],
                   help="fetch/train-op name for a GraphDef without a train_op collection (repeatable)")


def load_from_args(args):
    """The CLI's graph selection: positional GRAPH or ``--model NAME [--size] [--batch-size] [--fetch]``."""
    from placer.errors import GraphImportError
    from placer.graphs import load

    path = getattr(args, "graph", None)
    model = getattr(args, "model", None)
    if path and model:
        raise GraphImportError(f"give either a graph file ({path}) or --model {model}, not both")
    if not path and not model:
        raise GraphImportError("no graph given: pass a graph file (.pb, .pbtxt, .meta, SavedModel dir, .keras) or --model NAME")
    bs = getattr(args, "batch_size", None)
    if model:
        from placer.graphs.models import build_model

        if getattr(args, "fetch", None):
            raise GraphImportError(f"--fetch applies to a graph file, not to --model {model}")

        return build_model(model, size=getattr(args, "size", None) or "full", batch_size=bs,
                           layers=getattr(args, "layers", None), precision=getattr(args, "precision", None) or "fp32")
    if (getattr(args, "precision", None) or "fp32") != "fp32" or getattr(args, "layers", None):
        raise GraphImportError("--precision and --layers apply to built-in models (--model NAME), not to a graph file")
    return load(path, fetches=getattr(args, "fetch", None) or None, batch_size=bs)


def int_at_least(low: int):
    """An argparse type: an integer >= `low` (else argparse's one-line usage error naming the flag)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {value}")
        return value

    return parse


PLACEMENT_HELP = ("single, random, round_robin, a baseline name (anneal: the best of 1,000 simulated evaluations of "
                  "local search from the best grouped baseline), or a placement.json")


def _json_flag(p):
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="placer", description="Learned device placement for TensorFlow graphs.")
    ap.add_argument("--version", action="version", version=f"placer {__version__}")
    ap.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("inspect", help="import a graph and summarise ops, co-location groups and groups")
    _graph_args(p)
    p.add_argument("--groups", type=int_at_least(1), default=80, help="maximum groups after grouping (default 80)")
    _json_flag(p)

    p = sub.add_parser("simulate", help="simulate one training step of a placement on a (simulated) cluster")
    _graph_args(p)
    p.add_argument("--cluster", required=True, help="NxKIND (e.g. 4xK80), cpu, or a cluster JSON file")
    p.add_argument("--placement", default="single", help=PLACEMENT_HELP)
    p.add_argument("--costs", help="cost table file (from `placer profile`); default: analytical estimate")
    p.add_argument("--order", choices=["ready", "critical"], default="ready", help="per-device op order")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--trace", help="write a Chrome trace (Perfetto) of the simulated step")
    _json_flag(p)

    p = sub.add_parser("search", help="learn a placement with REINFORCE")
    _graph_args(p)
    p.add_argument("--cluster", help="simulated hardware: NxKIND, cpu, or a cluster JSON file (with --devices: "
                                      "the model of those devices, e.g. placer calibrate's cluster.json)")
    p.add_argument("--devices", help="real devices: cpu:N, a comma list of TF device names, or a tasks file")
    p.add_argument("--reward", choices=["sim", "measure"], default="sim")
    p.add_argument("--warmup", type=int, default=2, help="with --reward measure: warm-up steps per placement (2)")
    p.add_argument("--runs", type=int, default=5, help="with --reward measure: timed steps per placement (5)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="with --reward measure: seconds before one measurement is cut (a failed evaluation; 600)")
    p.add_argument("--workers", help="remote measurement workers HOST:PORT,... (with --reward measure)")
    p.add_argument("--token-file", help="token for the workers")
    p.add_argument("--tls-ca", help="PEM certificate to trust for workers started with --tls-cert (enables TLS)")
    p.add_argument("--costs", help="cost table file (from `placer profile`)")
    p.add_argument("--budget", type=float, help="search wall-time budget in seconds (default 300); with --resume "
                                                 "a new total, counting the seconds already spent")
    p.add_argument("--max-updates", type=int_at_least(0), help="stop after this many policy updates (0: only "
                                                                "the baselines)")
    p.add_argument("--max-evaluations", type=int_at_least(1),
                   help="stop after this many placements were evaluated (the baselines count)")
    p.add_argument("--patience", type=int_at_least(1), help="stop after this many updates without improvement")
    p.add_argument("--groups", type=int_at_least(1), help="number of groups (default min(256, 20 x #devices))")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--out", help="output directory")
    p.add_argument("--resume", metavar="DIR", help="continue the search saved in DIR")
    p.add_argument("--split-groups", metavar="BASELINE",
                   help="groups follow this baseline's device boundaries ('best': the fastest that fits), so the "
                        "search can start from it exactly")
    p.add_argument("--policy", help="start from a pretrained policy (a `placer pretrain` directory, or 'default' "
                                    "for the shipped one) instead of imitating a baseline")
    p.add_argument("--local-moves", type=int, metavar="N",
                   help="evaluations of an annealing chain's moves between policy updates (default: 128 with "
                        "--reward sim, 8 with measure; 0 = the policy alone)")
    p.add_argument("--merge-share", type=float, metavar="P",
                   help="share of the chain's moves that merge all of a device's groups into another device "
                        "(default: 0.05 from 8 accelerators on, else 0)")
    p.add_argument("--cluster-share", type=float, metavar="P",
                   help="share of the chain's moves that send a METIS part of the groups (a tower, a stack of "
                        "layers) to one device (default: 0.3 with --policy; else 0.1 from 8 accelerators on, "
                        "else 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _json_flag(p)

    p = sub.add_parser("replace", help="re-place a search's graph onto the devices left after losing some")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the directory `placer search --out` wrote")
    p.add_argument("--exclude", required=True, help="lost devices, comma-separated (e.g. /GPU:3,/GPU:5)")
    p.add_argument("--budget", type=float, default=60.0, help="search seconds after the quick answer (default 60)")
    p.add_argument("--max-updates", type=int_at_least(0), help="stop after this many policy updates")
    p.add_argument("--seed", type=int_at_least(0))
    p.add_argument("--out", required=True, help="output directory (files as for search)")
    p.add_argument("--no-progress", action="store_true")
    _json_flag(p)

    p = sub.add_parser("measure", help="measure a placement's step time on real devices")
    _graph_args(p)
    p.add_argument("--devices", required=True,
                   help="cpu:N, a comma list of TF device names, or a tasks file (placer cluster up)")
    p.add_argument("--placement", default="single", help=PLACEMENT_HELP)
    p.add_argument("--workers", help="measure on remote workers HOST:PORT,...")
    p.add_argument("--token-file")
    p.add_argument("--tls-ca", help="PEM certificate to trust for workers started with --tls-cert (enables TLS)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a measurement is cut")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    _json_flag(p)

    p = sub.add_parser("profile", help="record per-op times on real devices into a cost table")
    _graph_args(p)
    p.add_argument("--devices", required=True, help="cpu:N, TF device names, or a tasks file (profiled on task 0)")
    p.add_argument("--out", required=True, help="cost table file to write")
    p.add_argument("--runs", type=int, default=5)

    p = sub.add_parser("worker", help="serve placement measurements over gRPC")
    p.add_argument("--listen", default="127.0.0.1:50051",
                   help="HOST:PORT (default 127.0.0.1:50051); port 0 picks a free port (printed at start)")
    p.add_argument("--token-file", help="file holding the shared token (required off loopback)")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--allow-unsafe-ops", action="store_true",
                   help="accept graphs with ops outside the safe allowlist (file/process access)")
    p.add_argument("--devices", help="devices this worker measures on (default: all TF sees)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a measurement is cut (default 600)")

    p = sub.add_parser("bench", help="run baselines and the learned search per model x GPU count")
    p.add_argument("--models", default="rnnlm,nmt,nmt4,inception_v3")
    p.add_argument("--gpus", default="2,4")
    p.add_argument("--kind", default="K80")
    p.add_argument("--cluster", help="topology presets instead of --gpus/--kind, comma list (e.g. DGX1,DGX-A100)")
    p.add_argument("--precision", default="fp32", help="fp32 (default), fp16 or bf16 (Keras models)")
    p.add_argument("--size", choices=["tiny", "small", "full"], default="full")
    p.add_argument("--reward", choices=["sim", "measure"], default="sim")
    p.add_argument("--budget", type=float, default=600.0, help="search seconds per cell")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--split-groups", metavar="BASELINE",
                   help="groups follow this baseline's device boundaries ('best': the fastest that fits), so the "
                        "search can start from it exactly (large transformers on 8 GPUs)")
    p.add_argument("--no-anneal", action="store_true",
                   help="skip the annealing reference per cell (anneal_s, policy_s_at_evals, anneal_s_at_evals)")
    p.add_argument("--local-moves", type=int, metavar="N",
                   help="local-move evaluations between policy updates (default: 128 with --reward sim, 8 with "
                        "measure; 0 = the policy alone)")
    p.add_argument("--no-progress", action="store_true")

    p = sub.add_parser("place", help="place a graph with a pretrained policy in seconds (zero-shot, or a short "
                                     "fine-tune with --budget)")
    _graph_args(p)
    p.add_argument("--policy", default="default", help="a `placer pretrain` directory, or 'default' (shipped)")
    p.add_argument("--cluster", help="simulated hardware: NxKIND, a topology preset or a cluster JSON (with "
                                      "--devices: the model of those devices)")
    p.add_argument("--devices", help="real devices, simulated as TF reports them: cpu:N, a comma list of TF device "
                                      "names, or a tasks file")
    p.add_argument("--costs", help="cost table file (from `placer profile`)")
    p.add_argument("--samples", type=int, default=64,
                   help="placements sampled from the policy per batch, at least one batch (default 64)")
    p.add_argument("--sample-seconds", type=float, metavar="S",
                   help="keep sampling batches for S seconds (default 0: one batch); only distinct "
                        "placements are simulated")
    p.add_argument("--refine-seconds", type=float, metavar="S",
                   help="then local moves from the best sample for S seconds (the annealer's moves, never from a "
                        "baseline; default 7.5; 0: none)")
    p.add_argument("--refine-moves", type=int, metavar="N",
                   help="...or until N local moves, whichever ends first (default 4500; 0: seconds only); where the "
                        "moves end first, the same seed gives the same answer every run")
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds of fine-tuning after the zero-shot answer (default 0: none)")
    p.add_argument("--groups", type=int_at_least(1), help="number of groups (default min(256, 20 x #devices))")
    p.add_argument("--no-baselines", action="store_true",
                   help="skip computing the baselines (faster on large graphs; the answer is the policy's alone)")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _json_flag(p)

    p = sub.add_parser("pretrain", help="train a portable policy over a corpus of graphs and clusters")
    p.add_argument("--out", required=True, help="policy directory to write (policy.npz, policy.json); one that "
                                                 "already holds a policy is refused unless --force")
    p.add_argument("--force", action="store_true", help="overwrite the policy --out already holds")
    p.add_argument("--budget", type=float, default=1800.0, help="training seconds (default 1800; building the "
                                                                 "corpus comes on top)")
    p.add_argument("--corpus", default="default", help="default (LSTM families + random Keras stacks), wide (default + "
                   "random multi-input tower models and fp16 stacks, DGX-1 among the clusters), parallel (default + "
                   "compute-bound random tower models at batch 256-512 on 4-8 devices) or quick")
    p.add_argument("--init", metavar="POLICY", help="go on training this policy (a `placer pretrain` directory or "
                                                    "'default') instead of a new one")
    p.add_argument("--imitation-share", type=float, default=0.3, metavar="F",
                   help="share of the budget spent imitating each problem's best baseline first (default 0.3)")
    p.add_argument("--split-groups", metavar="BASELINE",
                   help="each corpus problem's groups follow this baseline's device boundaries ('best': the "
                        "fastest), so the policy imitates that baseline exactly")
    p.add_argument("--teacher-seconds", type=float, default=0.0, metavar="S",
                   help="first anneal each problem's best grouped baseline for S seconds and imitate the annealed "
                        "placement when it is faster (default 0: imitate the baseline); on top of --budget")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    _json_flag(p)

    p = sub.add_parser("demo", help="a short real search on an embedded default (NMT on 4 simulated K80s)")
    p.add_argument("--budget", type=float, default=90.0, help="search seconds (default 90)")
    p.add_argument("--out", default="demo-out")
    _add_cluster_commands(sub)
    return ap


# ---- begin: TF cluster devices and calibration (`placer cluster up|down`, `placer calibrate`) ---------------------
def _add_cluster_commands(sub) -> None:
    p = sub.add_parser("cluster", help="start or stop TF distributed-runtime tasks on this machine (--devices FILE)")
    act = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    q = act.add_parser("up", help="start N tf.distribute.Server tasks on 127.0.0.1, each pinned to its cores")
    q.add_argument("--tasks", type=int, required=True, help="number of tasks (job 'worker')")
    q.add_argument("--cores-per-task", type=int, help="cores (and intra/inter-op threads) per task "
                                                       "(default: the cores split evenly)")
    q.add_argument("--port", type=int, help="first port; tasks use PORT..PORT+N-1 (default: free ports)")
    q.add_argument("--out", required=True, help="tasks file to write (.json; logs go beside it)")
    q.add_argument("--share-cores", action="store_true",
                   help="allow more task cores than this machine has (tasks then share cores: noisy timings)")
    q.add_argument("--any-interface", action="store_true",
                   help="let the TF servers listen on every interface (no authentication!) when no C compiler "
                        "can build the loopback bind shim")
    q.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the tasks (default 120)")
    q = act.add_parser("down", help="stop exactly the task PIDs a tasks file lists")
    q.add_argument("tasks_file", metavar="TASKS_FILE")

    p = sub.add_parser("calibrate", help="profile op costs and measure links: DIR/costs.json, DIR/cluster.json")
    _graph_args(p)
    p.add_argument("--devices", required=True, help="a tasks file (placer cluster up), cpu:N or TF device names")
    p.add_argument("--out", required=True, help="directory for cluster.json and costs.json")
    p.add_argument("--runs", type=int, default=5, help="profiled steps (default 5)")
    p.add_argument("--link-runs", type=int, default=15, help="timed ping-pongs per link and size (default 15)")
    p.add_argument("--sizes", help="ping-pong sizes in bytes, comma list (default 1 KiB..64 MiB in x4 steps)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a measurement is cut")
    p.add_argument("--fit-placements", type=int, default=0, metavar="K",
                   help="tasks files: also measure K placements of the graph (baselines, all on each task, random) "
                        "and fit the tasks' shared speed and a transfer's copy work to them (default 0: off; "
                        "benchmarks/RESULTS.md, 'Simulator vs real')")
    _json_flag(p)
# ---- end: TF cluster devices and calibration --------------------------------------------------------------------


def given_flags(argv: list[str]) -> set[str]:
    """The argument names (argparse dests) that `argv` gives explicitly, even those equal to their defaults
    (`--size full` with `--resume` of a tiny search must be refused, not taken for the default)."""
    ap = build_parser()
    parsers = [ap]
    while parsers:
        for action in parsers.pop()._actions:
            if isinstance(getattr(action, "choices", None), dict):      # the subcommands
                parsers.extend(action.choices.values())
            elif action.dest != "command":
                action.default = argparse.SUPPRESS
    return set(vars(ap.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    args.given = given_flags(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.command:
        ap.print_help()
        return 0
    # measurement runs in child processes; this one keeps off the GPUs. TensorFlow is imported only when a
    # command needs it (~5 s): `placer simulate` on a cached graph, `cluster down` and a worker's own process never
    # do. Whenever it is imported, the GPUs are hidden from this process's runtime first (`placer._tf`)
    from placer._tf import defer_import

    defer_import(quiet=not args.debug, hide=True)
    mod, fn = COMMANDS[args.command].split(":")
    from placer.errors import PlacerError, taking_back_empty_dirs

    try:
        with taking_back_empty_dirs():      # an --out a refused command created and wrote nothing into
            return int(getattr(importlib.import_module(mod), fn)(args) or 0)
    except PlacerError as e:
        if args.debug:
            raise
        from placer.errors import MeasurementError

        # a measured search whose devices or workers all went out mid-search has checkpointed its updates
        kept = isinstance(e, MeasurementError) and _resumable(args, "checkpoint/state.json")
        print(f"placer {args.command}: error: {e}" + (f" (the search so far is kept; continue with: placer search "
                                                       f"--resume {kept})" if kept else ""), file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        run = getattr(args, "resume", None) or getattr(args, "out", None)
        kept = _resumable(args)
        best = run and args.command in ("search", "place") and _stopped_by_interrupt(Path(run) / "summary.json")
        trained = run and args.command == "pretrain" and _stopped_by_interrupt(Path(run) / "policy.json")
        print(f"placer {args.command}: interrupted"
              + (f"; the best placement so far is in {Path(run) / 'placement.json'}" if best else "")
              + (f"; the policy trained so far is in {run} (train on from it with --init {run} --out NEW)"
                 if trained else "")
              + (f"; continue with: placer search --resume {kept}" if kept else ""), file=sys.stderr)
        return 128 + getattr(e, "signum", 2)     # 130 for Ctrl-C, 143 for SIGTERM (a search's Interrupted)


def _stopped_by_interrupt(path: Path) -> bool:
    """Whether the JSON file `path` (a search's summary.json, a policy.json) has "stop_reason": "interrupted": a
    signal stopped the run, which wrote its work so far (`placer.search.search`, `placer.pretrain.pretrain`)."""
    try:
        return json.loads(path.read_text()).get("stop_reason") == "interrupted"
    except (OSError, ValueError, AttributeError):
        return False


def _resumable(args, needs: str = "") -> str | None:
    """The run directory `placer search --resume` can continue (its args.json, and `needs` when given), or None."""
    run = getattr(args, "resume", None) or getattr(args, "out", None)
    ok = args.command == "search" and run and all((Path(run) / f).is_file() for f in ("args.json", needs) if f)
    return run if ok else None


def out_dir(path: str, flag: str = "--out") -> Path:
    """Create the output directory `path` now, before any long work, and check that files can be written in it
    (a search never loses its work to a bad --out): OutputError naming the flag, the path and the OS's reason."""
    from placer.errors import writable_dir

    return writable_dir(path, f"{flag} {path}")


def out_file(path: str, flag: str, kind: "tuple[str, Callable[[Path], bool]] | None" = None,
             command: str = "") -> None:
    """Check now that the file `path` can be written (its directory created, as the writers do): OutputError naming
    the flag, the path and the OS's reason. `kind`: (what the command writes, e.g. "cost table"; a test that a file
    is one): an existing non-empty file that is not one is never overwritten (a placement.json, a source file given
    by a slip), as `placer cluster up --out` keeps any file that is no tasks file; one of that kind is replaced."""
    from placer.errors import OutputError, os_reason

    p = Path(path)
    if kind is not None and p.is_file() and p.stat().st_size > 0 and not kind[1](p):
        raise OutputError(f"{flag} {path}: the file exists and is no {kind[0]}; placer {command} will not overwrite it "
                          f"(remove it or pick another {flag})")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        existed = p.exists()
        with open(p, "a"):
            pass
        if not existed:
            p.unlink()
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot write it: {os_reason(e)}") from None


def flag_or(args, name: str, default):
    """args.NAME, or `default` when it is absent or None (an args.json from before the flag): never a 0 replaced
    by the default, so a bad --runs 0 / --timeout 0 reaches the runner's check and is reported."""
    v = getattr(args, name, None)
    return default if v is None else v


def print_json(obj) -> None:
    print(json.dumps(obj, indent=None, sort_keys=False))
