"""`placer calibrate`: measure the devices a search will run on, so that the simulator describes them.

    from placer.runtime.calibrate import calibrate
    summary = calibrate(graph, "c.json", "calib/")     # or "cpu:2", "/GPU:0,/GPU:1,/CPU:0"
    # placer simulate --model M --cluster calib/cluster.json --costs calib/costs.json ...

Writes two files (names and formats kept apart from the tasks file):
- `DIR/costs.json`: the graph's per-op costs, profiled (`placer.runtime.profile`) on one device per kind — on a
  tasks file, task 0's CPU.
- `DIR/cluster.json`: a cluster JSON (`--cluster`) of the devices (kind, memory, `concurrency` = the task's cores,
  each running ops with that many threads) with a D x D "links" matrix: `{"bandwidth_Bps", "latency_s", "shared":
  null}` per ordered device pair (null on the diagonal). Each measured link comes from a tensor ping-pong: a
  float32 variable of each size (1 KiB to 64 MiB, x4 steps) read on device i and taken by an Identity on device j,
  the median step time over `runs` minus the median of the same step with the Identity on i (see
  `_child._State.links`), fitted by least squares on relative residuals to time = latency + bytes / bandwidth.
  On a tasks file one link is measured per ordered pair of tasks (between their first devices) and stands for
  every device pair across those two tasks; devices of one task keep the default link model. Local devices
  (`cpu:N`, a device list) are measured pair by pair. The raw times and each fit's relative RMS residual are
  kept under "calibration".
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from placer.errors import MeasurementError, OutputError

log = logging.getLogger(__name__)

DEFAULT_SIZES = tuple(1024 * 4 ** k for k in range(9))      # 1 KiB .. 64 MiB


@dataclass(frozen=True)
class LinkFit:
    latency_s: float
    bandwidth_Bps: float
    rel_rms: float           # RMS of (fit - measured) / measured over the sizes
    clamped: bool = False    # the raw least-squares figure was not positive and was replaced

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "bandwidth_Bps": self.bandwidth_Bps, "rel_rms": self.rel_rms,
                "clamped": self.clamped}


PIPELINED_TASK_LINKS = True   # see benchmarks/RESULTS.md, "Simulator vs real"


def fit_link(sizes: Sequence[float], times: Sequence[float]) -> LinkFit:
    """Least squares of time = latency + bytes / bandwidth, each size weighted by 1 / time (relative residuals, so
    that the 64 MiB point does not drown the 1 KiB ones). A non-positive slope or intercept (noise on a fast
    link) is replaced by the largest size's time per byte / the smallest time still left, so both figures are
    finite and positive.

    >>> f = fit_link([1e3, 1e6, 1e8], [1e-4 + 1e3 / 1e9, 1e-4 + 1e6 / 1e9, 1e-4 + 1e8 / 1e9])
    >>> round(f.latency_s * 1e6), round(f.bandwidth_Bps / 1e9, 3)
    (100, 1.0)
    """
    s = np.asarray(sizes, float)
    t = np.asarray(times, float)
    ok = np.isfinite(t)
    s, t = s[ok], t[ok]
    if len(s) < 2:
        raise MeasurementError(f"a link fit needs at least two sizes with a time (got {len(s)})")
    w = 1.0 / np.maximum(np.abs(t), 1e-6)
    a = np.stack([np.ones_like(s), s], axis=1) * w[:, None]
    (lat, per_byte), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    clamped = False
    if not per_byte > 0:
        big = int(np.argmax(s))
        per_byte = max(t[big], 1e-9) / s[big]
        clamped = True
    if not lat > 0:
        lat = max(float(np.min(t - s * per_byte)), 1e-6)
        clamped = True
    fit = lat + s * per_byte
    rel = float(np.sqrt(np.mean(((fit - t) / np.maximum(np.abs(t), 1e-9)) ** 2)))
    return LinkFit(float(lat), float(1.0 / per_byte), rel, clamped)


def _units(cluster) -> tuple[list[int], list[list[int]]]:
    """Representative device of each unit a link is measured between, and each unit's devices: the tasks of a
    tasks-file cluster, else every device on its own."""
    names = cluster.device_names
    if cluster.meta.get("tasks_file"):
        groups: dict[str, list[int]] = {}
        for i, n in enumerate(names):
            groups.setdefault(n.split("/device:")[0], []).append(i)
        members = list(groups.values())
    else:
        members = [[i] for i in range(len(names))]
    return [m[0] for m in members], members


SHARED_IF_BELOW = 0.9    # a measured shared speed below this makes the tasks one compute group


def chains_graph(n: int = 512, length: int = 20):
    """An OpGraph of two independent chains a_k = tanh(a_{k-1} @ W_a) and b_k likewise, and its two placements:
    (everything on device 0, chain b and its variable on device 1)."""
    import tensorflow as tf

    from placer.graphs import load

    wa = tf.Variable(tf.random.normal([n, n], stddev=1.0 / n ** 0.5, seed=1), name="wa")
    wb = tf.Variable(tf.random.normal([n, n], stddev=1.0 / n ** 0.5, seed=2), name="wb")

    @tf.function
    def step(x, y):
        for k in range(length):
            with tf.name_scope(f"chain_a/{k}"):
                x = tf.tanh(tf.matmul(x, wa))
            with tf.name_scope(f"chain_b/{k}"):
                y = tf.tanh(tf.matmul(y, wb))
        return tf.reduce_sum(x) + tf.reduce_sum(y)

    spec = tf.TensorSpec([n, n], tf.float32)
    graph = load(step.get_concrete_function(spec, spec))
    split = np.array(["chain_b" in nm or "wb" in nm for nm in graph.names], np.int64)
    col = np.asarray(graph.colocation)
    for g in np.unique(col):                       # a variable and its reads stay together
        members = col == g
        split[members] = int(np.round(split[members].mean()))
    return graph, np.zeros(graph.num_ops, np.int64), split


def compute_sharing(tasks, *, rounds: int = 3, runs: int = 3, timeout: float = 600.0) -> dict:
    """How much do two tasks slow each other down when both compute? Two independent MatMul chains, both on
    task 0 and one per task, measured in interleaved rounds. speed = one-task time / (2 x split time): 1.0 for
    independent cores (the split runs twice as fast), 0.5 for two vCPUs that share one physical core. Returns
    {"one_task_s", "split_s", "speedup", "shared_speed", "runs"}."""
    import numpy as np

    from placer.runtime.tfcluster import TFClusterRunner

    graph, single, split = chains_graph()
    got: list[list[float]] = [[], []]
    with TFClusterRunner(graph, tasks, warmup=2, runs=runs, timeout=timeout) as r:
        for k in range(rounds):
            for i in ((0, 1) if k % 2 == 0 else (1, 0)):
                o = r.evaluate([(single, split)[i]])[0]
                if o.failed:
                    raise MeasurementError(f"measuring compute sharing failed: {o.reason}")
                got[i].extend(o.runs)
    one, two = float(np.median(got[0])), float(np.median(got[1]))
    return {"one_task_s": one, "split_s": two, "speedup": one / two, "shared_speed": min(1.0, one / (2.0 * two)),
            "runs": [len(got[0]), len(got[1])]}


def _is_calibration(path: Path) -> bool:
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(obj, dict) and "calibration" in obj


def check_out_dir(out: Path) -> None:
    """Before any measuring: calibrate replaces the cluster.json and costs.json of an earlier calibration in `out`,
    never a search's directory (its checkpoint/, and the cluster.json that `placer replace` and --resume read) nor
    other files of those names. OutputError naming the file."""
    from placer.sim.costs import is_cost_table

    if (out / "checkpoint").is_dir():
        raise OutputError(f"calibrate: {out} holds a search (its checkpoint/), whose cluster.json calibrate would "
                          f"replace: pick another --out")
    for name, what, test in (("cluster.json", "calibrated cluster", _is_calibration),
                             ("costs.json", "cost table", is_cost_table)):
        p = out / name
        if p.exists() and not (p.is_file() and (p.stat().st_size == 0 or test(p))):
            raise OutputError(f"calibrate: {p} exists and is no {what}; calibrate will not overwrite it (remove it "
                              f"or pick another --out)")


def calibrate(graph, devices, out_dir: "str | os.PathLike", *, sizes: Sequence[int] = DEFAULT_SIZES,
              link_runs: int = 15, link_warmup: int = 3, profile_runs: int = 5, timeout: float = 600.0,
              progress=None, fit_placements: int = 0, fit_rounds: int = 4, fit_runs: int = 1) -> dict:
    """Profile `graph` and measure the links of `devices` (a tasks file, `cpu:N` or device names); write
    DIR/costs.json and DIR/cluster.json. Returns a summary: {"cluster": path, "costs": path, "links": [{"src",
    "dst", "latency_s", "bandwidth_Bps", "rel_rms"}], "profile_s", "links_s"}.

    fit_placements > 0 (TF cluster tasks): also measure that many placements of `graph` (its baselines, all on
    each task, random ones; `fit_rounds` interleaved rounds of `fit_runs` timed runs: many rounds of one run,
    since runs taken one after another share the machine's load of that moment, `benchmarks/fidelity.py`'s
    `round_noise`) and fit the two machine
    figures micro-benchmarks get wrong, the tasks' shared speed and the copy work of a transfer
    (`placer.sim.fit`), into cluster.json; the summary's "machine_fit" says what was fitted, from what."""
    from placer.runtime.profile import profile
    from placer.sim.cluster import cluster_from_devices, cluster_to_dict
    from placer.tasks import looks_like_tasks_file

    say = progress or (lambda msg: None)
    for flag, v, low in (("--runs", profile_runs, 1), ("--link-runs", link_runs, 1), ("link_warmup", link_warmup, 0),
                         ("--fit-placements", fit_placements, 0)):
        if not isinstance(v, (int, np.integer)) or v < low:     # checked now, not after minutes of measuring
            raise MeasurementError(f"calibrate: {flag} must be an integer >= {low}, got {v!r}")
    cluster = cluster_from_devices(devices)
    if fit_placements and not (looks_like_tasks_file(devices) and cluster.num_devices >= 2):
        raise MeasurementError(f"calibrate: --fit-placements fits the shared speed of two or more TF cluster tasks: "
                               f"give --devices a tasks file of `placer cluster up` (not {devices})")
    out = Path(out_dir)
    check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    if looks_like_tasks_file(devices):
        from placer.runtime.tfcluster import TFClusterRunner

        runner = TFClusterRunner(graph, devices, warmup=2, runs=1, timeout=timeout)
    else:
        from placer.runtime.local import LocalRunner

        runner = LocalRunner(graph, cluster.device_names, warmup=2, runs=1, timeout=timeout)
    reps, members = _units(cluster)
    pairs = [(a, b) for a in range(len(reps)) for b in range(len(reps)) if a != b]
    fits: dict[tuple[int, int], LinkFit] = {}
    raw: dict[str, dict] = {}
    try:
        from placer.runtime.tfcluster import links_in_child

        t0 = time.perf_counter()
        if pairs:
            say(f"ping-pong over {len(pairs)} device pairs, {len(sizes)} sizes "
                f"{sizes[0]}..{sizes[-1]} bytes, {link_runs} runs each")
            res = links_in_child(runner, sizes, pairs=[(reps[a], reps[b]) for a, b in pairs],
                                 warmup=link_warmup, runs=link_runs)
            for a, b in pairs:
                key = f"{reps[a]},{reps[b]}"
                times = res["times"][key]
                fits[a, b] = f = fit_link(sizes, times)
                raw[key] = {"src": cluster.device_names[reps[a]], "dst": cluster.device_names[reps[b]],
                            "times_s": times, **f.to_dict()}
        links_s = time.perf_counter() - t0
        say(f"profiling {graph.name} on {cluster.device_names[0]}")
        t0 = time.perf_counter()
        table = profile(graph, devices, runs=profile_runs, timeout=timeout, runner=runner)
        profile_s = time.perf_counter() - t0
    finally:
        runner.close()
    costs_path = out / "costs.json"
    table.save(costs_path)
    d = cluster.num_devices
    unit_of = {i: u for u, m in enumerate(members) for i in m}
    links: list[list[dict | None]] = [[None] * d for _ in range(d)]
    for i in range(d):
        for j in range(d):
            if i == j:
                continue
            f = fits.get((unit_of[i], unit_of[j]))
            if f is not None:
                cluster.bandwidth[i, j], cluster.latency[i, j] = f.bandwidth_Bps, f.latency_s
            links[i][j] = {"bandwidth_Bps": float(cluster.bandwidth[i, j]), "latency_s": float(cluster.latency[i, j]),
                           "shared": None}
            if f is not None and PIPELINED_TASK_LINKS:
                # between tasks, TF's gRPC keeps many RecvTensor calls in flight: the latency does not hold the link
                links[i][j]["pipelined"] = True
    sharing = None
    if looks_like_tasks_file(devices) and len(reps) >= 2:
        say("two MatMul chains on one task and on two (compute sharing)")
        sharing = compute_sharing(devices, timeout=timeout)
    obj = cluster_to_dict(cluster)
    obj["name"] = f"calibrated {cluster.name}"
    obj["links"] = links
    if sharing is not None and sharing["shared_speed"] < SHARED_IF_BELOW:
        # the tasks' cores slow each other down (e.g. two vCPUs on one physical core): one compute group
        obj["compute_groups"] = [{"devices": cluster.device_names, "shared_speed": sharing["shared_speed"]}]
    obj["calibration"] = {"devices": str(devices), "sizes_bytes": [int(s) for s in sizes], "runs": int(link_runs),
                          "pairs": list(raw.values()), "costs": str(costs_path.name),
                          "tensorflow_version": runner.tf_version, "links_s": links_s, "profile_s": profile_s,
                          "compute_sharing": sharing}
    cluster_path = out / "cluster.json"
    cluster_path.write_text(json.dumps(obj, indent=1) + "\n")
    machine = None
    if fit_placements > 0 and looks_like_tasks_file(devices) and cluster.num_devices >= 2:
        say(f"measuring {fit_placements} placements to fit the machine's shared speed and copy work")
        machine = fit_to_placements(graph, devices, obj, costs_path, fit_placements, rounds=fit_rounds,
                                    runs=fit_runs, timeout=timeout)
        from placer.sim.fit import with_machine

        obj = with_machine(obj, machine["shared_speed"], machine["cpu_copy"])
        obj["calibration"]["machine_fit"] = machine
        cluster_path.write_text(json.dumps(obj, indent=1) + "\n")
    return {"cluster": str(cluster_path), "costs": str(costs_path), "devices": cluster.device_names,
            "concurrency": [int(x.concurrency) for x in cluster.devices],
            "links": [{k: v for k, v in r.items() if k != "times_s"} for r in raw.values()],
            "links_s": links_s, "profile_s": profile_s, "compute_sharing": sharing,
            **({"machine_fit": machine} if machine else {})}


