"""Mute a file descriptor while C code that writes to it runs: TensorFlow's start-up chatter on fd 2, METIS's
"***Cannot bisect a graph with 0 vertices!" on fd 1 (which would corrupt a command's JSON on stdout). What was
written is dropped, or written back to the Python stream if the code raised, so that a failure keeps its
reason.

    >>> with muted(1):
    ...     _ = os.write(1, b"C chatter\\n")
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
from typing import Iterator


def _flush_c_stdio() -> None:
    """C's stdio buffers (printf to a pipe or file is block-buffered): flushed into the muted descriptor before
    it is given back, or the chatter would come out later."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):     # no C library to load (not on Linux or macOS): nothing buffered there
        pass


@contextlib.contextmanager
def muted(fd: int = 2) -> Iterator[None]:
    """File descriptor `fd` sent to a temp file for the block; replayed to sys.stdout (fd 1) or sys.stderr if
    the block raises."""
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        except BaseException:
            _flush_c_stdio()
            os.dup2(saved, fd)
            tmp.seek(0)
            stream.write(tmp.read().decode(errors="replace"))
            raise
        finally:
            _flush_c_stdio()
            os.dup2(saved, fd)
            os.close(saved)
