"""The value every dataset builder returns, and the checks they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch.utils.data import Dataset


@dataclass
class Splits:
    train: Dataset
    val: Dataset


def random_split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A reproducible train/val split of ``range(n)``; the same seed gives the same split on every worker."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"dataset.val_fraction={val_fraction!r}: must be between 0 and 1 (exclusive).")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, round(n * val_fraction))
    return order[n_val:], order[:n_val]


def check_shape(name: str, input_shape: Sequence[int], expected: Sequence[int], num_outputs: int, expected_outputs: int) -> None:
    """Fixed-shape datasets state their shape in config so models can adapt; refuse a config that disagrees."""
    if list(input_shape) != list(expected) or num_outputs != expected_outputs:
        raise ValueError(
            f"dataset={name} has input_shape={list(expected)} and num_outputs={expected_outputs}; "
            f"the config says input_shape={list(input_shape)}, num_outputs={num_outputs}."
        )
