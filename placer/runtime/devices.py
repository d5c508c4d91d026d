"""Device-name helpers shared by the local runner, the worker and the CLI (no TensorFlow import).

Names are TensorFlow's short form (`/CPU:0`, `/GPU:1`). `parse_devices("cpu:4")` gives the CPU split into
four logical devices; a comma list is taken as TF device names and canonicalised.
"""
from __future__ import annotations

import re
from typing import Sequence

from placer import devnames
from placer.errors import ClusterError

def canonical_device(name: str) -> str:
    """`/device:CPU:0`, `/cpu:0`, `CPU:0`, `/job:localhost/replica:0/task:0/device:CPU:0` -> `/CPU:0`.

    Full names of another job/task are kept in TF's full form (remote devices).

    >>> canonical_device("/job:localhost/replica:0/task:0/device:gpu:1")
    '/GPU:1'
    """
    return devnames.canonical(name)


def device_of_trace(name: str) -> str | None:
    """Short device name of a RunMetadata `dev_stats.device` string (stream entries included), or None."""
    d = devnames.find(name)
    return d.short if d else None


def trace_device(name: str) -> str | None:
    """Like `device_of_trace`, but a device of another job (a TF cluster task) keeps its canonical full name:
    `/job:worker/replica:0/task:1/device:CPU:0 stream:all` -> `/job:worker/replica:0/task:1/device:CPU:0`.

    >>> trace_device("/job:localhost/replica:0/task:0/device:CPU:0"), trace_device("/job:worker/task:1/cpu:0")
    ('/CPU:0', '/job:worker/replica:0/task:1/device:CPU:0')
    """
    d = devnames.find(name)
    return d.canonical if d else None


MAX_CPU_SPLIT = 1024


def parse_devices(spec: str | Sequence[str]) -> list[str]:
    """`"cpu:N"` -> `/CPU:0..N-1`; `"/GPU:0,/GPU:1,/CPU:0"` or a list -> canonical names (order kept).

    >>> parse_devices("cpu:2")
    ['/CPU:0', '/CPU:1']
    """
    if isinstance(spec, str):
        s = spec.strip()
        m = re.fullmatch(r"cpu(?::(\d+))?", s, re.IGNORECASE)
        if m:
            n = int(m.group(1) or 1)
            if n < 1:
                raise ClusterError(f"--devices {spec!r}: need at least one CPU device")
            if n > MAX_CPU_SPLIT:   # as `NxKIND`'s GPU count; the simulator's link matrices are D x D
                raise ClusterError(f"--devices {spec!r}: the CPU can be split into at most {MAX_CPU_SPLIT} "
                                   f"logical devices")
            return [f"/CPU:{i}" for i in range(n)]
        items = [x for x in (p.strip() for p in s.split(",")) if x]
    else:
        items = [str(x) for x in spec]
    if not items:
        raise ClusterError(f"--devices {spec!r}: no devices given")
    out = [canonical_device(x) for x in items]
    if len(set(out)) != len(out):
        raise ClusterError(f"--devices {spec!r}: a device is listed twice")
    return out


def cpu_split(devices: Sequence[str]) -> int:
    """How many logical CPU devices the session must create so every `/CPU:k` named exists (>= 1)."""
    n = 1
    for d in map(devnames.parse, devices):
        if d.local and d.kind == "CPU":
            n = max(n, d.index + 1)
    return n


def devices_flag(names: Sequence[str]) -> str:
    """The `--devices` value that gives a worker (or this machine) every device of `names`: `cpu:N` for CPUs
    only, else the comma list.

    >>> devices_flag(["/CPU:1", "/CPU:0"])
    'cpu:2'
    """
    ds = [devnames.parse(n) for n in names]
    if ds and all(d.local and d.kind == "CPU" for d in ds):
        return f"cpu:{max(d.index for d in ds) + 1}"
    return ",".join(names)


def missing_devices_message(where: str, need: Sequence[str], have: Sequence[str]) -> str | None:
    """One line naming `where`, the devices of `need` missing from `have`, and the fix; None when none is."""
    from placer.sim.cluster import short_device_name

    have_short = {short_device_name(x) for x in have}
    missing = [n for n in need if short_device_name(n) not in have_short]
    if not missing:
        return None
    fix = f"start it with --devices {devices_flag([short_device_name(n) for n in need])}"
    if any("GPU" in m.upper() for m in missing):
        fix += " on a host whose TensorFlow sees those GPUs"
    return (f"{where} has no device {', '.join(missing)} (it reports: {', '.join(sorted(have_short)) or 'none'}): "
            f"{fix}")
