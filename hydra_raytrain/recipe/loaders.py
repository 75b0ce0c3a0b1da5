"""DataLoaders built here, not by ``ray.train.torch.prepare_data_loader``: it rebuilds the loader and drops
``persistent_workers``, ``prefetch_factor`` and any custom sampler (see RAY_NOTES)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.schema import DataLoaderConfig
from hydra_raytrain.recipe.sampler import SeededSamples, ShardedSampler
from hydra_raytrain.runtime.host import machine_cores


def _seed_loader_worker(worker_id: int) -> None:
    # torch seeds each loader worker from the loader's generator; numpy and random need it too.
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def loader_seed(seed: int, rank: int, epoch: int) -> int:
    """Seed of a loader's generator (and so of its worker processes): distinct per rank and per epoch."""
    return (seed * 1_000_003 + rank) * 10_007 + epoch


def build_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    train: bool,
    rank: int,
    world_size: int,
    seed: int,
    options: DataLoaderConfig,
    num_workers: int | None = None,
    pin_memory: bool | None = None,
    pad: bool | None = None,
) -> DataLoader:
    """``options`` as given; ``num_workers`` and ``pin_memory`` as the recipe sized them (else the options', null
    meaning none). Persistent workers and a prefetch factor apply when there are loader processes. ``pad``: as
    ``sharded_sampler``."""
    size = len(dataset)  # type: ignore[arg-type]  # a map-style dataset has a length; torch's Dataset does not say so
    num_workers = (options.num_workers if num_workers is None else num_workers) or 0
    pin_memory = options.pin_memory if pin_memory is None else pin_memory
    # Training samples loaded in worker processes are seeded per position of the epoch (SeededSamples): their
    # augmentations then resume exactly mid-epoch. In-process loading draws from the rank's checkpointed RNG.
    seeded = train and num_workers > 0
    sampler = sharded_sampler(size, train=train, rank=rank, world_size=world_size, seed=seed, seeds=seeded, pad=pad)
    return DataLoader(
        SeededSamples(dataset) if seeded else dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=bool(pin_memory),
        persistent_workers=options.persistent_workers and num_workers > 0,
        worker_init_fn=_seed_loader_worker if num_workers else None,
        # Distinct per rank, so augmentations in loader workers differ between ranks; the recipe reseeds it
        # every epoch so that a resumed epoch draws what the uninterrupted one drew.
        generator=torch.Generator().manual_seed(loader_seed(seed, rank, 0)),
        prefetch_factor=options.prefetch_factor if num_workers else None,  # None: torch's default
        collate_fn=collate_of(dataset),
    )


