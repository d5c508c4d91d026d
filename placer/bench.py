"""`placer bench`: every baseline and the learned search per cell (model × GPU count), the paper's table.

For each cell: build the model (`placer.graphs.models.build_model(name, size)`) and ONE `PlacementProblem` on
the cluster `NxKIND` (cost table, simulator, grouping, and every baseline of `placer.baselines.BASELINES`
computed once); simulate each baseline with the problem's simulator (null when it runs out of memory or cannot
be built, with the reason in `baseline_errors`); run the learned search on the same problem (`placer.search`,
budget seconds per cell). After each cell `DIR/results.json` (a list of cells, keys as in CLI.md) is
rewritten, so a rerun skips the cells already there with the same settings; then `DIR/RESULTS.md` and the
figures are regenerated from results.json. The command-line glue is `placer.cli.bench`.

Cell keys: model, gpus, kind, baselines {name: seconds | null}, rl_s (the placement the search returned:
never worse than the best baseline it knows), search_best_s (the best the policy itself sampled),
lower_bound_s, search_wall_s; extra: settings, rl_from, baseline_wall_s, baseline_errors, evaluations,
ops, cost_source, date, machine.

With `CellSettings.anneal` (default on) a cell also runs the local-search reference
(`placer.baselines.anneal`) on the same problem and adds `anneal_s` (annealing for the cell's wall budget, also
as `baselines["anneal"]`), `anneal_s_at_evals` and `policy_s_at_evals` ({"1000": s, "5000": s}: see
`best_within` for the rule, the same for both methods) and `anneal` (its runs' evaluations, wall and start).
"""
from __future__ import annotations

import datetime
import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer.errors import PlacerError, SearchError
from placer.grouped import auto_shares

log = logging.getLogger(__name__)

# table columns: (key in baselines, header), in the paper's order, then the list schedulers
PAPER_COLUMNS = [("single_cpu", "Single-CPU"), ("single_gpu", "Single-GPU")]
GPU_COLUMNS = [("scotch", "Scotch"), ("metis", "MinCut"), ("expert", "Expert")]
EXTRA_COLUMNS = [("heft", "HEFT"), ("m_topo", "m-TOPO"), ("m_etf", "m-ETF"), ("m_sct", "m-SCT")]
# what counts as "a baseline" for the speedup (random/round_robin are sanity checks, not baselines of the paper)
SPEEDUP_BASELINES = ("single_cpu", "single_gpu", "scotch", "metis", "expert", "heft", "m_topo", "m_etf", "m_sct")
RESULT_KEYS = ("model", "gpus", "kind", "baselines", "rl_s", "search_best_s", "lower_bound_s", "search_wall_s")
# evaluation counts at which the policy and the annealer are compared (keys of *_s_at_evals, as strings)
EVAL_POINTS = (1000, 5000)


