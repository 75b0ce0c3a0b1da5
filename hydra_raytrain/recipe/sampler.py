"""Sharded sampling whose data order does not depend on the number of workers."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ShardedSampler(Sampler[int]):
    """Rank ``r`` of ``W`` takes positions ``r, r+W, r+2W, ...`` of one permutation of the whole data set.

    The permutation is seeded by ``seed + epoch`` only, so every rank agrees on it without communicating, and
    the union of the ranks' k-th batches is the same set of samples for any ``W`` (global batch = B, per-worker
    batch = B/W). Call :meth:`set_epoch` before each epoch, or every epoch repeats the first one's order.

    ``pad=True`` (training) wraps around to give every rank the same number of samples, so DDP's ranks take the
    same number of steps and never wait on each other forever. ``pad=False`` (validation) repeats nothing: ranks
    may differ by one sample, and no sample is counted twice.
    """

    def __init__(
        self, size: int, num_replicas: int = 1, rank: int = 0, shuffle: bool = True, seed: int = 0, pad: bool = True
    ):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.size, self.num_replicas, self.rank = size, num_replicas, rank
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        if self.pad and self.size % self.num_replicas:
            total = math.ceil(self.size / self.num_replicas) * self.num_replicas
            order = (order * math.ceil(total / self.size))[:total]
        return iter(order[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        if self.pad:
            return math.ceil(self.size / self.num_replicas)
        return len(range(self.rank, self.size, self.num_replicas))
