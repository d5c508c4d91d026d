"""Cluster specs: devices and the links between them. Presets are data (see PRESETS).

    parse_cluster("4xK80")        four K80 dies /GPU:0../GPU:3 + the host /CPU:0 (last)
    parse_cluster("cpu")          the host CPU alone
    parse_cluster("box.json")     a cluster JSON file (CLUSTER_JSON_DOC; write one with to_json)
    cluster_from_devices("cpu:2") real local devices (--devices)
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from placer import devnames
from placer.errors import ClusterError


@dataclass(frozen=True)
class Device:
    name: str                 # TF short form: /GPU:0, /CPU:0 (or full form for remote devices)
    kind: str                 # preset kind: "K80", "V100", ..., "cpu"
    memory_bytes: int         # usable memory
    reserve_bytes: int = 0    # held back for the runtime (CUDA context, allocator slack)
    concurrency: int = 1      # ops it runs at once (1 on a GPU stream; >1 on a CPU)
    peak_flops: float = 1e12  # FLOP/s (fp32) for the roofline fallback
    mem_bandwidth: float = 1e11  # bytes/s of device memory for the roofline fallback
    peak_flops_fp16: float = 0.0  # FLOP/s of fp16 matmul/conv (tensor cores); 0 = no datasheet figure
    peak_flops_bf16: float = 0.0  # FLOP/s of bf16 matmul/conv (tensor cores); 0 = no datasheet figure

    def peak_for(self, precision: str) -> float:
        """Peak FLOP/s of matmuls/convolutions in `precision` (fp32 | fp16 | bf16); ClusterError naming the kind
        when the datasheet gives no figure for it. The host CPU runs 16-bit math at its fp32 rate (no tensor
        cores; AVX2 converts), so a CPU always has a figure."""
        if precision == "fp32":
            return self.peak_flops
        if precision not in ("fp16", "bf16"):
            raise ClusterError(f"unknown precision {precision!r}; valid: fp32, fp16, bf16")
        if self.is_cpu:
            return self.peak_flops
        v = self.peak_flops_fp16 if precision == "fp16" else self.peak_flops_bf16
        if not v > 0:
            raise ClusterError(f"{precision} matmuls (--precision {precision}, or a graph whose matmuls are "
                               f"{precision}): device kind {self.kind} ({self.name}) has no {precision} peak figure "
                               f"(no {precision} tensor cores on its datasheet); use fp32 or a kind that has one")
        return v

    @property
    def is_cpu(self) -> bool:
        return self.kind.lower() == "cpu" or devnames.kind(self.name) == "CPU"

    @property
    def capacity_bytes(self) -> int:
        return int(self.memory_bytes - self.reserve_bytes)


@dataclass(frozen=True, eq=False)
class Cluster:
    """devices: index-aligned with placement values. bandwidth[i, j] bytes/s and latency[i, j] seconds of the
    link i→j (diagonal unused)."""

    devices: tuple[Device, ...]
    bandwidth: np.ndarray
    latency: np.ndarray
    name: str = "cluster"
    meta: dict = field(default_factory=dict)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    @property
    def cpu_index(self) -> int | None:
        """Index of the host CPU (/CPU:0) if the cluster has one."""
        for i, d in enumerate(self.devices):
            if d.is_cpu:
                return i
        return None

    @property
    def gpu_indices(self) -> list[int]:
        """The accelerators ("N devices" in CLI.md). On a CPU-only cluster, all devices."""
        g = [i for i, d in enumerate(self.devices) if not d.is_cpu]
        return g or list(range(len(self.devices)))


# ---------------------------------------------------------------------------------------------------------------
# Presets (data). Every figure cites the vendor datasheet it comes from; "per GPU" means what TensorFlow sees as
# one device (a K80 board is two GK210 dies = two TF devices).
# Fields: memory_bytes, reserve_bytes, concurrency, peak_flops (fp32 FLOP/s), mem_bandwidth (bytes/s),
#         link ("pcie3" | "pcie4" | "pcie5" | "nvlink1" | "nvlink2" | "nvlink3" | "nvlink4": the GPU<->GPU fabric),
#         host_link (the GPU<->CPU link), sms + arch (what Grappler's DeviceProperties are built from).
# ---------------------------------------------------------------------------------------------------------------
GiB = 1 << 30

GRPC_BANDWIDTH, GRPC_LATENCY = 1.5e9, 300e-6   # see LINKS["grpc"]

LINKS: dict[str, dict[str, float]] = {
    # bandwidth per direction (bytes/s) and per-transfer latency (s).
    # PCIe 3.0 x16: 8 GT/s x 16 lanes, 128b/130b = 15.75 GB/s per direction (PCI-SIG PCIe 3.0 spec;
    #   NVIDIA K80/P100/V100-PCIe datasheets: "PCIe Gen3 x16, 32 GB/s" bidirectional).
    "pcie3": {"bandwidth": 15.75e9, "latency": 15e-6},
    # PCIe 4.0 x16: 31.5 GB/s per direction (A100 datasheet: "PCIe Gen4: 64 GB/s" bidirectional).
    "pcie4": {"bandwidth": 31.5e9, "latency": 12e-6},
    # PCIe 5.0 x16: 63 GB/s per direction (H100/H200 datasheet: "PCIe Gen5: 128 GB/s" bidirectional).
    "pcie5": {"bandwidth": 63e9, "latency": 10e-6},
    # NVLink 1 (P100 SXM2 datasheet: 4 links, 160 GB/s bidirectional total = 20 GB/s per link per direction;
    #   DGX-1 hybrid cube-mesh: one link between neighbouring GPUs).
    "nvlink1": {"bandwidth": 20e9, "latency": 10e-6},
    # NVLink 2 (V100 SXM2 datasheet: 6 links, 300 GB/s bidirectional = 25 GB/s per link per direction;
    #   DGX-1V: one or two links between neighbours; we charge one link).
    "nvlink2": {"bandwidth": 25e9, "latency": 10e-6},
    # NVLink 3 + NVSwitch (A100 SXM4 datasheet: 600 GB/s bidirectional per GPU = 300 GB/s per direction).
    "nvlink3": {"bandwidth": 300e9, "latency": 8e-6},
    # NVLink 4 + NVSwitch (H100/H200 SXM datasheet: 900 GB/s bidirectional per GPU = 450 GB/s per direction).
    "nvlink4": {"bandwidth": 450e9, "latency": 8e-6},
    # Logical CPU devices of one process: TF's intra-process rendezvous hands the buffer over without a copy;
    # we charge a host-memory copy (Xeon E5-2686 v4 datasheet: 76.8 GB/s, 4 x DDR4-2400) and a small latency.
    "host": {"bandwidth": 76.8e9, "latency": 5e-6},
    # Two TF tasks (`placer cluster up`) talking gRPC over loopback: not a datasheet figure but a measurement
    # (`placer calibrate`, tensor ping-pong 1 KiB-64 MiB, benchmarks/RESULTS.md "TF cluster links"); the default
    # between tasks until a calibrated cluster JSON replaces it.
    "grpc": {"bandwidth": GRPC_BANDWIDTH, "latency": GRPC_LATENCY},
}
# Latencies are not datasheet figures: they are the per-transfer fixed cost of a TF Send/Recv pair
# (rendezvous + cudaMemcpyAsync launch), measured order 10-20 us on PCIe systems.

PRESETS: dict[str, dict] = {
    # K80: no fp16 / bf16 figure (Kepler has no fp16 arithmetic rate on its datasheet, no tensor cores):
    # --precision fp16|bf16 on a K80 is a one-line error (Device.peak_for), not a silent fp32 rate.
    # NVIDIA Tesla K80 datasheet (2014): 2 x GK210, 24 GB GDDR5 = 12 GB per GPU, 480 GB/s = 240 GB/s per GPU,
    # 8.73 TFLOPS fp32 with GPU Boost = 4.37 TFLOPS per GPU (13 SMX x 192 cores x 2 x 875 MHz), PCIe Gen3 x16.
    "K80": dict(memory_bytes=12 * GiB, reserve_bytes=1 * GiB, concurrency=1, peak_flops=4.37e12,
                mem_bandwidth=240e9, link="pcie3", host_link="pcie3", sms=13, arch="3.7", model="Tesla K80"),
    # NVIDIA Tesla P100 PCIe datasheet (2016): 16 GB CoWoS HBM2, 732 GB/s, 9.3 TFLOPS fp32, PCIe Gen3 x16.
    # Same datasheet: "Half-Precision Performance 18.7 TeraFLOPS" (fp16 on the FP32 cores, packed; no tensor cores,
    # no bf16).
    "P100": dict(memory_bytes=16 * GiB, reserve_bytes=1 * GiB, concurrency=1, peak_flops=9.3e12,
                 peak_flops_fp16=18.7e12,
                 mem_bandwidth=732e9, link="pcie3", host_link="pcie3", sms=56, arch="6.0", model="Tesla P100"),
    # NVIDIA Tesla V100 SXM2 datasheet (2017): 16 GB HBM2, 900 GB/s, 15.7 TFLOPS fp32, NVLink 300 GB/s,
    # host over PCIe Gen3 x16.
    # Same datasheet: "Tensor Performance 125 TFLOPS" (fp16 inputs, fp32 accumulate, SXM2); Volta has no bf16.
    "V100": dict(memory_bytes=16 * GiB, reserve_bytes=1 * GiB, concurrency=1, peak_flops=15.7e12,
                 peak_flops_fp16=125e12,
                 mem_bandwidth=900e9, link="nvlink2", host_link="pcie3", sms=80, arch="7.0", model="Tesla V100"),
    # NVIDIA A100 Tensor Core GPU datasheet (2020, SXM4 40GB): 40 GB HBM2, 1,555 GB/s, 19.5 TFLOPS fp32,
    # NVLink 600 GB/s, PCIe Gen4 64 GB/s.
    # Same datasheet, Tensor Core (dense, without the 2x sparsity figures): BFLOAT16 312 TFLOPS, FP16 312 TFLOPS,
    # TF32 156 TFLOPS (`peak_flops_tf32`: recorded, not used: placer charges fp32 ops at the FP32 figure).
    "A100": dict(memory_bytes=40 * GiB, reserve_bytes=1 * GiB, concurrency=1, peak_flops=19.5e12,
                 peak_flops_fp16=312e12, peak_flops_bf16=312e12, peak_flops_tf32=156e12,
                 mem_bandwidth=1555e9, link="nvlink3", host_link="pcie4", sms=108, arch="8.0", model="A100"),
    # Same datasheet, A100 80GB SXM4: 80 GB HBM2e, 2,039 GB/s, 19.5 TFLOPS fp32, NVLink 600 GB/s, PCIe Gen4.
    "A100-80G": dict(memory_bytes=80 * GiB, reserve_bytes=1 * GiB, concurrency=1, peak_flops=19.5e12,
                     peak_flops_fp16=312e12, peak_flops_bf16=312e12, peak_flops_tf32=156e12,
                     mem_bandwidth=2039e9, link="nvlink3", host_link="pcie4", sms=108, arch="8.0",
                     model="A100 80GB"),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM5): 80 GB HBM3, 3.35 TB/s, 67 TFLOPS fp32,
    # NVLink 900 GB/s, PCIe Gen5 128 GB/s.
    # Same datasheet, H100 SXM Tensor Core: FP16 1,979 / BF16 1,979 / TF32 989 TFLOPS "with sparsity"; the dense
    # figures are half: 989.5 fp16/bf16, 494.7 TF32.
    "H100": dict(memory_bytes=80 * GiB, reserve_bytes=1 * GiB, concurrency=1, peak_flops=67e12,
                 peak_flops_fp16=989.5e12, peak_flops_bf16=989.5e12, peak_flops_tf32=494.7e12,
                 mem_bandwidth=3.35e12, link="nvlink4", host_link="pcie5", sms=132, arch="9.0", model="H100"),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 141 GB HBM3e, 4.8 TB/s, 67 TFLOPS fp32,
    # NVLink 900 GB/s, PCIe Gen5 128 GB/s.
    # H200 SXM Tensor Core: FP16 / BF16 1,979 TFLOPS with sparsity = 989.5 dense (same GH100 die as H100).
    "H200": dict(memory_bytes=141 * 10**9, reserve_bytes=1 * GiB, concurrency=1, peak_flops=67e12,
                 peak_flops_fp16=989.5e12, peak_flops_bf16=989.5e12, peak_flops_tf32=494.7e12,
                 mem_bandwidth=4.8e12, link="nvlink4", host_link="pcie5", sms=132, arch="9.0", model="H200"),
    # The host CPU: Intel Xeon E5-2686 v4 (the host of AWS p2 K80 instances; Intel ARK): 18 cores, 2.3 GHz,
    # AVX2 2 x FMA x 8 fp32 = 32 FLOP/cycle/core -> 18 x 2.3e9 x 32 = 1.32 TFLOPS; 4 x DDR4-2400 = 76.8 GB/s.
    # 256 GiB of host RAM (a typical K80 server), 16 GiB held back for the OS. concurrency: TF's inter-op pool
    # runs several ops at once, each op itself multi-threaded by Eigen; we model 2 ops at once at full speed.
    "cpu": dict(memory_bytes=256 * GiB, reserve_bytes=16 * GiB, concurrency=2, peak_flops=1.32e12,
                mem_bandwidth=76.8e9, link="host", host_link="host", cores=18, model="Xeon E5-2686 v4"),
}

GPU_KINDS = tuple(k for k in PRESETS if k != "cpu")
_DEVICE_FIELDS = ("memory_bytes", "reserve_bytes", "concurrency", "peak_flops", "mem_bandwidth")


def valid_kinds_text() -> str:
    return (", ".join(GPU_KINDS) + " (as NxKIND, e.g. 4xK80), DGX1, DGX-A100, HGX-H100, NxDGX-A100, cpu, "
            "or a cluster JSON file")


def preset_kind(kind: str) -> str:
    """The canonical preset name for `kind` (case-insensitive); ClusterError listing valid kinds when unknown."""
    for k in PRESETS:
        if k.lower() == str(kind).strip().lower():
            return k
    raise ClusterError(f"unknown device kind {kind!r}; valid: {valid_kinds_text()}")


def make_device(name: str, kind: str, **overrides) -> Device:
    """A Device of a preset kind named `name` (fields overridable)."""
    k = preset_kind(kind)
    p = PRESETS[k]
    fields = {f: p[f] for f in _DEVICE_FIELDS}
    fields.update({f: v for f, v in overrides.items() if v is not None})
    for f in ("peak_flops_fp16", "peak_flops_bf16"):
        fields[f] = overrides.get(f) if overrides.get(f) is not None else p.get(f, 0.0)
    return Device(name=name, kind=k, memory_bytes=int(fields["memory_bytes"]),
                  reserve_bytes=int(fields["reserve_bytes"]), concurrency=int(fields["concurrency"]),
                  peak_flops=float(fields["peak_flops"]), mem_bandwidth=float(fields["mem_bandwidth"]),
                  peak_flops_fp16=float(fields["peak_flops_fp16"]), peak_flops_bf16=float(fields["peak_flops_bf16"]))


def _link_of(kind: str, which: str) -> dict[str, float]:
    p = PRESETS.get(kind)
    return LINKS[p[which]] if p else LINKS["pcie3"]


def build_links(devices: Sequence[Device]) -> tuple[np.ndarray, np.ndarray]:
    """Default link model: GPU<->GPU over the preset's fabric (the slower of the two ends), GPU<->CPU over the
    GPU's host link (PCIe), CPU<->CPU through host memory. Unknown kinds: PCIe 3."""
    d = len(devices)
    bw = np.full((d, d), np.inf)
    lat = np.zeros((d, d))
    for i, a in enumerate(devices):
        for j, b in enumerate(devices):
            if i == j:
                continue
            if a.is_cpu and b.is_cpu:
                ln = LINKS["host"]
            elif a.is_cpu or b.is_cpu:
                ln = _link_of(b.kind if a.is_cpu else a.kind, "host_link")
            else:
                la, lb = _link_of(a.kind, "link"), _link_of(b.kind, "link")
                ln = la if la["bandwidth"] <= lb["bandwidth"] else lb
            bw[i, j] = ln["bandwidth"]
            lat[i, j] = ln["latency"]
    return bw, lat


