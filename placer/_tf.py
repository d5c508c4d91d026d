"""The search process's own TensorFlow stays off the GPUs, and TensorFlow is imported only when it is needed.

The policy, the cost estimate and the simulator run in the search process; the graphs being measured run in
child processes (`placer.runtime`), which need every GPU's memory. TensorFlow takes most of a GPU's memory as
soon as its runtime starts on it, so the search process hides the GPUs from its own runtime before that
happens. The child processes are not affected (they are other processes; no environment variable is changed).

Importing TensorFlow takes ~5 s, and many commands never need it (`placer simulate` on a cached graph, `placer
cluster down`). `defer_import` hides the GPUs, and mutes TensorFlow's start-up chatter, at the moment anything
first imports it, so the `placer` command does not import it up front (below, the GPUs are hidden and the
chatter muted if and when the import runs):

    >>> defer_import(quiet=True)    # doctest: +SKIP
    >>> import tensorflow as tf     # doctest: +SKIP
"""
from __future__ import annotations

import importlib.abc
import logging
import os
import sys

from placer._mute import muted

log = logging.getLogger(__name__)
_done = False


def hide_gpus() -> bool:
    """Make this process's TensorFlow runtime see no GPU (`tf.config.set_visible_devices([], "GPU")`). Returns
    False, with a warning, when the runtime had already started on its devices (e.g. placer used as a library
    inside a program that already ran TensorFlow on a GPU): then nothing can be changed."""
    global _done
    if _done:
        return True
    import tensorflow as tf

    try:
        if tf.config.list_physical_devices("GPU"):
            tf.config.set_visible_devices([], "GPU")
    except RuntimeError as e:   # "Visible devices cannot be modified after being initialized"
        log.warning("TensorFlow already runs on this process's GPUs, so placer's policy shares them: %s", e)
        return False
    _done = True
    return True


def _after_import(quiet: bool, hide: bool) -> None:
    """Once TensorFlow is imported: hide the GPUs (its CUDA probe quiet too) and, with quiet, mute its Python-level
    warnings (`tf.get_logger()` is the "tensorflow" logger) and absl's."""
    if hide:
        _quietly(hide_gpus) if quiet else hide_gpus()
    if not quiet:
        return
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)
    except ImportError:
        pass


def _quietly(fn) -> None:
    """Run fn with file descriptor 2 muted (TensorFlow's C++ start-up chatter: CUDA probing on a GPU-less host,
    absl banners); the chatter is replayed only if fn fails."""
    with muted(2):
        fn()


class _Loader(importlib.abc.Loader):
    """TensorFlow's own loader, then (after its package has run) the GPUs hidden; quiet when asked."""

    def __init__(self, inner, quiet: bool, hide: bool):
        self.inner, self.quiet, self.hide = inner, quiet, hide

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        _remove_finder()            # TensorFlow is being imported now: the hook has done its work
        if self.quiet:
            _quietly(lambda: self.inner.exec_module(module))
        else:
            self.inner.exec_module(module)
        _after_import(self.quiet, self.hide)

    def __getattr__(self, name):          # the rest of the loader protocol (resources, is_package, ...)
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, quiet: bool, hide: bool):
        self.quiet, self.hide = quiet, hide

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        # the hook stays until TensorFlow is really imported: `importlib.util.find_spec("tensorflow")` (a library
        # asking whether TensorFlow is there) must not use it up
        for finder in [f for f in sys.meta_path if not isinstance(f, _Finder)]:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, self.quiet, self.hide)
                return spec
        return None


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


def defer_import(quiet: bool = True, hide: bool = True) -> None:
    """When TensorFlow is first imported in this process (by anything), hide the GPUs from its runtime
    (`hide_gpus`) and, with quiet, mute its start-up chatter and Python-level warnings. If it is already
    imported, do that now."""
    if quiet:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if "tensorflow" in sys.modules:
        _after_import(quiet, hide)
        return
    _remove_finder()
    sys.meta_path.insert(0, _Finder(quiet, hide))
