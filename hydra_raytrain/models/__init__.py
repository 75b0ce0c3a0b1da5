"""Model builders that adapt to the dataset through config (``input_shape``, ``num_outputs``).
Exports resolve lazily: a config without a zoo model never imports torchvision, timm or transformers."""

from hydra_raytrain.runtime.lazy import lazy_exports

_EXPORTS = {
    "MLP": "mlp",
    "SimpleCNN": "simple_cnn",
    "torchvision_resnet": "resnet",
    "torchvision_model": "zoo",
    "timm_model": "zoo",
    "huggingface_model": "zoo",
    "causal_lm": "text",
    "text_classifier": "text",
    "Generator": "dcgan",
    "Discriminator": "dcgan",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
