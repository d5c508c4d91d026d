"""The tasks file of `placer cluster up` (CLI.md, "TF cluster devices"): data only, no TensorFlow, low in the house
so that `sim` (the cluster it describes) and `runtime` (the runner that measures on it) can both read it.

    {"format": 1, "job": "worker",
     "tasks": [{"address": "127.0.0.1:PORT", "pid": int|null, "cores": [int], "devices": [str]}, ...]}

Task k's devices are TF's full names `/job:worker/replica:0/task:k/device:CPU:0`. `pid` is null for a task started
by hand (on another host): `placer cluster down` leaves those alone. Tasks may carry more keys (`log`: the task's
log file); unknown keys are ignored. A tasks file is told apart from a device list by its `.json` ending, and from
a cluster JSON (`--cluster`) by its "tasks" key.

    >>> full_device_name("/job:worker/task:1/device:cpu:0")
    '/job:worker/replica:0/task:1/device:CPU:0'
"""
from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from placer import devnames
from placer.errors import ClusterError, write_text_atomic

TASKS_FORMAT = 1
PID_MAX = 2**22         # Linux's PID_MAX_LIMIT: a larger "pid" is no process (os.kill overflows on 2**63)



class TasksFileError(ClusterError):
    """A tasks file is missing, malformed, or names a device it does not have."""


def full_device_name(name: str) -> str:
    """Canonical full TF name of a device of a named job: `/job:J/replica:R/task:T/device:TYPE:N` (replica and
    task default to 0, the type is upper-cased). ClusterError when `name` has no job."""
    return devnames.full(name)


def is_host_port(addr) -> bool:
    """`addr` is "HOST:PORT" (a host name, an IPv4 address or a bracketed IPv6 one; a port 1-65535): a task's
    address, a measurement worker's (`--workers`).

    >>> is_host_port("127.0.0.1:50051"), is_host_port("[::1]:8"), is_host_port("notanaddr"), is_host_port("h:0")
    (True, True, False, False)
    """
    m = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):(\d+)", addr) if isinstance(addr, str) else None
    return bool(m) and 0 < int(m.group(2)) < 65536


def looks_like_tasks_file(spec) -> bool:
    """True when a `--devices` value names a JSON file (a tasks file), not a device list."""
    return isinstance(spec, (str, os.PathLike)) and str(spec).strip().lower().endswith(".json")


@dataclass(frozen=True)
class Task:
    index: int
    address: str                        # HOST:PORT
    pid: int | None                     # a local process `placer cluster down` may stop; None: started by hand
    cores: tuple[int, ...] = ()         # CPU cores it is pinned to (empty: unknown)
    devices: tuple[str, ...] = ()       # full TF names
    log: str | None = None

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def label(self) -> str:
        return f"task {self.index} ({self.address}" + (f", pid {self.pid})" if self.pid else ")")

    def to_dict(self) -> dict:
        d = {"address": self.address, "pid": self.pid, "cores": list(self.cores), "devices": list(self.devices)}
        if self.log:
            d["log"] = self.log
        return d


@dataclass(frozen=True)
class TasksFile:
    job: str
    tasks: tuple[Task, ...]
    path: str = "<tasks>"
    extra: dict = field(default_factory=dict)

    @property
    def devices(self) -> list[str]:
        """Every task's devices, task by task (the index order of placements over this cluster)."""
        return [d for t in self.tasks for d in t.devices]

    @property
    def target(self) -> str:
        """The session target: task 0's master."""
        return "grpc://" + self.tasks[0].address

    def cluster_spec(self) -> dict[str, list[str]]:
        return {self.job: [t.address for t in self.tasks]}

    def without(self, devices) -> "TasksFile":
        """The tasks that hold none of `devices` (lost ones); their first becomes the session target. Sessions on
        the survivors filter devices to them (`device_filters`), so the dead tasks are never contacted."""
        lost = {str(d) for d in devices}
        keep = tuple(t for t in self.tasks if not lost & set(t.devices))
        if not keep:
            raise TasksFileError(f"tasks file {self.path}: no task is left without {', '.join(sorted(lost))}")
        return TasksFile(self.job, keep, self.path, {**self.extra, "survivors_of": self.path})

    @property
    def device_filters(self) -> list[str]:
        """TF `ConfigProto.device_filters` for a session that must only see these tasks (after `without`)."""
        return [f"/job:{self.job}/task:{t.index}" for t in self.tasks] if self.extra.get("survivors_of") else []

    def task_of(self, device: str) -> Task:
        for t in self.tasks:
            if device in t.devices:
                return t
        raise TasksFileError(f"device {device!r} is not in the cluster of tasks file {self.path} "
                             f"(its devices: {', '.join(self.devices)})")

    def to_dict(self) -> dict:
        return {"format": TASKS_FORMAT, "job": self.job, "tasks": [t.to_dict() for t in self.tasks], **self.extra}

    def save(self, path: "str | os.PathLike") -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n", "tasks file")


