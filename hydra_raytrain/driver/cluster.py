"""Reaching Ray: start a local cluster sized for the run, or connect to one; refuse what cannot be served.

How a local cluster is sized: Ray schedules by *logical* resources. A run asking for more CPUs than the
machine has cores (4 workers x 1 CPU on 2 cores) gets a local cluster that promises that many CPUs, so the
workers share the cores (each worker keeps one compute thread, so they interleave rather than thrash). The
promise is capped at ``ray.max_cpu_oversubscription`` CPUs per core (4 by default), and the workers' memory
must fit in what the machine has free: past either, the run is refused before Ray starts.
An existing cluster (``ray.address``) is never oversubscribed: the run must fit its total resources.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.schema import RAY_ADDRESS_ENV, RayConfig, ScalingConfig
from hydra_raytrain.data import streamed
from hydra_raytrain.driver.builders import scaling_config
from hydra_raytrain.host import machine_cores
from hydra_raytrain.internals import resources_per_worker

# A CPU worker process with torch and Ray imported holds about this much memory before any model or data.
WORKER_MEMORY_BYTES = 700 * 2**20


@dataclass(frozen=True)
class ResourceRequest:
    num_workers: int  # what must fit (the minimum, when elastic)
    per_worker: dict[str, float]
    max_workers: int | None = None  # elastic: what a new local cluster is sized for
    data_cpus: int = 0  # CPUs left free for Ray Data's tasks (a streamed dataset): it stalls without one

    @property
    def total(self) -> dict[str, float]:
        total = {name: amount * self.num_workers for name, amount in self.per_worker.items() if amount}
        if self.data_cpus:
            total["CPU"] = total.get("CPU", 0.0) + self.data_cpus
        return total

    @property
    def largest(self) -> ResourceRequest:
        return ResourceRequest(max(self.num_workers, self.max_workers or 0), self.per_worker, None, self.data_cpus)

    def describe(self) -> str:
        each = ", ".join(f"{amount:g} {name}" for name, amount in self.per_worker.items() if amount)
        data = f" + {self.data_cpus:g} CPU for Ray Data" if self.data_cpus else ""
        return f"{self.num_workers} workers x {{{each}}}{data}"


def resource_request(scaling: ScalingConfig, data_cpus: int = 0) -> ResourceRequest:
    """What the run's workers ask Ray for, computed by Ray's own ScalingConfig (local mode asks for nothing), and
    the CPUs a streamed dataset's tasks need beside them."""
    per_worker = resources_per_worker(scaling_config(scaling))
    return ResourceRequest(
        scaling.num_workers, per_worker, scaling.max_workers, data_cpus if scaling.num_workers else 0
    )


def machine_share(scaling: ScalingConfig, cores: int) -> ScalingConfig:
    """For a new local cluster: each worker's share of the machine's cores as ``resources_per_worker.CPU`` (with
    ``max_workers``, the share of the largest group), unless the config sets the CPUs. Ray sets a worker's
    OMP_NUM_THREADS, and the recipe torch's threads and loader processes, from this."""
    workers = max(scaling.num_workers, scaling.max_workers or 0)
    resources = dict(scaling.resources_per_worker or {})
    share = cores // workers if workers else 1
    if "CPU" in resources or share <= 1:
        return scaling
    return dataclasses.replace(scaling, resources_per_worker={**resources, "CPU": share})


