"""What a worker builds before its first epoch (``recipe/loop.py``'s ``setup``): its loaders, its models spread over
the workers, its step (optimizers, schedules, precision) and its profiler. Builders: they read the config and the
worker's place (rank, device), and return what they built."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Any, cast

import ray.train
import ray.train.torch
import torch
from hydra.utils import instantiate

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.config.schema import checkpointed_modules
from hydra_raytrain.data.packing import check_text_models
from hydra_raytrain.recipe import finetune, parallel, warm_start
from hydra_raytrain.recipe.device_data import (
    DEVICE_MEMORY_SHARE,
    DeviceLoader,
    fits_device,
    in_memory_tensors,
    load_tensors,
    nbytes,
)
from hydra_raytrain.recipe.loaders import (
    build_loader,
    copies_ahead,
    loader_processes,
    per_worker_batch_size,
    sharded_sampler,
    worker_cpus,
)
from hydra_raytrain.recipe.step import Precision, StepTimer, TrainStep, build_lr_scheduler
from hydra_raytrain.recipe.streaming import StreamLoader, per_rank_rows

PROFILER_DIR = "profiler"


@dataclass
class Place:
    """Where a worker stands: its rank of ``world_size``, its device, and the float dtype of ``trainer.precision=64``
    (None otherwise)."""

    rank: int
    world_size: int
    device: torch.device
    float_dtype: torch.dtype | None = None


@dataclass
class Loaders:
    """A worker's loaders (a DataLoader, a DeviceLoader or a StreamLoader, each iterated alike) and their sizes."""

    train: Any
    val: Any
    batch_size: int  # this worker's
    train_batches: int  # an epoch's, after trainer.limit_train_batches
    val_batches: int
    splits: Any = None  # the dataset's splits, where built here


def build_loaders(cfg: Resolved, place: Place, rows: dict[str, int] | None = None, built: Any = None) -> Loaders:
    """The splits, on the device-resident path or behind DataLoaders (or this rank's shards of the splits Ray Data
    streams: ``rows``), sized to the CPUs this worker holds: torch's threads and the loader processes (printed once,
    by rank 0). ``built``: the text Ray Data tokenized for the run."""
    trainer = cfg.trainer
    batch = per_worker_batch_size(trainer.batch_size, trainer.batch_size_per_worker, place.world_size)
    val_batch = trainer.val_batch_size_per_worker or batch
    cpus = worker_cpus()
    torch.set_num_threads(trainer.num_threads or cpus)
    if rows is not None:
        train, val, where, splits = *_streamed(cfg, place, rows, batch, val_batch), None
    else:
        splits = built.splits() if built is not None else instantiate(cfg.dataset, _convert_="all")
        train, val, where = _in_process(cfg, place, splits, batch, val_batch, cpus)
    train_batches = min(len(train), trainer.limit_train_batches or len(train))
    if isinstance(val, StreamLoader):  # as many as this rank's shard holds
        val_batches = trainer.limit_val_batches or sys.maxsize
    else:
        val_batches = min(len(val), trainer.limit_val_batches or len(val))
    if place.rank == 0:
        threads, niceness = torch.get_num_threads(), os.nice(0)
        print(
            f"Workers: {place.world_size} x {cpus} CPU{'s' if cpus > 1 else ''}, {threads} torch "
            f"thread{'s' if threads > 1 else ''} each"
            + (f", niceness {niceness} (RAY_worker_niceness)" if niceness else "")
            + f"; data {where}",
            flush=True,
        )
    return Loaders(train, val, batch, train_batches, val_batches, splits)


