"""A worker's shard of a Ray Data split (``ray.train.get_dataset_shard``), iterated as the recipe's loaders are.

Training shards hold equal rows (Ray's ``streaming_split(equal=True)`` drops at most ``world_size - 1`` rows of
an epoch), so every rank takes the same, known number of steps: ``rows // world_size`` samples in batches of the
per-worker size, the last one smaller. Validation shards split the rows unevenly and drop none
(``builders.ValidationOnce``): every validation sample is counted once, and ranks run as many forward passes as
their shard holds (the sums are all-reduced once, after the loop).

Every epoch is a new pass over the data: Ray Data re-executes the pipeline (a new file order with
``dataset.shuffle=files``), and the local shuffle buffer draws with a seed of the run's seed, the epoch and the
rank. A stream cannot seek: a run resumed from a mid-epoch checkpoint takes the epoch's remaining steps from a
new pass over the data (the steps, schedules and metrics stay exact; which samples the rest of the epoch holds
does not).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from hydra_raytrain.data.decode import FEATURES, LABELS
from hydra_raytrain.recipe.loaders import loader_seed


class StreamLoader:
    """Batches ``(features, labels)`` of this rank's shard; ``len()`` is the epoch's batches (training only)."""

    def __init__(
        self,
        shard: Any,
        batch_size: int,
        *,
        rows: int | None,
        seed: int,
        rank: int,
        local_shuffle_buffer_size: int | None = None,
        prefetch_batches: int = 1,
        device: torch.device | None = None,
    ):
        self.shard, self.batch_size, self.rows = shard, batch_size, rows
        self.seed, self.rank, self.epoch = seed, rank, 0
        self.local_shuffle_buffer_size, self.prefetch_batches = local_shuffle_buffer_size, prefetch_batches
        self.device = device

    def __len__(self) -> int:
        if self.rows is None:
            raise TypeError("a validation shard's length is known once it is read")
        return -(-self.rows // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        shuffle = self.local_shuffle_buffer_size if self.rows is not None else None
        batches = self.shard.iter_torch_batches(
            batch_size=self.batch_size,
            prefetch_batches=self.prefetch_batches,
            local_shuffle_buffer_size=shuffle or None,
            local_shuffle_seed=loader_seed(self.seed, self.rank, self.epoch) if shuffle else None,
            device=str(self.device) if self.device is not None else "cpu",
        )
        yielded = 0
        for batch in batches:
            yielded += 1
            yield batch[FEATURES], batch[LABELS]
        if self.rows is not None and yielded < len(self):
            raise RuntimeError(
                f"rank {self.rank}'s shard ended after {yielded} batches of an epoch that has {len(self)} "
                f"({self.rows} rows in batches of {self.batch_size}): the data changed since the run started?"
            )


def per_rank_rows(rows: int, world_size: int) -> int:
    """The rows each rank's training shard holds (``streaming_split(equal=True)``)."""
    return rows // world_size