@dataclass
class CellSettings:
    model: str
    gpus: int
    kind: str
    size: str
    reward: str
    budget: float
    seed: int
    cluster: str | None = None     # a topology preset (DGX1, DGX-A100, HGX-H100, NxDGX-A100) instead of gpus x kind
    precision: str = "fp32"
    anneal: bool = True            # also run the local-search reference (placer.baselines.anneal)
    split_groups: str | None = None  # groups follow this baseline's devices ("best": the fastest), build_problem
    local_moves: int | None = None   # ReinforceConfig.local_moves for the search (None: the reward's default)

    def search_config(self):
        """The search's ReinforceConfig: the reward's defaults, with `local_moves` when given."""
        from placer.rl.reinforce import ReinforceConfig

        return ReinforceConfig.for_reward(self.reward, seed=self.seed,
                                          **({} if self.local_moves is None else {"local_moves": int(self.local_moves)}))

    def key(self) -> dict:
        k = {"size": self.size, "reward": self.reward, "budget": float(self.budget), "seed": int(self.seed),
             "anneal": bool(self.anneal)}
        if self.cluster or self.precision != "fp32":
            k.update(cluster=self.cluster, precision=self.precision)
        if self.split_groups:
            k["split_groups"] = self.split_groups
        from placer.sim.cluster import parse_cluster

        cluster = parse_cluster(self.spec)   # merges' and cluster moves' default shares follow its accelerators
        D, cpu = cluster.num_devices, cluster.cpu_index
        cfg = auto_shares(self.search_config(), D, cpu, "local_")
        if cfg.local_moves:      # cells searched before local moves existed have none
            k["local_moves"] = int(cfg.local_moves)
            if cfg.local_share:  # ...and before the chain's share of the wall time (2026-12-05) none
                k["local_share"] = float(cfg.local_share)
            if cfg.local_share_idle:   # ...nor a larger share while the policy brings no best (2026-12-06)
                k["local_share_idle"] = float(cfg.local_share_idle)
                k["local_share_patience"] = int(cfg.local_share_patience)
            if cfg.local_schedule != "search":   # ...nor a schedule that starts at the chain's first batch (same day)
                k["local_schedule"] = cfg.local_schedule
            # ...nor attractions, merges (2026-12-06), cluster moves (2026-12-07)
            for name in ("local_attract_prob", "local_merge_prob", "local_cluster_prob"):
                if v := getattr(cfg, name):
                    k[name] = float(v)
        if self.anneal:
            from placer.baselines.anneal import AnnealConfig

            a = auto_shares(AnnealConfig(), D, cpu)
            for name in ("attract_prob", "merge_prob", "cluster_prob"):
                if v := getattr(a, name):
                    k[f"anneal_{name}"] = float(v)
        return k

    @property
    def spec(self) -> str:
        return self.cluster or f"{self.gpus}x{self.kind}"

    @property
    def label(self) -> str:
        """Cell directory / display name: model_4xK80, gpt_DGX1_fp16."""
        return f"{self.model}_{self.spec}" + ("" if self.precision == "fp32" else f"_{self.precision}")


def _num(x) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _machine() -> str:
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"


def evaluate_baselines(problem) -> tuple[dict, dict]:
    """Simulate every baseline of the problem (computed once when it was built). Returns (step seconds | None,
    error reasons): None when a baseline runs out of memory or could not be built."""
    times: dict[str, float | None] = {k: None for k in problem.baseline_errors}
    errors = dict(problem.baseline_errors)
    names = list(problem.baselines)
    for name, o in zip(names, problem.simulator.evaluate([problem.baselines[n] for n in names])):
        if o.failed:
            times[name], errors[name] = None, o.reason or "failed"
        else:
            times[name] = float(o.step_time)
    return times, errors


def best_baseline(baselines: dict, names=SPEEDUP_BASELINES) -> tuple[str | None, float | None]:
    vals = [(v, k) for k, v in baselines.items() if k in names and v is not None]
    if not vals:
        return None, None
    v, k = min(vals)
    return k, v


def cell_label(c: dict) -> str:
    """The directory name of a results.json cell (CellSettings.label)."""
    prec = c.get("precision", "fp32")
    return f"{c['model']}_{c.get('cluster') or str(c['gpus']) + 'x' + c['kind']}" + ("" if prec == "fp32" else f"_{prec}")


def run_cell(s: CellSettings, out_dir: Path, *, progress: bool = False) -> dict:
    """One cell of the table (see the module docstring)."""
    from placer.graphs.models import build_model
    from placer.problem import build_problem
    from placer.search import search

    graph = build_model(s.model, s.size, precision=s.precision)
    problem = build_problem(graph, s.spec, seed=s.seed, split_groups=s.split_groups)
    try:
        times, errors = evaluate_baselines(problem)
        cell_dir = out_dir / s.label
        cell_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        res, search_error = None, None
        try:
            config = s.search_config() if s.local_moves is not None else None
            res = search(problem, budget_seconds=s.budget, seed=s.seed, out_dir=str(cell_dir), progress=progress,
                         model_name=s.model, config=config)
        except PlacerError as e:  # the cell still records the baselines; the table says the search failed
            log.warning("bench: search failed for %s on %s: %s", s.label, s.spec, e)
            search_error = str(e)
        search_wall = time.perf_counter() - t0
        cell = cell_record(s, problem, times, errors, res, search_wall, search_error, cell_dir)
        if s.anneal:
            cell.update(anneal_record(problem, s.budget, s.seed))
            cell["baselines"]["anneal"] = cell["anneal_s"]
            cell["policy_s_at_evals"] = ({str(n): best_within(policy_curve(res, len(problem.baselines)), n)
                                          for n in EVAL_POINTS} if res is not None else {})
    finally:
        problem.close()
    return cell


