"""The measurement child process: holds TensorFlow, one imported graph, and runs placed steps on request.

Started by `placer.runtime.local.LocalRunner` as `python -m placer.runtime._child FD_IN FD_OUT`; speaks pickled
tuples over two pipes (`multiprocessing.connection.Connection`). Anything printed to stdout goes to stderr so
the protocol pipes stay clean. Every request gets exactly one reply `("ok", payload)` or `("error", payload)`;
a crash, hang or OOM kill is seen by the parent as a dead pipe or a timeout.

Requests:
  ("init", {"cpus": N, "intra_op": int|None, "inter_op": int|None,
            "target": "grpc://HOST:PORT"|None, "op_timeout_ms": int|None, "nice": int|None, "device_filters": [str]|None})
        -> {"devices": [names TF sees], "tf_version": str, "import_s": float}
        With a `target` (a TF cluster task's master: `TFClusterRunner`) every session runs there, isolated from
        other sessions, each call cut by TF after `op_timeout_ms`; devices are the cluster's full names.
  ("load", {"meta_graph": bytes, "names": [op names], "fetches": [...], "fingerprint": str})
        -> {"feeds": [(name, shape, dtype)], "fetches": [...], "init": [...], "warnings": [...], "load_s": float}
  ("measure", {"placement": [device per op], "warmup": W, "runs": N, "trace": bool, "profile_runs": int})
        -> {"runs": [s], "on_assigned_device": float|None, "executed": int, "peak_memory": {dev: bytes},
            "op_times": {op: [s per profiled run]}, "setup_s": float,
            "place_s": float, "init_s": float}   (setup_s = placing + session + init + warm-up)
  ("links", {"devices": [a, b, ...], "sizes": [bytes], "warmup": W, "runs": N})
        -> {"times": {"i,j": [median seconds per size]}}  (see `links` below)
  ("ping", None) -> "pong"
  ("exit", None) -> no reply; the process ends.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback


def _short_error(e: BaseException, limit: int = 600) -> str:
    """First meaningful line(s) of a TF error (their messages run to pages of colocation debug info)."""
    msg = getattr(e, "message", None) or str(e)
    msg = msg.strip().split("\nColocation Debug Info", 1)[0]
    lines, skipping = [], False
    for x in msg.splitlines():
        s = x.strip()
        if not s or s.startswith("Graph execution error") or s.startswith("[[{{node"):
            continue
        if s.startswith("Detected at node"):
            skipping = True
            continue
        if skipping and not s.startswith("Node:"):
            continue
        skipping = False
        lines.append(s)
    msg = " ".join(lines[:4])
    name = type(e).__name__
    out = f"{name}: {msg}"
    return out if len(out) <= limit else out[: limit - 3] + "..."


class _State:
    def __init__(self) -> None:
        self.tf = None
        self.cpus = 1
        self.devices: list[str] = []
        self.graph = None            # tf.Graph with the imported (unplaced) graph
        self.graph_def = None
        self.names: list[str] = []
        self.ops = None              # tf.Operation per placed op name (index-aligned with names; None if absent)
        self.other_ops = []          # ops of the graph that the OpGraph does not list
        self.fetches: list = []
        self.init_ops: list = []
        self.feed: dict = {}
        self.config = None
        self.target = ""             # "" = in-process session; "grpc://..." = a TF cluster's master

    # ---- requests ---------------------------------------------------------------------------------------
    def init(self, req: dict) -> dict:
        t0 = time.perf_counter()
        import tensorflow as tf

        self.tf = tf
        self.cpus = max(1, int(req.get("cpus", 1)))
        self.target = str(req.get("target") or "")
        if req.get("nice"):
            os.nice(int(req["nice"]))
        cfg = tf.compat.v1.ConfigProto(allow_soft_placement=False, log_device_placement=False,
                                       device_count={"CPU": self.cpus})
        if self.target:
            # resources (variables) live in this session only and go with it; every call is cut by TF itself
            cfg.isolate_session_state = True
            if req.get("op_timeout_ms"):
                cfg.operation_timeout_in_ms = int(req["op_timeout_ms"])
            if req.get("device_filters"):       # a re-placement on the survivors: never contact dead tasks
                cfg.device_filters.extend(str(f) for f in req["device_filters"])
        if req.get("intra_op"):
            cfg.intra_op_parallelism_threads = int(req["intra_op"])
        if req.get("inter_op"):
            cfg.inter_op_parallelism_threads = int(req["inter_op"])
        cfg.gpu_options.allow_growth = True
        # the graph measured must be the graph placed: no Grappler rewrites, no classic-optimizer folding/CSE
        ro = cfg.graph_options.rewrite_options
        ro.disable_meta_optimizer = True
        oo = cfg.graph_options.optimizer_options
        oo.opt_level = tf.compat.v1.OptimizerOptions.L0
        oo.do_constant_folding = False
        oo.do_common_subexpression_elimination = False
        oo.do_function_inlining = False
        self.config = cfg
        keep_constants_placed()
        from placer.runtime.devices import trace_device

        with tf.Graph().as_default():
            with tf.compat.v1.Session(self.target, config=cfg) as s:
                devs = [trace_device(d.name) for d in s.list_devices()]
        self.devices = [d for d in devs if d and not d.startswith("/XLA")]
        return {"devices": self.devices, "tf_version": tf.__version__, "import_s": time.perf_counter() - t0}

    def load(self, req: dict) -> dict:
        t0 = time.perf_counter()
        tf = self.tf
        from tensorflow.core.protobuf import meta_graph_pb2

        from placer.graphs.runnable import runtime_spec, synthetic_feeds

        mg = meta_graph_pb2.MetaGraphDef()
        mg.ParseFromString(req["meta_graph"])
        if req.get("check_safe"):          # workers: refuse file/process/Python ops before anything runs
            from placer.runtime.allowlist import check_graph

            check_graph(mg.graph_def)
        spec = runtime_spec(mg, list(req.get("fetches") or ()))
        gd = mg.graph_def
        for node in gd.node:           # devices come from placements only
            node.device = ""
        g = tf.Graph()
        with g.as_default():
            tf.graph_util.import_graph_def(gd, name="")
        names = list(req["names"])
        by_name = {op.name: op for op in g.get_operations()}
        self.ops = [by_name.get(n) for n in names]
        named = set(names)
        self.other_ops = [op for op in g.get_operations() if op.name not in named]
        self.graph, self.graph_def, self.names = g, gd, names
        self.fetches = [_fetch(g, f) for f in spec.fetches]
        self.init_ops = [g.get_operation_by_name(n) for n in spec.init_ops]
        self.feed = {g.get_tensor_by_name(k): v for k, v in synthetic_feeds(spec).items()}
        feeds = [(n, shape, tf.as_dtype(dt).as_datatype_enum) for n, (dt, shape) in spec.feeds.items()]
        return {"feeds": feeds, "fetches": list(spec.fetches), "init": list(spec.init_ops),
                "warnings": list(spec.warnings), "load_s": time.perf_counter() - t0,
                "missing": [n for n, o in zip(names, self.ops) if o is None][:20]}

    def measure(self, req: dict) -> dict:
        tf = self.tf
        if self.graph is None:
            raise RuntimeError("no graph loaded")
        placement = req["placement"]
        if len(placement) != len(self.names):
            raise ValueError(f"placement has {len(placement)} entries, the graph {len(self.names)} ops")
        t0 = time.perf_counter()
        assigned = {}
        for op, dev in zip(self.ops, placement):
            if op is None:
                continue
            op._set_device_from_string(_full(dev))  # noqa: SLF001 - TF's own way to re-place an existing op
            assigned[op.name] = dev
        for op in self.other_ops:   # ops the OpGraph does not list go wherever TF's placer (colocation) puts them
            op._set_device_from_string("")  # noqa: SLF001
        warmup, runs = int(req.get("warmup", 2)), int(req.get("runs", 5))
        profile_runs = int(req.get("profile_runs", 0))
        out: dict = {"runs": [], "on_assigned_device": None, "executed": 0, "peak_memory": {}, "op_times": {}}
        out["place_s"] = time.perf_counter() - t0
        sess = tf.compat.v1.Session(self.target, graph=self.graph, config=self.config)
        try:
            if self.init_ops:
                sess.run(self.init_ops, feed_dict=self.feed)
            out["init_s"] = time.perf_counter() - t0 - out["place_s"]
            trace = bool(req.get("trace", True))

            def traced_run():
                opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
                md = tf.compat.v1.RunMetadata()
                sess.run(self.fetches, feed_dict=self.feed, options=opts, run_metadata=md)
                return md.step_stats

            def check(stats):
                frac, executed, peak = _placement_check(stats, assigned)
                out["on_assigned_device"], out["executed"], out["peak_memory"] = frac, executed, peak

            # the placement check rides on the last warm-up step (no extra step) when there is one
            for k in range(warmup):
                if trace and k == warmup - 1:
                    check(traced_run())
                else:
                    sess.run(self.fetches, feed_dict=self.feed)
            out["setup_s"] = time.perf_counter() - t0
            for _ in range(runs):
                t = time.perf_counter()
                sess.run(self.fetches, feed_dict=self.feed)
                out["runs"].append(time.perf_counter() - t)
            op_times: dict[str, list[float]] = {}
            for k in range(profile_runs):
                stats = traced_run()
                for name, (dev, secs) in _op_times(stats, assigned).items():
                    op_times.setdefault(name, []).append(secs)
            if trace and warmup == 0:
                check(stats if profile_runs else traced_run())
            if profile_runs:
                out["op_times"] = {k: (assigned.get(k), v) for k, v in op_times.items()}
        finally:
            sess.close()
            del sess
        return out


    def links(self, req: dict) -> dict:
        """Tensor ping-pong for `placer calibrate`: for each ordered pair (i, j) of `devices` and each size, the
        median wall time of a step that reads a float32 variable of that size on device i and hands it to an
        Identity on device j (one transfer i -> j), minus the median of the same step with the Identity on i
        (no transfer): the time of one transfer. Runs alternate between the two steps. Devices of one task
        (or one process) are not skipped: the caller decides which pairs it asks for via `pairs`."""
        tf = self.tf
        devs = list(req["devices"])
        sizes = [int(x) for x in req["sizes"]]
        pairs = [tuple(p) for p in req.get("pairs") or [(i, j) for i in range(len(devs))
                                                         for j in range(len(devs)) if i != j]]
        warmup, runs = int(req.get("warmup", 2)), int(req.get("runs", 5))
        g = tf.Graph()
        with g.as_default():
            reads = {}
            for i in sorted({p[0] for p in pairs}):
                with tf.device(_full(devs[i])):
                    for s in sizes:
                        v = tf.compat.v1.get_variable(f"pingpong_{i}_{s}", [max(1, s // 4)], tf.float32,
                                                      initializer=tf.compat.v1.zeros_initializer(), use_resource=True)
                        reads[i, s] = v.read_value()
            steps = {}
            for i, j in pairs:
                for s in sizes:
                    with tf.device(_full(devs[j])):
                        there = tf.identity(reads[i, s]).op
                    with tf.device(_full(devs[i])):
                        here = tf.identity(reads[i, s]).op
                    steps[i, j, s] = (here, there)
            init = tf.compat.v1.global_variables_initializer()
        times: dict[str, list[float]] = {}
        import numpy as np

        sess = tf.compat.v1.Session(self.target, graph=g, config=self.config)
        try:
            sess.run(init)
            for (i, j) in pairs:
                row = []
                for s in sizes:
                    here, there = steps[i, j, s]
                    for _ in range(warmup):
                        sess.run(here)
                        sess.run(there)
                    a, b = [], []
                    for _ in range(runs):
                        t = time.perf_counter()
                        sess.run(here)
                        a.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        sess.run(there)
                        b.append(time.perf_counter() - t)
                    row.append(float(np.median(b) - np.median(a)))
                times[f"{i},{j}"] = row
        finally:
            sess.close()
        return {"times": times, "sizes": sizes}


def keep_constants_placed() -> None:
    """TF's ReplicateConstantsPass (always on, after placement) copies a small constant (<= 16 elements, on a CPU,
    no control successors) with consumers on several devices to each consumer's device — "aggressive" mode, or,
    with this flag off, to CPU:0 of each consumer's task. Off, the logical CPUs of one process (`cpu:N`) all map
    to one CPU:0 and nothing is copied: the graph measured is the graph placed. Across TF cluster tasks the
    copies are still made (one per consumer task, `NAME/replicate/_K`): TF's own distributed behaviour, which
    the placement check does not count. A process-wide flag: the child sets it for its sessions, each cluster
    task for the graphs its master partitions."""
    try:
        from tensorflow.core.config import flags as tf_flags

        tf_flags.config().enable_aggressive_constant_replication.reset(False)
    except (ImportError, AttributeError):
        pass


def _full(dev: str) -> str:
    """`/CPU:1` -> `/device:CPU:1` (full names pass through)."""
    if dev.startswith("/job:") or dev.startswith("/device:"):
        return dev
    return "/device:" + dev.lstrip("/")


def _fetch(g, name: str):
    if ":" in name:
        return g.get_tensor_by_name(name)
    return g.get_operation_by_name(name)


def _placement_check(step_stats, assigned: dict) -> tuple[float | None, int, dict]:
    """Fraction of executed placed ops that ran on their assigned device, their count, peak bytes per device."""
    from placer.runtime.devices import trace_device

    ran: dict[str, set] = {}
    peak: dict[str, int] = {}
    for ds in step_stats.dev_stats:
        dev = trace_device(ds.device)
        if dev is None:
            continue
        for ns in ds.node_stats:
            name = ns.node_name.split(":", 1)[0]
            if name in assigned:
                ran.setdefault(name, set()).add(dev)
            for m in ns.memory:
                if m.peak_bytes > peak.get(dev, 0):
                    peak[dev] = int(m.peak_bytes)
    if not ran:
        return None, 0, peak
    good = sum(1 for n, devs in ran.items() if devs == {assigned[n]})
    return good / len(ran), len(ran), peak


def _op_times(step_stats, assigned: dict) -> dict[str, tuple[str, float]]:
    """Per placed op: (device, seconds) from one traced step. GPU stream entries (kernel time) take precedence
    over the host-side launch entry of the same op."""
    from placer.runtime.devices import trace_device

    best: dict[str, tuple[str, float, bool]] = {}
    for ds in step_stats.dev_stats:
        dev = trace_device(ds.device)
        if dev is None:
            continue
        stream = "stream" in ds.device
        for ns in ds.node_stats:
            name = ns.node_name.split(":", 1)[0]
            if name not in assigned:
                continue
            secs = max(ns.all_end_rel_micros, ns.op_end_rel_micros - ns.op_start_rel_micros, 0) * 1e-6
            prev = best.get(name)
            if prev is None or (stream and not prev[2]) or (stream == prev[2] and secs > prev[1]):
                best[name] = (dev, secs, stream)
    return {k: (v[0], v[1]) for k, v in best.items()}


def _die_with_parent() -> None:
    """Exit as soon as the parent is gone, even while busy inside a long TF step (TF releases the GIL), so a
    measurement child never outlives the search or worker that started it. (A watchdog thread rather than
    PR_SET_PDEATHSIG, which fires when the spawning *thread* ends.)"""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _exit_now(code: int) -> None:
    """Leave at once: this process holds nothing to save, and the interpreter's teardown with TensorFlow loaded
    takes about a second, which every runner's close() would wait for."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: list[str]) -> int:
    from multiprocessing.connection import Connection

    fd_in, fd_out = int(argv[1]), int(argv[2])
    _die_with_parent()
    # Ctrl-C in a terminal reaches the whole process group: it is for the parent (a search finishes its step and
    # checkpoints), which owns this process's life (pipe EOF, parent-death signal, kill); a measurement cut by
    # it would be reported as a failed placement
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # keep the protocol pipe clean: anything written to stdout goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    rx, tx = Connection(fd_in, writable=False), Connection(fd_out, readable=False)
    st = _State()
    while True:
        try:
            kind, req = rx.recv()
        except (EOFError, OSError):
            _exit_now(0)
        if kind == "exit":
            _exit_now(0)
        try:
            if kind == "ping":
                res = "pong"
            elif kind == "sleep":          # test hook: simulates a hang inside TensorFlow
                time.sleep(float(req))
                res = "slept"
            else:
                res = getattr(st, kind)(req)
            tx.send(("ok", res))
        except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent
            oom = type(e).__name__ == "ResourceExhaustedError" or isinstance(e, MemoryError)
            tb = traceback.format_exc(limit=3) if not hasattr(e, "op") else ""
            try:
                tx.send(("error", {"reason": _short_error(e), "oom": oom, "kind": type(e).__name__,
                                   "trace": tb[-2000:]}))
            except (OSError, EOFError):
                return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
