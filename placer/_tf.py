"""The search process's own TensorFlow stays off the GPUs.

The policy, the cost estimate and the simulator run in the search process; the graphs being measured run in
child processes (`placer.runtime`), which need every GPU's memory. TensorFlow takes most of a GPU's memory as
soon as its runtime starts on it, so the search process hides the GPUs from its own runtime before that
happens. The child processes are not affected (they are other processes; no environment variable is changed).
"""
from __future__ import annotations

import logging

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
