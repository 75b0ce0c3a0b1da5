"""The value every dataset builder returns, and the checks they share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from hydra_raytrain.config.errors import ConfigError, Problems


@dataclass
class Splits:
    train: Dataset
    val: Dataset


def random_split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A reproducible train/val split of ``range(n)``; the same seed gives the same split on every worker."""
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise ConfigError(
            "dataset.val_fraction", val_fraction, "must be between 0 and 1 (exclusive).", "a fraction, e.g. 0.2"
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, round(n * val_fraction))
    return order[n_val:], order[:n_val]


def check_shape(
    name: str, input_shape: Sequence[int], expected: Sequence[int], num_outputs: int, expected_outputs: int
) -> None:
    """Fixed-shape datasets state their shape in config so models can adapt; refuse a config that disagrees."""
    problems = Problems()
    if list(input_shape) != list(expected):
        problems.add(
            ConfigError(
                "dataset.input_shape",
                list(input_shape),
                f"dataset={name} has input_shape={list(expected)}.",
                f"dataset.input_shape={list(expected)}".replace(" ", ""),
            )
        )
    if num_outputs != expected_outputs:
        problems.add(
            ConfigError(
                "dataset.num_outputs",
                num_outputs,
                f"dataset={name} has {expected_outputs} outputs.",
                f"dataset.num_outputs={expected_outputs}",
            )
        )
    problems.raise_any()


def check_image_shape(input_shape: Sequence[int]) -> None:
    """Images are ``[channels, height, width]`` with 1 (grayscale) or 3 (RGB) channels."""
    shape = list(input_shape)
    if len(shape) != 3 or not all(isinstance(n, int) and n >= 1 for n in shape) or shape[0] not in (1, 3):
        raise ConfigError(
            "dataset.input_shape",
            shape,
            "images need [channels, height, width] with 1 or 3 channels.",
            "e.g. dataset.input_shape=[3,64,64] (RGB) or [1,28,28] (grayscale)",
        )
