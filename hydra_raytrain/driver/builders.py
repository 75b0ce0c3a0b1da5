"""Pure functions from our config to Ray Train's own config objects (unit-tested without a cluster)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray.train import CheckpointConfig, DataConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

from hydra_raytrain.config import schema
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.driver.storage import is_uri
from hydra_raytrain.storage import retry


def scaling_config(scaling: schema.ScalingConfig) -> ScalingConfig:
    elastic = scaling.max_workers is not None and scaling.max_workers > scaling.num_workers
    return ScalingConfig(
        num_workers=(scaling.num_workers, scaling.max_workers) if elastic else scaling.num_workers,
        use_gpu=scaling.use_gpu,
        resources_per_worker=dict(scaling.resources_per_worker) if scaling.resources_per_worker else None,
        placement_strategy=scaling.placement_strategy,
    )


def torch_config(scaling: schema.ScalingConfig) -> Any:
    """``scaling.torch_config`` as Ray's TorchConfig; by default Ray's, but gloo where workers share a GPU
    (``resources_per_worker.GPU`` below 1): NCCL refuses two ranks on one device."""
    from ray.train.torch import TorchConfig

    settings = dict(scaling.torch_config or {})
    gpus = (scaling.resources_per_worker or {}).get("GPU", 1)
    if scaling.use_gpu and gpus < 1 and "backend" not in settings:
        settings["backend"] = "gloo"
    return TorchConfig(**settings)


def worker_env(cfg: Resolved, base: Mapping[str, str], pythonpath: str | None) -> dict[str, str]:
    """Every worker's environment: the runner's own variables, the driver's import path, what
    ``trainer.deterministic`` needs, then the user's ``scaling.worker_env`` (which wins)."""
    env = {**base}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if cfg.trainer.deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS; read when CUDA starts
    env.update({name: str(value) for name, value in (cfg.scaling.worker_env or {}).items()})
    return env


def failure_config(failure: schema.FailureConfig) -> FailureConfig:
    return FailureConfig(
        max_failures=failure.max_failures,
        controller_failure_limit=failure.controller_failure_limit,
        max_preemption_failures=failure.max_preemption_failures,
        preemption_grace_s=failure.preemption_grace_s,
    )


def checkpoint_config(checkpoint: schema.CheckpointConfig) -> CheckpointConfig:
    return CheckpointConfig(
        num_to_keep=checkpoint.num_to_keep,
        checkpoint_score_attribute=checkpoint.checkpoint_score_attribute,
        checkpoint_score_order=checkpoint.checkpoint_score_order,
    )


def run_config(
    cfg: Resolved,
    storage_path: str,
    name: str,
    callbacks: Sequence[Any] | None = None,
    worker_env: Mapping[str, str] | None = None,
) -> RunConfig:
    """``name``: the run's identity, computed from the config as given (the driver sizes workers afterwards). A URI
    storage is handed to Ray as a filesystem that retries its transient errors (``retry.py``)."""
    filesystem = None
    if is_uri(storage_path) and cfg.storage.retry_window_s > 0:
        filesystem, storage_path = retry.retrying(storage_path, cfg.storage.retry_window_s, name)
    return RunConfig(
        name=name,
        storage_path=storage_path,
        storage_filesystem=filesystem,
        failure_config=failure_config(cfg.failure),
        checkpoint_config=checkpoint_config(cfg.checkpoint),
        callbacks=list(callbacks or []),
        worker_runtime_env={"env_vars": dict(worker_env)} if worker_env else None,
        logging_config=LoggingConfig(log_level=cfg.ray.logging_level),
    )


class ValidationOnce(DataConfig):
    """Ray Train's DataConfig for a streamed dataset: ``train`` split equally (every rank takes as many steps),
    ``val`` split without dropping a row (every validation sample counted once)."""

    def __init__(self) -> None:
        super().__init__(datasets_to_split="all")

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        shards: list[dict[str, Any]] = [{} for _ in range(world_size)]
        for name, dataset in datasets.items():  # Ray Train V2 passes one per call
            if name != "val":
                for rank, shard in enumerate(
                    super().configure({name: dataset}, world_size, worker_handles, worker_node_ids, **kwargs)
                ):
                    shards[rank].update(shard)
                continue
            if dataset.name is None:
                dataset.set_name(name)
            dataset = dataset.copy(dataset)
            # What DataConfig.configure sets (a private helper of Ray's since 2.5x; its public default before)
            resolve = getattr(self, "_resolve_execution_options", None)
            dataset.context.execution_options = resolve(name) if resolve else self.default_ingest_options()
            for rank, split in enumerate(dataset.streaming_split(world_size, equal=False)):
                shards[rank][name] = split
        return shards
