"""`Placement` (op name → device name: JSON file, `apply` to a graph, `retrace` a function) and the built-in
placements `single`, `random` and `round_robin`.

Low in the house: search, runtime, problem and api all use it; it imports only graphs (and TF lazily).
Names (op name → device string) live here, at the edge; inside, placements are op→device index arrays.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from placer._version import __version__
from placer import devnames
from placer.errors import ClusterError, PlacementError, write_text_atomic
from placer.graphs.opgraph import OpGraph

PLACEMENT_FORMAT = 1
BUILTIN_PLACEMENTS = ("single", "random", "round_robin")


def tf_version() -> str:
    try:
        from importlib.metadata import version

        return version("tensorflow")
    except Exception:  # noqa: BLE001
        return "unknown"


@dataclass
class Placement:
    """op name → device name (TF short form `/GPU:0`, `/CPU:0`, or full remote form).

    >>> p = Placement({"a": "/GPU:0", "b": "/CPU:0"}, devices=["/GPU:0", "/CPU:0"], graph_fingerprint="f00")
    >>> p.device_counts()
    {'/GPU:0': 1, '/CPU:0': 1}
    """

    mapping: dict[str, str]
    devices: list[str]
    graph_fingerprint: str = ""

    # ---- conversions ------------------------------------------------------------------
    @staticmethod
    def from_indices(graph: OpGraph, devices: Sequence[str], op_devices: np.ndarray) -> "Placement":
        op_devices = np.asarray(op_devices)
        if op_devices.shape != (graph.num_ops,):
            raise PlacementError(f"placement has {op_devices.shape} entries; graph {graph.name!r} has "
                                 f"{graph.num_ops} ops")
        if op_devices.size and (op_devices.min() < 0 or op_devices.max() >= len(devices)):
            bad = int(np.flatnonzero((op_devices < 0) | (op_devices >= len(devices)))[0])
            raise PlacementError(f"op {graph.names[bad]!r} is placed on device index {int(op_devices[bad])}, "
                                 f"outside the {len(devices)} devices {list(devices)}")
        devs = list(devices)
        return Placement({nm: devs[int(d)] for nm, d in zip(graph.names, op_devices)}, devs, graph.fingerprint)

    def to_indices(self, graph: OpGraph, devices: Sequence[str]) -> np.ndarray:
        """op→device index array for `graph` over `devices` (errors name the op or device at fault)."""
        self.check_graph(graph)
        pos = {_canon(d): i for i, d in enumerate(devices)}
        out = np.empty(graph.num_ops, np.int32)
        for i, nm in enumerate(graph.names):
            d = self.mapping.get(nm)
            if d is None:
                raise PlacementError(f"the placement has no device for op {nm!r}")
            j = pos.get(_canon(d))
            if j is None:
                raise PlacementError(f"op {nm!r} is placed on {d!r}, which is not one of the devices "
                                     f"{list(devices)}")
            out[i] = j
        if len(self.mapping) > graph.num_ops:    # every graph op was found, so some names are not the graph's
            known = set(graph.names)
            extra = [nm for nm in self.mapping if nm not in known]
            raise PlacementError(f"the placement names op {extra[0]!r}, which is not in graph {graph.name!r}"
                                 + (f" (nor are {len(extra) - 1} more of its ops)" if len(extra) > 1 else ""))
        return out

    def check_graph(self, graph: OpGraph) -> None:
        """A placement written for another graph is refused by fingerprint. One without a fingerprint (written by
        hand, or by a tool other than placer) is checked op by op instead, by `to_indices`: every op of the graph
        needs a device, and every op it names must be the graph's."""
        if self.graph_fingerprint and graph.fingerprint and self.graph_fingerprint != graph.fingerprint:
            raise PlacementError(f"this placement is for graph {self.graph_fingerprint}, not for graph "
                                 f"{graph.name!r} ({graph.fingerprint})")

    def device_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {d: 0 for d in self.devices}
        for d in self.mapping.values():
            counts[d] = counts.get(d, 0) + 1
        return counts

    # ---- files ------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": PLACEMENT_FORMAT, "graph_fingerprint": self.graph_fingerprint, "devices": self.devices,
                "placement": self.mapping, "placer_version": __version__, "tensorflow_version": tf_version()}

    def save(self, path: str | os.PathLike) -> None:
        """Write the placement file of CLI.md (atomically: a temp file then a rename)."""
        write_text_atomic(path, json.dumps(self.to_json(), indent=1), "placement file")

    @staticmethod
    def load(path: str | os.PathLike) -> "Placement":
        try:
            d = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise PlacementError(f"placement file {path} does not exist") from None
        except (OSError, ValueError) as e:
            raise PlacementError(f"placement file {path} is not valid JSON: {e}") from None
        if not isinstance(d, dict) or "placement" not in d or not isinstance(d["placement"], dict):
            raise PlacementError(f"{path} is not a placement file (no 'placement' object)")
        if d.get("format", PLACEMENT_FORMAT) != PLACEMENT_FORMAT or isinstance(d.get("format"), (bool, str)):
            raise PlacementError(f"{path}: placement format {d.get('format')!r} is not supported (expected 1)")
        bad = next(((k, v) for k, v in d["placement"].items() if not isinstance(v, str)), None)
        if bad:     # str(None) = 'None' was then reported as an unknown device
            raise PlacementError(f"{path}: op {bad[0]!r} is placed on {bad[1]!r}, not on a device name (a string)")
        devices = d.get("devices")
        if devices is not None and not (isinstance(devices, list) and all(isinstance(x, str) for x in devices)):
            raise PlacementError(f"{path}: \"devices\" must be a list of device names, got {devices!r}"[:300])
        fp = d.get("graph_fingerprint") or ""
        if not isinstance(fp, str):
            raise PlacementError(f"{path}: \"graph_fingerprint\" must be a string, got {fp!r}")
        mapping = {str(k): v for k, v in d["placement"].items()}
        # "devices" is informational (to_indices checks the map against the devices it is given): a device the
        # map names and the list lacks (a hand edit that moved an op) joins the list, so counts see every device
        listed = list(devices or [])
        seen = {_canon(x) for x in listed}
        for v in sorted(set(mapping.values())):
            if _canon(v) not in seen:
                seen.add(_canon(v))
                listed.append(v)
        return Placement(mapping, listed, fp)

    # ---- TensorFlow -------------------------------------------------------------------
    def apply(self, graph):
        """A placed copy of `graph`: an OpGraph (→ its runnable MetaGraphDef), a MetaGraphDef or a GraphDef
        (→ the same kind). Nodes the placement names get its device; others keep theirs."""
        from tensorflow.core.framework import graph_pb2
        from tensorflow.core.protobuf import meta_graph_pb2

        if isinstance(graph, OpGraph):
            self.check_graph(graph)
            out = graph.meta_graph_def()
            gd = out.graph_def
        elif isinstance(graph, meta_graph_pb2.MetaGraphDef):
            out = meta_graph_pb2.MetaGraphDef()
            out.CopyFrom(graph)
            gd = out.graph_def
        elif isinstance(graph, graph_pb2.GraphDef):
            out = graph_pb2.GraphDef()
            out.CopyFrom(graph)
            gd = out
        else:
            raise PlacementError(f"Placement.apply takes an OpGraph, MetaGraphDef or GraphDef, not "
                                 f"{type(graph).__name__}")
        matched = 0
        for node in gd.node:
            d = self.mapping.get(node.name)
            if d is not None:
                matched += 1
                node.device = d
                # a _class colocation attr would override the device at run time; the placement keeps
                # co-location itself, so the attr is dropped to let the assigned device stand
                if "_class" in node.attr:
                    del node.attr["_class"]
        if gd.node and self.mapping and not matched:      # another graph's placement: nothing would be placed
            raise PlacementError(f"the placement (for graph {self.graph_fingerprint or '?'}) names none of the "
                                 f"{len(gd.node)} nodes of this graph (its first: {gd.node[0].name!r})")
        return out

    def device_function(self) -> "DeviceFunction":
        """A TF device function for re-tracing a tf.function / Keras model with this placement; see
        `DeviceFunction` and `retrace()`."""
        return DeviceFunction(self)

    def retrace(self, fn: Callable, *args, **kwargs):
        """Trace `fn` (a tf.function, or a plain Python function of tensors) under this placement's device
        function. Returns (ConcreteFunction, DeviceFunction) — the latter reports how many of the traced
        ops it matched (`.matched`, `.unmatched`, `.match_fraction`), since op names drift between traces, counting
        the ops TF placed by colocation without asking it (`.colocated`), and which matched ops sit on another
        device than their placed one (`.off_device`): see `DeviceFunction.account`."""
        import tensorflow as tf

        df = self.device_function()
        tf_fn = fn if hasattr(fn, "get_concrete_function") else tf.function(fn)
        with tf.Graph().as_default() as g, g.device(df):
            cf = tf_fn.get_concrete_function(*args, **kwargs)
        return cf, df.account(cf.graph)


