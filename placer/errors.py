"""One exception hierarchy for placer. Every message names the op, device or file at fault."""


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


def writable_dir(path, label: str):
    """Create the directory `path` now, before any long work, and check that files can be written in it:
    OutputError "`label`: cannot create it or write in it: <the OS's reason>" (the CLI's --out, the library's
    out_dir). Returns it as a Path."""
    import tempfile
    from pathlib import Path

    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=p).close()
    except OSError as e:
        raise OutputError(f"{label}: cannot create it or write in it: {os_reason(e)}") from None
    return p


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
