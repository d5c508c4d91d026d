"""`placer cluster up` / `placer cluster down`: TF distributed-runtime tasks on this machine (no TensorFlow here).

    from placer.runtime.servers import cluster_up, cluster_down
    tasks = cluster_up(2, out="c.json")         # two tf.distribute.Server tasks, one core each
    ...                                          # placer measure --devices c.json ...
    cluster_down("c.json")                       # stops exactly the PIDs the file lists

Each task is `python -m placer.runtime._task` (see there), detached from the caller (its own session, re-parented
to init: it outlives `placer cluster up`), stdout/stderr to `<out stem>.task<K>.log` beside the tasks file, pinned to
its own cores with intra- and inter-op pools of as many threads. When the tasks need more cores than this process
may use, `cluster_up` refuses (one line) unless `share_cores=True` (`--share-cores`): cores are then dealt out in
turn and a warning says that the timings of tasks sharing a core disturb each other.

Loopback only: TensorFlow's gRPC server listens on every interface ("0.0.0.0:PORT", hard-coded in
grpc_server_lib.cc) and has no authentication. Each task therefore runs with a tiny LD_PRELOAD shim (C source
below, compiled once with the system C compiler into PLACER_CACHE_DIR) that turns a wildcard bind() into a
loopback one, and `cluster_up` checks in /proc/net/tcp{,6} that every listening socket of the tasks' ports is a
loopback one before it writes the tasks file. Without a C compiler `cluster_up` refuses, unless
`any_interface=True` (`--any-interface`, then a warning: anyone who reaches this host can run graphs in the tasks).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from placer.errors import ClusterError
from placer.runtime._task import MARKER
from placer.tasks import Task, TasksFile, TasksFileError, proc_state, down_tasks, load_tasks

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
START_TIMEOUT = 120.0

_SHIM_C = r"""
/* placer: make a wildcard TCP bind() a loopback one (TF's gRPC server binds 0.0.0.0 / [::]). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real = 0;
    if (!real) real = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {   /* [::] -> [::ffff:127.0.0.1]: IPv4 loopback only */
            memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
            a.sin6_addr.s6_addr[10] = 0xff;
            a.sin6_addr.s6_addr[11] = 0xff;
            a.sin6_addr.s6_addr[12] = 127;
            a.sin6_addr.s6_addr[15] = 1;
            return real(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real(fd, addr, len);
}
"""


def _cache_dir() -> Path:
    return Path(os.environ.get("PLACER_CACHE_DIR") or Path.home() / ".cache" / "placer")


def loopback_shim() -> str:
    """Path of the compiled bind shim (built on first use); ClusterError when it cannot be built."""
    tag = hashlib.sha256(_SHIM_C.encode()).hexdigest()[:12]
    so = _cache_dir() / f"bind-loopback-{tag}.so"
    if so.is_file():
        return str(so)
    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if not cc:
        raise ClusterError("cannot keep the TF servers on loopback: no C compiler (cc) to build the bind shim; "
                           "install one, or pass --any-interface to let them listen on every interface")
    so.parent.mkdir(parents=True, exist_ok=True)
    src = so.with_suffix(f".{os.getpid()}.c")
    tmp = so.with_suffix(f".{os.getpid()}.tmp")
    try:
        src.write_text(_SHIM_C)
        r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src), "-ldl"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise ClusterError(f"cannot build the loopback bind shim with {cc}: "
                               f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}; pass --any-interface to "
                               "let the TF servers listen on every interface")
        os.replace(tmp, so)
    finally:
        for p in (src, tmp):
            p.unlink(missing_ok=True)
    return str(so)


def listening_addresses(port: int) -> list[str]:
    """Local addresses with a socket LISTENing on TCP `port` (from /proc/net/tcp and tcp6)."""
    import ipaddress

    out = []
    for fn, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(fn).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if len(f) < 4 or f[3] != "0A":
                continue
            addr, _, p = f[1].partition(":")
            if int(p, 16) != port:
                continue
            raw = bytes.fromhex(addr)
            raw = b"".join(raw[k:k + 4][::-1] for k in range(0, len(raw), 4))   # 32-bit words, host order
            ip = ipaddress.ip_address(raw)
            if v6 and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            out.append(str(ip))
    return out


def _is_loopback(addr: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(addr).is_loopback


def _check_port_free(port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as gRPC does: TIME_WAIT is no conflict
        s.bind((HOST, port))
        s.listen(1)
    except OSError as e:
        raise ClusterError(f"port {HOST}:{port} is in use ({e.strerror}): pick another --port or stop what "
                           f"listens there") from None
    finally:
        s.close()


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def plan_cores(tasks: int, cores_per_task: int | None, share_cores: bool) -> list[list[int]]:
    """Cores of each task: disjoint runs of `cores_per_task` among the cores this process may use (default: an
    even split). ClusterError when they do not suffice, unless `share_cores` (then dealt out in turn, warning)."""
    avail = sorted(os.sched_getaffinity(0))
    k = cores_per_task if cores_per_task is not None else max(1, len(avail) // max(1, tasks))
    if tasks < 1:       # it said "(got 0, 2)": the 2 was the default core count, not a flag the user gave
        raise ClusterError(f"--tasks {tasks}: need at least one task")
    if k < 1:
        raise ClusterError(f"--cores-per-task {k}: need at least one core per task")
    need = tasks * k
    if need > len(avail):
        if not share_cores:
            raise ClusterError(f"{tasks} tasks x {k} cores need {need} cores, this process may use "
                               f"{len(avail)} ({','.join(map(str, avail))}): use fewer tasks or cores, or "
                               f"--share-cores (tasks sharing a core disturb each other's timings)")
        log.warning("%d tasks x %d cores share %d cores: tasks on one core disturb each other's timings",
                    tasks, k, len(avail))
    return [[avail[(t * k + c) % len(avail)] for c in range(k)] for t in range(tasks)]


def _running_placer_task(pid: int, task: Task | None = None) -> bool:
    """PID is a live `placer.runtime._task` process (serving `task`'s index and address when given)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if MARKER.encode() not in argv or proc_state(pid) in (None, "Z", "X"):
        return False
    if task is None:
        return True
    args = [a.decode(errors="replace") for a in argv]

    def value(flag: str) -> str | None:
        return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None

    return value("--index") == str(task.index) and task.address in (value("--addresses") or "").split(",")


def _log_tail(path: str, n: int = 3) -> str:
    try:
        lines = [x for x in Path(path).read_text(errors="replace").splitlines()
                 if x.strip() and not x.startswith(("WARNING: All log", "I0000"))]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-500:]


