"""Typed schemas of the framework's own settings, registered in Hydra's ConfigStore.

Hydra type-checks every override against these dataclasses while composing (``scaling.num_workers=two`` and
``trainer.max_epoch=3`` fail there). Range checks live in ``__post_init__``, which runs when
:func:`hydra_raytrain.preflight.validate` turns the composed config into objects.

Models, datasets, optimizers, schedulers and tasks stay free-form ``_target_`` nodes; they are checked
against their callables' signatures instead. Names follow Ray's and PyTorch's own.

These dataclasses are the one source of the typed sections' defaults: conf/ has no option files for them
(``python -m hydra_raytrain --cfg job`` prints the composed values). Each docstring opens with its usage.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.config.finetuning import FinetuneConfig, PeftConfig


def _mapping(key: str, value: Any, example: str) -> None:
    if value is not None and not isinstance(value, dict):
        raise ConfigError(key, value, "must be a mapping.", f"e.g. '{example}', or null")


def _at_least(key: str, value: float | None, low: float) -> None:
    if value is not None and value < low:
        raise ConfigError(key, value, f"must be >= {low}.")


TORCH_CONFIG_KEYS = ("backend", "init_method", "timeout_s")  # ray.train.torch.TorchConfig's fields


@dataclass
class ScalingConfig:
    """Ray Train's workers (``ray.train.ScalingConfig``)::

        python -m hydra_raytrain scaling.num_workers=4
        python -m hydra_raytrain scaling.num_workers=1 scaling.max_workers=4 trainer.batch_size=48   # elastic
        python -m hydra_raytrain scaling.use_gpu=true scaling.resources_per_worker='{GPU: 1, CPU: 4}'

    ``num_workers=0`` runs Ray Train's local mode (no Ray, one process), for debugging. With ``max_workers``,
    training is elastic: Ray starts as many workers as fit (at least ``num_workers``) and resizes the group after
    failures; the global batch size stays what ``trainer.batch_size`` says."""

    num_workers: int = 2
    max_workers: int | None = None  # set: elastic, Ray's num_workers=(num_workers, max_workers)
    use_gpu: bool = False
    # None: Ray's default, {"CPU": 1} or {"GPU": 1} with use_gpu. Typed Any because OmegaConf 2.3 cannot merge a
    # command-line dict into an Optional[Dict] that is None; __post_init__ checks the shape instead.
    resources_per_worker: Any = None
    placement_strategy: str = "PACK"
    # Environment variables of every worker process (RaySGD's initialization_hook role), merged into Ray's
    # worker runtime_env; for more (pip, working_dir) use ray.runtime_env. The mappings here are typed Any
    # (null by default) so that a command-line dict replaces them (OmegaConf cannot merge into a struct {}).
    worker_env: Any = None
    # ray.train.torch.TorchConfig's arguments (backend, init_method, timeout_s), e.g. '{backend: gloo}'. None: Ray's
    # (nccl on GPU workers, gloo on CPU ones), except gloo where workers share a GPU (NCCL refuses two ranks on one)
    torch_config: Any = None

    def __post_init__(self) -> None:
        _at_least("scaling.num_workers", self.num_workers, 0)
        if self.max_workers is not None and (self.num_workers < 1 or self.max_workers < self.num_workers):
            raise ConfigError(
                "scaling.max_workers",
                self.max_workers,
                f"elastic training needs 1 <= scaling.num_workers (now {self.num_workers}) <= scaling.max_workers.",
                f"scaling.max_workers >= {max(1, self.num_workers)}, or null for a fixed size.",
            )
        strategies = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
        if self.placement_strategy not in strategies:
            raise ConfigError(
                "scaling.placement_strategy", self.placement_strategy, "unknown strategy.", ", ".join(strategies)
            )
        _mapping("scaling.worker_env", self.worker_env, "{OMP_NUM_THREADS: 1}")
        _mapping("scaling.torch_config", self.torch_config, "{backend: gloo}")
        for key in self.torch_config or {}:
            if key not in TORCH_CONFIG_KEYS:
                raise ConfigError(
                    f"scaling.torch_config.{key}",
                    self.torch_config[key],
                    f"ray.train.torch.TorchConfig has no {key!r}{did_you_mean(key, TORCH_CONFIG_KEYS)}.",
                    ", ".join(TORCH_CONFIG_KEYS),
                )
        resources = self.resources_per_worker
        if resources is not None and not isinstance(resources, dict):
            raise ConfigError(
                "scaling.resources_per_worker",
                resources,
                "must be a mapping of resource name to amount.",
                "e.g. '{CPU: 2}' or '{GPU: 1, CPU: 4}'",
            )
        for name, amount in (resources or {}).items():
            if isinstance(amount, bool) or not isinstance(amount, (int, float)):
                raise ConfigError(f"scaling.resources_per_worker.{name}", amount, "must be a number.")
            _at_least(f"scaling.resources_per_worker.{name}", amount, 0)


@dataclass
class StorageConfig:
    """Where Ray keeps the run's results and checkpoints (``RunConfig(storage_path, name)``)::

    python -m hydra_raytrain storage.path=s3://bucket/prefix   # credentials and endpoint from AWS_* variables
    python -m hydra_raytrain storage.path=/mnt/nfs/ray storage.shared_filesystem=true   # multi-node, shared
    """

    path: str | None = None  # None: <run dir>/ray_storage. A shared path or URI (s3://...) on multi-node clusters.
    name: str | None = None  # None: derived from the config, so identical configs share it and others never do.
    shared_filesystem: bool = (
        False  # a local-looking path that every node mounts (NFS, ...): allowed on multi-node clusters
    )
    # A URI storage's transient errors (network away, 5xx, throttling) are retried for this long from an outage's
    # first failure, then the run stops, resumable; 0: not retried. A local path is never retried.
    retry_window_s: float = 600.0

    def __post_init__(self) -> None:
        _at_least("storage.retry_window_s", self.retry_window_s, 0)
        if self.name is not None and (str(self.name).strip() in ("", ".", "..") or {"/", "\\"} & set(str(self.name))):
            problem = (
                "names one folder inside storage.path (run.resume=never deletes it): no path separator, '.' or '..'."
            )
            raise ConfigError("storage.name", self.name, problem, "a plain name, e.g. my-run")


# Errors that repeat when the same code meets the same config and data: retrying them costs a start-up each and
# ends the same way. Regular expressions searched in "<ExceptionType>: <message>" of each worker's error.
NOT_RETRIED = (
    r"^(TypeError|ValueError|AttributeError|KeyError|IndexError|NameError|UnboundLocalError|NotImplementedError"
    r"|AssertionError|ZeroDivisionError|ImportError|ModuleNotFoundError|SyntaxError|RecursionError"
    r"|FileNotFoundError|IsADirectoryError|NotADirectoryError|PermissionError|InstantiationException"
    r"|ConfigError):",
    # torch's shape and dtype mismatches (RuntimeError)
    r"^RuntimeError: .*(shapes cannot be multiplied|size mismatch|must match the size of tensor|Given groups="
    r"|expected scalar type|Error\(s\) in loading state_dict|Expected all tensors to be on the same device)",
    r"^OutOfMemoryError: CUDA out of memory",  # the same batch will not fit next time either
)


@dataclass
class FailureConfig:
    """Worker-failure handling (``ray.train.FailureConfig``)::

        python -m hydra_raytrain failure.max_failures=3
        python -m hydra_raytrain failure.max_failures=3 'failure.retry_on=[CUDA out of memory]'

    Ray's default controller limit (-1) retries forever when resources never come; ours is finite. A worker
    that raises an error matching ``not_retried`` (and no ``retry_on`` pattern) ends the run at once instead of
    being retried; a worker process that died (killed, out of host memory, its node lost) is always retried.
    Both are lists of regular expressions searched in ``"<ExceptionType>: <message>"``."""

    max_failures: int = 0
    controller_failure_limit: int = 3
    not_retried: list[str] = field(default_factory=lambda: list(NOT_RETRIED))
    retry_on: list[str] = field(default_factory=list)
    # A drained node's workers gone before the run stopped (docs/resume.md#preemption): Ray's own restarts.
    max_preemption_failures: int = -1  # Ray's default: every preemption restarts from the latest checkpoint
    preemption_grace_s: float = 0.0  # past a drain's deadline, for the drain's checkpoint to finish storing

    def __post_init__(self) -> None:
        _at_least("failure.max_failures", self.max_failures, -1)
        _at_least("failure.controller_failure_limit", self.controller_failure_limit, 0)
        _at_least("failure.max_preemption_failures", self.max_preemption_failures, -1)
        _at_least("failure.preemption_grace_s", self.preemption_grace_s, 0)
        for key in ("not_retried", "retry_on"):
            for pattern in getattr(self, key):
                try:
                    re.compile(pattern)
                except re.error as error:
                    raise ConfigError(f"failure.{key}", pattern, f"not a regular expression ({error}).") from None


UPLOAD_MODES = ("ASYNC", "SYNC")  # of ray.train.CheckpointUploadMode; NO_UPLOAD would store nothing


@dataclass
class CheckpointConfig:
    """Full-state checkpoints (models, optimizers, schedulers, epoch, every rank's RNG) every ``every_n_epochs``
    epochs and at the end, and mid-epoch ones every ``every_n_steps`` optimizer steps and/or ``every_n_minutes``
    (rank 0's clock, decided the same on every rank); the rest maps onto ``ray.train.CheckpointConfig`` (which of
    them Ray keeps)::

        python -m hydra_raytrain checkpoint.every_n_epochs=2 checkpoint.num_to_keep=2 \\
            checkpoint.checkpoint_score_attribute=val_accuracy
        python -m hydra_raytrain checkpoint.every_n_steps=500 checkpoint.every_n_minutes=30

    A restarted worker group, or a re-run of the command, resumes from the latest; from a mid-epoch checkpoint, at
    the same place in the same epoch (its position in the epoch's order, the epoch's partial metric sums, every
    rank's RNG), so the run ends as the uninterrupted run would have.

    ``checkpoint_upload_mode`` is ``ray.train.report``'s: ``ASYNC`` (the default) stores a checkpoint in the background
    while training goes on, one upload at a time; ``SYNC`` waits for it. Either way Ray counts a checkpoint only once
    every rank's share is stored: complete or not counted."""

    every_n_epochs: int = 1
    every_n_steps: int | None = None
    every_n_minutes: float | None = None
    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None  # a reported metric, e.g. val_accuracy
    checkpoint_score_order: str = "max"
    checkpoint_upload_mode: str = "ASYNC"  # ray.train.CheckpointUploadMode: ASYNC or SYNC

    def __post_init__(self) -> None:
        _at_least("checkpoint.every_n_epochs", self.every_n_epochs, 1)
        _at_least("checkpoint.every_n_steps", self.every_n_steps, 1)
        if self.every_n_minutes is not None and self.every_n_minutes <= 0:
            raise ConfigError("checkpoint.every_n_minutes", self.every_n_minutes, "must be > 0.", "e.g. 30, or null")
        _at_least("checkpoint.num_to_keep", self.num_to_keep, 1)
        if self.checkpoint_score_order not in ("max", "min"):
            raise ConfigError(
                "checkpoint.checkpoint_score_order", self.checkpoint_score_order, "unknown order.", "max, min"
            )
        if self.checkpoint_upload_mode not in UPLOAD_MODES:
            raise ConfigError(
                "checkpoint.checkpoint_upload_mode",
                self.checkpoint_upload_mode,
                "unknown mode.",
                ", ".join(UPLOAD_MODES),
            )


@dataclass
class DataLoaderConfig:
    """``torch.utils.data.DataLoader`` options, honoured as given (we do not let Ray rebuild the loader). Left
    null, they follow from the worker: ``num_workers`` is, on a GPU worker reading sample by sample, one loader
    process per CPU it holds beyond the first (at most 8), else none; ``pin_memory`` is on for GPU workers
    (docs/performance.md)."""

    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool = False
    prefetch_factor: int | None = None

    def __post_init__(self) -> None:
        _at_least("trainer.dataloader.num_workers", self.num_workers, 0)
        _at_least("trainer.dataloader.prefetch_factor", self.prefetch_factor, 1)
        if self.num_workers == 0 and (self.persistent_workers or self.prefetch_factor is not None):
            raise ConfigError(
                "trainer.dataloader.num_workers",
                0,
                "persistent_workers and prefetch_factor need loader worker processes.",
                "set trainer.dataloader.num_workers >= 1 (or null), or leave persistent_workers=false and "
                "prefetch_factor=null.",
            )


@dataclass
class AugmentConfig:
    """Random augmentations of training images, done on whole batches of tensors on the worker's device (no
    per-sample Python), after the batch is there, on either input path::

        python -m hydra_raytrain dataset=cifar10 model=resnet18 trainer.augment.random_crop_padding=4 \\
            trainer.augment.horizontal_flip=true

    Each position of an epoch's order draws its own crop and flip from ``trainer.seed`` and the epoch: the same
    for any number of workers, and the same again when a run resumes mid-epoch."""

    random_crop_padding: int = 0  # > 0: pad each side with zeros by this much, then crop back at a random offset
    horizontal_flip: bool = False  # mirror half of the images, left to right

    def __post_init__(self) -> None:
        _at_least("trainer.augment.random_crop_padding", self.random_crop_padding, 0)


@dataclass
class EmaConfig:
    """An exponential moving average of the weights, updated after every optimizer step (torch's
    ``AveragedModel`` with ``get_ema_multi_avg_fn``, buffers averaged too)::

        python -m hydra_raytrain trainer.ema.decay=0.999

    When on, validation (and the monitored metric), the checkpoints' and the run's ``model.pt`` are the averaged
    weights; training goes on with the raw ones, which the full-state checkpoint keeps too (exact resume)."""

    decay: float | None = None  # None: off; else in (0, 1): the weight of the average so far at each step

    def __post_init__(self) -> None:
        if self.decay is not None and not 0 < self.decay < 1:
            raise ConfigError("trainer.ema.decay", self.decay, "must be in (0, 1).", "e.g. 0.999, or null (off)")


@dataclass
class EarlyStoppingConfig:
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` epochs. Decided from
    the all-reduced epoch history, so every rank agrees, and a resumed run continues the same count."""

    patience: int | None = None  # None: off
    monitor: str | None = None  # None: trainer.monitor, else the task's default
    mode: str | None = None  # "max" or "min"; None: as for monitor
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        _at_least("trainer.early_stopping.patience", self.patience, 1)
        _at_least("trainer.early_stopping.min_delta", self.min_delta, 0)
        if self.mode not in (None, "max", "min"):
            raise ConfigError("trainer.early_stopping.mode", self.mode, "unknown mode.", "max, min")


PRECISIONS = ("32", "64", "bf16-mixed", "16-mixed")
PARALLEL_STRATEGIES = ("ddp", "fsdp")
ACTIVATION_CHECKPOINTING = ("none", "full")


@dataclass
class FSDPConfig:
    """FSDP2 (``torch.distributed.fsdp.fully_shard``), with ``trainer.parallel_strategy=fsdp``: every rank holds
    1/N of each parameter, gradient and optimizer state, and gathers a unit's parameters for its forward and
    backward only (docs/sharding.md)::

        python -m hydra_raytrain model=resnet18 trainer.parallel_strategy=fsdp 'fsdp.shard_modules=[BasicBlock]'

    Each module whose class ``shard_modules`` names (``BasicBlock``, or a dotted path) becomes a shard unit, then
    the root takes the rest; with none named the whole model is one unit. The mixed precision policy follows
    ``trainer.precision`` (bf16-mixed: bfloat16 parameters in forward and backward, float32 gradient reduction).
    Checkpoints are sharded (every rank writes its own part) and resume on any number of workers."""

    shard_modules: list[str] = field(default_factory=list)
    reshard_after_forward: bool = True  # free a unit's gathered parameters after its forward (gather again in backward)
    cpu_offload: bool = False  # keep sharded parameters, gradients and optimizer state in host memory (GPU workers)


@dataclass
class TrainerConfig:
    """The training loop::

        python -m hydra_raytrain trainer.max_epochs=20 trainer.batch_size=128 trainer.seed=1
        python -m hydra_raytrain trainer.precision=bf16-mixed trainer.accumulate_grad_batches=4
        python -m hydra_raytrain trainer.early_stopping.patience=3 trainer.compile=true trainer.profile=true

    ``batch_size`` is global (split evenly across workers, like RaySGD's BATCH_SIZE); ``batch_size=null`` and
    ``batch_size_per_worker=N`` is the alternative (then the global size grows with the workers)."""

    max_epochs: int = 12
    seed: int = 0
    batch_size: int | None = 64
    batch_size_per_worker: int | None = None
    val_batch_size_per_worker: int | None = None  # None: the training batch size per worker
    limit_train_batches: int | None = None  # per worker and epoch; for smoke tests
    limit_val_batches: int | None = None
    monitor: str | None = None  # metric that picks the best epoch; None: the task's default
    monitor_mode: str | None = None  # "max" or "min"; None: the task's default
    dataloader: DataLoaderConfig = field(default_factory=DataLoaderConfig)
    # The input path: None puts data held in memory as tensors (the bundled sets) on the worker's device and
    # slices batches there; true also loads any other dataset once, up front; false always reads via the DataLoader
    data_on_device: bool | None = None
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)  # an average of the weights, validated and saved
    # Optimisation
    precision: str = (
        "32"  # 32, 64 (float64 weights and inputs), bf16-mixed (autocast), 16-mixed (autocast + GradScaler)
    )
    accumulate_grad_batches: int = 1  # micro-batches per optimizer step; DDP syncs on the last one only
    gradient_clip_val: float | None = None  # clip the gradients' total norm (after unscaling)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    # Speed
    compile: bool = False  # nn.Module.compile() before DDP wraps the model (state_dict keys stay the same)
    compile_kwargs: Any = None  # torch.compile options, e.g. {backend: aot_eager, mode: max-autotune}
    channels_last: bool = False  # model and 4-D inputs in channels-last memory format
    num_threads: int | None = None  # torch's intra-op threads in each worker; None: the CPUs the worker holds
    sync_debug_mode: str | None = None  # GPU: torch.cuda.set_sync_debug_mode over the training steps (warn, error)
    # Reproducibility: seed seeds python, numpy, torch (per rank) and every loader worker
    deterministic: bool = False  # torch.use_deterministic_algorithms(True) as well
    # Distribution: DDP (Ray's prepare_model, with parallel_strategy_kwargs) or FSDP2 (the fsdp section)
    parallel_strategy: str = "ddp"  # ddp or fsdp
    parallel_strategy_kwargs: Any = None  # DDP's, e.g. {find_unused_parameters: true, bucket_cap_mb: 50}
    # Memory: "full" recomputes the named modules' activations in the backward pass instead of keeping them
    activation_checkpointing: str = "none"  # none or full
    activation_checkpointing_modules: list[str] | None = None  # module classes; None: fsdp.shard_modules
    # Profiling
    progress_bar: bool | None = (
        None  # rank 0's per-epoch bar (ray.experimental.tqdm_ray), drawn by the driver; None: when it has a terminal
    )
    profile: bool = False  # per-epoch time breakdown in the metrics: data, forward, backward, optimizer (rank 0)
    profiler_steps: int = 0  # > 0: a torch.profiler trace of that many steps of rank 0 into <run dir>/profiler
    # task=lightning: more arguments of lightning.Trainer, e.g. {num_sanity_val_steps: 0, log_every_n_steps: 10}
    lightning_kwargs: Any = None

    def __post_init__(self) -> None:
        _at_least("trainer.max_epochs", self.max_epochs, 1)
        if self.ema.decay is not None and self.parallel_strategy == "fsdp":
            raise ConfigError(
                "trainer.ema.decay",
                self.ema.decay,
                "averages whole weights on every rank: not available with trainer.parallel_strategy=fsdp.",
                "trainer.parallel_strategy=ddp, or trainer.ema.decay=null",
            )
        _at_least("trainer.accumulate_grad_batches", self.accumulate_grad_batches, 1)
        _at_least("trainer.profiler_steps", self.profiler_steps, 0)
        _at_least("trainer.num_threads", self.num_threads, 1)
        if self.sync_debug_mode not in (None, "warn", "error"):
            raise ConfigError("trainer.sync_debug_mode", self.sync_debug_mode, "unknown mode.", "warn, error, or null")
        if self.gradient_clip_val is not None and self.gradient_clip_val <= 0:
            raise ConfigError(
                "trainer.gradient_clip_val",
                self.gradient_clip_val,
                "must be > 0.",
                "a positive norm, or null for no clipping",
            )
        _mapping("trainer.compile_kwargs", self.compile_kwargs, "{backend: aot_eager}")
        _mapping("trainer.parallel_strategy_kwargs", self.parallel_strategy_kwargs, "{find_unused_parameters: true}")
        _mapping("trainer.lightning_kwargs", self.lightning_kwargs, "{num_sanity_val_steps: 0}")
        if self.precision not in PRECISIONS:
            raise ConfigError("trainer.precision", self.precision, "unknown precision.", ", ".join(PRECISIONS))
        if self.parallel_strategy not in PARALLEL_STRATEGIES:
            raise ConfigError(
                "trainer.parallel_strategy", self.parallel_strategy, "unknown strategy.", ", ".join(PARALLEL_STRATEGIES)
            )
        if self.activation_checkpointing not in ACTIVATION_CHECKPOINTING:
            raise ConfigError(
                "trainer.activation_checkpointing",
                self.activation_checkpointing,
                "unknown mode.",
                ", ".join(ACTIVATION_CHECKPOINTING),
            )
        _at_least("trainer.batch_size", self.batch_size, 1)
        _at_least("trainer.batch_size_per_worker", self.batch_size_per_worker, 1)
        _at_least("trainer.val_batch_size_per_worker", self.val_batch_size_per_worker, 1)
        _at_least("trainer.limit_train_batches", self.limit_train_batches, 1)
        _at_least("trainer.limit_val_batches", self.limit_val_batches, 1)
        if (self.batch_size is None) == (self.batch_size_per_worker is None):
            raise ConfigError(
                "trainer.batch_size",
                self.batch_size,
                f"set exactly one of trainer.batch_size (global) and trainer.batch_size_per_worker "
                f"(now {self.batch_size_per_worker!r}).",
                "e.g. trainer.batch_size=64 trainer.batch_size_per_worker=null",
            )
        if self.monitor_mode not in (None, "max", "min"):
            raise ConfigError("trainer.monitor_mode", self.monitor_mode, "unknown mode.", "max, min")


def checkpointed_modules(activation_checkpointing_modules: list[str] | None, shard_modules: list[str]) -> list[str]:
    """The module classes whose activations are recomputed: trainer.activation_checkpointing_modules, or else (None)
    FSDP's shard units."""
    return list(shard_modules if activation_checkpointing_modules is None else activation_checkpointing_modules)


@dataclass
class SchedulerConfig:
    """``lr_scheduler`` is a ``_partial_`` node called with the optimizer; ``interval`` says when it steps."""

    interval: str = "epoch"  # "epoch" or "step" (after every optimizer step)
    lr_scheduler: Any = None
    warmup_steps: int = 0  # > 0: the LR rises linearly over this many optimizer steps (on top of lr_scheduler)
    warmup_start_factor: float = 0.01  # the first step's LR, as a fraction of the scheduled one

    def __post_init__(self) -> None:
        _at_least("scheduler.warmup_steps", self.warmup_steps, 0)
        if not 0 < self.warmup_start_factor <= 1:
            raise ConfigError("scheduler.warmup_start_factor", self.warmup_start_factor, "must be in (0, 1].")
        if self.interval not in ("epoch", "step"):
            raise ConfigError("scheduler.interval", self.interval, "unknown interval.", "epoch, step")


@dataclass
class RayConfig:
    """How the driver reaches Ray: without ``address`` it joins the cluster ``RAY_ADDRESS`` names (Ray's own
    convention: `ray job submit` sets it for every job), else a local cluster starts, sized for the run
    (docs/clusters.md)::

        python -m hydra_raytrain ray.address=auto            # the cluster `ray start --head` started here
        python -m hydra_raytrain ray.address=10.0.0.5:6379   # a remote head node
        python -m hydra_raytrain ray.address=local           # a local cluster of this run's, whatever RAY_ADDRESS says
    """

    address: str | None = None  # "auto", "host:port" of an existing cluster, "local"; None: RAY_ADDRESS, else local
    num_cpus: int | None = None  # logical CPUs of a local cluster; None: max(cores, what the run asks)
    max_cpu_oversubscription: float = 4.0  # a local cluster may promise at most this many CPUs per core
    include_dashboard: bool | None = None  # None: Ray decides (on with ray[default]; the state API needs it)
    runtime_env: dict[str, Any] = field(default_factory=dict)  # passed to ray.init (py_modules, env_vars, ...)
    logging_level: str = "WARNING"

    def __post_init__(self) -> None:
        _at_least("ray.num_cpus", self.num_cpus, 1)
        _at_least("ray.max_cpu_oversubscription", self.max_cpu_oversubscription, 1)


def cluster_address(address: str | None, environ: Mapping[str, str]) -> str | None:
    """The cluster a run joins, by Ray's own convention: ``ray.address`` when set, else the environment's
    ``RAY_ADDRESS`` (every `ray job submit` job has it, as may a user's shell). None, or ``local`` in either: a
    local cluster of the run's own."""
    chosen = address if address is not None else environ.get(RAY_ADDRESS_ENV) or None
    return None if chosen == "local" else chosen


RAY_ADDRESS_ENV = "RAY_ADDRESS"


@dataclass
class RunSettings:
    """Whether a run picks up where the same run (same identity, see config/identity.py) left off::

        python -m hydra_raytrain run.resume=never    # discard that run's previous state and train from scratch

    The identical command finds the same run: an unfinished one resumes from its latest checkpoint, a finished one
    is reported as complete. One run at a time holds its run dir (``storage/locks.py``): the same command started again
    while the first runs is refused at once, naming it (``if_running=wait``: waits for it to end, then resumes or
    reports it); a killed run's hold ends with its process. ``init_from`` starts a new run from another run's
    weights (recipe/warm_start.py)::

        python -m hydra_raytrain run.init_from=outputs/runs/<name> optimizer.lr=1e-4   # fine-tune

    ``init_full_state`` continues another run's checkpoint folder as if it were this run's own: weights, optimizers,
    LR schedules, epoch, optimizer step and history, with this run's optimizer settings applied to the live
    optimizer (a changed ``lr`` rescales the schedule). Population Based Training's exploits use it.
    """

    resume: str = "auto"  # auto: resume an unfinished run, report a finished one; never: discard its state, start fresh
    if_running: str = "refuse"  # the run dir held by a live run of this config: refuse at once, or wait for it to end
    init_from: str | None = None  # a run dir or a checkpoint folder (local, or s3://...): its weights to start from
    init_from_strict: bool = True  # the same keys (shapes must always match)
    init_optimizer: bool = False  # the optimizers' state too (a checkpoint folder's train_state.pt)
    init_full_state: bool = False  # continue a checkpoint folder: its epoch, step, schedules and history too

    def __post_init__(self) -> None:
        if self.resume not in ("auto", "never"):
            raise ConfigError("run.resume", self.resume, "unknown policy.", "auto, never")
        if self.if_running not in ("refuse", "wait"):
            raise ConfigError("run.if_running", self.if_running, "unknown policy.", "refuse, wait")
        if self.init_full_state and not self.init_from:
            raise ConfigError(
                "run.init_full_state", True, "continues run.init_from, which is not set.", "run.init_from=<checkpoint>"
            )


@dataclass
class TrainConfig:
    """The root: free-form component nodes plus the typed framework settings."""

    model: Any = MISSING
    dataset: Any = MISSING
    optimizer: Any = MISSING
    task: Any = MISSING
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    failure: FailureConfig = field(default_factory=FailureConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    peft: PeftConfig = field(default_factory=PeftConfig)
    logger: dict[str, Any] = field(default_factory=dict)  # name -> _target_ node; {} means none
    callbacks: dict[str, Any] = field(default_factory=dict)  # name -> _target_ node (hydra_raytrain.callbacks)
    # task=lightning: a LightningDataModule's _target_ node; {}: the dataset group's splits feed the module
    datamodule: dict[str, Any] = field(default_factory=dict)
    ray: RayConfig = field(default_factory=RayConfig)
    run: RunSettings = field(default_factory=RunSettings)


# The typed sections, in the order validation reports them.
TYPED_SECTIONS = (
    "scaling",
    "storage",
    "failure",
    "checkpoint",
    "trainer",
    "fsdp",
    "finetune",
    "peft",
    "scheduler",
    "ray",
    "run",
)


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
