"""Chrome trace (Trace Event Format, opens in Perfetto / chrome://tracing) of one simulated step.

One row per device (process "devices", a thread per device, ops as complete events) and one row per link in use
(process "links", a thread per "src -> dst" pair, transfers named after the tensor's producer op).

>>> from placer.graphs.opgraph import OpGraph
>>> from placer.sim.cluster import parse_cluster
>>> from placer.sim.simulator import Simulator
>>> import numpy as np
>>> g = OpGraph.build([("a", "X", 8), ("b", "X", 8)], [("a", "b")])
>>> cl = parse_cluster("2xK80")
>>> r = Simulator(g, cl, np.ones(2)).simulate(np.array([0, 1]), trace=True)
>>> [e["name"] for e in chrome_trace(g, cl, r)["traceEvents"] if e["ph"] == "X"]
['a', 'b', 'a:0']
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from placer.errors import PlacementError
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster

DEVICES_PID = 1
LINKS_PID = 2


def chrome_trace(graph: OpGraph, cluster: Cluster, result) -> dict:
    """Trace Event Format dict of `result` (a SimResult made with trace=True). Times in microseconds."""
    tr = getattr(result, "trace", None)
    if tr is None:
        raise PlacementError("the simulation was run without trace=True: no timeline to write")
    names = cluster.device_names
    ev: list[dict] = [
        {"ph": "M", "pid": DEVICES_PID, "name": "process_name", "args": {"name": "devices"}},
        {"ph": "M", "pid": LINKS_PID, "name": "process_name", "args": {"name": "links"}},
        {"ph": "M", "pid": DEVICES_PID, "name": "process_sort_index", "args": {"sort_index": 0}},
        {"ph": "M", "pid": LINKS_PID, "name": "process_sort_index", "args": {"sort_index": 1}},
    ]
    for d, nm in enumerate(names):
        ev.append({"ph": "M", "pid": DEVICES_PID, "tid": d, "name": "thread_name", "args": {"name": nm}})
        ev.append({"ph": "M", "pid": DEVICES_PID, "tid": d, "name": "thread_sort_index", "args": {"sort_index": d}})
    for i in np.argsort(tr.op_start, kind="stable"):
        s = float(tr.op_start[i])
        if not np.isfinite(s):
            continue
        ev.append({"ph": "X", "pid": DEVICES_PID, "tid": int(tr.placement[i]), "name": graph.names[i],
                   "cat": graph.types[i], "ts": s * 1e6, "dur": float(tr.op_end[i] - s) * 1e6,
                   "args": {"op": int(i), "type": graph.types[i], "out_bytes": int(graph.out_bytes[i])}})
    D = len(names)
    links_seen: dict[int, int] = {}
    t_first = np.searchsorted(graph.tensor_op, np.arange(graph.num_ops))
    for k in np.argsort(tr.x_start, kind="stable"):
        src, dst, t = int(tr.x_src[k]), int(tr.x_dst[k]), int(tr.x_tensor[k])
        lid = src * D + dst
        if lid not in links_seen:
            links_seen[lid] = len(links_seen)
            ev.append({"ph": "M", "pid": LINKS_PID, "tid": lid, "name": "thread_name",
                       "args": {"name": f"{names[src]} -> {names[dst]}"}})
        op = int(graph.tensor_op[t])
        ev.append({"ph": "X", "pid": LINKS_PID, "tid": lid, "name": f"{graph.names[op]}:{t - int(t_first[op])}",
                   "cat": "transfer", "ts": float(tr.x_start[k]) * 1e6,
                   "dur": float(tr.x_end[k] - tr.x_start[k]) * 1e6,
                   "args": {"bytes": int(graph.tensor_bytes[t]), "from": names[src], "to": names[dst]}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"graph": graph.name, "cluster": cluster.name, "step_time_s": float(result.step_time),
                          "oom": bool(result.oom),
                          "peak_memory_bytes": {nm: int(b) for nm, b in zip(names, result.peak_memory)}}}


def is_chrome_trace(path: "str | os.PathLike") -> bool:
    """Whether the file `path` holds a Chrome trace (Trace Event Format: an object with a "traceEvents" list, or a
    list of events), e.g. one `write_trace` wrote: what `placer simulate --trace` may replace."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    events = obj.get("traceEvents") if isinstance(obj, dict) else obj
    return isinstance(events, list) and all(isinstance(e, dict) and "ph" in e for e in events)


def write_trace(path: "str | os.PathLike", graph: OpGraph, cluster: Cluster, result) -> None:
    """Write chrome_trace(...) as JSON to `path`."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(chrome_trace(graph, cluster, result)))