def cluster_up(tasks: int, out: "str | os.PathLike", *, cores_per_task: int | None = None, port: int | None = None,
               share_cores: bool = False, any_interface: bool = False, job: str = "worker",
               timeout: float = START_TIMEOUT) -> TasksFile:
    """Start `tasks` TF server tasks on 127.0.0.1 (see the module docstring), wait until each serves, write and
    return the tasks file `out`. On any failure every task started is stopped again and ClusterError says why."""
    out = Path(out)
    if out.suffix.lower() != ".json":
        raise ClusterError(f"--out {out}: a tasks file name must end in .json")
    if out.exists():
        try:
            old = load_tasks(out)
        except TasksFileError as e:     # another file (a placement, a cluster JSON...): never overwritten
            raise ClusterError(f"--out {out}: {e}; cluster up will not overwrite it (remove it or pick another "
                               "--out)") from None
        live = [t for t in old.tasks if t.pid and _running_placer_task(t.pid, t)]
        if live:
            raise ClusterError(f"{out} lists tasks that still run ({', '.join(t.label for t in live)}): "
                               f"`placer cluster down {out}` first")
    cores = plan_cores(tasks, cores_per_task, share_cores)
    if port is not None:
        if not (0 < port and port + tasks - 1 < 65536):
            raise ClusterError(f"--port {port}: ports {port}..{port + tasks - 1} are not all valid")
        ports = list(range(port, port + tasks))
        for p in ports:
            _check_port_free(p)
    else:
        ports = _free_ports(tasks)
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["GRPC_FAIL_FAST"] = "true"        # a dead task fails a step at once (UnavailableError), never a wait
    if any_interface:
        log.warning("the TF servers listen on every interface without authentication (--any-interface)")
    else:
        shim = loopback_shim()
        env["LD_PRELOAD"] = (shim + " " + env["LD_PRELOAD"]).strip() if env.get("LD_PRELOAD") else shim
    out.parent.mkdir(parents=True, exist_ok=True)
    addresses = [f"{HOST}:{p}" for p in ports]
    # absolute: the tasks file names them for whoever reads it, from any directory
    logs = [str(out.absolute().with_name(f"{out.stem}.task{k}.log")) for k in range(tasks)]
    pids: dict[int, int] = {}
    devices: dict[int, list[str]] = {}
    pipes: dict[int, int] = {}
    bufs: dict[int, bytes] = {}
    try:
        for k in range(tasks):
            r, w = os.pipe()
            with open(logs[k], "ab") as logf:
                cmd = [sys.executable, "-m", MARKER, "--job", job, "--index", str(k), "--addresses",
                       ",".join(addresses), "--cores", ",".join(map(str, cores[k])), "--threads",
                       str(len(cores[k])), "--ready-fd", str(w), "--detach"]
                p = subprocess.Popen(cmd, pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=logf,
                                     stderr=subprocess.STDOUT, env=env, close_fds=True)
            os.close(w)
            pipes[k], bufs[k] = r, b""
            if p.wait(timeout=30) != 0:                 # the launcher forks the task and exits at once
                raise ClusterError(f"task {k} did not start (launcher exit {p.returncode}): {_log_tail(logs[k])}")
        deadline = time.monotonic() + timeout
        while len(devices) < tasks:
            left = deadline - time.monotonic()
            waiting = [fd for k, fd in pipes.items() if k not in devices]
            if left <= 0:
                late = [k for k in range(tasks) if k not in devices]
                raise ClusterError(f"task(s) {late} did not serve within {timeout:g} s (logs: "
                                   f"{', '.join(logs[k] for k in late)})")
            ready, _, _ = select.select(waiting, [], [], min(left, 1.0))
            for fd in ready:
                k = next(k for k, f in pipes.items() if f == fd)
                if not _read_ready_lines(fd, bufs, k, pids, devices) and k not in devices:
                    raise ClusterError(f"task {k} ({addresses[k]}) exited while starting: "
                                       f"{_log_tail(logs[k]) or 'see ' + logs[k]}")
        if not any_interface:
            for k, p in enumerate(ports):
                bad = [a for a in listening_addresses(p) if not _is_loopback(a)]
                if bad:
                    raise ClusterError(f"task {k} listens on {', '.join(bad)}:{p}, not only on loopback: "
                                       f"stopped (the bind shim did not take)")
        result = TasksFile(job=job, tasks=tuple(
            Task(k, addresses[k], pids[k], tuple(cores[k]), tuple(devices[k]), logs[k]) for k in range(tasks)),
            path=str(out))
        down = down_tasks(result, timeout=5.0)
        if down:
            raise ClusterError("; ".join(down))
        result.save(out)
        return result
    except BaseException:
        # a task whose pid line was not read yet (a timeout before the first read) is stopped too, never left
        # serving with no tasks file naming it: its pid comes at once, so wait for it briefly
        unread = {fd: k for k, fd in pipes.items() if k not in pids}
        end = time.monotonic() + 5.0
        while unread and time.monotonic() < end:
            for fd in select.select(list(unread), [], [], 0.1)[0]:
                try:
                    more = _read_ready_lines(fd, bufs, unread[fd], pids, devices)
                except (OSError, ValueError, KeyError):
                    more = False
                if not more or unread[fd] in pids:
                    del unread[fd]
        _stop_pids(list(pids.values()))
        raise
    finally:
        for fd in pipes.values():
            os.close(fd)


