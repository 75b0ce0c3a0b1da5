"""Facts of the machine and process a command runs in, for every floor (standard library only): where a config's
``_target_`` imports from, and the cores this process may use."""

from __future__ import annotations

import os


def import_path() -> str:
    """The driver's folder and PYTHONPATH: where a config's ``_target_`` (a task in the user's folder) imports
    from. Ray's processes do not inherit the folder, so workers (and sweep trials, predict's actors, serve's
    replicas) get it in PYTHONPATH."""
    return os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))


def machine_cores() -> int:
    """The cores this command may run on (its CPU affinity, as ``taskset`` or a container's cpuset limit it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


TIMELINE_ENV = "HYDRA_RAYTRAIN_TIMELINE"  # a file: where a run's start-up goes (benchmarks/throughput.py)


def mark(event: str) -> None:
    """With ``HYDRA_RAYTRAIN_TIMELINE=<file>`` set (on a local cluster the workers inherit it), one line
    ``<unix time> <event>`` appended to that file: the driver marks its config composed, checked and Ray reached,
    rank 0 its train function entered and its setup done. Nothing otherwise."""
    path = os.environ.get(TIMELINE_ENV)
    if path:
        import time

        with open(path, "a") as file:
            file.write(f"{time.time():.3f} {event}\n")