def _streamed(cfg: Resolved, place: Place, rows: dict[str, int], batch: int, val_batch: int) -> tuple[Any, Any, str]:
    """This rank's shards of the splits Ray Data streams (``recipe/streaming.py``)."""
    dataset = cfg.dataset
    options = dict(
        seed=cfg.trainer.seed, rank=place.rank, prefetch_batches=dataset.get("prefetch_batches", 1), device=place.device
    )
    per_rank = per_rank_rows(rows["train"], place.world_size)
    buffer = dataset.get("local_shuffle_buffer_size")
    train = StreamLoader(
        ray.train.get_dataset_shard("train"), batch, rows=per_rank, local_shuffle_buffer_size=buffer, **options
    )
    val = StreamLoader(ray.train.get_dataset_shard("val"), val_batch, rows=None, **options)
    where = (
        f"streamed by Ray Data ({rows['train']:,} training rows, {per_rank:,} per worker per epoch; "
        f"{rows['val']:,} validation rows)"
    )
    return train, val, where


def _in_process(
    cfg: Resolved, place: Place, splits: Any, batch: int, val_batch: int, cpus: int
) -> tuple[Any, Any, str]:
    """The splits built here: on the device-resident path or behind DataLoaders."""
    trainer, device = cfg.trainer, place.device
    held = {"train": in_memory_tensors(splits.train), "val": in_memory_tensors(splits.val)}
    in_memory = all(tensors is not None for tensors in held.values())
    options = trainer.dataloader
    processes = loader_processes(options.num_workers, cpus, in_memory, device.type == "cuda")
    pinned = device.type == "cuda" if options.pin_memory is None else options.pin_memory
    shard: dict[str, Any] = dict(rank=place.rank, world_size=place.world_size, seed=trainer.seed)
    on_device = _on_device(cfg, device, splits, held, in_memory, processes)
    if on_device is not None:
        loaders = {
            split: DeviceLoader(
                tensors,
                batch if split == "train" else val_batch,
                sharded_sampler(len(tensors[0]), train=split == "train", **shard),
                device,
                place.float_dtype,
            )
            for split, tensors in on_device.items()
        }
        where = f"on {device} as tensors ({nbytes(on_device['train']) + nbytes(on_device['val']):,} bytes)"
        return loaders["train"], loaders["val"], where
    loading: dict[str, Any] = dict(options=options, num_workers=processes, pin_memory=pinned, **shard)
    train = build_loader(splits.train, batch, train=True, **loading)
    val = build_loader(splits.val, val_batch, train=False, **loading)
    where = (
        f"read by DataLoaders ({processes} loader processes per worker"
        + (", pinned memory" if pinned else "")
        + (", each batch copied ahead" if copies_ahead(train, device) else "")
        + ")"
    )
    return train, val, where


def _on_device(
    cfg: Resolved,
    device: torch.device,
    splits: Any,
    held: dict[str, tuple[torch.Tensor, ...] | None],
    in_memory: bool,
    loader_processes: int,
) -> dict[str, tuple[torch.Tensor, ...]] | None:
    """The splits' tensors for the device-resident path, or None for the DataLoader path
    (``trainer.data_on_device``: null takes in-memory tensors that fit when no loader process was asked for)."""
    wanted = cfg.trainer.data_on_device
    if wanted is False or (wanted is None and not (in_memory and loader_processes == 0)):
        return None
    if wanted is None:
        size = sum(nbytes(tensors) for tensors in held.values() if tensors is not None)
        return cast(dict, held) if fits_device(size, device, DEVICE_MEMORY_SHARE) else None
    loaded = {
        name: tensors if tensors is not None else load_tensors(getattr(splits, name), loader_processes, name)
        for name, tensors in held.items()
    }
    size = sum(nbytes(tensors) for tensors in loaded.values())
    if not fits_device(size, device, 1.0):
        raise ConfigError(
            "trainer.data_on_device",
            True,
            f"the splits take {size / 2**30:.1f} GiB, more than {device} has free.",
            "trainer.data_on_device=false (the DataLoader path)",
        )
    return loaded