def make_cluster(devices: Sequence[Device], name: str = "cluster", **meta) -> Cluster:
    """A Cluster over `devices` with the default link model (see build_links)."""
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        raise ClusterError(f"duplicate device names in cluster {name!r}: {names}")
    if not devices:
        raise ClusterError(f"cluster {name!r} has no devices")
    bw, lat = build_links(devices)
    return Cluster(devices=tuple(devices), bandwidth=bw, latency=lat, name=name, meta=dict(meta))


# ---- nodes with real topologies (per-pair link matrix; shared links) --------------------------------------------
# DGX-1 with Tesla V100 (NVIDIA, "NVIDIA DGX-1 With Tesla V100 System Architecture" whitepaper, WP-08437-002, 2017,
# Figure 4 "hybrid cube-mesh"): each V100 has 6 NVLink 2 links; GPUs 0-3 and 4-7 form two fully connected quads
# and GPU i is joined to GPU i+4; the pairs below carry 2 links (50 GB/s per direction), the other NVLink pairs
# 1 link (25 GB/s); as `nvidia-smi topo -m` prints on a DGX-1V (NV1 / NV2). The remaining 12 pairs have no NVLink:
# they go GPU -> PCIe switch -> CPU socket (-> QPI -> other socket) -> PCIe switch -> GPU, charged as one PCIe 3
# x16 hop (15.75 GB/s) with a host-staging latency; each PCIe switch (one per GPU pair 0-1, 2-3, 4-5, 6-7) is
# shared by its two GPUs' traffic to the host and to non-NVLink peers.
DGX1_NVLINKS = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2, (2, 6): 1,
                (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}
