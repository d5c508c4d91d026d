"""`PlacementProblem`: everything a search, a bench cell or a simulation needs about one graph on one cluster,
built once by `build_problem`.

    from placer.problem import build_problem
    problem = build_problem(graph, cluster="4xK80")          # or devices="cpu:2" / a tasks file
    problem.baselines["m_etf"]                               # op→device index array, computed once
    problem.simulator.evaluate([problem.baselines["expert"]])[0].step_time
    problem.resolve("round_robin")                           # a --placement value → index array

It holds the cluster, the cost table and matrix, one simulator (`SimEvaluator`), the grouping with its allowed
mask, every baseline's placement (each computed once; a baseline that cannot be built is in
`baseline_errors` with its reason) and the lower bound. The baselines' memory model is calibrated once per
problem (`placer.baselines._common.calibrated` is memoised on graph, cluster and costs).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from placer.errors import PlacementError, PlacerError, SearchError, fmt_bytes
from placer.graphs.group import Grouping, default_max_groups, group
from placer.graphs.opgraph import OpGraph
from placer.placement import (BUILTIN_PLACEMENTS, Placement, random_placement, round_robin_placement,
                              single_placement)
from placer.sim.cluster import Cluster, cluster_from_devices, parse_cluster
from placer.sim.costs import CostTable, load_or_analytical
from placer.sim.simulator import SimEvaluator

log = logging.getLogger(__name__)
ANNEAL_EVALUATIONS = 1000      # `--placement anneal`: simulated evaluations of the annealer (the bench's first point)


@dataclass
class PlacementProblem:
    """One graph on one cluster, with everything derived from the pair (see the module docstring)."""
    graph: OpGraph
    cluster: Cluster
    costs: "CostTable | np.ndarray"         # as given: a table, or a bare cost matrix
    cost: np.ndarray                       # float64[n, D] seconds per op and device (inf: cannot run there)
    simulator: SimEvaluator                # the simulated reward (an Evaluator)
    grouping: Grouping
    allowed: np.ndarray                    # bool[G, D] devices each group may use
    baselines: dict[str, np.ndarray]       # name → op→device placement (the ones that could be built)
    baseline_errors: dict[str, str]        # name → why it could not be built
    lower_bound: float                     # seconds: no placement on this cluster can be faster (simulated)
    devices: str | Sequence[str] | None = None   # the real devices the cluster was built from, if any
    allow_cpu: bool = False
    seed: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def device_names(self) -> list[str]:
        return self.cluster.device_names

    @property
    def cost_source(self) -> str:
        return str(self.simulator.sim.cost_source)

    def resolve(self, spec: str) -> np.ndarray:
        """A `--placement` value → op→device index array: `single`, `random`, `round_robin`, a baseline name
        (the problem's own, computed once), or a placement.json path."""
        return resolve_placement(spec, self.graph, self.cluster, seed=self.seed, costs=self.cost,
                                 baselines=self.baselines, baseline_errors=self.baseline_errors)

    def placement(self, op_devices: np.ndarray) -> Placement:
        """An index array → a `Placement` (op name → device name) for this graph."""
        return Placement.from_indices(self.graph, self.device_names, op_devices)

    def close(self) -> None:
        self.simulator.close()


def group_allowed(grouping: Grouping, cost: np.ndarray, cpu_index: int | None) -> np.ndarray:
    """bool[G, D]: CPU-only groups on the CPU only, and no group on a device where one of its ops has no
    kernel (infinite cost)."""
    G, D = grouping.num_groups, cost.shape[1]
    allowed = grouping.allowed_mask(D, cpu_index)
    runnable = np.ones((G, D), bool)
    bad_op, bad_dev = np.nonzero(~np.isfinite(cost))
    runnable[grouping.op_group[bad_op], bad_dev] = False
    both = allowed & runnable
    empty = ~both.any(axis=1)
    both[empty] = allowed[empty]      # keep the grouping's rule if nothing is left (the simulator will say why)
    return both


def check_total_memory(graph: OpGraph, cluster: Cluster, usable: Sequence[int]) -> None:
    """The model's variables must fit in the usable devices' memory taken together (even split): else an error
    naming the memory needed against what the devices hold."""
    need = float(np.asarray(graph.persistent_bytes, np.float64).sum())
    devs = [cluster.devices[i] for i in usable]
    have = float(sum(d.capacity_bytes for d in devs))
    if need > have:
        raise SearchError(f"graph {graph.name!r} needs at least {fmt_bytes(need)} for its variables, but the "
                          f"devices it may use on {cluster.name} hold {fmt_bytes(have)} together "
                          f"({', '.join(f'{d.name} {fmt_bytes(d.capacity_bytes)}' for d in devs)})")


def compute_baselines(graph: OpGraph, cluster: Cluster, cost: np.ndarray, seed: int = 0
                      ) -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, float]]:
    """Every baseline of placer.baselines that builds (name → op placement), why the others did not, and the
    wall seconds each took."""
    from placer.baselines import BASELINES, run_baseline

    out, errors, walls = {}, {}, {}
    for name in BASELINES:
        t0 = time.perf_counter()
        try:
            out[name] = run_baseline(name, graph, cluster, costs=cost, seed=seed)
        except PlacerError as e:
            errors[name] = str(e)
            log.info("baseline %s cannot be built: %s", name, e)
        walls[name] = time.perf_counter() - t0
    return out, errors, walls