def build_models(cfg: Resolved, place: Place, splits: Any = None) -> dict[str, torch.nn.Module]:
    """Each model: built, channels-last, activation checkpointing and compiled if asked, then spread over the
    workers: FSDP2 (``recipe/parallel.py``), or Ray's prepare_model (device; DDP with more than one worker)."""
    trainer = cfg.trainer
    several = "_target_" not in cfg.model  # config.model names several models (a GAN)
    specs = dict(cfg.model) if several else {"model": cfg.model}
    sharding = trainer.parallel_strategy == "fsdp" and torch.distributed.is_initialized()  # not in local mode
    run = cfg.run
    built_start = warm_start.starts_built(cfg.peft.method, run.init_from, run.init_full_state)
    models = {}
    for name, spec in specs.items():
        # peft with run.init_from: new adapters on the source's weights; else they load once the model is built
        module = warm_start.starting_model(spec, run.init_from) if built_start else instantiate(spec, _convert_="all")
        check_text_models(cfg.dataset, splits, {name: module})
        module = finetune.add_adapters(module, cfg.peft)  # peft=lora: only the adapters train
        finetune.freeze(module, cfg.finetune.freeze)  # before DDP, which then leaves them out
        if place.float_dtype is not None:
            module = module.to(place.float_dtype)
        if trainer.channels_last:
            module = module.to(memory_format=torch.channels_last)
        if trainer.activation_checkpointing == "full":
            parallel.checkpoint_activations(
                module, checkpointed_modules(trainer.activation_checkpointing_modules, cfg.fsdp.shard_modules)
            )
        if trainer.compile:
            module.compile(**(trainer.compile_kwargs or {}))  # in place: state_dict keys unchanged
        if sharding:
            fsdp = cfg.fsdp
            models[name] = parallel.fully_shard(
                module,
                place.device,
                fsdp.shard_modules,
                fsdp.reshard_after_forward,
                trainer.precision,
                fsdp.cpu_offload,
            )
            continue
        models[name] = ray.train.torch.prepare_model(
            module, parallel_strategy="ddp", parallel_strategy_kwargs=trainer.parallel_strategy_kwargs or None
        )
    return models


def build_step(
    cfg: Resolved, models: dict[str, torch.nn.Module], train_batches: int, device: torch.device
) -> TrainStep:
    """One optimizer per model (config.optimizer is one node for all, or one per model name), each with the
    configured LR schedule and warm-up."""
    trainer, scheduler = cfg.trainer, cfg.scheduler
    specs = {name: cfg.optimizer for name in models} if "_target_" in cfg.optimizer else dict(cfg.optimizer)
    optimizers = {name: finetune.build_optimizer(specs[name], model, cfg.finetune) for name, model in models.items()}
    steps_per_epoch = math.ceil(train_batches / trainer.accumulate_grad_batches)
    lr_schedulers: dict[str, list[Any]] = {}
    warmups: dict[str, Any] = {}
    for name, optimizer in optimizers.items():
        lr_schedulers[name] = []
        if scheduler.lr_scheduler is not None:
            lr_schedulers[name].append(build_lr_scheduler(scheduler.lr_scheduler, optimizer, steps_per_epoch))
        if scheduler.warmup_steps:  # built after the main schedule: both scale the LR the other one set
            warmups[name] = torch.optim.lr_scheduler.LinearLR(
                optimizer, scheduler.warmup_start_factor, total_iters=scheduler.warmup_steps
            )
    return TrainStep(
        models,
        optimizers,
        lr_schedulers,
        Precision.build(trainer.precision, device),
        accumulate_grad_batches=trainer.accumulate_grad_batches,
        gradient_clip_val=trainer.gradient_clip_val,
        step_scheduler_per_batch=scheduler.interval == "step",
        warmups=warmups,
        timer=StepTimer(trainer.profile, device),
    )


def build_profiler(cfg: Resolved, place: Place, run_dir: str) -> torch.profiler.profile | None:
    """``trainer.profiler_steps``: a torch.profiler trace of that many training steps of rank 0 (after one step of
    warm-up), written as a Chrome trace into ``<run dir>/profiler``; started."""
    steps = cfg.trainer.profiler_steps
    if not steps or place.rank != 0:
        return None
    folder = os.path.join(run_dir, PROFILER_DIR)
    os.makedirs(folder, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if place.device.type == "cuda" else []
    )
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(folder, f"rank0_step{p.step_num}.json")),
    )
    profiler.start()
    return profiler