def plan_local_cpus(request: ResourceRequest, cores: int, free_memory: int, ray_cfg: RayConfig) -> int:
    """How many logical CPUs a new local cluster gets, or a ConfigError when the machine cannot serve the run."""
    request = request.largest
    wanted = request.total.get("CPU", 0.0)
    limit = int(cores * ray_cfg.max_cpu_oversubscription)
    if wanted > limit:
        raise ConfigError(
            "scaling.num_workers",
            request.num_workers,
            f"{request.describe()} needs {wanted:g} CPUs; this machine has {cores} cores and a local cluster "
            f"promises at most {limit} "
            f"(ray.max_cpu_oversubscription={ray_cfg.max_cpu_oversubscription:g} per core).",
            f"scaling.num_workers <= {limit // max(1, int(request.per_worker.get('CPU', 1)))}, fewer CPUs in "
            f"scaling.resources_per_worker, or a bigger cluster via ray.address=HOST:PORT.",
        )
    memory = request.num_workers * WORKER_MEMORY_BYTES
    if memory > free_memory:
        most = max(0, free_memory // WORKER_MEMORY_BYTES)
        raise ConfigError(
            "scaling.num_workers",
            request.num_workers,
            f"{request.num_workers} worker processes need about {memory / 2**30:.1f} GiB; this machine has "
            f"{free_memory / 2**30:.1f} GiB free.",
            f"scaling.num_workers <= {most}, or a bigger cluster via ray.address=HOST:PORT.",
        )
    planned = ray_cfg.num_cpus or max(cores, int(-(-wanted // 1)))
    if planned < wanted:
        raise ConfigError(
            "ray.num_cpus", ray_cfg.num_cpus, f"{request.describe()} needs {wanted:g} CPUs.", f">= {wanted:g}"
        )
    return planned


def check_fits(request: ResourceRequest, available: Mapping[str, float], where: str) -> None:
    """Refuse a run whose workers can never be placed, instead of letting Ray wait for them forever."""
    for name, amount in request.total.items():
        have = float(available.get(name, 0.0))
        if amount > have:
            key = "scaling.use_gpu" if name == "GPU" else "scaling.num_workers"
            value = True if name == "GPU" else request.num_workers
            raise ConfigError(
                key,
                value,
                f"{request.describe()} needs {amount:g} {name}; {where} has {have:g}.",
                "a request within those resources (scaling.num_workers, scaling.resources_per_worker"
                + (", scaling.use_gpu=false" if name == "GPU" else "")
                + "), or another cluster via ray.address.",
            )


RAY_ADDRESS_VALID = (
    "the HOST:PORT of a running cluster's head (what `ray start --head` prints), auto for the cluster "
    "started on this machine, local for a local cluster of the run's own, or null (the cluster RAY_ADDRESS names, "
    "else a local cluster)"
)


def address_key(address: str) -> str:
    """Where a joined cluster's address came from, for messages: the environment's RAY_ADDRESS, or ray.address."""
    return RAY_ADDRESS_ENV if os.environ.get(RAY_ADDRESS_ENV) == address else "ray.address"


def check_reachable(address: str, timeout_s: float = 3.0) -> None:
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
            address_key(address),
            address,
            f"no Ray cluster answers there ({error.strerror or error}).",
            RAY_ADDRESS_VALID,
        ) from None


def local_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def free_memory_bytes() -> int:
    import psutil

    return psutil.virtual_memory().available


_started_here: str | None = None  # the GCS address of the last local cluster this process started


def started_here() -> bool:
    """Whether the Ray this process is connected to is a local cluster it started (for an earlier job of a
    sequential multirun), not one that user code started or joined since: its runs are sized like the first."""
    return ray.is_initialized() and _started_here == ray.get_runtime_context().gcs_address


def local_cpus(ray_cfg: RayConfig, data_cpus: int = 0) -> int:
    """The CPUs the workers of a local cluster of this command share: the running cluster's when it was started
    for an earlier job, else ``ray.num_cpus``, less the CPUs Ray Data's tasks keep (``data_cpus``); never more than
    the cores this command may run on (a new cluster of its own promises Ray Data's CPUs beyond the cores)."""
    cores = machine_cores()
    if started_here():
        return max(1, min(int(ray.cluster_resources().get("CPU", 1)) - data_cpus, cores))
    return max(1, min(ray_cfg.num_cpus - data_cpus, cores)) if ray_cfg.num_cpus else cores


def connect(ray_cfg: RayConfig, request: ResourceRequest) -> None:
    """Start or join Ray, then check the run fits. A Ray already initialised in this process is reused
    (notebooks, tests, and every job of a sequential multirun share one cluster)."""
    global _started_here
    if ray.is_initialized():
        check_fits(request, ray.cluster_resources(), "the connected Ray cluster")
        return
    runtime_env = dict(ray_cfg.runtime_env) or None
    common = dict(logging_level=ray_cfg.logging_level, include_dashboard=ray_cfg.include_dashboard)
    num_cpus = check_request(ray_cfg, request)
    if ray_cfg.address:
        joined_cluster_environment()
        _started_here = None
        try:
            ray.init(address=ray_cfg.address, runtime_env=runtime_env, **common)
        except ConnectionError as error:  # "auto" with no cluster on this machine, or one that went away
            raise ConfigError(
                address_key(ray_cfg.address), ray_cfg.address, f"no Ray cluster to join: {error}", RAY_ADDRESS_VALID
            ) from None
        where = f"the cluster at {address_key(ray_cfg.address)}={ray_cfg.address}"
        check_fits(request, ray.cluster_resources(), where)
        print(f"Ray: joined {where}: {describe_cluster()}", flush=True)
        return
    gpus = local_gpu_count()
    runtime_env = local_runtime_env(runtime_env, ray_cfg.include_dashboard)
    local = dict(address="local", num_cpus=num_cpus, num_gpus=gpus, runtime_env=runtime_env, **common)
    options = local_cluster_environment(ray_cfg.include_dashboard)
    started = ray.init(**local, **options)
    if options and not started.dashboard_url:
        # Another process took the port between the check and the dashboard's start (two commands started
        # together): Ray then runs on without a dashboard, so without the state API this cluster's processes are
        # pointed at. Start again on a port taken now.
        ray.shutdown()
        ray.init(**local, **local_cluster_environment(ray_cfg.include_dashboard, port=free_port()))
    _started_here = ray.get_runtime_context().gcs_address


def describe_cluster() -> str:
    """The connected cluster's live nodes and resources: "2 nodes, 8 CPUs, 1 GPU"."""
    nodes = len([node for node in ray.nodes() if node["Alive"]])
    total = ray.cluster_resources()
    counts = [(nodes, "node"), (int(total.get("CPU", 0)), "CPU"), (int(total.get("GPU", 0)), "GPU")]
    return ", ".join(f"{count} {name}{'s' if count != 1 else ''}" for count, name in counts if count or name != "GPU")


def check_request(ray_cfg: RayConfig, request: ResourceRequest) -> int | None:
    """What can be checked before starting or joining Ray: a joined cluster's address answers; this machine can
    serve a local cluster for the request (its GPUs, CPUs and memory). Returns the local cluster's CPUs."""
    if ray_cfg.address:
        check_reachable(ray_cfg.address)
        return None
    if request.total.get("GPU"):
        check_fits(
            ResourceRequest(request.num_workers, {"GPU": request.per_worker["GPU"]}),
            {"GPU": local_gpu_count()},
            "this machine",
        )
    return plan_local_cpus(request, machine_cores(), free_memory_bytes(), ray_cfg)


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
      run; a cluster joined later in the same process gets the watcher back (``connect``).
    - Ray Data logs at WARNING (RAY_DATA_LOG_LEVEL), unless the environment sets it, and lists a Parquet read's
      files with one footer-reading actor, not 32 (``streamed.few_footer_readers``).
    - Ray starts worker processes at niceness 15 (RAY_worker_niceness): on a busy machine the driver, Ray's own
      processes and anything else running there take the cores before the training workers do (measured on 2
      cores: a hand-written Ray Train loop 9% slower than at 0). The cluster is this run's: workers at 0, unless
      the environment sets the variable.
    """
    global _watcher_turned_off
    if WATCHER_ENV not in os.environ:
        os.environ[WATCHER_ENV], _watcher_turned_off = "0", True
    os.environ.setdefault(NICENESS_ENV, "0")
    # Ray Data's tasks and actors (a streamed dataset) log two INFO lines per split and epoch to the console.
    os.environ.setdefault("RAY_DATA_LOG_LEVEL", "WARNING")
    streamed.few_footer_readers()
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
_watcher_turned_off = False  # this process set WATCHER_ENV for a local cluster (not the user)
QUIET_CLEANER_HOOK = "hydra_raytrain.logfiles.quiet_placement_group_cleaner"


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


def state_api_problem(timeout_s: float = 60) -> str | None:
    """Why a process in the cluster cannot reach Ray's state API (None when it can), asked from such a process on
    this node, as Ray Train's placement-group cleaner asks it: the dashboard serves the API."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def reach() -> str | None:
        from ray.util.state import list_nodes

        try:
            list_nodes(limit=1, timeout=10)
        except Exception as error:
            return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return None

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    try:
        return ray.get(reach.options(scheduling_strategy=here).remote(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        return f"no answer in {timeout_s:g} s"
