"""torchvision ResNets adapted to any number of channels, image size and classes."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

# Below this side length the ImageNet stem (7x7 stride 2 + max-pool) would shrink the image to nothing.
SMALL_IMAGE = 64


def torchvision_resnet(
    arch: str, input_shape: Sequence[int], num_outputs: int, weights: str | None = None
) -> nn.Module:
    """``torchvision.models.get_model(arch)`` with its stem and head replaced where the data needs it.

    ``weights`` (e.g. ``"IMAGENET1K_V1"``) loads pretrained weights; the head is then re-initialised for
    ``num_outputs`` classes and a replaced stem starts from scratch.
    """
    import torchvision  # here, not at the top: validating the config on the driver should not import it

    model = torchvision.models.get_model(arch, weights=weights)
    in_channels, height, width = input_shape
    if min(height, width) < SMALL_IMAGE:
        model.conv1 = nn.Conv2d(in_channels, model.conv1.out_channels, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != model.conv1.in_channels:
        model.conv1 = nn.Conv2d(in_channels, model.conv1.out_channels, 7, stride=2, padding=3, bias=False)
    model.fc = nn.Linear(model.fc.in_features, num_outputs)
    return model
