"""Cluster specs: devices and the links between them. Presets are data (see PRESETS)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Device:
    name: str                 # TF short form: /GPU:0, /CPU:0 (or full form for remote devices)
    kind: str                 # preset kind: "K80", "V100", ..., "cpu"
    memory_bytes: int         # usable memory
    reserve_bytes: int = 0    # held back for the runtime (CUDA context, allocator slack)
    concurrency: int = 1      # ops it runs at once (1 on a GPU stream; >1 on a CPU)
    peak_flops: float = 1e12  # FLOP/s (fp32) for the roofline fallback
    mem_bandwidth: float = 1e11  # bytes/s of device memory for the roofline fallback

    @property
    def is_cpu(self) -> bool:
        return self.kind.lower() == "cpu" or "CPU" in self.name.upper().rsplit("/", 1)[-1]

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