SYS_LATENCY = 25e-6   # PCIe peer path through the host (not a datasheet figure; order of a staged cudaMemcpy)
# InfiniBand HDR (NVIDIA ConnectX-6 datasheet: 200 Gb/s per port = 25 GB/s per direction); DGX A100 user guide:
# 8 single-port ConnectX-6 for the compute fabric, one per GPU; ~2 us switch + HCA latency, plus TF's Send/Recv.
IB_HDR = {"bandwidth": 25e9, "latency": 12e-6}
TOPOLOGIES = ("DGX1", "DGX-A100", "HGX-H100", "NxDGX-A100")
_NODE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(DGX-A100)\s*$", re.I)


def _link(bw: float, lat: float, shared: str | None = None) -> dict:
    return {"bandwidth_Bps": float(bw), "latency_s": float(lat), "shared": shared}


def topology_cluster(spec: str) -> Cluster | None:
    """The cluster of a topology preset (`DGX1`, `DGX-A100`, `HGX-H100`, `NxDGX-A100`), or None when `spec` is
    none of them. GPUs /GPU:0..8N-1 then the host /CPU:0; per-pair links in `cluster.meta["links"]` (as the
    cluster JSON's "links") with the shared ones named in `meta["link_shared"]` / `meta["shared_links"]`.

    >>> c = topology_cluster("DGX1")
    >>> c.num_devices, float(c.bandwidth[0, 3] / 1e9), float(c.bandwidth[0, 5] / 1e9)
    (9, 50.0, 15.75)
    """
    s = str(spec).strip()
    m = _NODE_RE.match(s)
    up = s.upper()
    if m:
        nodes, name = int(m.group(1)), f"{int(m.group(1))}xDGX-A100"
        if not 1 <= nodes <= 128:
            raise ClusterError(f"cluster spec {s!r}: the node count must be 1..128")
    elif up in ("DGX1", "DGX-1", "DGX1V"):
        nodes, name = 1, "DGX1"
    elif up in ("DGX-A100", "DGXA100"):
        nodes, name = 1, "DGX-A100"
    elif up in ("HGX-H100", "HGXH100"):
        nodes, name = 1, "HGX-H100"
    else:
        return None
    kind = {"DGX1": "V100", "HGX-H100": "H100"}.get(name, "A100")
    n = 8 * nodes
    devs = [make_device(f"/GPU:{i}", kind) for i in range(n)] + [make_device("/CPU:0", "cpu")]
    pcie = LINKS[PRESETS[kind]["host_link"]]
    shared_links: dict[str, dict] = {}
    links: list[list] = [[None] * (n + 1) for _ in range(n + 1)]

    def switch(i: int) -> str:         # the PCIe switch of GPU i (two GPUs per switch on all three boards)
        nm = f"node{i // 8}/pcie_switch{(i % 8) // 2}"
        shared_links[nm] = {"bandwidth_Bps": pcie["bandwidth"]}
        return nm

    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            if i // 8 != j // 8:        # across nodes: the sender's own HDR NIC
                nic = f"node{i // 8}/nic{i % 8}"
                shared_links[nic] = {"bandwidth_Bps": IB_HDR["bandwidth"]}
                links[i][j] = _link(IB_HDR["bandwidth"], IB_HDR["latency"], nic)
            elif name == "DGX1":
                k = DGX1_NVLINKS.get((min(i, j), max(i, j)), 0)
                links[i][j] = (_link(k * LINKS["nvlink2"]["bandwidth"], LINKS["nvlink2"]["latency"]) if k
                               else _link(pcie["bandwidth"], SYS_LATENCY, switch(i)))
            else:                       # NVSwitch: every pair at the full per-GPU NVLink bandwidth
                ln = LINKS[PRESETS[kind]["link"]]
                links[i][j] = _link(ln["bandwidth"], ln["latency"])
        # GPU <-> host CPU over the GPU's PCIe switch (node 0's host; other nodes reach it through their NIC)
        if i < 8:
            links[i][n] = _link(pcie["bandwidth"], pcie["latency"], switch(i))
            links[n][i] = _link(pcie["bandwidth"], pcie["latency"], switch(i))
        else:
            nic = f"node{i // 8}/nic{i % 8}"
            links[i][n] = _link(IB_HDR["bandwidth"], IB_HDR["latency"], nic)
            links[n][i] = _link(IB_HDR["bandwidth"], IB_HDR["latency"], nic)
    c = make_cluster(devs, name=name, spec=name, gpu_kind=kind, topology=name)
    _read_links(c, links, name)
    c.meta["links"] = links
    c.meta["shared_links"] = shared_links
    return c