def tasks_from_dict(obj, source: str = "<tasks>") -> TasksFile:
    """Validate a tasks-file object; TasksFileError naming `source` and the task at fault."""
    def bad(msg: str) -> TasksFileError:
        return TasksFileError(f"tasks file {source}: {msg}")

    if not isinstance(obj, dict) or not isinstance(obj.get("tasks"), list):
        raise bad('expected {"format": 1, "job": "worker", "tasks": [{"address": "HOST:PORT", "pid": int|null, '
                  '"cores": [int], "devices": [str]}, ...]}')
    if obj.get("format", TASKS_FORMAT) != TASKS_FORMAT:
        raise bad(f"format {obj.get('format')!r} is not supported (this placer reads format {TASKS_FORMAT})")
    job = obj.get("job", "worker")
    if not isinstance(job, str) or not re.fullmatch(r"[A-Za-z0-9_\-]+", job):
        raise bad(f"job {job!r} is not a job name")
    if not obj["tasks"]:
        raise bad("no tasks")
    tasks, seen = [], set()
    for k, t in enumerate(obj["tasks"]):
        if not isinstance(t, dict):
            raise bad(f"task {k} is not an object")
        addr = t.get("address")
        if not is_host_port(addr):
            raise bad(f"task {k}: address {addr!r} is not HOST:PORT")
        if addr in seen:
            raise bad(f"task {k}: address {addr} is listed twice")
        seen.add(addr)
        pid = t.get("pid")
        if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or not 1 < pid <= PID_MAX):
            raise bad(f"task {k}: pid {pid!r} is not a process id (or null)")
        cores = t.get("cores") or []
        if not isinstance(cores, list) or not all(isinstance(c, int) and c >= 0 for c in cores):
            raise bad(f"task {k}: cores {cores!r} is not a list of core numbers")
        devs = t.get("devices")
        if not isinstance(devs, list) or not devs or not all(isinstance(d, str) for d in devs):
            raise bad(f"task {k}: devices must be a non-empty list of TF device names")
        names = []
        for d in devs:
            try:
                fd = full_device_name(d)
            except ClusterError:
                raise bad(f"task {k}: device {d!r} is not a full TF device name like "
                          f"/job:{job}/replica:0/task:{k}/device:CPU:0") from None
            if not fd.startswith(f"/job:{job}/replica:0/task:{k}/"):
                raise bad(f"task {k}: device {d!r} is not a device of /job:{job}/replica:0/task:{k}")
            names.append(fd)
        if len(set(names)) != len(names):
            raise bad(f"task {k}: a device is listed twice")
        log = t.get("log")
        tasks.append(Task(k, addr, pid, tuple(cores), tuple(names), log if isinstance(log, str) else None))
    extra = {k: v for k, v in obj.items() if k not in ("format", "job", "tasks")}
    return TasksFile(job=job, tasks=tuple(tasks), path=source, extra=extra)


def load_tasks(path: "str | os.PathLike") -> TasksFile:
    """Read and validate a tasks file (TasksFileError, one line, naming the file)."""
    p = Path(path)
    if not p.is_file():
        raise TasksFileError(f"tasks file {str(p)} does not exist (start a cluster with "
                             f"`placer cluster up --tasks N --out {p.name}`)")
    try:
        obj = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TasksFileError(f"tasks file {str(p)} is not valid JSON: {e}") from None
    if isinstance(obj, dict) and isinstance(obj.get("placement"), dict) and "tasks" not in obj:
        raise TasksFileError(f"{str(p)} is a placement file (op → device), not a tasks file of `placer cluster up`")
    if isinstance(obj, dict) and "devices" in obj and "tasks" not in obj:
        raise TasksFileError(f"{str(p)} is a cluster JSON (simulated hardware): pass it as --cluster, not --devices")
    return tasks_from_dict(obj, str(p))


# ---- liveness ---------------------------------------------------------------------------------------------------
def proc_state(pid: int) -> str | None:
    """The state letter of a local process (R, S, T, Z...) or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return "?"
        except ProcessLookupError:
            return None
        except PermissionError:
            return "?"


def probe_task(task: Task, timeout: float = 2.0, *, connect: bool = True) -> str | None:
    """None when the task looks up (its process, if local, exists and runs; its port accepts a connection); else
    why not, in a few words. `connect=False`: a task with a pid is judged by its process alone."""
    if task.pid:
        st = proc_state(task.pid)
        if st is None or st in ("Z", "X"):
            return "its process is gone"
        if st in ("T", "t"):
            return "its process is stopped"
        if not connect:
            return None
    try:
        with socket.create_connection((task.host, task.port), timeout=timeout):
            pass
    except OSError as e:
        return f"its port does not answer ({e.strerror or e})"
    return None


def down_tasks(tasks: TasksFile, timeout: float = 2.0, *, connect: bool = True) -> list[str]:
    """One phrase per task that is down, e.g. `task 1 (127.0.0.1:24002, pid 812) is down: its process is gone`."""
    return [f"{t.label} is down: {why}" for t, why in down_task_list(tasks, timeout, connect=connect)]


def down_task_list(tasks: TasksFile, timeout: float = 2.0, *, connect: bool = True) -> list[tuple["Task", str]]:
    """(task, why) for each task that is down."""
    out = []
    for t in tasks.tasks:
        why = probe_task(t, timeout, connect=connect)
        if why:
            out.append((t, why))
    return out
