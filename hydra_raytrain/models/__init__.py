"""Model builders that adapt to the dataset through config (``input_shape``, ``num_outputs``)."""

from hydra_raytrain.models.mlp import MLP
from hydra_raytrain.models.resnet import torchvision_resnet
from hydra_raytrain.models.simple_cnn import SimpleCNN

__all__ = ["MLP", "SimpleCNN", "torchvision_resnet"]