_SPEC_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9_\-]+)\s*$")


def parse_cluster(spec: "str | os.PathLike | Cluster") -> Cluster:
    """`NxKIND` (N GPUs /GPU:0..N-1 then the host /CPU:0), `cpu` (the host CPU alone), `KIND` (= 1xKIND) or a
    path to a cluster JSON file (see `cluster_from_json`).

    >>> c = parse_cluster("4xK80")
    >>> c.device_names
    ['/GPU:0', '/GPU:1', '/GPU:2', '/GPU:3', '/CPU:0']
    """
    if isinstance(spec, Cluster):
        return spec
    s = str(spec).strip()
    if not s:
        raise ClusterError(f"empty cluster spec; valid: {valid_kinds_text()}")
    if s.lower().endswith(".json") or os.path.sep in s or os.path.exists(s):
        return load_cluster(s)
    if s.lower() == "cpu":
        return make_cluster([make_device("/CPU:0", "cpu")], name="cpu", spec="cpu")
    topo = topology_cluster(s)
    if topo is not None:
        return topo
    m = _SPEC_RE.match(s)
    n, kind = (int(m.group(1)), m.group(2)) if m else (1, s)
    try:
        k = preset_kind(kind)
    except ClusterError:
        raise ClusterError(f"unknown cluster spec {s!r} (device kind {kind!r}); valid: {valid_kinds_text()}") \
            from None
    if k == "cpu":
        if n != 1:
            raise ClusterError(f"cluster spec {s!r}: the host CPU is one device; use --devices cpu:{n} for "
                               f"logical CPU devices")
        return parse_cluster("cpu")
    if n < 1 or n > 1024:
        raise ClusterError(f"cluster spec {s!r}: the GPU count must be 1..1024")
    devs = [make_device(f"/GPU:{i}", k) for i in range(n)] + [make_device("/CPU:0", "cpu")]
    return make_cluster(devs, name=f"{n}x{k}", spec=f"{n}x{k}", gpu_kind=k)


