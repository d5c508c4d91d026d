"""Fit the simulator's two machine parameters to measured step times of placements on that machine.

A calibrated cluster (`placer calibrate`) measures per-op costs, link latency and bandwidth directly. Two effects
of a real multi-task machine are not well measured by micro-benchmarks, and they decide how much a split gains:
- **compute sharing** (`compute_groups[].shared_speed`): tasks on SMT siblings of one physical core slow each
  other down. How much depends on the op mix: MatMul chains (`calibrate.compute_sharing`) share the core's
  vector units and see 0.45 on this VM, while a graph of small ops, stalled on memory and the executor, loses
  less;
- **copy work** (`links[i][j].cpu_copy`): gRPC between CPU-only tasks serialises and parses each tensor on the
  tasks' own cores, taking compute from both.

`fit_machine` grid-searches both on measured placements (the median |log(simulated / measured)|, the error a
user feels), and `with_machine` writes them into a cluster JSON object.

>>> with_machine({"devices": [{"name": "a"}, {"name": "b"}], "links": [[None, {}], [{}, None]]}, 0.6, 0.25)["links"]
[[None, {'cpu_copy': 0.25}], [{'cpu_copy': 0.25}, None]]
"""
from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import cluster_from_dict

SHARED_SPEEDS = (0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9, 1.0)
CPU_COPY = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass
class MachineFit:
    shared_speed: float        # 1.0 = the tasks do not slow each other down (no compute group)
    cpu_copy: float            # fraction of a transfer's byte time each endpoint's processor spends copying
    median_abs_log_err: float  # on the placements it was fitted to
    simulated: dict            # (shared_speed, cpu_copy) -> simulated step times of every placement given


def with_machine(cluster: dict, shared_speed: float, cpu_copy: float) -> dict:
    """A copy of a cluster JSON object with one compute group of every device at `shared_speed` (none at 1.0)
    and `cpu_copy` on every link between two devices (none at 0)."""
    obj = copy.deepcopy(cluster)
    obj.pop("compute_groups", None)
    if shared_speed < 1.0:
        obj["compute_groups"] = [{"devices": [d["name"] for d in obj["devices"]], "shared_speed": float(shared_speed)}]
    for row in obj.get("links") or ():
        for ln in row:
            if ln is not None:
                ln.pop("cpu_copy", None)
                if cpu_copy > 0:
                    ln["cpu_copy"] = float(cpu_copy)
    return obj


def simulate_grid(graph: OpGraph, cluster: dict, costs, placements: Sequence[np.ndarray],
                  shared_speeds=SHARED_SPEEDS, cpu_copies=CPU_COPY) -> dict:
    """(shared_speed, cpu_copy) -> simulated step times (s) of `placements` (nan where the simulator fails)."""
    from placer.sim.simulator import Simulator

    out = {}
    for ss, cc in itertools.product(shared_speeds, cpu_copies):
        sim = Simulator(graph, cluster_from_dict(with_machine(cluster, ss, cc), "fit"), costs)
        out[(ss, cc)] = np.array([sim.simulate(p).step_time for p in placements], float)
    return out


def pick(grids: Sequence[dict], measured: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """(shared_speed, cpu_copy, score) minimising the median |log(simulated / measured)| pooled over several
    graphs' placements (`grids[k]` from `simulate_grid`, `measured[k]` their step times; nan = not fitted on).
    Ties go to the simpler machine: higher speed, less copy."""
    meas = [np.asarray(m, float) for m in measured]
    if not any(np.isfinite(m).any() for m in meas):
        raise ValueError("fit_machine: no measured step time to fit")

    def score(key) -> float:
        errs = []
        for grid, m in zip(grids, meas):
            s = grid[key]
            good = np.isfinite(m) & (m > 0) & np.isfinite(s) & (s > 0)
            errs.append(np.abs(np.log(s[good] / m[good])))
        e = np.concatenate(errs)
        return float(np.median(e)) if len(e) else float("inf")

    best = min(grids[0], key=lambda k: (round(score(k), 6), -k[0], k[1]))
    return float(best[0]), float(best[1]), score(best)


def fit_machine(graph: OpGraph, cluster: dict, costs, placements: Sequence[np.ndarray], measured_s: Sequence[float],
                grid: dict | None = None) -> MachineFit:
    """The (shared_speed, cpu_copy) whose simulated step times of `placements` are closest to `measured_s` (see
    `pick`). `grid` reuses `simulate_grid`'s output."""
    grid = grid if grid is not None else simulate_grid(graph, cluster, costs, placements)
    ss, cc, sc = pick([grid], [measured_s])
    return MachineFit(shared_speed=ss, cpu_copy=cc, median_abs_log_err=sc, simulated=grid)
