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
    test: Dataset | None = None  # held out of training and validation: scored once, on the best checkpoint


def random_split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A reproducible train/val split of ``range(n)``; the same seed gives the same split on every worker."""
    train, val, _ = split_indices(n, val_fraction, seed)
    return train, val


def split_indices(
    n: int, val_fraction: float, seed: int, test_fraction: float = 0.0, folds: int | None = None, fold: int = 0
) -> tuple[list[int], list[int], list[int]]:
    """Train, val and test indices of ``range(n)``: one seeded order, validation first, then the test rows (so
    asking for a test split leaves the validation split as it was, and takes its rows from training).

    With ``folds=K`` (cross-validation) validation is fold ``fold`` of K: the test rows are those of the usual
    split (so a configuration chosen by cross-validation and trained again without folds is tested on rows no fold
    saw), the rest is cut into K near-equal folds, so the K runs of ``fold=0..K-1`` validate on disjoint folds
    that together hold every other sample once."""
    check_fractions(val_fraction, test_fraction)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, round(n * val_fraction))
    n_test = max(1, round(n * test_fraction)) if test_fraction else 0
    cut = fold_range(n - n_test, folds, fold)
    if cut is not None:
        pool, test = order[:n_val] + order[n_val + n_test :], order[n_val : n_val + n_test]
        return pool[: cut[0]] + pool[cut[1] :], pool[cut[0] : cut[1]], test
    if n_val + n_test >= n:
        key, value = (
            ("dataset.test_fraction", test_fraction) if test_fraction else ("dataset.val_fraction", val_fraction)
        )
        raise ConfigError(key, value, f"leaves no training sample of {n} (val {n_val}, test {n_test}).")
    return order[n_val + n_test :], order[:n_val], order[n_val : n_val + n_test]


def fold_range(samples: int, folds: int | None, fold: int) -> tuple[int, int] | None:
    """Where fold ``fold`` of ``folds`` near-equal contiguous folds of ``samples`` starts and ends; None without
    cross-validation (``folds`` unset)."""
    if folds is None:
        if fold:
            raise ConfigError(
                "dataset.fold", fold, "picks a fold of dataset.folds, which is not set.", "dataset.folds=K"
            )
        return None
    check_folds(folds, fold, samples)
    return samples * fold // folds, samples * (fold + 1) // folds


def check_folds(folds: int, fold: int, samples: int) -> None:
    """``folds`` of at least 2 and at most the samples cross-validated; ``fold`` one of them (0 to folds - 1)."""
    if isinstance(folds, bool) or not isinstance(folds, int) or not 2 <= folds <= samples:
        raise ConfigError(
            "dataset.folds",
            folds,
            f"cross-validation needs 2 to {samples} folds (the samples outside the test split).",
            "e.g. dataset.folds=5, or null (no cross-validation)",
        )
    if isinstance(fold, bool) or not isinstance(fold, int) or not 0 <= fold < folds:
        raise ConfigError(
            "dataset.fold",
            fold,
            f"must be one of the {folds} folds: 0 to {folds - 1}.",
            f"dataset.fold=range(0,{folds}) (every fold, as a sweep)",
        )


def check_fractions(val_fraction: float, test_fraction: float = 0.0) -> None:
    """``val_fraction`` in (0, 1), ``test_fraction`` in [0, 1), and both together below 1."""
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise ConfigError(
            "dataset.val_fraction", val_fraction, "must be between 0 and 1 (exclusive).", "a fraction, e.g. 0.2"
        )
    if not isinstance(test_fraction, (int, float)) or not 0 <= test_fraction < 1 - val_fraction:
        raise ConfigError(
            "dataset.test_fraction",
            test_fraction,
            f"must be at least 0 and below 1 - dataset.val_fraction ({1 - val_fraction:g}).",
            "a fraction, e.g. 0.1 (0: no test split)",
        )


def held_out(dataset: Dataset, test_fraction: float, seed: int) -> tuple[Dataset, Dataset | None]:
    """A seeded ``test_fraction`` of ``dataset`` held out as the test split (a set whose validation split is its
    own, like torchvision's test sets); ``(dataset, None)`` when no test split is asked for."""
    from torch.utils.data import Subset

    if not test_fraction:
        return dataset, None
    if not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
        raise ConfigError("dataset.test_fraction", test_fraction, "must be at least 0 and below 1.", "e.g. 0.1")
    n = len(dataset)  # type: ignore[arg-type]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_test = min(n - 1, max(1, round(n * test_fraction)))
    return Subset(dataset, order[n_test:]), Subset(dataset, order[:n_test])


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