# ---- JSON -----------------------------------------------------------------------------------------------------
CLUSTER_JSON_DOC = """Cluster JSON file (format 1):
{"format": 1, "name": "my-box",
 "devices": [{"name": "/GPU:0", "kind": "V100"},                      # preset figures for the kind
             {"name": "/GPU:1", "kind": "V100", "memory_bytes": 17179869184},   # any field overridable
             {"name": "/CPU:0", "kind": "cpu", "concurrency": 4},
             {"name": "/GPU:2", "kind": "MyChip", "memory_bytes": 1e10, "peak_flops": 2e13,
              "mem_bandwidth": 1e12}],                                 # a non-preset kind gives every figure
 "bandwidth": [[...D floats...], ...],   # optional: bytes/s of link i->j (default: the presets' link model)
 "latency":   [[...D floats...], ...],   # optional: seconds per transfer on link i->j
 "links": [[null, {"bandwidth_Bps": 1.2e9, "latency_s": 3e-4, "shared": null, "pipelined": true}, ...], ...],
                                         # optional, wins over the two matrices (written by `placer calibrate`)
 "shared_links": {"node0/nic0": {"bandwidth_Bps": 2.5e10}}}
                                         # optional: links whose "shared" names one queue on it as well
Device fields: name (TF short form or full form), kind, memory_bytes, reserve_bytes (0), concurrency (1; the
host CPU preset: 2), peak_flops (fp32 FLOP/s), mem_bandwidth (bytes/s). Diagonal entries are ignored; a null or
missing matrix (or link) takes the default link model. A transfer of B bytes on link i->j takes
latency + B / bandwidth. A link's "pipelined": true lets transfers overlap their latency (gRPC); "cpu_copy": true
(or a fraction f) makes both endpoint devices busy for B / bandwidth (or f x that: the tasks' own cores serialise
and parse the tensor)."""


def cluster_to_dict(cluster: Cluster) -> dict:
    def num(x):
        return None if not np.isfinite(x) else float(x)

    return {
        "format": 1,
        "name": cluster.name,
        "devices": [dict(name=d.name, kind=d.kind, memory_bytes=int(d.memory_bytes),
                         reserve_bytes=int(d.reserve_bytes), concurrency=int(d.concurrency),
                         peak_flops=float(d.peak_flops), mem_bandwidth=float(d.mem_bandwidth),
                         peak_flops_fp16=float(d.peak_flops_fp16), peak_flops_bf16=float(d.peak_flops_bf16))
                    for d in cluster.devices],
        "bandwidth": [[num(x) for x in row] for row in np.asarray(cluster.bandwidth, float)],
        "latency": [[float(x) for x in row] for row in np.asarray(cluster.latency, float)],
        **({"compute_groups": [{"devices": [cluster.devices[i].name for i in g["devices"]],
                                "shared_speed": float(g["shared_speed"])} for g in cluster.meta["compute_groups"]]}
           if cluster.meta.get("compute_groups") else {}),
        **({"links": _links_of(cluster)} if {"link_shared", "link_pipelined", "link_cpu_copy"} & set(cluster.meta) else
           {"links": cluster.meta["links"]} if cluster.meta.get("links") is not None else {}),
        **({"shared_links": cluster.meta["shared_links"]} if cluster.meta.get("shared_links") is not None else {}),
    }


def _links_of(cluster: Cluster) -> list:
    """The "links" matrix of a cluster whose links carry more than bandwidth and latency (shared, pipelined)."""
    shared = cluster.meta.get("link_shared", {})
    pipe, copy = link_pipelined(cluster), link_cpu_copy(cluster)
    return [[None if i == j else {"bandwidth_Bps": float(cluster.bandwidth[i, j]),
                                  "latency_s": float(cluster.latency[i, j]), "shared": shared.get(f"{i},{j}"),
                                  **({"pipelined": True} if pipe[i, j] else {}),
                                  **({"cpu_copy": True if copy[i, j] == 1.0 else float(copy[i, j])}
                                     if copy[i, j] else {})}
             for j in range(cluster.num_devices)] for i in range(cluster.num_devices)]


def to_json(cluster: Cluster, path: "str | os.PathLike | None" = None) -> str:
    """Serialise a cluster (format of CLUSTER_JSON_DOC); write it to `path` when given. Round-trips through
    parse_cluster(path)."""
    text = json.dumps(cluster_to_dict(cluster), indent=1)
    if path is not None:
        Path(path).write_text(text)
    return text


