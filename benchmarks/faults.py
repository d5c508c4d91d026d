"""Faults survived (issue 16): faults injected into real measured-reward searches on loopback workers.

    python benchmarks/faults.py [--model rnnlm] [--size tiny] [--updates 4] [--only worker_kill,...]
                                [--out benchmarks/results/faults.json]

Each fault runs `placer search --reward measure --devices cpu:2 --workers A,B` (subprocesses of this Python; every
worker on 127.0.0.1, stopped by its PID at the end) and injects one fault:
- worker_kill         kill -9 of worker A once the search has started measuring;
- worker_hang         SIGSTOP of worker A (cut by the pool's health heartbeat; SIGCONT and stopped at the end);
- worker_restart      kill -9 of worker A after the first update, then a new worker at the same port: it must
                      rejoin (the search prints that it answers again and is re-checked);
- port_closed         worker A stopped gracefully (its port closes) mid-search;
- search_kill_resume  kill -9 of the search once it has checkpointed, then `placer search --resume DIR`;
- corrupt_checkpoint  a finished search's checkpoint state overwritten with garbage, then `--resume`: must be a
                      one-line error, nothing run;
- device_mismatch     worker A started without --devices (only /CPU:0) for a search over cpu:2: refused up front.

A search survives when it exits 0 with a finite step time (for the last two: exits non-zero with a one-line error
naming the file / the worker and the missing device). `evaluations_lost`: evaluations a clean search of the same
seed and update count makes that the faulted search's summary lacks (0 when nothing completed was lost).
`message`: what the user saw (the warning or error lines). Writes `--out` (default benchmarks/results/faults.json).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ["worker_kill", "worker_hang", "worker_restart", "port_closed", "search_kill_resume", "corrupt_checkpoint",
          "device_mismatch"]


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerProc:
    """A `placer worker` subprocess on 127.0.0.1:port; stopped by its PID."""

    def __init__(self, port: int, *devices: str, log: Path):
        self.port, self.address = port, f"127.0.0.1:{port}"
        self.log = open(log, "a")
        self.p = subprocess.Popen([sys.executable, "-m", "placer", "worker", "--listen", self.address, *devices],
                                  stdout=self.log, stderr=subprocess.STDOUT, env=_env())
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                if self.p.poll() is not None:
                    raise RuntimeError(f"worker {self.address} exited with {self.p.returncode} (log: {log})")
                time.sleep(0.3)
        raise RuntimeError(f"worker {self.address} did not start (log: {log})")

    def signal(self, sig) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, sig)

    def stop(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGCONT)
            os.kill(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=10)
        self.log.close()


def search_cmd(args, out: Path, workers: list[str], *, resume: bool = False) -> list[str]:
    if resume:
        return [sys.executable, "-m", "placer", "search", "--resume", str(out), "--json", "--no-progress"]
    return [sys.executable, "-m", "placer", "search", "--model", args.model, "--size", args.size, "--devices",
            "cpu:2", "--reward", "measure", "--workers", ",".join(workers), "--budget", str(args.budget),
            "--max-updates", str(args.updates), "--seed", "0", "--out", str(out), "--json", "--no-progress"]


def run_search(cmd, log: Path, *, inject=None, timeout: float = 900.0):
    """Run a search; `inject(proc, t0)` is called every 0.2 s until it returns True. Returns (rc, summary, lines)."""
    with open(log, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=_env(), text=True)
        t0 = time.time()
        if inject is not None:
            while p.poll() is None and not inject(p, t0):
                time.sleep(0.2)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    try:
        summary = json.loads(out) if p.returncode == 0 else None
    except ValueError:
        summary = None
    return p.returncode, summary, lines


def _measuring(out: Path) -> bool:
    """True once the search has started measuring (its directory holds args.json and some seconds passed)."""
    return (out / "args.json").exists()


def _warn(lines: list[str], *keys: str) -> str:
    hits = [ln.strip() for ln in lines if any(k in ln for k in keys)]
    return " | ".join(dict.fromkeys(hits))[:600]


def fault_result(fault: str, survived: bool, lost: int, ok: bool, message: str) -> dict:
    return {"fault": fault, "injected": 1, "survived": int(bool(survived)), "evaluations_lost": int(lost),
            "result_ok": bool(ok), "message": message}


def _ok(summary) -> bool:
    import math

    return bool(summary) and summary.get("step_time_s") is not None and math.isfinite(summary["step_time_s"])


def run_fault(fault: str, args, work: Path, expected: int) -> dict:
    d = work / fault
    d.mkdir(parents=True, exist_ok=True)
    out = d / "search"
    devs = () if fault == "device_mismatch" else ("--devices", "cpu:2")
    a = WorkerProc(free_port(), *devs, log=d / "worker_a.log")
    b = WorkerProc(free_port(), "--devices", "cpu:2", log=d / "worker_b.log")
    procs = [a, b]
    try:
        cmd = search_cmd(args, out, [a.address, b.address])
        if fault == "device_mismatch":
            rc, summary, lines = run_search(cmd, d / "search.log", timeout=300)
            msg = lines[-1] if lines else ""
            one_line = rc != 0 and len(lines) == 1 and "Traceback" not in "\n".join(lines)
            named = a.address in msg and "/CPU:1" in msg and "--devices cpu:2" in msg
            return fault_result(fault, one_line and named, 0, one_line and named, msg)
        if fault == "corrupt_checkpoint":
            rc, summary, lines = run_search(cmd, d / "search.log", timeout=900)
            if rc != 0:
                return fault_result(fault, False, expected, False, f"clean search failed: {_warn(lines, '')}")
            ck = out / "checkpoint"
            files = sorted(p for p in ck.rglob("*") if p.is_file())
            state = next((p for p in files if p.name == "state.json"), files[0])
            state.write_bytes(b"\x00garbage{not json")
            rc2, _, lines2 = run_search(search_cmd(args, out, [], resume=True), d / "resume.log", timeout=300)
            msg = lines2[-1] if lines2 else ""
            one_line = rc2 != 0 and len(lines2) == 1 and "Traceback" not in "\n".join(lines2)
            named = state.name in msg or str(ck) in msg
            return fault_result(fault, one_line and named, 0, one_line and named and _ok(summary), msg)
        fired = {"t": None}

        def inject(p, t0):
            if not _measuring(out) or time.time() - t0 < args.delay:
                return False
            fired["t"] = time.time()
            if fault == "worker_kill":
                a.signal(signal.SIGKILL)
            elif fault == "worker_hang":
                a.signal(signal.SIGSTOP)
            elif fault == "port_closed":
                a.signal(signal.SIGTERM)
            elif fault == "worker_restart":
                if not (out / "checkpoint" / "state.json").exists():    # once it measures with this pool
                    fired["t"] = None
                    return False
                a.signal(signal.SIGKILL)
                a.p.wait(timeout=20)
                a.log.close()
                time.sleep(2.0)
                procs.append(WorkerProc(a.port, "--devices", "cpu:2", log=d / "worker_a2.log"))
            elif fault == "search_kill_resume":
                if not (out / "checkpoint" / "state.json").exists():
                    fired["t"] = None
                    return False
                p.send_signal(signal.SIGKILL)
            return True

        rc, summary, lines = run_search(cmd, d / "search.log", inject=inject)
        if fault == "search_kill_resume":
            if rc != -signal.SIGKILL:
                return fault_result(fault, False, 0, _ok(summary), f"the search ended before the kill (rc {rc})")
            before = json.loads((out / "checkpoint" / "state.json").read_text()).get("evaluations", 0)
            rc, summary, lines = run_search(search_cmd(args, out, [], resume=True), d / "resume.log")
            got = summary.get("evaluations", 0) if summary else 0
            msg = (f"search killed (-9) with {before} evaluations checkpointed; --resume finished with {got} "
                   f"evaluations" + (f": {_warn(lines, 'rror')}" if rc else ""))
            return fault_result(fault, rc == 0 and _ok(summary), max(0, expected - got) if rc == 0 else before,
                                _ok(summary), msg)
        got = summary.get("evaluations", 0) if summary else 0
        msg = _warn(lines, "measurement worker", "rror") or f"(no warning printed; rc {rc})"
        survived = rc == 0 and _ok(summary) and fired["t"] is not None
        if fault == "worker_restart":
            survived = survived and "answers again" in msg
        return fault_result(fault, survived, max(0, expected - got), _ok(summary), msg)
    finally:
        for w in procs:
            w.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="rnnlm")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--updates", type=int, default=4, help="policy updates per search (default 4)")
    ap.add_argument("--budget", type=float, default=900)
    ap.add_argument("--delay", type=float, default=8.0, help="seconds after the search starts before the fault")
    ap.add_argument("--only", help="comma list of faults (default: all)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "faults.json"))
    ap.add_argument("--keep", action="store_true", help="keep the working directory (logs, search dirs)")
    args = ap.parse_args(argv)
    faults = [f for f in (args.only.split(",") if args.only else FAULTS)]
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        ap.error(f"unknown faults {bad}; known: {FAULTS}")
    work = Path(tempfile.mkdtemp(prefix="placer-faults-"))
    try:
        # the clean reference: how many evaluations the same search makes without a fault
        ref = work / "reference"
        ref.mkdir()
        a = WorkerProc(free_port(), "--devices", "cpu:2", log=ref / "worker_a.log")
        b = WorkerProc(free_port(), "--devices", "cpu:2", log=ref / "worker_b.log")
        try:
            rc, summary, lines = run_search(search_cmd(args, ref / "search", [a.address, b.address]),
                                            ref / "search.log")
        finally:
            a.stop()
            b.stop()
        if rc != 0:
            print(f"the clean reference search failed (rc {rc}): {' | '.join(lines[-3:])}", file=sys.stderr)
            return 1
        expected = int(summary["evaluations"])
        rows = []
        for f in faults:
            t = time.time()
            r = run_fault(f, args, work, expected)
            r["wall_s"] = round(time.time() - t, 1)
            rows.append(r)
            print(json.dumps(r), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        for r in rows:
            r.update(updates=args.updates, reference_evaluations=expected)
        if args.only and Path(args.out).exists():      # keep the other faults' rows of an earlier run
            old = {r["fault"]: r for r in json.loads(Path(args.out).read_text()).get("faults", [])}
            old.update({r["fault"]: r for r in rows})
            rows = [old[f] for f in FAULTS if f in old]
        Path(args.out).write_text(json.dumps({"model": args.model, "size": args.size, "faults": rows}, indent=1)
                                  + "\n")
        print(f"wrote {args.out}")
        return 0 if all(r["survived"] == r["injected"] and r["result_ok"] for r in rows) else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
