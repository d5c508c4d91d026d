"""Reading the npz files a user hands back (graph caches, run directories, checkpoints, policies): data only."""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np


def load_npz(path: "str | os.PathLike"):
    """``np.load(path, allow_pickle=False)`` of an npz archive (use it as a context manager). A file that is no
    npz (a zip: ``PK``...) is a ValueError naming the file: numpy would call any such file "pickled (object)
    data" and advise loading it with ``allow_pickle``, which runs whatever code the file holds.

    >>> load_npz(os.devnull)
    Traceback (most recent call last):
    ValueError: null is not an npz archive (empty, truncated, corrupt or another kind of file)
    """
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(2)
    what = f"{p.name} is not an npz archive (empty, truncated, corrupt or another kind of file)"
    if head != b"PK":
        raise ValueError(what)
    try:
        return np.load(p, allow_pickle=False)
    except zipfile.BadZipFile:      # a zip cut short (a kill while copying it): numpy lets zipfile's error out
        raise ValueError(what) from None
