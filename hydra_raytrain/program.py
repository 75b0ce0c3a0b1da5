"""What every command of the package does about its own end: ``python -m hydra_raytrain`` and its ``.predict``,
``.evaluate``, ``.export`` and ``.serve``, ``hydra-raytrain-check``. Import-light (nothing but the standard library)."""

from __future__ import annotations

import atexit
import gc

_ending_quickly = False


def end_quickly() -> None:
    """The process skips its interpreter's last garbage collection: at exit (an ``atexit`` handler) the objects
    alive then are frozen (``gc.freeze``) instead of traversed one last time. With torch, Ray and Hydra imported that
    traversal takes ~0.8 s of every command on 2 cores, for memory the operating system takes back anyway. The rest
    of the end runs as always: the libraries' own ``atexit`` handlers (Ray's shutdown, W&B's, MLflow's, logging's
    flush), the flushing of open files (but for one caught in a reference cycle), the modules' teardown. A test
    calling a command's ``main`` in its own process gets its pytest's end frozen the same way, nothing before it."""
    global _ending_quickly
    if not _ending_quickly:
        atexit.register(gc.freeze)
        _ending_quickly = True
