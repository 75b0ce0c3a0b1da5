"""Data sets that ship inside scikit-learn: training works offline, with nothing to download."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import TensorDataset

from hydra_raytrain.data.splits import Splits, check_shape, split_indices


def digits(
    input_shape: Sequence[int] = (1, 8, 8),
    num_outputs: int = 10,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    test_fraction: float = 0.0,
    folds: int | None = None,
    fold: int = 0,
) -> Splits:
    """1,797 8x8 grayscale digits (pixels 0..16, scaled to 0..1), 10 classes."""
    check_shape("digits", input_shape, (1, 8, 8), num_outputs, 10)
    pixels, target = digits_arrays()
    images = torch.tensor(pixels, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(target, dtype=torch.long)
    train, val, test = split_indices(len(labels), val_fraction, split_seed, test_fraction, folds, fold)
    train_set, val_set = (TensorDataset(images[i], labels[i]) for i in (train, val))
    return Splits(train_set, val_set, _test(images, labels, test))


def _test(x: torch.Tensor, y: torch.Tensor, test: list[int]) -> TensorDataset | None:
    return TensorDataset(x[test], y[test]) if test else None


def digits_arrays(package_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``load_digits()``'s images and target, read with numpy from the file scikit-learn ships
    (``sklearn/datasets/data/digits.csv.gz``: 64 pixels and the label per row), as load_digits reads it. Importing
    sklearn.datasets (scipy and more) took 1.5-2.7 s of every worker's start, for a 30 ms read. Where the file is
    not there (another layout), load_digits itself."""
    if not package_dir:  # found without importing sklearn
        spec = importlib.util.find_spec("sklearn")
        assert spec is not None and spec.submodule_search_locations, "scikit-learn is a dependency"
        package_dir = spec.submodule_search_locations[0]
    path = os.path.join(package_dir, "datasets", "data", "digits.csv.gz")
    if not os.path.isfile(path):
        from sklearn.datasets import load_digits

        data = load_digits()
        return data.images, data.target
    rows = np.loadtxt(path, delimiter=",")
    return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(int)


def diabetes(
    input_shape: Sequence[int] = (10,),
    num_outputs: int = 1,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    test_fraction: float = 0.0,
    folds: int | None = None,
    fold: int = 0,
) -> Splits:
    """442 patients, 10 features, disease progression after one year. Features and target are standardised
    with the training split's mean and std, so losses are in units of the target's standard deviation."""
    from sklearn.datasets import load_diabetes

    check_shape("diabetes", input_shape, (10,), num_outputs, 1)
    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.float32).unsqueeze(1)
    train, val, test = split_indices(len(y), val_fraction, split_seed, test_fraction, folds, fold)
    x = (x - x[train].mean(0)) / x[train].std(0)
    y = (y - y[train].mean(0)) / y[train].std(0)
    return Splits(TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val]), _test(x, y, test))
