"""The one door to Ray, for every command (train, a sweep, predict, serve): one rule for where Ray is, and what
a local cluster of the command's own inherits.

Where: the command's address (``ray.address``, ``--address``), else the environment's ``RAY_ADDRESS`` (Ray's own
convention: every ``ray job submit`` job has it), else a local cluster of the command's own, sized by the caller
(``local`` in either means that too: ``config.schema.cluster_address``). A joined address where nothing listens is
refused in seconds, not after ray.init's minutes of retries.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import ray

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.schema import RAY_ADDRESS_ENV, cluster_address
from hydra_raytrain.runtime.host import machine_cores


def reach_ray(
    address: str | None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    *,
    logging_level: str = "WARNING",
    include_dashboard: bool | None = None,
    runtime_env: dict[str, Any] | None = None,
    given_as: str = "ray.address",
) -> str | None:
    """Join the cluster at ``address`` (given, else ``RAY_ADDRESS``), or start a local one of ``num_cpus`` CPUs
    (and ``num_gpus``; None: what Ray finds) for this command. Returns the address joined, None for a local
    cluster. A ConfigError naming where the address came from (``given_as``, or RAY_ADDRESS) when no cluster
    answers there."""
    global _started_here
    address = cluster_address(address, os.environ)
    common: dict[str, Any] = dict(logging_level=logging_level, include_dashboard=include_dashboard)
    if address:
        check_reachable(address, given_as=given_as)
        joined_cluster_environment()
        _started_here = None
        try:
            ray.init(address=address, runtime_env=runtime_env, **common)
        except ConnectionError as error:  # "auto" with no cluster on this machine, or one that went away
            raise ConfigError(
                address_key(address, given_as), address, f"no Ray cluster to join: {error}", RAY_ADDRESS_VALID
            ) from None
        return address
    runtime_env = local_runtime_env(runtime_env, include_dashboard)
    local = dict(address="local", num_cpus=num_cpus, num_gpus=num_gpus, runtime_env=runtime_env, **common)
    options = local_cluster_environment(include_dashboard)
    started = ray.init(**local, **options)
    if options and not started.dashboard_url:
        # Another process took the port between the check and the dashboard's start (two commands started
        # together): Ray then runs on without a dashboard, so without the state API this cluster's processes are
        # pointed at. Start again on a port taken now.
        ray.shutdown()
        ray.init(**local, **local_cluster_environment(include_dashboard, port=free_port()))
    _started_here = ray.get_runtime_context().gcs_address
    return None


RAY_ADDRESS_VALID = (
    "the HOST:PORT of a running cluster's head (what `ray start --head` prints), auto for the cluster "
    "started on this machine, local for a local cluster of the run's own, or null (the cluster RAY_ADDRESS names, "
    "else a local cluster)"
)


def address_key(address: str, given_as: str = "ray.address") -> str:
    """Where a joined cluster's address came from, for messages: the environment's RAY_ADDRESS, or ray.address."""
    return RAY_ADDRESS_ENV if os.environ.get(RAY_ADDRESS_ENV) == address else given_as


def check_reachable(address: str, timeout_s: float = 3.0, given_as: str = "ray.address") -> None:
    """A HOST:PORT (or ray://HOST:PORT) where nothing listens is refused in seconds: ray.init itself retries the
    connection for minutes, printing Ray's GCS errors. "auto" and "local" are Ray's own words, left to it."""
    host, _, port = address.split("://")[-1].rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if address in ("auto", "local") or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ConfigError(
            address_key(address, given_as),
            address,
            f"no Ray cluster answers there ({error.strerror or error}).",
            RAY_ADDRESS_VALID,
        ) from None


_started_here: str | None = None  # the GCS address of the last local cluster this process started


def started_here() -> bool:
    """Whether the Ray this process is connected to is a local cluster it started (for an earlier job of a
    sequential multirun), not one that user code started or joined since: its runs are sized like the first."""
    return ray.is_initialized() and _started_here == ray.get_runtime_context().gcs_address


def local_cluster_environment(include_dashboard: bool | None, port: int | None = None) -> dict[str, Any]:
    """What a new local cluster's processes inherit from this one's environment, and its dashboard port.

    - Ray's state API (Ray Train's placement-group cleaner calls it in every run) finds "the" cluster by looking
      for Ray processes on this machine, and fails with "Found multiple active Ray instances" (a traceback per
      run on the console, and no clean-up) when another Ray instance runs here: a second training command, a
      `ray start --head`. The dashboard, which serves that API, gets ``port`` or a port chosen here (Ray's 8265
      when free), and RAY_API_SERVER_ADDRESS names it.
    - One node and no autoscaler: nothing drains a node, so Ray Train's PreemptionWatcher has nothing to watch
      (and logs an ERROR line about its restart arguments in every run): off, unless the environment sets
      RAY_TRAIN_ENABLE_PREEMPTION_WATCHER. Ray Train reads the variable from this process's environment at each
      run; a cluster joined later in the same process gets the watcher back (``joined_cluster_environment``).
    - Ray Data logs at WARNING (RAY_DATA_LOG_LEVEL), unless the environment sets it, and lists a Parquet read's
      files with one footer-reading actor, not 32 (``few_footer_readers``).
    - Ray starts worker processes at niceness 15 (RAY_worker_niceness): on a busy machine the driver, Ray's own
      processes and anything else running there take the cores before the training workers do (measured on 2
      cores: a hand-written Ray Train loop 9% slower than at 0). The cluster is this run's: workers at 0, unless
      the environment sets the variable.
    - Ray's raylet starts at most min(cores, CPUs) worker processes at a time: two on a 2-core machine, where a
      2-worker run's controller, workers and helper actors (six processes) then start in waves, each process
      mostly waiting on Ray, not on a core (measured on 2 cores: 8 actors ready in 3.8-4.5 s, 1.6-1.8 s at 8;
      the default config's 2-worker run 24.6 s -> 19.6 s, the mean of 12). At least 8 at a time
      (RAY_worker_maximum_startup_concurrency), or the cores this command may run on where more, unless the
      environment sets it.
    """
    global _watcher_turned_off
    if WATCHER_ENV not in os.environ:
        os.environ[WATCHER_ENV], _watcher_turned_off = "0", True
    os.environ.setdefault(NICENESS_ENV, "0")
    os.environ.setdefault(STARTUP_CONCURRENCY_ENV, str(max(machine_cores(), 8)))
    # Ray Data's tasks and actors (a streamed dataset) log two INFO lines per split and epoch to the console.
    os.environ.setdefault("RAY_DATA_LOG_LEVEL", "WARNING")
    few_footer_readers()
    if include_dashboard is False:
        return {}
    port = port or (DASHBOARD_PORT if port_is_free(DASHBOARD_PORT) else free_port())
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    return {"dashboard_port": port}


def joined_cluster_environment() -> None:
    """A joined cluster has nodes to drain: Ray Train's PreemptionWatcher back on where a local cluster started
    earlier in this process turned it off (a notebook, a multirun), not where the user did."""
    global _watcher_turned_off
    if _watcher_turned_off:
        os.environ.pop(WATCHER_ENV, None)
        _watcher_turned_off = False


def local_runtime_env(runtime_env: dict[str, Any] | None, include_dashboard: bool | None) -> dict[str, Any] | None:
    """A new local cluster's job runtime_env: the user's ``ray.runtime_env``, and without the dashboard (so without
    Ray's state API, which Ray Train's placement-group cleaner asks every few seconds, warning each time) a
    ``worker_process_setup_hook`` that keeps that cleaner to errors: it has nothing to clean on a cluster that
    ends with the command. A hook of the user's own wins."""
    if include_dashboard is not False:
        return runtime_env
    return {"worker_process_setup_hook": QUIET_CLEANER_HOOK, **(runtime_env or {})}


DASHBOARD_PORT = 8265  # Ray's default
WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
NICENESS_ENV = "RAY_worker_niceness"  # read by the raylet when it starts
STARTUP_CONCURRENCY_ENV = "RAY_worker_maximum_startup_concurrency"  # the raylet: worker processes started at once
FOOTER_READERS_ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"  # Ray Data: a Parquet read's footer-reading actors
_watcher_turned_off = False  # this process set WATCHER_ENV for a local cluster (not the user)
QUIET_CLEANER_HOOK = "hydra_raytrain.storage.logfiles.quiet_placement_group_cleaner"


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def few_footer_readers() -> None:
    """Before a local cluster starts (its processes inherit the environment): Ray Data lists a Parquet read's
    files with a pool of footer-reading actors, 32 by default and a new process each, sized for thousands of files
    on a large cluster, and a streamed dataset is read again every epoch. One machine needs one (it keeps 128
    reads in flight): measured on 2 cores, a 12-epoch streamed Parquet run's test 71 -> 58 s, a 1,000-row predict
    ~1 s sooner. Unless the environment sets it."""
    os.environ.setdefault(FOOTER_READERS_ENV, "1")
