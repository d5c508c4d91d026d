"""TensorFlow device names: the one parser every room uses (no TensorFlow import; nothing above `errors`).

TensorFlow spells one device many ways: `/GPU:0`, `/gpu:0`, `/device:GPU:0`, `GPU:0`,
`/job:localhost/replica:0/task:0/device:GPU:0`, and in step stats with a suffix (`.../device:GPU:0 stream:all`,
`/device:GPU:0/stream:12`). placer's own spelling (CLI.md) is the short form for this process's devices
(`/GPU:0`) and TF's full form for a device of another job (`/job:worker/replica:0/task:1/device:CPU:0`).

>>> canonical("/job:localhost/replica:0/task:0/device:gpu:1"), canonical("/job:worker/task:1/cpu:0")
('/GPU:1', '/job:worker/replica:0/task:1/device:CPU:0')
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from placer.errors import ClusterError

# optional /job:J[/replica:R][/task:T], then /device:TYPE:N, /TYPE:N or TYPE:N (TYPE is never job/replica/task)
_NAME = (r"(?:/job:(?P<job>[A-Za-z0-9_\-]+))?(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?"
         r"(?:^|/)(?:device:)?(?!(?:job|replica|task):)(?P<kind>[A-Za-z_]+):(?P<index>\d+)")
_STRICT = re.compile(r"\s*" + _NAME + r"\s*", re.IGNORECASE)
_SEARCH = re.compile(_NAME + r"(?![\w])", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceName:
    kind: str                  # upper case: CPU, GPU, TPU...
    index: int
    job: str | None = None     # None or "localhost": a device of this process
    replica: int = 0
    task: int = 0

    @property
    def local(self) -> bool:
        return self.job in (None, "localhost")

    @property
    def short(self) -> str:
        return f"/{self.kind}:{self.index}"

    @property
    def full(self) -> str:
        return f"/job:{self.job or 'localhost'}/replica:{self.replica}/task:{self.task}/device:{self.kind}:{self.index}"

    @property
    def canonical(self) -> str:
        """placer's spelling: short for a local device, full for a device of another job."""
        return self.short if self.local else self.full


def _from_match(m: re.Match) -> DeviceName:
    return DeviceName(kind=m.group("kind").upper(), index=int(m.group("index")), job=m.group("job"),
                      replica=int(m.group("replica") or 0), task=int(m.group("task") or 0))


def parse(name: str) -> DeviceName:
    """The whole of `name` as a device name; ClusterError naming it otherwise.

    >>> parse("/job:worker/replica:0/task:1/device:CPU:0").task
    1
    """
    m = _STRICT.fullmatch(str(name))
    if not m:
        raise ClusterError(f"{name!r} is not a TensorFlow device name like /CPU:0, /GPU:1 or "
                           f"/job:worker/replica:0/task:1/device:CPU:0")
    return _from_match(m)


def find(text: str) -> DeviceName | None:
    """The first device name inside `text` (a step-stats device string with its stream suffix), or None.

    >>> find("/job:localhost/replica:0/task:0/device:GPU:0 stream:all").short
    '/GPU:0'
    """
    m = _SEARCH.search(str(text))
    return _from_match(m) if m else None


def canonical(name: str) -> str:
    """`/device:CPU:0`, `/cpu:0`, `CPU:0`, `/job:localhost/.../device:CPU:0` -> `/CPU:0`; a device of another job
    -> its full form with replica and task filled in. ClusterError when `name` is no device name."""
    return parse(name).canonical


def full(name: str) -> str:
    """The full TF form of a device of a named job; ClusterError when `name` names no job (or `localhost`)."""
    d = parse(name)
    if d.job is None:
        raise ClusterError(f"{name!r} is not a full TensorFlow device name like "
                           f"/job:worker/replica:0/task:1/device:CPU:0")
    return d.full


def short(name: str) -> str:
    """`/TYPE:N` of any spelling, the job dropped (for matching against a process's own device list)."""
    return parse(name).short


def kind(name: str) -> str:
    """The device type of any spelling, upper case ('CPU', 'GPU'), or '' when `name` is no device name."""
    d = find(name)
    return d.kind if d else ""
