"""torchvision ResNets adapted to any number of channels, image size and classes (``model=resnet18``)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from hydra_raytrain.models.zoo import torchvision_model


def torchvision_resnet(
    arch: str, input_shape: Sequence[int], num_outputs: int, weights: str | None = None
) -> nn.Module:
    """A ResNet of torchvision's by its name (``resnet18``, ``resnext50_32x4d``...): ``zoo.torchvision_model``,
    whose images under 64 px get a 3x3 stem without max-pooling (CIFAR-style)."""
    return torchvision_model(arch, input_shape, num_outputs, weights)
