"""Shared by the benchmarks that measure on a real TF cluster of this machine (fidelity.py, measured.py): start
the cluster, calibrate the simulator to it, write a section of RESULTS.md, and describe the machine.

Every figure these scripts write is produced here, in one run, from the code of this repository.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
PLACER = [sys.executable, "-m", "placer"]


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load {load:.2f} at start")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-1500:]}")
    return r


@contextlib.contextmanager
def tf_cluster(workdir: Path, tasks: int = 2):
    """`placer cluster up --tasks N` for the duration of the block, then `placer cluster down` (always)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "tasks.json"
    run(PLACER + ["cluster", "up", "--tasks", str(tasks), "--out", str(path)], timeout=300)
    try:
        yield path
    finally:
        subprocess.run(PLACER + ["cluster", "down", str(path)], capture_output=True, text=True, timeout=120)


def calibrate(model: str, size: str, tasks: Path, out: Path) -> tuple[Path, Path]:
    """`placer calibrate --model M --size S --devices tasks.json --out DIR` → (cluster.json, costs.json)."""
    if not ((out / "cluster.json").exists() and (out / "costs.json").exists()):
        run(PLACER + ["calibrate", "--model", model, "--size", size, "--devices", str(tasks), "--out", str(out)],
            timeout=3600)
    return out / "cluster.json", out / "costs.json"


def write_section(name: str, text: str, path: Path = ROOT / "RESULTS.md") -> None:
    """Replace the text between `<!-- name -->` and `<!-- /name -->` in RESULTS.md (appended when absent)."""
    body = path.read_text() if path.exists() else ""
    block = f"<!-- {name} -->\n{text.rstrip()}\n<!-- /{name} -->"
    pat = re.compile(rf"<!-- {re.escape(name)} -->.*?<!-- /{re.escape(name)} -->", re.S)
    body = pat.sub(lambda _: block, body) if pat.search(body) else body.rstrip() + "\n\n" + block + "\n"
    path.write_text(body)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def config_overrides(ap, flag: str, text: str, config=None) -> dict:
    """A flag's JSON object of `config`'s fields (a dataclass, default `ReinforceConfig`: transfer.py
    --zero-shot-config, finetune_start.py --config; `AnnealConfig`: transfer.py --anneal-config): {} when empty;
    otherwise not JSON, not an object or an unknown field is one `ap.error` line naming the flag."""
    if not text:
        return {}
    from dataclasses import fields

    if config is None:
        from placer.rl.reinforce import ReinforceConfig as config

    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as e:
        ap.error(f"{flag} is not JSON: {e}")
    if not isinstance(overrides, dict):
        ap.error(f"{flag} wants a JSON object of {config.__name__} fields")
    unknown = sorted(set(overrides) - {f.name for f in fields(config)})
    if unknown:
        ap.error(f"{flag}: unknown {config.__name__} fields: {', '.join(unknown)}")
    return overrides


def placer_commit() -> str | None:
    """The commit of the `placer` package imported (PYTHONPATH may point at another checkout)."""
    import placer

    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           cwd=Path(placer.__file__).resolve().parent)
        return r.stdout.strip() or None
    except OSError:
        return None