def _read_ready_lines(fd: int, bufs: dict, k: int, pids: dict, devices: dict) -> bool:
    """Read what task k wrote on its ready pipe (`{"pid": P}`, then `{"pid": P, "devices": [...]}`) into `pids`
    and `devices`; False at the end of the pipe."""
    chunk = os.read(fd, 65536)
    bufs[k] += chunk
    while b"\n" in bufs[k]:
        line, bufs[k] = bufs[k].split(b"\n", 1)
        msg = json.loads(line)
        pids[k] = int(msg["pid"])
        if "devices" in msg:
            devices[k] = list(msg["devices"])
    return bool(chunk)


def _gone(pid: int) -> bool:
    try:                                   # our own child (not the usual case: tasks are detached)
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    return proc_state(pid) in (None, "Z", "X")


def _stop_pids(pids: list[int], grace: float = 5.0) -> list[int]:
    """SIGTERM to all, then SIGKILL to those left after `grace` s; returns the PIDs still there after that."""
    left = list(pids)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait
        while left and time.monotonic() < end:
            left = [p for p in left if not _gone(p)]
            if left:
                time.sleep(0.02)
        if not left:
            break
    return left


def cluster_down(path: "str | os.PathLike") -> list[str]:
    """Stop the tasks a tasks file lists: exactly their PIDs, and only those whose /proc/PID/cmdline is still that
    placer task (a reused PID is left alone). Returns one line per task saying what happened."""
    tf_ = load_tasks(path)
    ours = [t for t in tf_.tasks if t.pid is not None and _running_placer_task(t.pid, t)]
    left = set(_stop_pids([t.pid for t in ours]))
    if left:
        raise ClusterError(f"{', '.join(t.label for t in ours if t.pid in left)} did not stop after SIGKILL")
    return [f"{t.label}: " + ("no pid (started by hand): left alone" if t.pid is None else
                              "stopped" if t in ours else "not running") for t in tf_.tasks]