def cluster_from_dict(obj: dict, source: str = "<dict>") -> Cluster:
    if isinstance(obj, dict) and "tasks" in obj and "devices" not in obj:
        raise ClusterError(f"{source} is a tasks file (TF cluster tasks), not a cluster JSON: measure or search "
                           f"on it with --devices {source}, or simulate the cluster.json that `placer calibrate "
                           f"--devices {source} --out DIR` writes")
    if isinstance(obj, dict) and isinstance(obj.get("placement"), dict):
        raise ClusterError(f"{source} is a placement file (op → device), not a cluster JSON: pass it as --placement")
    if not isinstance(obj, dict) or not isinstance(obj.get("devices"), list) or not obj["devices"]:
        raise ClusterError(f"{source}: a cluster JSON needs a non-empty \"devices\" list, e.g. {{\"devices\": "
                           f"[{{\"name\": \"/GPU:0\", \"kind\": \"V100\"}}]}} (the format: "
                           f"placer.sim.cluster.CLUSTER_JSON_DOC)")
    devs = []
    for k, d in enumerate(obj["devices"]):
        if not isinstance(d, dict) or "name" not in d:
            raise ClusterError(f"{source}: device #{k} needs at least a \"name\"")
        name = str(d["name"])
        try:
            devnames.parse(name)
        except ClusterError as e:
            raise ClusterError(f"{source}: device #{k}: {e}") from None
        kind = str(d.get("kind") or ("cpu" if devnames.kind(name) == "CPU" else ""))
        where = f"{source}: device {name!r}"
        extra = {f: _device_figure(d, f, where) for f in _DEVICE_FIELDS + ("peak_flops_fp16", "peak_flops_bf16")}
        try:
            dev = make_device(name, kind, **extra)
        except ClusterError:
            missing = [f for f in ("memory_bytes", "peak_flops", "mem_bandwidth") if extra[f] is None]
            if missing:
                raise ClusterError(f"{source}: device {name!r} has kind {kind!r}, which is no preset "
                                   f"({valid_kinds_text()}); give {', '.join(missing)} for it") from None
            dev = Device(name=name, kind=kind or "custom", memory_bytes=int(extra["memory_bytes"]),
                         reserve_bytes=int(extra["reserve_bytes"] or 0), concurrency=int(extra["concurrency"] or 1),
                         peak_flops=extra["peak_flops"], mem_bandwidth=extra["mem_bandwidth"],
                         peak_flops_fp16=extra["peak_flops_fp16"] or 0.0,
                         peak_flops_bf16=extra["peak_flops_bf16"] or 0.0)
        if dev.concurrency < 1 or dev.capacity_bytes <= 0 or dev.peak_flops <= 0 or dev.mem_bandwidth <= 0:
            raise ClusterError(f"{source}: device {name!r}: concurrency, memory - reserve, peak_flops and "
                               f"mem_bandwidth must be positive")
        devs.append(dev)
    c = make_cluster(devs, name=str(obj.get("name") or Path(source).stem), spec=source)
    n = len(devs)
    for key in ("bandwidth", "latency"):
        m = obj.get(key)
        if m is None:
            continue
        try:
            arr = np.array([[np.inf if x is None else float(x) for x in row] for row in m], dtype=float)
        except (TypeError, ValueError) as e:
            raise ClusterError(f"{source}: {key!r} must be a {n}x{n} matrix of numbers ({e})") from None
        if arr.shape != (n, n):
            raise ClusterError(f"{source}: {key!r} must be {n}x{n} (one row per device), got {arr.shape}")
        off = ~np.eye(n, dtype=bool)
        if key == "bandwidth" and (arr[off] <= 0).any():
            raise ClusterError(f"{source}: every bandwidth must be > 0 bytes/s")
        if key == "latency" and (arr[off] < 0).any():
            raise ClusterError(f"{source}: latencies must be >= 0 s")
        np.fill_diagonal(arr, np.inf if key == "bandwidth" else 0.0)
        getattr(c, key)[...] = arr
    if obj.get("links") is not None:        # per-pair link objects win over the plain matrices
        _read_links(c, obj["links"], source)
        c.meta["links"] = obj["links"]
    if obj.get("compute_groups") is not None:
        c.meta["compute_groups"] = _read_compute_groups(c, obj["compute_groups"], source)
    if obj.get("shared_links") is not None:
        sl = obj["shared_links"]
        if not isinstance(sl, dict) or not all(isinstance(v, dict) and isinstance(v.get("bandwidth_Bps"), (int, float))
                                               and v["bandwidth_Bps"] > 0 for v in sl.values()):
            raise ClusterError(f"{source}: \"shared_links\" must map names to {{\"bandwidth_Bps\": float > 0}}")
        c.meta["shared_links"] = sl
    # a "shared" name that "shared_links" does not define is a shared link as fast as the links that name it
    return c


def _device_figure(d: dict, key: str, where: str) -> float | None:
    """A cluster JSON device's figure `key` as a float (None when absent); ClusterError naming the file and the
    device (`where`) and the field when it is not a finite number."""
    v = d.get(key)
    if v is None:
        return None
    try:
        x = float("nan") if isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        x = float("nan")
    if not np.isfinite(x):
        raise ClusterError(f"{where}: \"{key}\" must be a number, got {v!r}")
    return x


