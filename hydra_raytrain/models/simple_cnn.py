"""A small CNN for small images. No batch norm, so results are exact under DDP whatever the worker count."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


class SimpleCNN(nn.Module):
    def __init__(
        self, input_shape: Sequence[int], num_outputs: int, channels: Sequence[int] = (32, 64), hidden: int = 128
    ):
        super().__init__()
        in_channels = input_shape[0]
        layers: list[nn.Module] = []
        for out_channels in channels:
            layers += [nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.ReLU()]
            in_channels = out_channels
        # Pool to at most 4x4 whatever the image size, so one config serves 8x8 digits and 224x224 photos.
        side = min(4, input_shape[1], input_shape[2])
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(side), nn.Flatten())
        self.head = nn.Sequential(
            nn.Linear(in_channels * side * side, hidden), nn.ReLU(), nn.Linear(hidden, num_outputs)
        )

    def forward(self, x):
        return self.head(self.features(x))
