"""Data sets that ship inside scikit-learn: training works offline, with nothing to download."""

from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.data import TensorDataset

from hydra_raytrain.data.splits import Splits, check_shape, random_split_indices


def digits(input_shape: Sequence[int] = (1, 8, 8), num_outputs: int = 10, val_fraction: float = 0.2, split_seed: int = 0) -> Splits:
    """1,797 8x8 grayscale digits (pixels 0..16, scaled to 0..1), 10 classes."""
    from sklearn.datasets import load_digits

    check_shape("digits", input_shape, (1, 8, 8), num_outputs, 10)
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    train, val = random_split_indices(len(labels), val_fraction, split_seed)
    return Splits(TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val]))


def diabetes(input_shape: Sequence[int] = (10,), num_outputs: int = 1, val_fraction: float = 0.2, split_seed: int = 0) -> Splits:
    """442 patients, 10 features, disease progression after one year. Features and target are standardised
    with the training split's mean and std, so losses are in units of the target's standard deviation."""
    from sklearn.datasets import load_diabetes

    check_shape("diabetes", input_shape, (10,), num_outputs, 1)
    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.float32).unsqueeze(1)
    train, val = random_split_indices(len(y), val_fraction, split_seed)
    x = (x - x[train].mean(0)) / x[train].std(0)
    y = (y - y[train].mean(0)) / y[train].std(0)
    return Splits(TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val]))
