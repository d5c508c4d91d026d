"""Per-op cost tables: seconds of every op on each device kind.

Sources
- analytical (`analytical_costs`): Grappler's op-level cost model, run once per device kind on a virtual
  cluster of ONE device with that kind's properties (`tensorflow.python.grappler.cluster.Cluster(devices=...)`
  + `MeasureCosts` on a `grappler.item.Item` of the graph's MetaGraphDef; per-op times read from the step
  stats in nanoseconds). Ops Grappler does not run (outside the fetches' fan-in) and hand-built graphs without
  a MetaGraphDef get a roofline estimate: max(flops / peak_flops, bytes touched / mem_bandwidth) + a launch
  overhead (LAUNCH_OVERHEAD). `source` says which: "analytical:grappler+roofline" or "analytical:roofline".
- profiled (`placer profile`, runtime room): measured on real devices; same file format, source "profiled".

File format (`CostTable.save`): an .npz with fingerprint, source, op names, cpu_only, kinds and a
[kinds, n] float64 seconds array; or, for paths ending in .json, the same as JSON:
  {"format": 1, "graph_fingerprint": str, "source": str, "ops": [name, ...], "cpu_only": [bool, ...],
   "seconds": {kind: [float, ...]}, "meta": {...}}

>>> from placer.graphs.opgraph import OpGraph
>>> from placer.sim.cluster import parse_cluster
>>> g = OpGraph.build([("a", "MatMul", 4096, 0, 2e9)])
>>> t = analytical_costs(g, parse_cluster("1xK80"), cache=False)
>>> t.matrix(parse_cluster("1xK80")).shape
(1, 2)
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from placer import _version, devnames
from placer._npz import load_npz
from placer.errors import CostTableError, GraphImportError
from placer.graphs.opfacts import TENSOR_CORE_OPS
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import PRESETS, Cluster, Device

log = logging.getLogger(__name__)

COSTS_FORMAT = 1
# the analytical cost cache's format: bump when the estimate changes for the same graph and device figures (placer's
# version is in the key too, so a release never reads columns another release wrote)
COSTS_CACHE_FORMAT = 2   # 2: Grappler costs for graphs larger than one device's memory (not the roofline)
# Fixed per-op cost added by the roofline fallback: a CUDA kernel launch + TF executor dispatch on a GPU
# (~5 us on K80-era drivers; NVIDIA CUDA C Best Practices Guide, "kernel launch overhead" order of 5 us), ~1 us
# of executor overhead on the CPU.
LAUNCH_OVERHEAD = {"gpu": 5e-6, "cpu": 1e-6}


def cache_dir() -> Path:
    return Path(os.environ.get("PLACER_CACHE_DIR") or Path.home() / ".cache" / "placer") / "costs"


@dataclass
class CostTable:
    """seconds[kind] = float64[n] (op i's time on one device of that kind), for the graph with `fingerprint`.

    `matrix(cluster)` -> float64[n, D], `inf` where an op cannot run (a CPU-only op on a non-CPU device)."""

    fingerprint: str
    names: tuple[str, ...]
    cpu_only: np.ndarray
    seconds: dict[str, np.ndarray]
    source: str = "analytical:roofline"
    meta: dict = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        return list(self.seconds)

    def _kind_key(self, kind: str) -> str | None:
        for k in self.seconds:
            if k.lower() == kind.lower():
                return k
        return None

    def has_kind(self, kind: str) -> bool:
        return self._kind_key(kind) is not None

    def for_kind(self, kind: str) -> np.ndarray:
        k = self._kind_key(kind)
        if k is None:
            raise CostTableError(f"cost table ({self.source}) has no times for device kind {kind!r}; it has: "
                                 f"{', '.join(self.seconds) or 'none'}")
        return self.seconds[k]

    def matrix(self, cluster: Cluster) -> np.ndarray:
        """float64[n, D]: seconds of op i on device d of `cluster`; inf for CPU-only ops on non-CPU devices."""
        n = len(self.names)
        m = np.empty((n, cluster.num_devices))
        for d, dev in enumerate(cluster.devices):
            col = np.asarray(self.for_kind(dev.kind), np.float64)
            if not dev.is_cpu:
                col = np.where(self.cpu_only, np.inf, col)
            m[:, d] = col
        return m

    def merged(self, other: "CostTable") -> "CostTable":
        """This table plus the kinds only `other` has (same graph)."""
        if other.fingerprint != self.fingerprint:
            raise CostTableError(f"cannot merge cost tables of graphs {self.fingerprint} and {other.fingerprint}")
        secs = dict(self.seconds)
        for k, v in other.seconds.items():
            if not self.has_kind(k):
                secs[k] = v
        src = self.source if other.source == self.source else f"{self.source}+{other.source}"
        return CostTable(self.fingerprint, self.names, self.cpu_only, secs, src, {**other.meta, **self.meta})

    # ---- files --------------------------------------------------------------------------------------------
    def save(self, path: "str | os.PathLike") -> None:
        """Write the table (.json -> JSON, anything else -> .npz; see the module docstring)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        kinds = list(self.seconds)
        if p.suffix.lower() == ".json":
            obj = {"format": COSTS_FORMAT, "graph_fingerprint": self.fingerprint, "source": self.source,
                   "ops": list(self.names), "cpu_only": [bool(x) for x in self.cpu_only],
                   "seconds": {k: [float(x) for x in self.seconds[k]] for k in kinds}, "meta": self.meta}
            p.write_text(json.dumps(obj))
            return
        arr = np.stack([np.asarray(self.seconds[k], np.float64) for k in kinds]) if kinds else \
            np.zeros((0, len(self.names)))
        with open(p, "wb") as f:
            np.savez(f, format=np.asarray(COSTS_FORMAT), fingerprint=np.asarray(self.fingerprint),
                     source=np.asarray(self.source), names=np.asarray(self.names, dtype=str),
                     cpu_only=np.asarray(self.cpu_only, bool), kinds=np.asarray(kinds, dtype=str),
                     seconds=arr, meta=np.asarray(json.dumps(self.meta)))

    @staticmethod
    def load(path: "str | os.PathLike", graph: OpGraph | None = None) -> "CostTable":
        """Read a table; with `graph`, a table of another graph is a CostTableError naming both fingerprints."""
        p = Path(path)
        if not p.is_file():
            raise CostTableError(f"cost table file {str(p)!r} does not exist")
        try:
            head = p.read_bytes()[:1]
            if head in (b"{", b"[", b" ", b"\n"):
                obj = json.loads(p.read_text())
                t = CostTable(str(obj["graph_fingerprint"]), tuple(obj["ops"]),
                              np.asarray(obj["cpu_only"], bool),
                              {str(k): np.asarray(v, np.float64) for k, v in obj["seconds"].items()},
                              str(obj.get("source", "profiled")), dict(obj.get("meta") or {}))
            else:
                try:
                    z = load_npz(p)        # no pickles: a cost file must not run code
                except ValueError:         # no npz: numpy would call it a pickle
                    raise CostTableError(f"{str(p)!r} is not a cost table (neither JSON nor an npz; `placer "
                                         f"profile --out FILE` writes one)") from None
                missing = [k for k in ("kinds", "seconds", "fingerprint", "names", "cpu_only", "source", "meta")
                           if k not in z.files]
                if missing:    # another zip (a .keras model...) or npz: not "no 'x is not a file in the archive'"
                    raise CostTableError(f"{str(p)!r} is not a cost table (an archive without {missing[0]!r}; "
                                         f"`placer profile --out FILE` writes one)")
                kinds = [str(k) for k in z["kinds"]]
                secs = z["seconds"]
                t = CostTable(str(z["fingerprint"]), tuple(str(x) for x in z["names"]), z["cpu_only"].astype(bool),
                              {k: np.asarray(secs[i], np.float64) for i, k in enumerate(kinds)}, str(z["source"]),
                              json.loads(str(z["meta"])))
        except CostTableError:
            raise
        except KeyError as e:
            raise CostTableError(f"cannot read cost table {str(p)!r}: it has no {e} field (not a cost table "
                                 f"`placer profile` wrote?)") from None
        except Exception as e:  # noqa: BLE001 - any unreadable file is one clear error
            raise CostTableError(f"cannot read cost table {str(p)!r}: {e}") from None
        n = len(t.names)
        for k, v in t.seconds.items():
            if v.shape != (n,) or np.isnan(v).any() or (v < 0).any():
                raise CostTableError(f"cost table {str(p)!r}: times of kind {k!r} are not {n} non-negative numbers")
        if graph is not None:
            t.check_graph(graph, str(p))
        return t

    def check_graph(self, graph: OpGraph, where: str = "cost table") -> None:
        if self.fingerprint != graph.fingerprint or len(self.names) != graph.num_ops:
            raise CostTableError(f"{where} is for graph {self.fingerprint} ({len(self.names)} ops), not for graph "
                                 f"{graph.name!r} {graph.fingerprint} ({graph.num_ops} ops)")


# =================================================================================================================
# analytical estimates
# =================================================================================================================
def _tf_version() -> str:
    """The installed TensorFlow's version, for the cost cache's key, without importing TensorFlow when it is not
    yet imported (that takes seconds, and `build_problem` on a cached table needs no TensorFlow)."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and getattr(tf, "__version__", None):
        return tf.__version__
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-macos"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:
        import tensorflow as tf  # noqa: F811 - an install without package metadata

        return tf.__version__
    except ImportError:  # pragma: no cover
        return "none"


def _kind_devices(cluster: Cluster) -> dict[str, Device]:
    """One representative device per kind (the first)."""
    out: dict[str, Device] = {}
    for d in cluster.devices:
        out.setdefault(d.kind, d)
    return out


def input_bytes(graph: OpGraph) -> np.ndarray:
    """Bytes each op reads (sum over its distinct input tensors)."""
    tb = np.asarray(graph.tensor_bytes, np.float64)
    return np.bincount(np.asarray(graph.edge_dst, np.int64), weights=tb[np.asarray(graph.edge_tensor, np.int64)],
                       minlength=graph.num_ops)


def roofline_seconds(graph: OpGraph, device: Device) -> np.ndarray:
    """max(flops / peak_flops, (input + output bytes) / mem_bandwidth) + launch overhead, per op.

    >>> from placer.sim.cluster import make_device
    >>> g = OpGraph.build([("a", "MatMul", 0, 0, 4.37e12)])
    >>> float(roofline_seconds(g, make_device("/GPU:0", "K80"))[0])
    1.000005
    """
    touched = input_bytes(graph) + np.asarray(graph.out_bytes, np.float64)
    t = np.maximum(np.asarray(graph.flops, np.float64) / device.peak_flops, touched / device.mem_bandwidth)
    return t + LAUNCH_OVERHEAD["cpu" if device.is_cpu else "gpu"]


def _grappler_cores_per_sm(arch: str) -> int:
    # OpLevelCostEstimator::GetDeviceInfo (tensorflow/core/grappler/costs/op_level_cost_estimator.cc)
    if arch < "3":
        return 32
    if arch < "4":
        return 192
    if arch < "6":
        return 128
    return 64


def device_properties(device: Device):
    """Grappler DeviceProperties whose peak FLOP/s and bandwidth (as OpLevelCostEstimator derives them) equal
    the device's: GPU gflops = num_cores x frequency(MHz) x 1e-3 x cores_per_SM(arch) x 2; CPU gflops =
    num_cores x frequency x 1e-3; bandwidth in KB/s."""
    from tensorflow.core.protobuf import device_properties_pb2

    p = PRESETS.get(device.kind, {})
    if device.is_cpu:
        cores = int(p.get("cores", 16))
        freq = device.peak_flops / cores / 1e6  # effective MHz so that cores x freq = peak (Grappler: 1 flop/cycle)
        return device_properties_pb2.DeviceProperties(
            type="CPU", vendor="Intel", model=str(p.get("model", device.kind)), frequency=int(round(freq)),
            num_cores=cores, memory_size=int(device.memory_bytes), bandwidth=int(device.mem_bandwidth / 1e3),
            l1_cache_size=32 * 1024, l2_cache_size=256 * 1024, l3_cache_size=45 * 1024 * 1024)
    arch = str(p.get("arch", "7.0"))
    sms = int(p.get("sms", 80))
    freq = device.peak_flops / (sms * _grappler_cores_per_sm(arch) * 2) / 1e6
    major, minor = (arch.split(".") + ["0"])[:2]
    return device_properties_pb2.DeviceProperties(
        type="GPU", vendor="NVIDIA", model=str(p.get("model", device.kind)), frequency=int(round(freq)),
        num_cores=sms, environment={"architecture": arch, "cuda": "11080", "cudnn": "8600"},
        memory_size=int(device.memory_bytes), bandwidth=int(device.mem_bandwidth / 1e3),
        l2_cache_size=6 * 1024 * 1024, num_registers=65536, shared_memory_size_per_multiprocessor=98304)


def grappler_device_name(device: Device) -> str:
    return "/job:localhost/replica:0/task:0/device:" + ("CPU:0" if device.is_cpu else "GPU:0")


def grappler_item(graph: OpGraph, clear_devices: bool = True, devices: dict[str, str] | None = None):
    """A grappler Item of the graph's MetaGraphDef (fetches as the `train_op` collection). Device fields are
    cleared (everything on the virtual cluster's default device) unless `devices` maps op name -> full
    device name."""
    import tensorflow as tf  # noqa: F401 - registers ops
    from tensorflow.python.grappler import item as gitem

    mg = graph.meta_graph_def()
    fetches = list(graph.fetches)
    col = mg.collection_def["train_op"].node_list.value
    if not list(col):
        col.extend(fetches)
    for node in mg.graph_def.node:
        if devices is not None:
            node.device = devices.get(node.name, "")
        elif clear_devices:
            node.device = ""
    try:
        return gitem.Item(mg, ignore_colocation=True, ignore_user_placement=False)
    except Exception as e:  # noqa: BLE001 - grappler raises assorted errors for graphs it cannot item-ize
        raise CostTableError(f"Grappler cannot build an item for graph {graph.name!r}: {e}") from None


def grappler_measure(item, devices: Sequence[tuple[str, object]]):
    """Run Grappler's MeasureCosts on a virtual cluster of `devices` ((full name, DeviceProperties) pairs).
    Returns (run_time seconds, {node name: seconds}) with per-node times from the step stats (nanoseconds)."""
    from tensorflow.core.protobuf import device_properties_pb2
    from tensorflow.python.grappler import cluster as gcluster

    named = [device_properties_pb2.NamedDevice(name=n, properties=p) for n, p in devices]
    cl = gcluster.Cluster(devices=named, disable_timeline=False)
    try:
        _, run_time, step_stats = cl.MeasureCosts(item)
    except Exception as e:  # noqa: BLE001
        raise CostTableError(f"Grappler MeasureCosts failed: {e}") from None
    finally:
        cl.Shutdown()
    per_node: dict[str, float] = {}
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            t = ns.op_end_rel_nanos * 1e-9 if ns.op_end_rel_nanos else ns.op_end_rel_micros * 1e-6
            per_node[ns.node_name] = per_node.get(ns.node_name, 0.0) + t
    return float(run_time), per_node


def _grappler_seconds(graph: OpGraph, device: Device) -> tuple[np.ndarray, np.ndarray]:
    """Grappler's per-op times for every op of `graph` on one device like `device`; NaN where Grappler has
    none. Returns (seconds, covered mask)."""
    item = grappler_item(graph)
    props = device_properties(device)
    # per-op times do not depend on the device's memory, but MeasureCosts refuses a graph that does not fit one
    # device ("Graph requires N bytes of memory on device ...") -- every model worth splitting: costs would fall
    # back to the roofline for every op
    props.memory_size = max(props.memory_size, 1 << 50)
    _, per_node = grappler_measure(item, [(grappler_device_name(device), props)])
    secs = np.full(graph.num_ops, np.nan)
    idx = graph._name_index
    for nm, t in per_node.items():
        i = idx.get(nm)
        if i is not None:
            secs[i] = t
    return secs, ~np.isnan(secs)


def apply_precision(graph: OpGraph, device: Device, col: np.ndarray) -> np.ndarray:
    """Per-op seconds for `graph.precision` on `device`: matmuls and convolutions (TENSOR_CORE_OPS) of a 16-bit
    graph at the device's tensor-core peak for that dtype (roofline on their dtype-sized bytes); other ops keep
    `col`. ClusterError (one line) when the device kind has no figure for the precision (e.g. K80 and fp16)."""
    prec = getattr(graph, "precision", "fp32") or "fp32"
    peak = device.peak_for(prec)
    if prec == "fp32":
        return col
    tc = np.fromiter((t in TENSOR_CORE_OPS for t in graph.types), bool, graph.num_ops)
    touched = input_bytes(graph) + np.asarray(graph.out_bytes, np.float64)
    fast = np.maximum(np.asarray(graph.flops, np.float64) / peak, touched / device.mem_bandwidth) \
        + LAUNCH_OVERHEAD["cpu" if device.is_cpu else "gpu"]
    return np.where(tc, fast, col)


def _figures_key(device: Device) -> str:
    return hashlib.sha256(repr((device.kind, device.peak_flops, device.mem_bandwidth, device.is_cpu,
                                sorted(LAUNCH_OVERHEAD.items()))).encode()).hexdigest()[:10]


def analytical_costs(graph: OpGraph, cluster: Cluster, *, cache: bool = True, use_grappler: bool = True) -> CostTable:
    """Analytical cost table for every device kind of `cluster` (Grappler where it has an estimate, roofline
    elsewhere), cached per (graph fingerprint, kind + figures, TF version, placer version) under
    $PLACER_CACHE_DIR/costs.

    >>> from placer.sim.cluster import parse_cluster
    >>> g = OpGraph.build([("a", "X", 100)])
    >>> analytical_costs(g, parse_cluster("2xV100"), cache=False).kinds
    ['V100', 'cpu']
    """
    has_mg = graph.meta_graph is not None and use_grappler
    tfv = _tf_version() if has_mg else "none"
    made_by = hashlib.sha256(repr((COSTS_CACHE_FORMAT, _version.__version__)).encode()).hexdigest()[:8]
    secs: dict[str, np.ndarray] = {}
    covered_frac: dict[str, float] = {}
    prec = getattr(graph, "precision", "fp32") or "fp32"
    for dev in _kind_devices(cluster).values():
        dev.peak_for(prec)   # one-line error before any work when a kind has no figure for the precision
    for kind, dev in _kind_devices(cluster).items():
        path = cache_dir() / (f"{graph.fingerprint}-{kind}-{_figures_key(dev)}-{'g' if has_mg else 'r'}-tf{tfv}"
                              f"-p{made_by}{'' if prec == 'fp32' else f'-{prec}{dev.peak_for(prec):.4g}'}.npy")
        col = None
        if cache and path.is_file():
            try:
                col = np.load(path, allow_pickle=False)
                if col.shape != (graph.num_ops,):
                    col = None
            except (OSError, ValueError):
                col = None
        if col is None:
            roof = roofline_seconds(graph, dev)
            if has_mg:
                try:
                    g_secs, ok = _grappler_seconds(graph, dev)
                except (CostTableError, GraphImportError) as e:
                    log.warning("Grappler costs unavailable for %s on %s (%s); using the roofline", graph.name, kind, e)
                    g_secs, ok = roof, np.zeros(graph.num_ops, bool)
                col = np.where(ok, g_secs, roof)
                covered = float(ok.mean()) if graph.num_ops else 1.0
            else:
                col, covered = roof, 0.0
            col = apply_precision(graph, dev, col)
            if cache:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy")
                    os.close(fd)
                    np.save(tmp, col)
                    os.replace(tmp, path)
                    path.with_suffix(".cov").write_text(str(covered))
                except OSError as e:
                    log.warning("cannot write cost cache %s: %s", path, e)
        else:
            try:
                covered = float(path.with_suffix(".cov").read_text())
            except (OSError, ValueError):
                covered = float("nan")
        secs[kind] = np.asarray(col, np.float64)
        covered_frac[kind] = covered
    source = "analytical:grappler+roofline" if has_mg else "analytical:roofline"
    return CostTable(graph.fingerprint, tuple(graph.names), np.asarray(graph.cpu_only, bool), secs, source,
                     {"grappler_coverage": covered_frac, "tensorflow": tfv})


def is_cost_table(path: "str | os.PathLike") -> bool:
    """Whether the file `path` reads as a cost table (`CostTable.load`, any graph): what `placer profile --out` may
    replace."""
    try:
        CostTable.load(path)
    except CostTableError:
        return False
    return True


def load_or_analytical(graph: OpGraph, cluster: Cluster, path: "str | os.PathLike | None" = None) -> CostTable:
    """The table at `path` (checked against `graph`), with any device kind of `cluster` it lacks filled in
    analytically; without `path`, the analytical table."""
    if path is None:
        return analytical_costs(graph, cluster)
    t = CostTable.load(path, graph)
    missing = [k for k in _kind_devices(cluster) if not t.has_kind(k)]
    if missing:
        log.warning("cost table %s has no times for %s; estimating those analytically", path, ", ".join(missing))
        sub = Cluster(tuple(d for d in cluster.devices if d.kind in missing), cluster.bandwidth, cluster.latency)
        t = t.merged(analytical_costs(graph, sub))
    return t


def grappler_step_time(graph: OpGraph, cluster: Cluster, placement: np.ndarray | None = None) -> float:
    """Grappler's own estimate (MeasureCosts run time on a virtual cluster of `cluster`'s devices, transfers
    free) of one step of `graph` placed by `placement` (op→device index; None = Grappler's default device).
    The peer the simulator is checked against."""
    full = {}
    for d in cluster.devices:
        full[d.name] = devnames.parse(d.name).full
    devices = None
    if placement is not None:
        names = cluster.device_names
        devices = {nm: full[names[int(p)]] for nm, p in zip(graph.names, np.asarray(placement))}
    item = grappler_item(graph, devices=devices)
    run_time, _ = grappler_measure(item, [(full[d.name], device_properties(d)) for d in cluster.devices])
    return run_time