def fit_placements_of(problem, n: int, seed: int = 0) -> list[tuple[str, "np.ndarray"]]:
    """`n` distinct placements that span what a search meets: the baselines, everything on each device, then
    random group placements (each group on a uniformly drawn allowed device)."""
    import numpy as np

    out, seen = [], set()

    def add(name, p):
        key = np.asarray(p, np.int64).tobytes()
        if key not in seen and len(out) < n:
            seen.add(key)
            out.append((name, np.asarray(p, np.int64)))

    for name, p in problem.baselines.items():
        add(name, p)
    G, D = problem.allowed.shape
    for d in range(D):
        if problem.allowed[:, d].any():
            add(f"all_on_{d}", problem.grouping.expand(np.where(problem.allowed[:, d], d,
                                                                 problem.allowed.argmax(axis=1)),
                                                        problem.cluster.cpu_index))
    rng = np.random.default_rng(seed)
    for k in range(20 * n):
        if len(out) >= n:
            break
        groups = np.array([rng.choice(np.flatnonzero(problem.allowed[g])) for g in range(G)])
        add(f"random_{k}", problem.grouping.expand(groups, problem.cluster.cpu_index))
    return out


def fit_to_placements(graph, tasks, cluster_obj: dict, costs_path, n: int, *, rounds: int = 4, runs: int = 1,
                      timeout: float = 600.0, seed: int = 0) -> dict:
    """Measure `n` placements on the tasks (interleaved rounds) and fit shared speed and copy work to them."""
    import numpy as np

    from placer.problem import build_problem
    from placer.runtime.tfcluster import TFClusterRunner
    from placer.sim.costs import CostTable
    from placer.sim.fit import pick, simulate_grid

    tmp = Path(costs_path).with_name("cluster.json")
    problem = build_problem(graph, str(tmp), costs=str(costs_path), seed=seed)
    try:
        cands = fit_placements_of(problem, n, seed)
    finally:
        problem.close()
    times: list[list[float]] = [[] for _ in cands]
    with TFClusterRunner(graph, tasks, warmup=1, runs=runs, timeout=timeout) as r:
        for k in range(rounds):
            order = range(len(cands)) if k % 2 == 0 else reversed(range(len(cands)))
            for i in order:
                o = r.measure(cands[i][1])
                if o.ok:
                    times[i].extend(o.runs or (o.step_time,))
    meas = np.array([np.median(t) if t else np.nan for t in times])
    grid = simulate_grid(graph, cluster_obj, CostTable.load(costs_path, graph), [p for _, p in cands])
    ss, cc, score = pick([grid], [meas])
    sim = grid[(ss, cc)]
    return {"shared_speed": ss, "cpu_copy": cc, "median_abs_log_err": score,
            "placements": [{"source": name, "measured_s": None if not np.isfinite(m) else float(m),
                            "simulated_s": float(s)} for (name, _), m, s in zip(cands, meas, sim)]}
