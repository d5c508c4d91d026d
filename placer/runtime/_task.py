"""One TF cluster task: a `tf.distribute.Server` (job `worker`) pinned to its cores. Started by `placer cluster up`
(`placer.runtime.servers.cluster_up`) as

    python -m placer.runtime._task --job worker --index K --addresses A0,A1,... --cores 0,1 --threads 2 --ready-fd FD

It pins itself to `--cores` (before TensorFlow starts any thread), starts the server with intra- and inter-op
pools of `--threads` threads and serves until killed. With `--detach` it first forks (the launcher exits at once,
the task runs in a new session). On the pipe `--ready-fd` it writes the JSON line `{"pid": int}` at once, then
`{"pid": int, "devices": [full names]}` once the server serves, and closes it. Its command line carries the marker `placer.runtime._task` and its address,
which `placer cluster down` checks before it signals a PID from a tasks file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

MARKER = "placer.runtime._task"


def _say(fd: int | None, msg: dict) -> None:
    if fd is not None:
        os.write(fd, (json.dumps(msg) + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=MARKER)
    ap.add_argument("--job", default="worker")
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--addresses", required=True)
    ap.add_argument("--cores", default="")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ready-fd", type=int)
    ap.add_argument("--detach", action="store_true", help="fork, let the launcher exit, serve in a new session")
    a = ap.parse_args(argv)
    if a.detach:
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    _say(a.ready_fd, {"pid": os.getpid()})       # first the pid: the launcher can stop a task that hangs
    cores = {int(c) for c in a.cores.split(",") if c.strip()}
    if cores:
        os.sched_setaffinity(0, cores)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from placer.runtime._child import keep_constants_placed

    keep_constants_placed()
    addresses = [x for x in a.addresses.split(",") if x]
    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=a.threads, inter_op_parallelism_threads=a.threads)
    cfg.gpu_options.allow_growth = True
    server = tf.distribute.Server(tf.train.ClusterSpec({a.job: addresses}), job_name=a.job, task_index=a.index,
                                  protocol="grpc", config=cfg, start=True)
    prefix = f"/job:{a.job}/replica:0/task:{a.index}/device:"
    devices = []
    for d in tf.config.list_physical_devices():     # the server made one device per physical CPU/GPU
        if d.device_type in ("CPU", "GPU"):
            devices.append(prefix + d.name.rsplit("device:", 1)[-1])
    print(f"{MARKER}: task {a.index} of job {a.job} serving {server.target} on cores {sorted(cores)} "
          f"({a.threads} threads): {', '.join(devices)}", flush=True)
    _say(a.ready_fd, {"pid": os.getpid(), "devices": devices})
    if a.ready_fd is not None:
        os.close(a.ready_fd)
    server.join()        # until SIGTERM/SIGKILL (default actions: a TF server has no clean shutdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