def best_within(curve: list[dict], n: int) -> float | None:
    """The best step time a method reached within its first `n` evaluations: the least `best_s` among the rows
    of `curve` with `evaluations <= n`; None when the method never used `n` evaluations (it stopped earlier) or
    had nothing working by then.

    The rule, the same for the policy and the annealer: evaluations count every placement the method sent to
    the evaluator: the op-level baselines, their grouped versions (the start), then its own samples or moves.
    The best counts the grouped baselines (the start both methods share) and the method's own placements, not
    the op-level baselines (the floor `rl_s` adds). Rows come after whole batches (the policy's K = 16 samples,
    the annealer's moves), so a batch that crosses `n` does not count.

    >>> best_within([{"evaluations": 10, "best_s": 2.0}, {"evaluations": 26, "best_s": 1.5}], 20)
    2.0
    >>> best_within([{"evaluations": 10, "best_s": 2.0}], 20) is None
    True
    """
    if not curve or max(r["evaluations"] for r in curve) < n:
        return None
    vals = [r["best_s"] for r in curve if r["evaluations"] <= n and r["best_s"] is not None]
    return _num(min(vals)) if vals else None


def policy_curve(res, n_baselines: int) -> list[dict]:
    """The policy search's (a SearchResult's) best-so-far against evaluations, as `best_within` reads it: a
    first row once the `n_baselines` op-level baselines and the grouped baselines were evaluated, holding the
    best grouped baseline, then a row after each batch that improved the policy's own best (its samples, the
    local moves between updates, a zero-shot refinement: `extra["best_curve"]`), and a last row at the search's
    total evaluations. A result without that curve (older ones) falls back on one row per update (`history`),
    which counts the local moves between two updates only at the second."""
    grouped = [t for t in (res.extra.get("grouped_baselines") or {}).values() if t is not None]
    e0 = n_baselines + len(res.extra.get("grouped_baselines") or {})
    start = min(grouped) if grouped else float("inf")
    rows = [{"evaluations": e0, "best_s": start}]
    if "best_curve" in res.extra:
        rows += [{"evaluations": int(e), "best_s": min(start, float(t))} for e, t in res.extra["best_curve"]]
        best = min([r["best_s"] for r in rows])
        return rows + [{"evaluations": int(res.evaluations), "best_s": min(best, float(res.search_best))}]
    return rows + [
        {"evaluations": int(h["evaluations"]), "best_s": min(start, float(h["search_best_s"]))}
        for h in res.history if isinstance(h, dict) and "evaluations" in h]


def anneal_record(problem, budget_s: float, seed: int) -> dict:
    """The annealer on the cell's problem: once for the wall budget (`anneal_s`), and once per EVAL_POINTS
    count with that many evaluations as its budget (its schedule cools over the budget it is given)."""
    from placer.baselines.anneal import anneal

    wall = anneal(problem, budget_seconds=budget_s, seed=seed)
    at = {n: anneal(problem, max_evaluations=n, seed=seed) for n in EVAL_POINTS}
    return {"anneal_s": _num(wall.step_time),
            "anneal_s_at_evals": {str(n): best_within(r.history, n) for n, r in at.items()},
            "anneal": {"evaluations": int(wall.evaluations), "wall_s": float(wall.wall_s), "start": wall.start,
                       "start_s": _num(wall.start_s), "stop_reason": wall.stop_reason,
                       "at_evals_wall_s": {str(n): float(r.wall_s) for n, r in at.items()}}}


