"""Seeds: one for the initial weights (the same on every rank), one per rank for everything after."""

from __future__ import annotations

import random

import numpy as np
import torch


def rank_seed(seed: int, rank: int) -> int:
    """Distinct per rank (dropout masks, a GAN's noise and augmentations must differ between ranks)."""
    return (seed * 1_000_003 + 7_919 * (rank + 1)) % 2**32


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def use_deterministic_algorithms() -> None:
    """``trainer.deterministic=true``. On GPUs cuBLAS also needs CUBLAS_WORKSPACE_CONFIG, which the driver sets
    in every worker's environment (it must be set before CUDA starts)."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
