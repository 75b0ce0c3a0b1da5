"""A multi-layer perceptron over the flattened input."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn


class MLP(nn.Sequential):
    def __init__(
        self,
        input_shape: Sequence[int],
        num_outputs: int,
        hidden_sizes: Sequence[int] = (128, 64),
        dropout: float = 0.0,
    ):
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = hidden
        layers.append(nn.Linear(width, num_outputs))
        super().__init__(*layers)