def cell_record(s: CellSettings, problem, times: dict, errors: dict, res, search_wall: float,
                search_error: str | None, cell_dir: Path) -> dict:
    """The results.json cell of one search (`res`: a SearchResult, or None when the search failed). rl_s is
    the placement the search returned (never worse than the best baseline, which is its floor);
    search_best_s is what the policy itself sampled, reported as it is, above the floor when the policy lost."""
    rl_s, rl_from = None, "search"
    if res is not None:
        rl_s = _num(res.step_time)
        rl_from = str(res.extra.get("source", "search"))
    bname, bval = best_baseline(times)
    if bval is not None and (rl_s is None or bval < rl_s):
        rl_s, rl_from = bval, bname          # the search failed: the best baseline is what a user gets
    history = [h for h in (res.history if res is not None else []) if isinstance(h, dict)]
    (cell_dir / "history.json").write_text(json.dumps(history, default=float))
    return {
        "model": s.model, "gpus": int(s.gpus), "kind": s.kind,
        **({"cluster": s.cluster or f"{s.gpus}x{s.kind}", "precision": s.precision}
           if (s.cluster or s.precision != "fp32") else {}),
        "baselines": {k: _num(v) for k, v in times.items()},
        "rl_s": _num(rl_s), "search_best_s": _num(res.search_best) if res is not None else None,
        "lower_bound_s": float(problem.lower_bound),
        "search_wall_s": float(search_wall),  # the search call: its baseline floor, warm start, updates
        "search_loop_s": float(res.wall_s) if res is not None else 0.0,
        "search_error": search_error,
        "settings": s.key(), "rl_from": rl_from,
        "baseline_wall_s": {k: round(v, 4) for k, v in problem.meta.get("baseline_wall_s", {}).items()},
        "baseline_errors": errors,
        "evaluations": int(res.evaluations) if res is not None else 0, "ops": int(problem.graph.num_ops),
        "groups": int(problem.grouping.num_groups),
        **({"grouped_baselines": dict(res.extra.get("grouped_baselines") or {})} if res is not None else {}),
        **({"split_groups": problem.meta["split_groups"]} if problem.meta.get("split_groups") else {}),
        "cost_source": problem.cost_source,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": _machine(),
    }


def load_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SearchError(f"cannot read {path}: {e} (move it away to start over)") from e
    if not isinstance(data, list):
        raise SearchError(f"{path} is not a list of cells (move it away to start over)")
    bad = next((i for i, c in enumerate(data) if not isinstance(c, dict)), None)
    if bad is not None:
        raise SearchError(f"{path}: entry #{bad} is not a cell (a JSON object) (move the file away to start over)")
    return data


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


# ---- report ---------------------------------------------------------------------------------------------------
def _fmt(v: float | None) -> str:
    if v is None:
        return "OOM"
    return f"{v:.4g}" if v < 10 else f"{v:.2f}"


def _pct(a: float | None, b: float | None) -> str:
    """Speedup of b over a as a percentage: a / b - 1 (the time the baseline takes more than the placer)."""
    if a is None or b is None or b <= 0:
        return "–"
    return f"{100.0 * (a / b - 1.0):+.1f}%"


