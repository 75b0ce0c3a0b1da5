"""DataLoaders built here, not by ``ray.train.torch.prepare_data_loader``: it rebuilds the loader and drops
``persistent_workers``, ``prefetch_factor`` and any custom sampler (see RAY_NOTES)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hydra_raytrain.config.schema import DataLoaderConfig
from hydra_raytrain.recipe.sampler import SeededSamples, ShardedSampler


def _seed_loader_worker(worker_id: int) -> None:
    # torch seeds each loader worker from the loader's generator; numpy and random need it too.
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def loader_seed(seed: int, rank: int, epoch: int) -> int:
    """Seed of a loader's generator (and so of its worker processes): distinct per rank and per epoch."""
    return (seed * 1_000_003 + rank) * 10_007 + epoch


def build_loader(
    dataset: Dataset, batch_size: int, *, train: bool, rank: int, world_size: int, seed: int, options: DataLoaderConfig
) -> DataLoader:
    size = len(dataset)  # type: ignore[arg-type]  # a map-style dataset has a length; torch's Dataset does not say so
    num_workers = options.num_workers
    # Training samples loaded in worker processes are seeded per position of the epoch (SeededSamples): their
    # augmentations then resume exactly mid-epoch. In-process loading draws from the rank's checkpointed RNG.
    seeded = train and num_workers > 0
    sampler = ShardedSampler(size, world_size, rank, shuffle=train, seed=seed, pad=train, seeds=seeded)
    return DataLoader(
        SeededSamples(dataset) if seeded else dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=options.pin_memory,
        persistent_workers=options.persistent_workers,
        worker_init_fn=_seed_loader_worker if num_workers else None,
        # Distinct per rank, so augmentations in loader workers differ between ranks; the recipe reseeds it
        # every epoch so that a resumed epoch draws what the uninterrupted one drew.
        generator=torch.Generator().manual_seed(loader_seed(seed, rank, 0)),
        prefetch_factor=options.prefetch_factor,  # None: torch's default (the schema refuses it without workers)
    )


def per_worker_batch_size(batch_size: int | None, batch_size_per_worker: int | None, world_size: int) -> int:
    """``trainer.batch_size`` is global and split evenly (RaySGD's BATCH_SIZE); the per-worker size is the
    alternative."""
    from hydra_raytrain.config.errors import ConfigError

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