def _read_links(c: Cluster, links, source: str) -> None:
    """Fill `c.bandwidth` / `c.latency` from a D x D "links" matrix of {"bandwidth_Bps", "latency_s", "shared"}
    objects (null entries and the diagonal keep the default link model). A link's "shared" name is kept in
    `c.meta["link_shared"]` (the simulator queues transfers on it too: `simulator.shared_link_arrays`)."""
    n = c.num_devices
    if not isinstance(links, list) or len(links) != n or not all(isinstance(r, list) and len(r) == n for r in links):
        raise ClusterError(f"{source}: \"links\" must be a {n}x{n} matrix (one row per device) of "
                           f"{{\"bandwidth_Bps\": float, \"latency_s\": float, \"shared\": str|null}} or null")
    shared, pipelined, cpu_copy = {}, [], []
    for i, row in enumerate(links):
        for j, ln in enumerate(row):
            if ln is None or i == j:
                continue
            where = f"{source}: link {c.devices[i].name} -> {c.devices[j].name}"
            if not isinstance(ln, dict):
                raise ClusterError(f"{where}: expected an object or null, got {ln!r}")
            try:
                bw = float(ln.get("bandwidth_Bps", c.bandwidth[i, j]))
                lat = float(ln.get("latency_s", c.latency[i, j]))
            except (TypeError, ValueError) as e:
                raise ClusterError(f"{where}: bad figure ({e})") from None
            if not bw > 0 or not np.isfinite(lat) or lat < 0:
                raise ClusterError(f"{where}: bandwidth_Bps must be > 0 and latency_s >= 0 (got {bw}, {lat})")
            c.bandwidth[i, j], c.latency[i, j] = bw, lat
            if ln.get("shared") is not None:
                shared[f"{i},{j}"] = str(ln["shared"])
            if ln.get("pipelined"):
                pipelined.append(f"{i},{j}")
            if ln.get("cpu_copy"):
                cpu_copy.append(f"{i},{j}" if ln["cpu_copy"] is True else f"{i},{j},{float(ln['cpu_copy'])}")
    if shared:
        c.meta["link_shared"] = shared
    if pipelined:
        c.meta["link_pipelined"] = pipelined
    if cpu_copy:
        c.meta["link_cpu_copy"] = cpu_copy


def _read_compute_groups(c: Cluster, groups, source: str) -> list[dict]:
    """"compute_groups": [{"devices": [names], "shared_speed": s in (0, 1]}]: devices sharing one physical core
    (each runs at s of its speed while another of the group is busy). Kept with device indices."""
    out = []
    names = c.device_names
    for g in groups if isinstance(groups, list) else [groups]:
        try:
            idx = [names.index(str(d)) for d in g["devices"]]
            speed = float(g["shared_speed"])
        except (TypeError, KeyError, ValueError) as e:
            raise ClusterError(f"{source}: \"compute_groups\" entries are {{\"devices\": [names of this cluster], "
                               f"\"shared_speed\": float}} ({type(e).__name__}: {e})") from None
        if not 0.0 < speed <= 1.0 or len(idx) < 2:
            raise ClusterError(f"{source}: a compute group needs >= 2 devices and 0 < shared_speed <= 1")
        out.append({"devices": idx, "shared_speed": speed})
    return out


def _link_flags(cluster: Cluster, key: str) -> np.ndarray:
    out = np.zeros((cluster.num_devices, cluster.num_devices))
    for k in cluster.meta.get(key, ()):
        i, j, *f = str(k).split(",")
        out[int(i), int(j)] = float(f[0]) if f else 1.0
    return out


def link_pipelined(cluster: Cluster) -> np.ndarray:
    """float64[D, D]: 1 where link i→j is pipelined (its latency does not hold the link: many transfers in
    flight, as gRPC between TF tasks), else 0 (the transfer holds the link for latency + bytes / bandwidth)."""
    return _link_flags(cluster, "link_pipelined")


def link_cpu_copy(cluster: Cluster) -> np.ndarray:
    """float64[D, D]: 1 where a transfer on link i→j is done by both endpoints' processors (gRPC between
    CPU-only TF tasks serialises and parses the tensor on the tasks' own cores), so that neither device computes
    while it copies; 0 where a DMA engine or NIC moves the bytes (GPUs, the presets)."""
    return _link_flags(cluster, "link_cpu_copy")


def load_cluster(path: "str | os.PathLike") -> Cluster:
    """Read a cluster JSON file (CLUSTER_JSON_DOC)."""
    p = Path(path)
    if not p.is_file():
        raise ClusterError(f"cluster file {str(p)!r} does not exist (or the spec is not valid: "
                           f"{valid_kinds_text()})")
    try:
        obj = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ClusterError(f"cannot read cluster file {str(p)!r}: {e}") from None
    return cluster_from_dict(obj, str(p))


# ---- real local devices -----------------------------------------------------------------------------------------
def short_device_name(name: str) -> str:
    """'/job:localhost/replica:0/task:0/device:GPU:0' or '/device:GPU:0' or 'gpu:0' -> '/GPU:0' (local names);
    remote names (a job other than localhost) keep TF's full form (`placer.devnames.canonical`)."""
    return devnames.canonical(name)


def _host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return int(PRESETS["cpu"]["memory_bytes"])


def _kind_of_gpu_model(model: str) -> str | None:
    m = model.upper()
    if "A100" in m:
        return "A100-80G" if "80" in m.replace("A100", "") else "A100"
    for k in ("H200", "H100", "V100", "P100", "K80"):
        if k in m:
            return k
    return None