def write_report(results: list[dict], out: Path, command: str = "") -> None:
    """DIR/RESULTS.md (the paper's table + the list schedulers, bound and search time) and the figures."""
    rows = []
    hdr = (["Model", "Single-CPU", "Single-GPU", "#GPUs"] + [h for _, h in GPU_COLUMNS] + ["RL", "Speedup"] +
           [h for _, h in EXTRA_COLUMNS] +
           ["Policy best", "vs best baseline", "vs Expert", "Lower bound", "RL / LB", "Search (s)"] +
           ["Anneal", "Policy vs anneal"] +
           [f"{who} @{n // 1000}k" if n % 1000 == 0 else f"{who} @{n}" for n in EVAL_POINTS
            for who in ("Policy", "Anneal")])
    rows.append("| " + " | ".join(hdr) + " |")
    rows.append("|" + "|".join(["---"] + ["---:"] * (len(hdr) - 1)) + "|")
    for c in sorted(results, key=lambda c: (c["model"], c["gpus"], c.get("cluster") or "", c.get("precision") or "")):
        b = c.get("baselines", {})
        bname, bval = best_baseline(b)
        rl, pol, lb = c.get("rl_s"), c.get("search_best_s"), c.get("lower_bound_s")
        name = c["model"] + (f" ({c['cluster']}, {c.get('precision', 'fp32')})" if c.get("cluster") else "")
        cells = [name, _fmt(b.get("single_cpu")) if "single_cpu" in b else "–",
                 _fmt(b.get("single_gpu")) if "single_gpu" in b else "–", str(c["gpus"])]
        cells += [_fmt(b[k]) if k in b else "n/a" for k, _ in GPU_COLUMNS]
        cells += [_fmt(rl), _pct(bval, rl)]
        cells += [_fmt(b[k]) if k in b else "n/a" for k, _ in EXTRA_COLUMNS]
        cells += [_fmt(pol), f"{_pct(bval, pol)} ({bname})" if bname else "–", _pct(b.get("expert"), pol),
                  _fmt(lb), f"{rl / lb:.2f}" if rl and lb else "–", f"{c.get('search_wall_s', 0):.0f}"]
        ann = c.get("anneal_s")
        cells += [_fmt(ann) if "anneal_s" in c else "n/a", _pct(ann, pol)]
        for n in EVAL_POINTS:
            for key in ("policy_s_at_evals", "anneal_s_at_evals"):
                at = c.get(key) or {}
                cells.append(_fmt(at[str(n)]) if at.get(str(n)) is not None else "–" if key in c else "n/a")
        rows.append("| " + " | ".join(cells) + " |")
    figs = plot_figures(results, out)
    dates = sorted({c.get("date", "") for c in results if c.get("date")})
    machines = sorted({c.get("machine", "") for c in results if c.get("machine")})
    lines = [
        "# placer bench results",
        "",
        "Generated by `placer bench` from `results.json` (do not edit by hand).",
        "",
        f"- Command: `{command}`" if command else None,
        f"- Date: {dates[0]} – {dates[-1]}" if dates else None,
        f"- Machine: {'; '.join(machines)}" if machines else None,
        "- Step times in seconds per training step, simulated (`placer.sim.simulator`, analytical cost model);"
        " OOM = the placement does not fit device memory (or the baseline cannot build one); n/a = not run.",
        "- RL = the placement the search returned (never worse than the best baseline it knows); Speedup ="
        " best baseline / RL − 1. Policy best = the best placement the policy itself sampled (no baseline"
        " floor); 'vs best baseline' and 'vs Expert' compare it the same way (positive = the policy is faster).",
        "- Baselines: Single-CPU/GPU, Scotch, MinCut (METIS), Expert (the papers' rules), HEFT, m-TOPO, m-ETF,"
        " m-SCT (Baechi's memory-constrained list schedulers). Lower bound = the simulator's bound (max of the"
        " critical path and the per-device load); RL / LB = how far the returned placement is from it.",
        "- Anneal = simulated annealing over the same groups from the same start (the best grouped baseline),"
        " run for the same wall budget (`placer.baselines.anneal`); 'Policy vs anneal' compares Policy best to"
        " it (positive = the policy is faster). Policy/Anneal @N = the best each reached within N evaluations,"
        " counting the baselines and grouped baselines both evaluate first; the grouped start counts, the"
        " op-level baselines do not; the annealer is run with N evaluations as its budget (`placer.bench."
        "best_within`); – = the policy did not reach N evaluations in its budget.",
        "",
        *rows,
        "",
    ]
    if figs:
        lines += ["## Figures", ""] + [f"![{f.stem}]({f.name})" for f in figs] + [""]
    errs = [(c["model"], c["gpus"], k, v) for c in results for k, v in (c.get("baseline_errors") or {}).items()]
    if errs:
        lines += ["## Baselines that did not fit or could not be built", ""]
        lines += [f"- {m} on {n} GPUs, {k}: {v}" for m, n, k, v in errs] + [""]
    fails = [(c["model"], c["gpus"], c["search_error"]) for c in results if c.get("search_error")]
    if fails:
        lines += ["## Cells where the search failed (RL = best baseline)", ""]
        lines += [f"- {m} on {n} GPUs: {e}" for m, n, e in fails] + [""]
    (out / "RESULTS.md").write_text("\n".join(x for x in lines if x is not None) + "\n")


