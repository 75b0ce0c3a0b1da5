"""Sizing a run for Ray: a local cluster sized for the run (started by ``runtime/reach.py``, the one door to Ray), or
the run checked against a cluster it joins; refuse what cannot be served.

How a local cluster is sized: Ray schedules by *logical* resources. A run asking for more CPUs than the
machine has cores (4 workers x 1 CPU on 2 cores) gets a local cluster that promises that many CPUs, so the
workers share the cores (each worker keeps one compute thread, so they interleave rather than thrash). The
promise is capped at ``ray.max_cpu_oversubscription`` CPUs per core (4 by default), and the workers' memory
must fit in what the machine has free: past either, the run is refused before Ray starts.
An existing cluster (``ray.address``) is never oversubscribed: the run must fit its total resources.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import ray

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.schema import RayConfig, ScalingConfig
from hydra_raytrain.driver.builders import scaling_config
from hydra_raytrain.runtime.host import machine_cores
from hydra_raytrain.runtime.internals import resources_per_worker
from hydra_raytrain.runtime.reach import address_key, check_reachable, reach_ray, started_here

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


def local_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def free_memory_bytes() -> int:
    import psutil

    return psutil.virtual_memory().available


def connect(ray_cfg: RayConfig, request: ResourceRequest) -> None:
    """Start or join Ray (``reach_ray``), then check the run fits. A Ray already initialised in this process is
    reused (notebooks, tests, and every job of a sequential multirun share one cluster)."""
    if ray.is_initialized():
        check_fits(request, ray.cluster_resources(), "the connected Ray cluster")
        return
    num_cpus = check_request(ray_cfg, request)
    joined = reach_ray(
        ray_cfg.address or "local",  # resolved already (RAY_ADDRESS applied): None is a local cluster
        num_cpus,
        None if ray_cfg.address else local_gpu_count(),
        logging_level=ray_cfg.logging_level,
        include_dashboard=ray_cfg.include_dashboard,
        runtime_env=dict(ray_cfg.runtime_env) or None,
    )
    if joined:
        where = f"the cluster at {address_key(joined)}={joined}"
        check_fits(request, ray.cluster_resources(), where)
        print(f"Ray: joined {where}: {describe_cluster()}", flush=True)


def local_cpus(ray_cfg: RayConfig, data_cpus: int = 0) -> int:
    """The CPUs the workers of a local cluster of this command share: the running cluster's when it was started
    for an earlier job, else ``ray.num_cpus``, less the CPUs Ray Data's tasks keep (``data_cpus``); never more than
    the cores this command may run on (a new cluster of its own promises Ray Data's CPUs beyond the cores)."""
    cores = machine_cores()
    if started_here():
        return max(1, min(int(ray.cluster_resources().get("CPU", 1)) - data_cpus, cores))
    return max(1, min(ray_cfg.num_cpus - data_cpus, cores)) if ray_cfg.num_cpus else cores


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
