"""What every command of the package does about its own options and its end: ``python -m hydra_raytrain``
(``hydra-raytrain``) and its ``.predict``, ``.evaluate``, ``.export`` and ``.serve``, ``hydra-raytrain-check``.
Import-light (nothing but the standard library)."""

from __future__ import annotations

import argparse
import atexit
import gc

_ending_quickly = False


def end_quickly() -> None:
    """The process skips its interpreter's garbage collections at exit (after the ``atexit`` handlers, and during
    the modules' teardown): an ``atexit`` handler freezes the objects alive then (``gc.freeze``) instead. With torch,
    Ray and Hydra imported those traversals take ~0.6-1 s of every command on 2 cores, for memory the operating system
    takes back anyway. The libraries' own ``atexit`` handlers run as before (Ray's shutdown, W&B's, MLflow's,
    logging's flush, ``weakref.finalize``'s), and so do the standard streams' flush and the exit code. What no longer
    happens: finalizing an object that only a reference cycle keeps at exit (its ``__del__``, weakref callbacks, the
    buffer of a file it holds open): Python does not promise those at exit either, and the package closes its files
    itself; code of a user's own running in the driver should too. A test that calls a command's ``main`` inside the
    pytest process freezes that process's exit the same way, and nothing earlier."""
    global _ending_quickly
    if not _ending_quickly:
        atexit.register(gc.freeze)
        _ending_quickly = True


def at_least_one(text: str) -> int:
    """An option's whole number >= 1 (``type=`` of argparse), else argparse's one-line refusal naming the option,
    before anything starts."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number >= 1")
    return int(text)