def collate_of(dataset: Dataset) -> Callable[[list[Any]], Any] | None:
    """A dataset's own batching (``collate``: text pads a batch to its longest row), through ``Subset``s; None:
    torch's default_collate."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return getattr(dataset, "collate", None)


def sharded_sampler(
    size: int, *, train: bool, rank: int, world_size: int, seed: int, seeds: bool = False, pad: bool | None = None
) -> ShardedSampler:
    """Training: shuffled each epoch, padded so every rank takes as many steps; validation: in order, unpadded
    unless ``pad`` (Lightning's validation, where every rank must run as many batches)."""
    return ShardedSampler(
        size, world_size, rank, shuffle=train, seed=seed, pad=train if pad is None else pad, seeds=seeds
    )


def worker_cpus() -> int:
    """The CPUs Ray gave this worker (floored, at least 1: a GPU worker given no CPU drives its GPU from one);
    outside a Ray worker (Ray Train's local mode runs in the driver), the cores this process may run on."""
    import ray

    context = ray.get_runtime_context() if ray.is_initialized() else None
    if context is not None and context.worker.mode == ray.WORKER_MODE:
        return max(1, int(context.get_assigned_resources().get("CPU", 0)))
    return machine_cores()


def loader_processes(configured: int | None, cpus: int, in_memory: bool, on_gpu: bool) -> int:
    """``trainer.dataloader.num_workers``, or when null: on GPU workers, one per CPU beyond the one that drives the
    GPU (at most 8), for data read sample by sample. None on CPU workers, whose CPUs compute (a loader process
    beside the compute threads slowed a 2-CPU worker by a third), nor for data in memory as tensors (a process
    would only add a copy)."""
    if configured is not None:
        return configured
    return max(0, min(8, cpus - 1)) if on_gpu and not in_memory else 0


def copies_ahead(loader: Any, device: torch.device) -> bool:
    """Whether the recipe copies a loader's next batch to the device while the current one computes: for GPUs fed
    by loader processes (asynchronously from pinned memory). Their batches hold no draw of the worker's own RNG
    (each sample is seeded by its position), so reading one batch early changes nothing that a checkpoint saves.
    In-process loading draws from the checkpointed RNG, and the device-resident path has no host copy to hide."""
    return device.type == "cuda" and isinstance(loader, DataLoader) and loader.num_workers > 0


def prefetched(
    batches: Iterable[Any], to_device: Callable[[Any], Any], device: torch.device, ahead: bool
) -> Iterator[Any]:
    """``batches`` moved by ``to_device``; with ``ahead`` (a GPU), one batch ahead: batch k+1's copy is issued on
    a side CUDA stream before batch k is handed out, so it overlaps k's compute (from pinned memory the copy is
    asynchronous). Otherwise each batch is moved when it is handed out."""
    if not ahead:
        yield from (to_device(batch) for batch in batches)
        return
    stream, iterator = torch.cuda.Stream(device), iter(batches)

    def issue() -> Any:
        batch = next(iterator, None)
        if batch is None:
            return None
        with torch.cuda.stream(stream):
            return to_device(batch)

    ready = issue()
    while ready is not None:
        torch.cuda.current_stream(device).wait_stream(stream)
        _record_stream(ready, torch.cuda.current_stream(device))  # the copies' memory is used on this stream now
        batch, ready = ready, issue()
        yield batch


def _record_stream(batch: Any, stream: Any) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            _record_stream(item, stream)
    elif isinstance(batch, dict):
        for item in batch.values():
            _record_stream(item, stream)


def per_worker_batch_size(batch_size: int | None, batch_size_per_worker: int | None, world_size: int) -> int:
    """``trainer.batch_size`` is global and split evenly (RaySGD's BATCH_SIZE); the per-worker size is the
    alternative."""
    if batch_size_per_worker is not None:
        return batch_size_per_worker
    assert batch_size is not None, "the schema requires one of the two"
    if batch_size % world_size:
        raise ConfigError(
            "trainer.batch_size",
            batch_size,
            f"a global batch must split evenly over {world_size} workers.",
            f"a multiple of {world_size}, or trainer.batch_size=null trainer.batch_size_per_worker=N.",
        )
    return batch_size // world_size


def move_to(
    batch: Any,
    device: torch.device,
    memory_format: torch.memory_format | None = None,
    float_dtype: torch.dtype | None = None,
) -> Any:
    """Tensors in a batch (a tensor, or lists / tuples / dicts of them) moved to ``device``; 4-D ones (images)
    also into ``memory_format`` when given (``trainer.channels_last``), floating ones into ``float_dtype`` when
    given (``trainer.precision=64``)."""
    if isinstance(batch, torch.Tensor):
        dtype = float_dtype if float_dtype is not None and batch.is_floating_point() else None
        if memory_format is not None and batch.dim() == 4:
            return batch.to(device, dtype=dtype, non_blocking=True, memory_format=memory_format)
        return batch.to(device, dtype=dtype, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(item, device, memory_format, float_dtype) for item in batch)
    if isinstance(batch, dict):
        return {key: move_to(value, device, memory_format, float_dtype) for key, value in batch.items()}
    return batch