def cluster_from_devices(spec: "str | Sequence[str]") -> Cluster:
    """Cluster of real local devices for `--devices`: `cpu:N` (N logical CPU devices /CPU:0../CPU:N-1 sharing the
    host: each gets the host's memory and 1/N of its peak, concurrency 1 when N > 1) or a comma list of TF device
    names (kind and memory from TensorFlow's device list; a GPU model that is no preset gets the V100 figures).

    A path ending in `.json` is a tasks file of `placer cluster up` (see `cluster_from_tasks`).

    >>> cluster_from_devices("cpu:2").device_names
    ['/CPU:0', '/CPU:1']
    """
    from placer.tasks import looks_like_tasks_file

    if looks_like_tasks_file(spec):
        return cluster_from_tasks(spec)
    if isinstance(spec, str):
        s = spec.strip()
        m = re.match(r"^cpu\s*:\s*(\d+)$", s, re.I)
        if m:
            n = int(m.group(1))
            if n < 1 or n > 256:
                raise ClusterError(f"--devices {s!r}: N must be 1..256")
            host = PRESETS["cpu"]
            mem = _host_memory_bytes()
            devs = [make_device(f"/CPU:{i}", "cpu", memory_bytes=mem, reserve_bytes=min(mem // 8, 2 * GiB),
                                concurrency=host["concurrency"] if n == 1 else 1,
                                peak_flops=host["peak_flops"] / n, mem_bandwidth=host["mem_bandwidth"] / n)
                    for i in range(n)]
            return make_cluster(devs, name=f"cpu:{n}", spec=f"cpu:{n}")
        names = [x for x in (t.strip() for t in s.split(",")) if x]
    else:
        names = [str(x) for x in spec]
    if not names:
        raise ClusterError("--devices is empty; use cpu:N or a comma list like /GPU:0,/GPU:1,/CPU:0")
    short = [short_device_name(x) for x in names]
    if len(set(short)) != len(short):
        raise ClusterError(f"--devices names a device twice: {names}")
    local = _local_tf_devices()
    devs = []
    for nm in short:
        if nm not in local:
            raise ClusterError(f"device {nm!r} is not available here; TensorFlow sees: {', '.join(local) or 'none'}")
        kind, mem = local[nm]
        if kind == "cpu":
            hm = _host_memory_bytes()
            devs.append(make_device(nm, "cpu", memory_bytes=hm, reserve_bytes=min(hm // 8, 2 * GiB)))
        else:
            devs.append(make_device(nm, kind, memory_bytes=mem))
    return make_cluster(devs, name=",".join(short), spec=",".join(short))


def cluster_from_tasks(tasks) -> Cluster:
    """The cluster of a tasks file (a path or a `placer.tasks.TasksFile`): every task's devices in task order, by
    their full TF names. A CPU device gets the host's memory (as `cpu:N` does) and as many ops at once as its
    task has cores, with that many cores' share of the host preset's roofline figures; a GPU of a task gets the
    V100 figures. Devices of different tasks talk over LINKS["grpc"], devices of one task over the default link
    model. `placer calibrate` measures the links and costs and writes a cluster JSON that replaces these guesses.
    """
    from placer.tasks import TasksFile, load_tasks

    tf_ = tasks if isinstance(tasks, TasksFile) else load_tasks(tasks)
    host = PRESETS["cpu"]
    mem = _host_memory_bytes()
    devs, owner = [], []
    for t in tf_.tasks:
        k = max(1, len(t.cores))
        share = k / host["cores"]
        for d in t.devices:
            if devnames.kind(d) == "CPU":
                devs.append(make_device(d, "cpu", memory_bytes=mem, reserve_bytes=min(mem // 8, 2 * GiB),
                                        concurrency=k, peak_flops=host["peak_flops"] * share,
                                        mem_bandwidth=host["mem_bandwidth"] * share))
            else:
                devs.append(make_device(d, "V100"))
            owner.append(t.index)
    c = make_cluster(devs, name=f"tasks:{Path(tf_.path).name}", spec=tf_.path, tasks_file=tf_.path)
    own = np.asarray(owner)
    across = own[:, None] != own[None, :]
    c.bandwidth[across] = LINKS["grpc"]["bandwidth"]
    c.latency[across] = LINKS["grpc"]["latency"]
    return c


def cluster_from_reported(devices: Sequence[str], reported: dict[str, Sequence[str]]) -> Cluster:
    """Cluster of `devices` (short TF names, index order kept) on remote measurement workers, from the device
    lists the workers report (`{address: [names]}`; `RemotePool.reported_devices`), never from this machine's
    TensorFlow. Every worker must have every device (ClusterError naming the worker, the device and what the
    worker has). Kinds and figures are nominal: the `cpu` preset for CPUs, V100 for GPUs (give a cluster JSON with
    --cluster for the real figures).

    >>> cluster_from_reported(["/GPU:0", "/CPU:0"], {"h1:50051": ["/CPU:0", "/GPU:0"]}).devices[0].kind
    'V100'
    """
    names = [short_device_name(x) for x in devices]
    if len(set(names)) != len(names):
        raise ClusterError(f"--devices names a device twice: {list(devices)}")
    if not reported:
        raise ClusterError("no measurement worker reported its devices")
    for addr, have in reported.items():
        have_short = {short_device_name(x) for x in have}
        missing = [n for n in names if n not in have_short]
        if missing:
            raise ClusterError(f"worker {addr} has no device {missing[0]} (it reports: "
                               f"{', '.join(sorted(have_short)) or 'none'})")
    devs = [make_device(n, "cpu" if devnames.kind(n) == "CPU" else "V100") for n in names]
    return make_cluster(devs, name=",".join(names), spec=",".join(names), workers=sorted(reported))


def _local_tf_devices() -> dict[str, tuple[str, int | None]]:
    """short name -> (preset kind, memory bytes or None) for the devices of this machine. Reads TensorFlow's
    *physical* device list, which does not start the runtime on the GPUs (listing logical devices would, and
    TensorFlow would then hold their memory in this process; see `placer._tf.hide_gpus`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    out: dict[str, tuple[str, int | None]] = {}
    for d in tf.config.list_physical_devices():
        nm = short_device_name(d.name.replace("/physical_device:", "/device:"))
        if d.device_type == "CPU":
            out[nm] = ("cpu", None)
        elif d.device_type == "GPU":
            kind = "V100"
            try:
                det = tf.config.experimental.get_device_details(d)
                kind = _kind_of_gpu_model(str(det.get("device_name", ""))) or "V100"
            except Exception:  # noqa: BLE001 - details are best effort
                pass
            out[nm] = (kind, None)
    return out


def cluster_from_args(args) -> Cluster:
    """`--cluster SPEC` or `--devices LIST` (CLI.md)."""
    spec = getattr(args, "cluster", None)
    if spec:
        return parse_cluster(spec)
    devs = getattr(args, "devices", None)
    if devs:
        return cluster_from_devices(devs)
    raise ClusterError("give --cluster SPEC (e.g. 4xK80) or --devices LIST (e.g. cpu:2)")