def plot_figures(results: list[dict], out: Path) -> list[Path]:
    """Per-model bar charts of step time per method and learning curves (best-so-far vs evaluations)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    methods = [k for k, _ in PAPER_COLUMNS + GPU_COLUMNS + EXTRA_COLUMNS] + ["anneal", "policy", "rl"]
    labels = dict(PAPER_COLUMNS + GPU_COLUMNS + EXTRA_COLUMNS, anneal="Anneal", policy="Policy best", rl="RL")
    for model in sorted({c["model"] for c in results}):
        cells = sorted([c for c in results if c["model"] == model], key=lambda c: c["gpus"])
        fig, ax = plt.subplots(figsize=(10, 4))
        width = 0.8 / max(len(cells), 1)
        x = np.arange(len(methods))
        for k, c in enumerate(cells):
            b = dict(c.get("baselines", {}), policy=c.get("search_best_s"), rl=c.get("rl_s"))
            vals = np.array([b.get(m) if b.get(m) is not None else np.nan for m in methods], float)
            ax.bar(x + k * width, vals, width, label=f"{c['gpus']} GPUs")
            for j, m in enumerate(methods):
                if m in b and b[m] is None:
                    ax.text(x[j] + k * width, 0, "OOM", rotation=90, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x + width * (len(cells) - 1) / 2)
        ax.set_xticklabels([labels[m] for m in methods], rotation=30, ha="right")
        ax.set_ylabel("simulated step time (s)")
        ax.set_title(f"{model}: step time per method")
        ax.legend()
        fig.tight_layout()
        f = out / f"bars_{model}.png"
        fig.savefig(f, dpi=100)
        plt.close(fig)
        files.append(f)
    curves = []
    for c in sorted(results, key=lambda c: (c["model"], c["gpus"], c.get("cluster") or "", c.get("precision") or "")):
        hp = out / cell_label(c) / "history.json"
        try:
            hist = json.loads(hp.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        xs, ys = _curve(hist, best_baseline(c.get("baselines", {}))[1])
        if len(xs):
            curves.append((f"{c['model']} {c['gpus']}x{c['kind']}", xs, ys))
    if curves:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for label, xs, ys in curves:
            ax.plot(xs, ys, label=label)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xlabel("search wall time (s)")
        ax.set_ylabel("policy's best step time / best baseline")
        ax.set_title("learning curves (below 1 = the policy beats every baseline)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        f = out / "learning_curves.png"
        fig.savefig(f, dpi=100)
        plt.close(fig)
        files.append(f)
    return files


def _curve(hist: list[dict], norm: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) from a search history (`placer.rl.search` rows): x = wall seconds (else evaluations, else index),
    y = the best step time the policy itself has sampled so far (`search_best_s`, else `best_s`), divided by
    `norm` (the cell's best baseline) or else by its first finite value."""
    xk = next((k for k in ("wall_s", "evaluations", "update") if hist and k in hist[0]), None)
    yk = next((k for k in ("search_best_s", "best_s", "min_s") if hist and k in hist[0]), None)
    if yk is None:
        return np.zeros(0), np.zeros(0)
    ys = np.array([h.get(yk) if h.get(yk) is not None else np.nan for h in hist], float)
    ys = np.where(np.isfinite(ys), ys, np.nan)
    ys = np.fmin.accumulate(np.where(np.isnan(ys), np.inf, ys))
    ys[~np.isfinite(ys)] = np.nan
    xs = np.array([h.get(xk, i) for i, h in enumerate(hist)], float) if xk else np.arange(len(hist), dtype=float)
    ok = np.isfinite(ys)
    if not ok.any():
        return np.zeros(0), np.zeros(0)
    scale = norm if norm else ys[ok][0]
    return xs[ok], ys[ok] / scale
