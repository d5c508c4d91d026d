"""The graph cache: imported OpGraphs saved under ``$PLACER_CACHE_DIR/graphs`` (default ``~/.cache/placer``).

    g = cached(("file", sha256_of_bytes, fetches, batch_size), build, cache=True)

An entry is keyed by a hash of the caller's key parts, the TensorFlow version, placer's version and
:data:`CACHE_FORMAT` (so an upgrade that changes what the importer builds never reuses an older entry); it is
one ``.npz`` of plain numeric arrays written by :meth:`OpGraph.save` (names and metadata as JSON bytes, never
pickles) and read with ``allow_pickle=False``. An entry that cannot be read -- corrupt, truncated, or written by
an older placer -- is a miss: the graph is built again and the entry replaced. A cache directory that cannot be
written only costs the next import its time.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from placer import _version
from placer.errors import GraphImportError
from placer.graphs.opgraph import OpGraph

log = logging.getLogger(__name__)

# bump when the importer builds other OpGraphs (fields, grouping inputs) for the same input; placer's version is
# in the key too, so a release never reads a cache another release wrote
CACHE_FORMAT = 6   # 3: npz without pickles (names/metadata as JSON), feed limits in the runnable MetaGraphDef;
#                   4: fetches checked as tensor names (an entry imported with 'loss:3' is no longer served);
#                   5: a Keras LossScaleOptimizer's step traced without its all-finite `If` (trace._finite_step);
#                   6: an imported step's precision read from its matmuls' dtype (opfacts.graph_precision)


def cache_dir() -> Path:
    return Path(os.environ.get("PLACER_CACHE_DIR") or Path.home() / ".cache" / "placer") / "graphs"


def tf_version() -> str:
    """TensorFlow's version without importing it (a cache hit must not pay TF's import time)."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"].__version__
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    import tensorflow as tf

    return tf.__version__


def entry_path(key_parts: Sequence[Any]) -> Path:
    """The cache file of `key_parts` (it may not exist)."""
    key = (CACHE_FORMAT, _version.__version__, tf_version(), *key_parts)
    h = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
    return cache_dir() / f"{h}.npz"


def cached(key_parts: Sequence[Any], build: Callable[[], OpGraph], cache: bool = True) -> OpGraph:
    """The cached OpGraph for `key_parts`, else ``build()`` (saved for next time). `cache=False`: just build."""
    if not cache:
        return build()
    path = entry_path(key_parts)
    if path.exists():
        try:
            return OpGraph.load(path)
        except GraphImportError as e:
            log.warning("rebuilding unreadable graph cache entry: %s", e)
    g = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
        os.close(fd)
        try:
            g.save(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as e:  # a read-only cache dir must not break the import
        log.warning("cannot write graph cache %s: %s", path, e)
    return g
