"""Simulator vs real: how well the calibrated simulator predicts step times measured on a real 2-task TF cluster
of this machine (issue 12, item 3).

    .venv/bin/python benchmarks/fidelity.py                       # inception_v3, nmt, rnnlm at --size small
    .venv/bin/python benchmarks/fidelity.py --models nmt --placements 30 --rounds 9 --runs 1

For each model: start `placer cluster up --tasks 2` (two `tf.distribute.Server` tasks on 127.0.0.1, one core
each), `placer calibrate` the simulator to it (per-op costs profiled on task 0, link latency and bandwidth from a
tensor ping-pong), then take at least `--placements` distinct placements: every baseline, round_robin, single
on each task, random ones, and samples from the first 40% of a simulated search (60 updates). Each is simulated by
the calibrated simulator and measured on the cluster: `--rounds` rounds (9), each measuring every placement in turn
(`--runs` timed runs after one warm-up, 1), so load drift hits all placements alike; the measured step time is the
median of all its runs. Many rounds of one run, not a few rounds of several: runs taken one after another share the
VM's load of that moment, and in the sessions kept here a placement's round medians spread up to twice as much as
its runs within a round (`round_noise`). Writes results/fidelity.json (one object per model: model, placements,
spearman, median_abs_err, p90_abs_err, and every point), results/fidelity.png and the section "Simulator vs real" of
RESULTS.md.
Keep the machine otherwise idle while it runs.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _cluster import RESULTS, calibrate, machine, now, tf_cluster, write_json, write_section  # noqa: E402

TARGET_RHO, TARGET_MEDIAN = 0.9, 0.15


class Recorder:
    """An Evaluator wrapper that keeps every placement a search asks it to evaluate."""

    def __init__(self, inner):
        self.inner, self.devices, self.seen = inner, inner.devices, []

    def evaluate(self, placements):
        self.seen.extend(np.asarray(p).copy() for p in placements)
        return self.inner.evaluate(placements)

    def close(self):
        pass


def choose_placements(problem, n: int, seed: int = 0, search_updates: int = 60) -> list[tuple[str, np.ndarray]]:
    """At least `n` distinct placements: baselines, built-ins, random, and samples spread over a search."""
    from placer.placement import random_placement
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search

    out: list[tuple[str, np.ndarray]] = []

    def add(name, p):
        p = np.asarray(p, np.int64)
        if not any(np.array_equal(p, q) for _, q in out):
            out.append((name, p))

    for name, p in problem.baselines.items():
        add(name, p)
    for spec in ("round_robin", "single"):
        add(spec, problem.resolve(spec))
    for d in range(problem.cluster.num_devices):          # everything on one task
        add(f"all_on_{d}", problem.grouping.expand(np.full(problem.grouping.num_groups, d), None))
    for s in range(3):
        add(f"random_{s}", random_placement(problem.graph, problem.cluster, seed=seed + s))
    rec = Recorder(problem.simulator)
    cl = problem.cluster
    Search(problem.grouping, rec, cpu_index=cl.cpu_index, allowed=problem.allowed, baselines=problem.baselines,
           config=ReinforceConfig(seed=seed), seed=seed, progress=False, tensorboard=False).run(
        3600, max_updates=search_updates)
    samples = rec.seen[len(problem.baselines):]
    need = max(0, n - len(out))
    if samples and need:
        # evenly spaced, in the order the search sampled them, over 4x as many points as needed; the first
        # distinct ones are taken, so the samples come from about the first 40% of the search's samples,
        # before it converges (every kept session's placements were chosen this way)
        idx = np.unique(np.linspace(0, len(samples) - 1, num=4 * need).astype(int))
        for i in idx:
            if len(out) >= n + need // 2:
                break
            add(f"search_{i}", samples[i])
    return out


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


@contextlib.contextmanager
def _nan_quiet():
    """NaN-aware reductions over all-NaN rows (a placement whose runs failed): NaN, without warnings."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _round_blocks(runs_arr, rounds: int) -> np.ndarray | None:
    """The runs as [placement, round, run in round] (NaN for a failed run), or None when the columns do not split
    into `rounds` equal rounds."""
    runs_arr = np.asarray(runs_arr, float)
    if rounds < 1 or runs_arr.shape[1] % rounds:
        return None
    return runs_arr.reshape(runs_arr.shape[0], rounds, runs_arr.shape[1] // rounds)


def retest_spearman(runs_arr, splits: int = 200, seed: int = 0, rounds: int = 1) -> tuple[float, float]:
    """How well the measurements rank the placements against themselves: the Spearman ρ between two halves of
    each placement's measurements (their medians), averaged over `splits` random splits; and that figure
    projected to all the measurements (Spearman-Brown, 2r / (1 + r)). No simulator can be expected to rank the
    placements better than the measurements agree with themselves.

    With `rounds` > 1 (the runs kept round after round, as `measure_interleaved` takes them) the halves are
    halves of the rounds, the same split for every placement and a round's runs kept together, so that each
    half holds every placement measured at the same moments (as the full medians do): runs taken one after
    another share the machine's load of that moment, and splitting them between the halves would overstate the
    agreement (on this VM the spread of a placement's round medians is up to twice that of its runs within a
    round: `round_noise`). With an odd number of rounds the halves differ by one round. rounds=1 splits each
    placement's runs at random on its own (the figure before 2026-12-02)."""
    rng = np.random.default_rng(seed)
    blocks = _round_blocks(runs_arr, rounds) if rounds > 1 else None
    if blocks is not None:
        keep = np.isfinite(blocks).sum(axis=(1, 2)) >= 2
        blocks = blocks[keep]
        if len(blocks) < 3:
            return float("nan"), float("nan")
        rs = []
        with _nan_quiet():
            for _ in range(splits):
                perm = rng.permutation(rounds)
                a = np.nanmedian(blocks[:, perm[: rounds // 2]].reshape(len(blocks), -1), axis=1)
                b = np.nanmedian(blocks[:, perm[rounds // 2:]].reshape(len(blocks), -1), axis=1)
                ok = np.isfinite(a) & np.isfinite(b)
                if ok.sum() >= 3:
                    rs.append(spearman(a[ok], b[ok]))
        if not rs:
            return float("nan"), float("nan")
        half = float(np.mean(rs))
        return half, 2 * half / (1 + half)
    rows = [np.asarray(r, float)[np.isfinite(r)] for r in runs_arr]
    rows = [r for r in rows if len(r) >= 2]
    if len(rows) < 3:
        return float("nan"), float("nan")
    rs = []
    for _ in range(splits):
        a, b = [], []
        for r in rows:
            perm = rng.permutation(len(r))
            a.append(np.median(r[perm[: len(r) // 2]]))
            b.append(np.median(r[perm[len(r) // 2:]]))
        rs.append(spearman(np.array(a), np.array(b)))
    half = float(np.mean(rs))
    return half, 2 * half / (1 + half)


def round_noise(runs_arr, rounds: int) -> dict | None:
    """Where the measurement noise is, from log step times: `within_round` the standard deviation of a
    placement's runs about their round's mean, `between_rounds` that of its round means about their mean (both
    averaged over placements). When the second is the larger, more rounds of fewer runs each narrow a
    placement's median more than more runs per round do."""
    blocks = _round_blocks(runs_arr, rounds)
    if blocks is None or rounds < 2:
        return None
    with _nan_quiet():
        logs = np.log(blocks)
        within = np.nanmean(np.nanvar(logs, axis=2, ddof=1)) if blocks.shape[2] > 1 else float("nan")
        between = np.nanmean(np.nanvar(np.nanmean(logs, axis=2), axis=1, ddof=1))
    return {"rounds": int(rounds), "runs_per_round": int(blocks.shape[2]),
            "within_round": float(np.sqrt(within)), "between_rounds": float(np.sqrt(between))}


def per_round(runs_arr, sim, rounds: int) -> list[dict]:
    """Each measurement round on its own (the runs are kept round after round, `runs` per round): the median
    step time over placements, its drift against round 1, and the simulator's Spearman ρ against that round's
    medians alone. Load that comes and goes during a measurement shows here: a round whose step times drift
    also re-orders the placements it slows unevenly (split placements lose more to another process than
    one-task ones)."""
    blocks = _round_blocks(runs_arr, rounds)
    if blocks is None:
        return []
    out, first = [], None
    for k in range(rounds):
        with np.errstate(all="ignore"):
            med = np.nanmedian(blocks[:, k], axis=1)
        ok = np.isfinite(med) & np.isfinite(sim)
        first = med if first is None else first
        both = ok & np.isfinite(first) & (first > 0)
        out.append({"round": k + 1, "median_step_s": float(np.median(med[ok])),
                    "drift": float(np.median(med[both] / first[both])),
                    "spearman": spearman(sim[ok], med[ok]) if ok.sum() >= 3 else None})
    return out


def measure_interleaved(evaluator, placements, rounds: int, runs: int) -> list[list[float]]:
    """Every placement measured once per round, rounds one after another; returns all runs per placement (a
    failed measurement adds none)."""
    got: list[list[float]] = [[] for _ in placements]
    for r in range(rounds):
        order = list(range(len(placements)))
        if r % 2:
            order.reverse()                           # drift within a round falls on both ends alike
        for i in order:
            o = evaluator.evaluate([placements[i]])[0]
            if not o.failed:
                got[i].extend(float(x) for x in o.runs)
            else:
                print(f"  placement {i} failed: {o.reason}", file=sys.stderr)
    return got


def run_model(model: str, size: str, tasks: Path, workdir: Path, n: int, rounds: int, runs: int, seed: int) -> dict:
    """Choose, simulate and measure the placements of one model; the measured runs and the placements are kept
    in WORKDIR/fidelity_MODEL_SIZE.npz, so that `--resimulate` can grade another simulator on the same
    measurements."""
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.runtime import make_evaluator

    t0 = time.perf_counter()
    graph = build_model(model, size)
    cluster_json, costs_json = calibrate(model, size, tasks, workdir / f"calib_{model}_{size}")
    problem = build_problem(graph, str(cluster_json), costs=str(costs_json), seed=seed)
    chosen = choose_placements(problem, n, seed=seed)
    problem.close()
    names = [c[0] for c in chosen]
    pls = [c[1] for c in chosen]
    with make_evaluator(graph, str(tasks), warmup=1, runs=runs) as ev:
        if list(ev.devices) != problem.device_names:
            raise SystemExit(f"the cluster's devices {list(ev.devices)} are not the calibrated ones "
                             f"{problem.device_names}")
        got = measure_interleaved(ev, pls, rounds, runs)
    width = max(1, max(len(g) for g in got))
    runs_arr = np.full((len(got), width), np.nan)
    for i, g in enumerate(got):
        runs_arr[i, :len(g)] = g
    np.savez(workdir / f"fidelity_{model}_{size}.npz", placements=np.stack(pls), runs=runs_arr,
             names=np.array(names), cluster=np.array(str(cluster_json)), costs=np.array(str(costs_json)),
             rounds=np.array(rounds))
    rec = grade(model, size, graph, workdir, seed, rounds=rounds)
    rec.update(rounds=rounds, runs_per_round=runs, wall_s=time.perf_counter() - t0)
    return rec


def _kept(model: str, size: str, workdir: Path):
    """The kept measurements: placements, runs, names, cluster JSON object, costs path."""
    with np.load(workdir / f"fidelity_{model}_{size}.npz", allow_pickle=False) as z:
        pls, runs_arr, names = z["placements"], z["runs"], [str(x) for x in z["names"]]
        cluster_json, costs_json = str(z["cluster"]), str(z["costs"])
    if not Path(cluster_json).exists():      # measurements moved (e.g. results/fidelity_data): files beside them
        cluster_json = str(workdir / f"calib_{model}_{size}" / "cluster.json")
        costs_json = str(workdir / f"calib_{model}_{size}" / "costs.json")
    return pls, runs_arr, names, json.loads(Path(cluster_json).read_text()), costs_json, cluster_json


def _kept_rounds(model: str, size: str, workdir: Path, given: int | None) -> int:
    """The rounds the kept runs were taken in: recorded beside them (since 2026-12-02), else `given`
    (`--rounds`), else 3 (every earlier session but `fidelity_data_s3`, which took 5)."""
    with np.load(workdir / f"fidelity_{model}_{size}.npz", allow_pickle=False) as z:
        if "rounds" in z.files:
            return int(z["rounds"])
    return int(given) if given else 3


def _measured(runs_arr) -> np.ndarray:
    return np.array([np.median(r[np.isfinite(r)]) if np.isfinite(r).any() else np.nan for r in runs_arr])


def grade(model: str, size: str, graph, workdir: Path, seed: int = 0, shared_speed: float | None = None,
          cpu_copy: float = 0.0, rounds: int | None = None) -> dict:
    """Simulate the kept placements with the current simulator and compare with their kept measurements.
    shared_speed: model the tasks' cores as one compute group at that speed (see `chains.py`); cpu_copy: the
    fraction of each transfer's byte time both tasks' cores spend copying (links "cpu_copy"); both written into
    a copy of the calibrated cluster.json."""
    from placer.sim.cluster import cluster_from_dict
    from placer.sim.costs import CostTable
    from placer.sim.fit import with_machine
    from placer.sim.simulator import Simulator

    pls, runs_arr, names, cluster_obj, costs_json, cluster_json = _kept(model, size, workdir)
    rounds = _kept_rounds(model, size, workdir, rounds)
    obj = with_machine(cluster_obj, shared_speed if shared_speed is not None else 1.0, cpu_copy)
    simulator = Simulator(graph, cluster_from_dict(obj, cluster_json), CostTable.load(costs_json, graph))
    sim = np.array([simulator.simulate(p).step_time for p in pls], float)
    if shared_speed is not None or cpu_copy:
        tag = ("_shared" if shared_speed is not None else "") + ("_copy" if cpu_copy else "")
        cluster_json = str(workdir / f"cluster_{model}_{size}{tag}.json")
        Path(cluster_json).write_text(json.dumps(obj, indent=1))
    return _record(model, size, graph, names, runs_arr, sim,
                   {"shared_speed": shared_speed, "cpu_copy": float(cpu_copy), "machine": "given",
                    "cluster": cluster_json}, rounds)


def grade_fitted(models: list[str], size: str, graphs: dict, workdir: Path, how: str, seed: int = 0,
                 rounds: int | None = None) -> list[dict]:
    """Grade each model with the machine parameters (shared speed, cpu_copy) fitted to OTHER measurements
    (`placer.sim.fit`): `how="models"`: fitted to the other models' placements (leave one model out: the two
    figures are the machine's, not a model's); `how="halves"`: fitted to half of this model's placements,
    each half graded by the fit to the other (2-fold, split by `seed`). Nothing is graded by a fit it was in."""
    from placer.sim.costs import CostTable
    from placer.sim.fit import pick, simulate_grid

    data = {}
    for m in models:
        pls, runs_arr, names, cluster_obj, costs_json, cluster_json = _kept(m, size, workdir)
        grid = simulate_grid(graphs[m], cluster_obj, CostTable.load(costs_json, graphs[m]), list(pls))
        data[m] = (grid, _measured(runs_arr), runs_arr, names, cluster_json, _kept_rounds(m, size, workdir, rounds))
    out = []
    for m in models:
        grid, meas, runs_arr, names, cluster_json, m_rounds = data[m]
        sim, folds = np.full(len(meas), np.nan), []
        if how == "models":
            others = [k for k in models if k != m]
            if not others:
                raise SystemExit("--fit models needs at least two models")
            ss, cc, sc = pick([data[k][0] for k in others], [data[k][1] for k in others])
            sim = grid[(ss, cc)]
            folds.append({"fitted_on": others, "shared_speed": ss, "cpu_copy": cc, "fit_median_abs_log_err": sc})
        else:
            perm = np.random.default_rng(seed).permutation(len(meas))
            halves = [np.sort(perm[::2]), np.sort(perm[1::2])]
            for k, test in enumerate(halves):
                train = np.full(len(meas), np.nan)
                train[halves[1 - k]] = meas[halves[1 - k]]
                ss, cc, sc = pick([grid], [train])
                sim[test] = grid[(ss, cc)][test]
                folds.append({"fitted_on": [names[i] for i in halves[1 - k]], "shared_speed": ss, "cpu_copy": cc,
                              "fit_median_abs_log_err": sc})
        out.append(_record(m, size, graphs[m], names, runs_arr, sim,
                           {"shared_speed": None, "cpu_copy": None, "folds": folds,
                            "machine": "fitted to the other models" if how == "models" else "fitted, 2-fold",
                            "cluster": f"{cluster_json} (+ shared_speed and cpu_copy as fitted)"}, m_rounds))
    return out


def _record(model, size, graph, names, runs_arr, sim, extra: dict, rounds: int = 3) -> dict:
    points = []
    for name, s, row in zip(names, sim, runs_arr):
        g = row[np.isfinite(row)]
        points.append({"source": name, "simulated_s": None if not np.isfinite(s) else float(s),
                       "measured_s": float(np.median(g)) if len(g) else None, "runs": int(len(g)),
                       "spread": float((g.max() - g.min()) / np.median(g)) if len(g) else None})
    ok = [p for p in points if p["simulated_s"] is not None and p["measured_s"] is not None]
    sim_a = np.array([p["simulated_s"] for p in ok])
    meas_a = np.array([p["measured_s"] for p in ok])
    err = np.abs(sim_a - meas_a) / meas_a
    half, full = retest_spearman(runs_arr, rounds=rounds)
    _, full_runs = retest_spearman(runs_arr)
    rec = {"model": model, "size": size, "placements": len(ok), "spearman": spearman(sim_a, meas_a),
           "median_abs_err": float(np.median(err)), "p90_abs_err": float(np.percentile(err, 90)),
           "ops": int(graph.num_ops), "measured_range_s": [float(meas_a.min()), float(meas_a.max())],
           "mean_signed_err": float(np.mean((sim_a - meas_a) / meas_a)), "failed": len(points) - len(ok),
           "retest_spearman_half": half, "retest_spearman": full, "retest_spearman_runs": full_runs,
           "round_noise": round_noise(runs_arr, rounds),
           "per_round": per_round(runs_arr, np.asarray(sim, float), rounds), **extra, "points": points}
    how = ("  [" + "; ".join(f"ss {f['shared_speed']:.2f} cc {f['cpu_copy']:.2f} from {len(f['fitted_on'])}"
                             for f in extra["folds"]) + "]") if extra.get("folds") else ""
    print(f"{model}: {len(ok)} placements, spearman {rec['spearman']:.3f}, median |err| "
          f"{rec['median_abs_err']:.1%}, p90 {rec['p90_abs_err']:.1%}, mean signed {rec['mean_signed_err']:+.1%}, "
          f"measured {meas_a.min() * 1e3:.1f}-{meas_a.max() * 1e3:.1f} ms, retest ρ {full:.3f} (halves {half:.3f}; "
          f"by runs {full_runs:.3f})"
          + (f", noise within/between rounds {rn['within_round']:.3f}/{rn['between_rounds']:.3f}"
             if (rn := rec["round_noise"]) else "") + how, flush=True)
    return rec


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(records), figsize=(4.5 * len(records), 4.2), squeeze=False)
    for ax, r in zip(axes[0], records):
        pts = [p for p in r["points"] if p["simulated_s"] is not None and p["measured_s"] is not None]
        m = np.array([p["measured_s"] for p in pts]) * 1e3
        s = np.array([p["simulated_s"] for p in pts]) * 1e3
        base = np.array([not p["source"].startswith(("search_", "random_")) for p in pts])
        ax.scatter(m[~base], s[~base], s=14, alpha=0.7, label="search samples, random")
        ax.scatter(m[base], s[base], s=22, marker="s", label="baselines, built-ins")
        lo, hi = min(m.min(), s.min()) * 0.9, max(m.max(), s.max()) * 1.1
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured step time (ms), 2-task TF cluster")
        ax.set_ylabel("simulated step time (ms), calibrated")
        ax.set_title(f"{r['model']} ({r['size']}): ρ={r['spearman']:.2f}, median |err| {r['median_abs_err']:.0%}",
                     fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _rt(r: dict) -> str:
    full, half = r.get("retest_spearman"), r.get("retest_spearman_half")
    return "n/a" if full is None or not np.isfinite(full) else f"{full:.3f} (halves {half:.3f})"


def table(records: list[dict]) -> list[str]:
    rows = ["| model | size | ops | placements | measured range (ms) | Spearman ρ | median \\|err\\| | p90 \\|err\\| "
            "| mean signed err | measured vs itself ρ | target ρ ≥ 0.9, median ≤ 15% |",
            "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in records:
        met = r["spearman"] >= TARGET_RHO and r["median_abs_err"] <= TARGET_MEDIAN
        lo, hi = r["measured_range_s"]
        rows.append(f"| {r['model']} | {r['size']} | {r['ops']:,} | {r['placements']} | {lo * 1e3:.1f}–{hi * 1e3:.1f} "
                    f"| {r['spearman']:.3f} | {r['median_abs_err']:.1%} | {r['p90_abs_err']:.1%} "
                    f"| {r['mean_signed_err']:+.1%} | {_rt(r)} | {'met' if met else 'MISSED'} |")
    return rows


def section(records: list[dict], command: str, started: str, mach: str, base: list[dict] | None = None,
            note: str = "") -> str:
    shared = records[0].get("shared_speed") if records else None
    fitted = bool(records) and str(records[0].get("machine", "")).startswith("fitted")
    extra = []
    if base and fitted:
        bs = base[0].get("shared_speed")
        extra = ["", "The same measurements graded with the machine as `placer calibrate` measures it (per-op costs, "
                 "links" + (f", one compute group at the MatMul chains' shared speed {bs:.3f}" if bs else "") +
                 ", no copy work):", "", *table(base)]
    elif base:
        extra = ["", "The same measurements graded by the simulator without the compute group (calibrated costs "
                 "and links only; the cluster.json `placer calibrate` wrote before it measured compute sharing):",
                 "", *table(base)]
    fit_text = ""
    if fitted:
        fits = "; ".join(f"{r['model']}: " + ", ".join(f"shared speed {f['shared_speed']:.2f}, cpu_copy "
                                                          f"{f['cpu_copy']:.2f} (fitted on {', '.join(f['fitted_on'])})"
                                                          if records[0]["machine"] == "fitted to the other models"
                                                          else f"shared speed {f['shared_speed']:.2f}, cpu_copy "
                                                               f"{f['cpu_copy']:.2f}" for f in r["folds"])
                         for r in records)
        fit_text = (" Two machine figures are not taken from micro-benchmarks but fitted (`placer.sim.fit`, the "
                    "median |log(simulated / measured)|) to measured placements other than those graded ("
                    f"{records[0]['machine']}): the tasks' shared speed when both compute, and the fraction of a "
                    "transfer's byte time both tasks' cores spend on its gRPC copy (links `cpu_copy`). "
                    f"Fitted: {fits}.")
    noise_text = ""
    if any(r.get("round_noise") for r in records):
        noise_text = (" Where the noise is (standard deviation of log step time, mean over placements: of a "
                      "placement's runs within a round / of its round medians; `round_noise`): " + "; ".join(
                          f"{r['model']} {n['within_round']:.3f} / {n['between_rounds']:.3f}"
                          if np.isfinite(n["within_round"]) else f"{r['model']} – / {n['between_rounds']:.3f}"
                          for r in records if (n := r.get("round_noise"))) +
                      f" ({records[0]['round_noise']['rounds']} rounds of "
                      f"{records[0]['round_noise']['runs_per_round']} run"
                      f"{'s' if records[0]['round_noise']['runs_per_round'] > 1 else ''})."
                      if records[0].get("round_noise") else ".")
    rounds_text = ""
    if any(r.get("per_round") for r in records):
        rounds_text = (" Each measurement round on its own (the simulator's ρ against that round's medians; the "
                       "round's median step time against round 1's, `per_round`): " + "; ".join(
                           f"{r['model']}: " + ", ".join(f"ρ {x['spearman']:.3f} ({x['drift'] - 1:+.1%})"
                                                         for x in r["per_round"] if x["spearman"] is not None)
                           for r in records if r.get("per_round")) + ".")
    return "\n".join([
        "## Simulator vs real (measured on a 2-task TF cluster of this machine)",
        "",
        f"Written by `benchmarks/fidelity.py` ({started}; {mach}). Command: `{command}`.",
        "Each point: one placement's step time simulated by the calibrated simulator (`placer calibrate` on the "
        "same cluster: per-op costs profiled on task 0, per-pair link latency/bandwidth from a ping-pong) against "
        "the median of its measured runs on two `tf.distribute.Server` tasks pinned to one core each (measured, "
        "runs of all placements interleaved). Errors are |simulated − measured| / measured. "
        "Scatter: `results/fidelity.png`; every point: `results/fidelity.json`. \"Measured vs itself\": how well "
        "the measurements rank the placements against themselves (the measurement rounds split at random into two "
        "halves, the same split for every placement and a round's runs kept together, Spearman ρ between the "
        "halves' medians, mean of 200 splits, projected to all rounds by Spearman-Brown; `retest_spearman`): a "
        "ceiling on what any simulator can reach. The figure before 2026-12-02 split each placement's runs at "
        "random on its own (`retest_spearman_runs`: " + ", ".join(
            f"{r['model']} {r['retest_spearman_runs']:.3f}" for r in records
            if r.get("retest_spearman_runs") is not None) + "): with several runs per round it puts runs of one "
        "round, taken one after another under the same load, in both halves and overstates the agreement; with "
        "one it compares halves taken at different moments for different placements." + noise_text + (f" {note}" if note else "")
        + (f" The tasks' two cores are one compute group at shared speed {shared:.3f} (two MatMul chains: "
           f"`benchmarks/chains.py`, the measurement `placer calibrate` makes): this VM's two vCPUs slow each "
           f"other down, so a placement split over them gains far less than two independent cores would give."
           if shared else "") + fit_text + rounds_text,
        "",
        *table(records),
        *extra,
        "",
        "![fidelity](results/fidelity.png)",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="inception_v3,nmt,rnnlm")
    ap.add_argument("--size", default="small")
    ap.add_argument("--placements", type=int, default=30)
    ap.add_argument("--rounds", type=int,
                    help="measurement rounds (default 9; with --resimulate: the rounds the kept runs were taken in, "
                         "when the kept file does not say: 3)")
    ap.add_argument("--runs", type=int, help="timed runs per placement per round (default 1: the noise on this VM "
                                             "is mostly between rounds, `round_noise`)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="/tmp/placer-fidelity")
    ap.add_argument("--no-write", action="store_true", help="print only (no results files)")
    ap.add_argument("--note", default="", help="a sentence added to the RESULTS.md section (e.g. when the kept "
                                               "measurements were taken)")
    ap.add_argument("--shared-speed",
                    help="with --resimulate: the tasks' cores share one physical core, each at this speed when both "
                         "are busy; a number, or `chains` for the last record of results/chains.jsonl "
                         "(`benchmarks/chains.py`, the measurement `placer calibrate` makes: speedup / 2)")
    ap.add_argument("--cpu-copy", type=float, default=0.0,
                    help="with --resimulate: the fraction of each transfer's byte time both tasks' cores spend on "
                         "its gRPC copy (links \"cpu_copy\")")
    ap.add_argument("--fit", choices=["models", "halves"],
                    help="with --resimulate: grade with shared speed and cpu_copy fitted (placer.sim.fit) to other "
                         "measurements: `models` to the other models' placements, `halves` to the other half of "
                         "this model's (2-fold); the given calibration is graded beside it")
    ap.add_argument("--resimulate", action="store_true",
                    help="measure nothing: grade the current simulator on the measurements kept in --workdir "
                         "(those of the published run: benchmarks/results/fidelity_data)")
    a = ap.parse_args(argv)
    started, mach = now(), machine()
    command = "python benchmarks/fidelity.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    records, base = [], []
    workdir = Path(a.workdir)
    models = [x.strip() for x in a.models.split(",") if x.strip()]
    if a.shared_speed == "chains":
        rec = json.loads((RESULTS / "chains.jsonl").read_text().strip().splitlines()[-1])
        a.shared_speed = min(1.0, rec["one_task_s"] / (2.0 * rec["split_s"]))
        print(f"shared speed {a.shared_speed:.4f} from chains.py of {rec['date']}")
    elif a.shared_speed is not None:
        a.shared_speed = float(a.shared_speed)
    if a.resimulate:
        from placer.graphs.models import build_model

        graphs = {m: build_model(m, a.size) for m in models}
        if a.fit:
            records = grade_fitted(models, a.size, graphs, workdir, a.fit, a.seed, rounds=a.rounds)
            base = [grade(m, a.size, graphs[m], workdir, a.seed, shared_speed=a.shared_speed, cpu_copy=a.cpu_copy,
                          rounds=a.rounds)
                    for m in models]
        for m in models if not a.fit else ():
            graph = graphs[m]
            rec = grade(m, a.size, graph, workdir, a.seed, shared_speed=a.shared_speed, cpu_copy=a.cpu_copy,
                        rounds=a.rounds)
            if a.shared_speed is not None or a.cpu_copy:
                base.append(grade(m, a.size, graph, workdir, a.seed, rounds=a.rounds))
            records.append(rec)
    else:
        with tf_cluster(workdir) as tasks:
            for m in models:
                records.append(run_model(m, a.size, tasks, workdir, a.placements, a.rounds or 9, a.runs or 1,
                                         a.seed))
    if a.no_write:
        return 0
    out = [{k: v for k, v in r.items()} for r in records]
    write_json(RESULTS / "fidelity.json", out)
    plot(records, RESULTS / "fidelity.png")
    write_section("fidelity", section(records, command.strip(), started, mach, base=base, note=a.note))
    print(f"wrote {RESULTS / 'fidelity.json'}, {RESULTS / 'fidelity.png'} and RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
