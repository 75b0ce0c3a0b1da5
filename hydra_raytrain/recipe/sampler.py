"""Sharded sampling whose data order does not depend on the number of workers, and that resumes mid-epoch."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler


class ShardedSampler(Sampler[Any]):
    """Rank ``r`` of ``W`` takes positions ``r, r+W, r+2W, ...`` of one permutation of the whole data set.

    The permutation is seeded by ``seed + epoch`` only, so every rank agrees on it without communicating, and
    the union of the ranks' k-th batches is the same set of samples for any ``W`` (global batch = B, per-worker
    batch = B/W). Call :meth:`set_epoch` before each epoch, or every epoch repeats the first one's order;
    ``set_epoch(epoch, start=n)`` skips the epoch's first ``n`` positions (a mid-epoch resume: what the ranks
    consumed before the checkpoint, ``batches * B``).

    ``pad=True`` (training) wraps around to give every rank the same number of samples, so DDP's ranks take the
    same number of steps and never wait on each other forever. ``pad=False`` (validation) repeats nothing: ranks
    may differ by one sample, and no sample is counted twice.

    ``seeds=True`` yields ``(index, seed)`` pairs for :class:`SeededSamples`: a seed per position of the epoch, so
    a sample's random augmentations do not depend on which loader worker process loads it (nor on how many there
    are, nor on where a resumed epoch restarted).
    """

    def __init__(
        self,
        size: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        pad: bool = True,
        seeds: bool = False,
    ):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.size, self.num_replicas, self.rank = size, num_replicas, rank
        self.shuffle, self.seed, self.pad, self.seeds = shuffle, seed, pad, seeds
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def _order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.size)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=generator)

    def _positions(self) -> range:
        """This rank's positions in the epoch's (padded) order: position p is sample ``order[p % size]``."""
        total = math.ceil(self.size / self.num_replicas) * self.num_replicas if self.pad else self.size
        return range(self.start + self.rank, total, self.num_replicas)

    def indices(self) -> torch.Tensor:
        """This rank's sample indices for the epoch (from ``start``), in order, as one tensor: what iterating
        yields, for the device-resident path to slice batches from."""
        positions = self._positions()
        steps = torch.arange(len(positions))  # a range past its end (a rank with nothing left) is empty
        return self._order()[(positions.start + positions.step * steps) % self.size]

    def __iter__(self) -> Iterator[Any]:
        indices = self.indices().tolist()
        if not self.seeds:
            return iter(indices)
        return iter(
            (index, sample_seed(self.seed, self.epoch, p)) for index, p in zip(indices, self._positions(), strict=True)
        )

    def __len__(self) -> int:
        return len(self._positions())


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """A 63-bit seed for one position of one epoch."""
    return ((seed * 1_000_003 + epoch) * 2_147_483_647 + position) % 2**63


class SeededSamples(torch.utils.data.Dataset):
    """A map-style dataset read through :class:`ShardedSampler`'s ``(index, seed)`` pairs, in loader worker
    processes: torch's CPU generator, numpy's global one and random are seeded with the position's seed before each
    sample is loaded, and CUDA's where the loader process uses CUDA (a 'spawn' loader context). Not
    ``torch.manual_seed``: for each accelerator not initialised in the process it also queues a seed with a
    formatted stack trace, ~0.1 ms per sample (measured with ``make bench-loader`` on a CPU: ours' loader ~0.6x
    torch's own DataLoader with it, 0.94x without)."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        import random

        import numpy as np

        index, seed = key
        torch.default_generator.manual_seed(seed)
        if torch.cuda.is_initialized():  # False in a loader process forked from a CUDA worker: CUDA is unusable there
            torch.cuda.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        return self.dataset[index]
