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
