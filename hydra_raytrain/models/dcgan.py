"""A DCGAN-style generator and discriminator sized by ``input_shape`` (two stride-2 stages: 8x8 digits, 32x32...)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class Generator(nn.Module):
    """Noise (``latent_dim``) -> image in [0, 1] of ``input_shape``; batch norm in the generator only."""

    def __init__(self, input_shape: Sequence[int], latent_dim: int = 32, width: int = 64):
        super().__init__()
        channels, height, width_px = input_shape
        if height % 4 or width_px % 4:
            raise ValueError(f"Generator: image sides must be multiples of 4, got {height}x{width_px}")
        self.latent_dim, self.start = latent_dim, (width, height // 4, width_px // 4)
        self.project = nn.Linear(latent_dim, width * (height // 4) * (width_px // 4))
        self.body = nn.Sequential(
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.ConvTranspose2d(width, width // 2, 4, stride=2, padding=1),
            nn.BatchNorm2d(width // 2),
            nn.ReLU(),
            nn.ConvTranspose2d(width // 2, channels, 4, stride=2, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        return self.body(self.project(noise).view(-1, *self.start))  # -1: an exported batch axis stays dynamic


class Discriminator(nn.Module):
    """Image -> one logit (real vs generated). No batch norm: the generator's step runs it outside DDP."""

    def __init__(self, input_shape: Sequence[int], width: int = 64):
        super().__init__()
        channels, height, width_px = input_shape
        self.body = nn.Sequential(
            nn.Conv2d(channels, width // 2, 4, stride=2, padding=1),
            nn.LeakyReLU(0.2),
            nn.Conv2d(width // 2, width, 4, stride=2, padding=1),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
            nn.Linear(width * (height // 4) * (width_px // 4), 1),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images).squeeze(1)
