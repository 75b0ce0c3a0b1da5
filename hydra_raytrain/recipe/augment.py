"""``trainer.augment``: random crop (with zero padding) and horizontal flip of training images, done on a whole
batch of tensors on the worker's device: no per-sample Python, no host round trip.

What each image gets is a pure function of ``(seed, epoch, position)``, its position in the epoch's order
(:class:`~hydra_raytrain.recipe.sampler.ShardedSampler`): a hash, computed on the device, draws nothing from any
generator. So the augmentations are the same for any number of workers and after a mid-epoch resume, on the
DataLoader path and the device-resident path alike.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from hydra_raytrain.config.errors import ConfigError

# splitmix64's constants as signed 64-bit integers: torch's int64 arithmetic wraps around like C's uint64.
_GOLDEN, _MIX1, _MIX2 = (
    c - 2**64 if c >= 2**63 else c for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
)


def position_hash(seed: int, epoch: int, positions: torch.Tensor) -> torch.Tensor:
    """A 63-bit hash per position (int64, >= 0), the same on every device: splitmix64 of the position offset by
    the seed and the epoch."""
    z = positions.to(torch.int64) + ((seed * 1_000_003 + epoch) * 2_147_483_647 % 2**62)
    z = z * _GOLDEN
    for shift, multiplier in ((30, _MIX1), (27, _MIX2)):
        z = (z ^ _logical_shift(z, shift)) * multiplier
    return (z ^ _logical_shift(z, 31)) & (2**63 - 1)


def _logical_shift(z: torch.Tensor, shift: int) -> torch.Tensor:
    return (z >> shift) & ((1 << (64 - shift)) - 1)


class Augment:
    def __init__(self, random_crop_padding: int, horizontal_flip: bool, seed: int):
        self.padding, self.flip, self.seed = random_crop_padding, horizontal_flip, seed

    @property
    def enabled(self) -> bool:
        return bool(self.padding or self.flip)

    def __call__(self, batch: Any, epoch: int, positions: torch.Tensor) -> Any:
        """``batch`` with its images (its first tensor, or the batch itself) augmented; ``positions``: each
        sample's position in the epoch's order."""
        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
            shape = list(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ConfigError(
                "trainer.augment",
                {"random_crop_padding": self.padding, "horizontal_flip": self.flip},
                f"augments images: the batch's first tensor must be float [batch, channels, height, width], "
                f"this one is {shape}.",
                "trainer.augment.random_crop_padding=0 trainer.augment.horizontal_flip=false for this dataset",
            )
        augmented = self.images(images, position_hash(self.seed, epoch, positions.to(images.device)))
        if isinstance(batch, (list, tuple)):
            return type(batch)([augmented, *batch[1:]])
        return augmented

    def images(self, images: torch.Tensor, hashes: torch.Tensor) -> torch.Tensor:
        n, _, height, width = images.shape
        memory_format = (
            torch.channels_last if images.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
        )
        if self.flip:
            flip = (hashes & 1).bool().view(n, 1, 1, 1)
            images = torch.where(flip, images.flip(3), images)
        if self.padding:
            p, span = self.padding, 2 * self.padding + 1
            dy, dx = (hashes >> 1) % span, (hashes >> 17) % span
            padded = F.pad(images, (p, p, p, p))
            rows = (dy.view(n, 1) + torch.arange(height, device=images.device)).view(n, 1, height, 1)
            cols = (dx.view(n, 1) + torch.arange(width, device=images.device)).view(n, 1, 1, width)
            batch = torch.arange(n, device=images.device).view(n, 1, 1, 1)
            channel = torch.arange(images.shape[1], device=images.device).view(1, -1, 1, 1)
            images = padded[batch, channel, rows, cols]
        return images.contiguous(memory_format=memory_format)
