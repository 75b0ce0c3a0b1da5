"""Model builders adapt to the dataset's channels, image size and number of outputs."""

import pytest
import torch

from hydra_raytrain.models import MLP, SimpleCNN, torchvision_resnet


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32), (1, 28, 28)])
def test_image_models_fit_any_image_shape(shape):
    x = torch.zeros(2, *shape)
    for model in (MLP(shape, 7), SimpleCNN(shape, 7), torchvision_resnet("resnet18", shape, 7)):
        assert model(x).shape == (2, 7)


def test_resnet_keeps_the_imagenet_stem_for_large_images_and_adapts_channels():
    model = torchvision_resnet("resnet18", (1, 64, 64), 3)
    assert model.conv1.kernel_size == (7, 7) and model.conv1.in_channels == 1
    assert model(torch.zeros(1, 1, 64, 64)).shape == (1, 3)
    small = torchvision_resnet("resnet50", (3, 32, 32), 10)
    assert small.conv1.kernel_size == (3, 3) and isinstance(small.maxpool, torch.nn.Identity)


def test_mlp_on_tabular_data():
    assert MLP((10,), 1, hidden_sizes=(4,))(torch.zeros(3, 10)).shape == (3, 1)