def build_problem(graph: OpGraph, cluster: "str | os.PathLike | Cluster | None" = None, *,
                  devices: "str | Sequence[str] | None" = None, costs=None, max_groups: int | None = None,
                  allow_cpu: bool = False, seed: int = 0, baselines: bool = True,
                  check_memory: bool = True, grouping: Grouping | None = None,
                  split_groups: str | None = None) -> PlacementProblem:
    """Build the problem of placing `graph` on `cluster` (simulated hardware: "4xK80", a cluster JSON path or a
    Cluster) or on real `devices` ("cpu:2", TF device names, a tasks file: the cluster is built from them). With
    both, `cluster` models `devices` (e.g. the cluster.json `placer calibrate` wrote for them): its device names
    must be theirs.

    costs: a CostTable, a cost-table path (`placer profile` / `placer calibrate`), a float64[n, D] matrix, or
    None (the analytical estimate). max_groups: default min(256, 20 × #GPUs). allow_cpu: let groups that are
    not CPU-only use the host CPU too (off by default: on GPU clusters the CPU is a slow trap that never runs out
    of memory, and CLI.md's "N devices" are the GPUs). baselines=False skips computing them, and
    check_memory=False skips the up-front check that the variables fit (`placer simulate` reports OOM instead).
    grouping: reuse this grouping of `graph` instead of grouping it again (re-placement keeps a run's groups).
    split_groups: a baseline name, or "best" (the fastest baseline that fits, simulated): the groups follow that
    baseline's device boundaries (`group(..., split_by=...)`), so the search can start from it exactly. Large
    transformers on 8 GPUs need it: the op-level partitions of METIS or the list schedulers split layers in ways
    scope-contiguous groups cannot express.

    >>> from placer.graphs.opgraph import OpGraph
    >>> g = OpGraph.build([("a", "MatMul", 4), ("b", "MatMul", 4)], [("a", "b")])
    >>> p = build_problem(g, "2xK80", costs=np.ones((2, 3)))
    >>> sorted(p.baselines)[:3], p.grouping.num_groups <= 40
    (['expert', 'heft', 'm_etf'], True)
    """
    if cluster is None and devices is None:
        raise SearchError("give a cluster (simulated hardware, e.g. 4xK80) or devices (real, e.g. cpu:2)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SearchError(f"seed must be a non-negative integer, got {seed!r}")   # (numpy's RNGs say no more)
    if max_groups is not None and (isinstance(max_groups, bool) or not isinstance(max_groups, (int, np.integer))
                                   or max_groups < 1):
        raise SearchError(f"max_groups must be a positive integer (or None: the default), got {max_groups!r}")
    check_split_groups(split_groups)          # before the baselines are computed
    if cluster is None:
        cluster = cluster_from_devices(devices)
    elif not isinstance(cluster, Cluster):
        cluster = parse_cluster(cluster)
    if devices is not None:      # both: the cluster models the devices (e.g. `placer calibrate`'s cluster.json)
        names = cluster_from_devices(devices).device_names
        if names != cluster.device_names:
            raise SearchError(f"cluster {cluster.name!r} has devices {cluster.device_names}, but the devices "
                              f"given are {names}: a cluster file for other devices")
    if costs is None or isinstance(costs, (str, os.PathLike)):
        costs = load_or_analytical(graph, cluster, costs)
    sim = SimEvaluator(graph, cluster, costs)      # a CostTable or a float64[n, D] matrix
    cost = sim.sim.cost
    gpus = cluster.gpu_indices
    if check_memory:
        check_total_memory(graph, cluster, list(range(cluster.num_devices)) if allow_cpu else sorted(set(gpus)))
    base, errors, walls = compute_baselines(graph, cluster, cost, seed) if baselines else ({}, {}, {})
    split_name = None
    if grouping is None:
        G = int(max_groups) if max_groups else default_max_groups(len(gpus))
        split = None
        if split_groups:
            split_name = _split_baseline(split_groups, base, errors, sim)
            split = base[split_name]
        grouping = group(graph, max_groups=G, op_costs=np.where(np.isfinite(cost[:, gpus[0]]), cost[:, gpus[0]], 0.0),
                         split_by=split)
    allowed = group_allowed(grouping, cost, cluster.cpu_index)
    cpu = cluster.cpu_index
    if not allow_cpu and cpu is not None and cpu not in gpus:
        # "N devices" are the accelerators (CLI.md): only CPU-only groups go to the host CPU, unless asked
        off = allowed.copy()
        off[~np.asarray(grouping.cpu_only, bool), cpu] = False
        keep = off.any(axis=1)
        allowed[keep] = off[keep]
    return PlacementProblem(graph=graph, cluster=cluster, costs=costs, cost=cost, simulator=sim, grouping=grouping,
                            allowed=allowed, baselines=base, baseline_errors=errors,
                            lower_bound=float(sim.lower_bound()), devices=devices, allow_cpu=allow_cpu, seed=seed,
                            meta={"baseline_wall_s": walls, **({"split_groups": split_name} if split_name else {})})


def check_split_groups(spec: str | None) -> None:
    """A `split_groups` that is neither "best" nor a baseline's name is a SearchError naming it, before any problem
    is built (`placer pretrain` builds its whole corpus first)."""
    from placer.baselines import BASELINES

    if spec and spec != "best" and spec not in BASELINES:
        raise SearchError(f"cannot split groups by {spec!r}: no such baseline (use best or one of "
                          f"{', '.join(BASELINES)})")


def _split_baseline(spec: str, base: dict, errors: dict, sim) -> str:
    """The baseline `build_problem(split_groups=spec)` groups along: `spec` itself, or for "best" the fastest
    one that fits (simulated)."""
    if spec != "best":
        if spec not in base:
            why = errors.get(spec, "not computed (baselines=False)" if not base else "no such baseline")
            raise SearchError(f"cannot split groups by baseline {spec!r}: {why.splitlines()[0] if why else why}")
        return spec
    names = [n for n in base if n not in ("random", "round_robin")]
    outs = sim.evaluate([base[n] for n in names]) if names else []
    ok = {n: o.step_time for n, o in zip(names, outs) if o.ok}
    if not ok:
        raise SearchError("cannot split groups by the best baseline: no baseline fits in memory")
    return min(ok, key=ok.get)


def resolve_placement(spec: str, graph: OpGraph, cluster: Cluster, seed: int = 0, costs=None, *,
                      baselines: dict[str, np.ndarray] | None = None,
                      baseline_errors: dict[str, str] | None = None) -> np.ndarray:
    """A `--placement` value → op→device index array over `cluster.devices`: `single`, `random`,
    `round_robin`, a baseline name (`metis`, `expert`, ...: taken from `baselines` when given, else computed), or
    a placement.json path."""
    if spec == "single":
        return single_placement(graph, cluster)
    if spec == "random":
        return random_placement(graph, cluster, seed)
    if spec == "round_robin":
        return round_robin_placement(graph, cluster)
    from placer.baselines import BASELINES, run_baseline

    if spec in BASELINES:
        if baselines is not None and spec in baselines:
            return baselines[spec]
        if baseline_errors and spec in baseline_errors:
            raise PlacementError(f"baseline {spec!r} cannot be built: {baseline_errors[spec]}")
        return run_baseline(spec, graph, cluster, costs=costs, seed=seed)
    if spec == "anneal":
        return anneal_placement(graph, cluster, seed=seed, costs=costs)
    if os.path.exists(spec) or spec.endswith(".json"):
        try:
            return Placement.load(spec).to_indices(graph, cluster.device_names)
        except PlacementError as e:      # "op 'x' is placed on..." without the file the user gave
            if spec in str(e):
                raise
            raise PlacementError(f"placement file {spec}: {e}") from None
    valid = list(BUILTIN_PLACEMENTS) + sorted(set(BASELINES) - set(BUILTIN_PLACEMENTS) | {"anneal"})
    raise PlacementError(f"unknown placement {spec!r}: use one of {valid} or a placement.json path")


def anneal_placement(graph: OpGraph, cluster: Cluster, seed: int = 0, costs=None) -> np.ndarray:
    """The baseline `anneal` as a `--placement`: the best placement simulated annealing finds in
    ANNEAL_EVALUATIONS simulated evaluations from the best grouped baseline (`placer.baselines.anneal`)."""
    from placer.baselines.anneal import anneal

    problem = build_problem(graph, cluster, costs=costs, seed=seed, check_memory=False)
    try:
        res = anneal(problem, max_evaluations=ANNEAL_EVALUATIONS, seed=seed)
    finally:
        problem.close()
    if res.placement is None:
        raise PlacementError(f"anneal: none of the {res.evaluations} placements it evaluated fits on {cluster.name}")
    return res.placement


def cluster_without(cluster: Cluster, exclude: Sequence[str]) -> tuple[Cluster, list[int]]:
    """The cluster of the survivors when the devices `exclude` are lost, and the old index of each survivor.
    ClusterError (one line) for a name the cluster does not have, or when no accelerator would be left."""
    from dataclasses import replace as dc_replace

    from placer.errors import ClusterError
    from placer.placement import _canon as canon

    names = [canon(d) for d in cluster.device_names]
    drop = []
    for d in exclude:
        if canon(d) not in names:
            raise ClusterError(f"cannot exclude {d!r}: cluster {cluster.name!r} has devices {cluster.device_names}")
        drop.append(names.index(canon(d)))
    keep = [i for i in range(cluster.num_devices) if i not in drop]
    if not keep or all(cluster.devices[i].is_cpu for i in keep) and any(not d.is_cpu for d in cluster.devices):
        raise ClusterError(f"excluding {', '.join(exclude)} leaves no accelerator of cluster {cluster.name!r} "
                           f"({', '.join(cluster.device_names)})")
    ix = np.ix_(keep, keep)
    meta = {k: v for k, v in cluster.meta.items() if k not in ("link_shared", "link_pipelined", "link_cpu_copy", "links")}

    def kept(key: str) -> str | None:     # "i,j" of the old cluster → of the survivors (None: a link lost)
        i, j = (int(x) for x in key.split(","))
        return f"{keep.index(i)},{keep.index(j)}" if i in keep and j in keep else None

    shared = {kept(k): v for k, v in cluster.meta.get("link_shared", {}).items() if kept(k)}
    if shared:
        meta["link_shared"] = shared
    for flag in ("link_pipelined", "link_cpu_copy"):
        links = [kept(k) for k in cluster.meta.get(flag, ()) if kept(k)]
        if links:
            meta[flag] = links
    groups = [{"devices": [keep.index(i) for i in g["devices"] if i in keep], "shared_speed": g["shared_speed"]}
              for g in cluster.meta.get("compute_groups") or ()]
    meta["compute_groups"] = [g for g in groups if len(g["devices"]) >= 2]
    meta["excluded"] = [cluster.device_names[i] for i in drop]
    out = dc_replace(cluster, devices=tuple(cluster.devices[i] for i in keep),
                     bandwidth=np.asarray(cluster.bandwidth)[ix].copy(), latency=np.asarray(cluster.latency)[ix].copy(),
                     name=f"{cluster.name} without {', '.join(cluster.device_names[i] for i in drop)}", meta=meta)
    return out, keep