def _canon(device: str) -> str:
    """Canonical device spelling: '/device:GPU:0' and '/gpu:0' both → '/GPU:0'; a string that is no device name
    (a user's placement file may hold one) is kept as given, for the caller to report."""
    try:
        return devnames.canonical(device)
    except ClusterError:
        return device.strip()


_SUFFIX = re.compile(r"_\d+(?=/|$)")
_LAST_SUFFIX = re.compile(r"_\d+$")


class DeviceFunction:
    """Callable TF device function mapping each traced op to its placed device by name, for names that drift
    between traces (TF's uniquifying suffixes: `MatMul_2`, `dense_1`). An op gets, in this order:
    1. the device of the op of the same name;
    2. else that of the op whose name differs only in the last component's suffix (`dense_1/MatMul_3` →
       `dense_1/MatMul`): the scope still says which layer it is;
    3. else that of the ops whose names match with every suffix stripped, only when they all share one device
       (so `dense_2/MatMul` never takes the device of `dense/MatMul` when `dense_1/MatMul` sits elsewhere);
    4. else its own device (counted in `unmatched`).
    Counts what it matched; `account(graph)` then adds the traced graph's ops it was never called for."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self.last: dict[str, str | None] = {}
        self.loose: dict[str, str | None] = {}
        for nm, d in placement.mapping.items():
            for table, key in ((self.last, _LAST_SUFFIX.sub("", nm)), (self.loose, _SUFFIX.sub("", nm))):
                table[key] = d if table.get(key, d) == d else None    # None: ambiguous
        self.matched = 0
        self.unmatched: list[str] = []
        self.colocated: list[str] = []      # ops TF placed by colocation, without calling this (`account`)
        self.off_device: list[str] = []     # matched ops on another device than their placed one (`account`)
        self._asked: set[str] = set()

    def device_for(self, name: str) -> str | None:
        """The placed device for a traced op name, or None (see the class docstring)."""
        d = self.placement.mapping.get(name)
        if d is None:
            d = self.last.get(_LAST_SUFFIX.sub("", name))
        if d is None:
            d = self.loose.get(_SUFFIX.sub("", name))
        return d

    def __call__(self, op) -> str:
        self._asked.add(op.name)
        d = self.device_for(op.name)
        if d is None:
            self.unmatched.append(op.name)
            return op.device or ""
        self.matched += 1
        return d

    def account(self, graph) -> "DeviceFunction":
        """Count the ops of the traced `graph` (a tf.Graph / FuncGraph) this device function was never called for:
        TF creates an op under `colocate_with` (gradients colocated with their forward ops, optimizer slots...) on
        the device of the op it is colocated with, without asking device functions. Each is counted in `matched`
        or `unmatched` by its name as the others are, and listed in `colocated`; every matched op whose traced
        device is not its placed one (colocation, or a device scope inside the traced code, won) is listed in
        `off_device`. Returns self."""
        for op in graph.get_operations():
            d = self.device_for(op.name)
            if op.name not in self._asked:
                self._asked.add(op.name)
                self.colocated.append(op.name)
                if d is None:
                    self.unmatched.append(op.name)
                else:
                    self.matched += 1
            if d is not None and _canon(op.device or "") != _canon(d) and op.name not in self.off_device:
                self.off_device.append(op.name)
        return self

    @property
    def match_fraction(self) -> float:
        tot = self.matched + len(self.unmatched)
        return self.matched / tot if tot else 0.0


# ---- built-in placements -------------------------------------------------------------------

def _by_colocation(graph: OpGraph, group_device: np.ndarray, cluster) -> np.ndarray:
    out = np.asarray(group_device)[graph.colocation].astype(np.int32)
    cpu = cluster.cpu_index
    if cpu is not None:
        out[graph.cpu_only.astype(bool)] = cpu
    return out


def single_placement(graph: OpGraph, cluster) -> np.ndarray:
    """Every op on the first GPU, CPU-only ops on /CPU:0; on a CPU-only cluster everything on the first CPU."""
    first = cluster.gpu_indices[0]
    return _by_colocation(graph, np.full(graph.colocation.max() + 1 if graph.num_ops else 0, first), cluster)


def random_placement(graph: OpGraph, cluster, seed: int = 0) -> np.ndarray:
    """Uniform over the GPUs per co-location group (CPU-only ops on the CPU)."""
    rng = np.random.default_rng(seed)
    gpus = np.asarray(cluster.gpu_indices)
    k = int(graph.colocation.max()) + 1 if graph.num_ops else 0
    return _by_colocation(graph, gpus[rng.integers(0, len(gpus), size=k)], cluster)


def round_robin_placement(graph: OpGraph, cluster) -> np.ndarray:
    """Co-location groups dealt to the GPUs in turn, in topological order of their first op."""
    gpus = np.asarray(cluster.gpu_indices)
    k = int(graph.colocation.max()) + 1 if graph.num_ops else 0
    first_pos = np.full(k, graph.num_ops)
    np.minimum.at(first_pos, graph.colocation, np.arange(graph.num_ops))
    rank = np.empty(k, np.int64)
    rank[np.argsort(first_pos, kind="stable")] = np.arange(k)
    return _by_colocation(graph, gpus[rank % len(gpus)], cluster)
