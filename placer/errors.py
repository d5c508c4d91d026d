"""One exception hierarchy for placer. Every message names the op, device or file at fault."""
import contextlib


class PlacerError(Exception):
    """Base class of every error placer raises on purpose (the CLI prints it as one line)."""


class GraphImportError(PlacerError):
    """A graph could not be read or turned into an OpGraph (bad file, cycle, unknown fetch...)."""


class ClusterError(PlacerError):
    """A cluster spec, preset or device list is invalid."""


class PlacementError(PlacerError):
    """A placement is invalid for this graph or cluster (unknown device, wrong graph...)."""


class CostTableError(PlacerError):
    """A cost table is missing, for another graph, or unreadable."""


class MeasurementError(PlacerError):
    """Real measurement failed in a way that is not a per-placement failure (no device, no worker)."""


class SearchError(PlacerError):
    """The search cannot run (budget, memory, checkpoint problems)."""


class OutputError(PlacerError):
    """An output file or directory (--out, --trace) cannot be created or written."""


def os_reason(e: OSError) -> str:
    """The OS's reason; mkdir's "File exists" (with exist_ok) means a file stands where a directory must be."""
    import errno
    import os

    return os.strerror(errno.ENOTDIR) if isinstance(e, FileExistsError) else e.strerror or str(e)


def write_text_atomic(path, text: str, what: str) -> None:
    """Write `text` to `path` atomically (a temp file beside it, then a rename: a reader never sees half a file).
    On failure no temp file stays and OutputError says "`what` PATH: cannot write it: <the OS's reason>" (the OS's
    error named the temp file)."""
    import os
    from pathlib import Path

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        if tmp.is_file():
            tmp.unlink()
        raise OutputError(f"{what} {path}: cannot write it: {os_reason(e)}") from None


_CREATED: list = []     # the top directories writable_dir created in this process (taking_back_empty_dirs)


def writable_dir(path, label: str):
    """Create the directory `path` now, before any long work, and check that files can be written in it:
    OutputError "`label`: cannot create it or write in it: <the OS's reason>" (the CLI's --out, the library's
    out_dir). Returns it as a Path. The directories it creates are remembered, so that a command refused after
    this can take them back while they are empty (`taking_back_empty_dirs`)."""
    import tempfile
    from pathlib import Path

    p = Path(path)
    new = [a for a in (p.absolute(), *p.absolute().parents) if not a.exists()]
    try:
        p.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=p).close()
    except OSError as e:
        raise OutputError(f"{label}: cannot create it or write in it: {os_reason(e)}") from None
    if new:
        _CREATED.append(new[-1])
    return p


@contextlib.contextmanager
def taking_back_empty_dirs():
    """Around a command or a library call that creates its output directory (`writable_dir`) before all its
    checks: when it fails with a PlacerError, the directories it created and wrote nothing into are removed (a
    refused call leaves no empty --out behind). Never a file, never a directory that holds one. Also a
    decorator."""
    import os

    mark = len(_CREATED)
    try:
        yield
    except PlacerError:
        for top in reversed(_CREATED[mark:]):
            for d, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):      # deepest first
                try:
                    os.rmdir(d)          # only if empty
                except OSError:
                    pass
        raise
    finally:
        del _CREATED[mark:]


def fmt_bytes(n: float) -> str:
    """Bytes for a message: 1536 → '1.5 KiB'.

    >>> fmt_bytes(3 * 2**30)
    '3.0 GiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"
