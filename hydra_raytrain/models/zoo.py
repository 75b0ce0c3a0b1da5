"""Model zoos by their own names, adapted to the dataset: any torchvision classification builder, any timm
model and any Hugging Face image-classification architecture (built from its config), with the dataset's classes
and input channels, a small-image stem where the zoo has one, and pretrained
weights read from the local cache (refused at once, naming the file, when they are not there and cannot be
downloaded)."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from hydra_raytrain.config.errors import ConfigError, did_you_mean

# Below this side length the ImageNet stem (7x7 stride 2 + max-pool) would shrink the image to nothing.
SMALL_IMAGE = 64
# torchvision builders whose training-mode forward returns auxiliary logits unless told not to.
AUX_LOGITS = ("googlenet", "inception_v3")
TORCHVISION_LISTING = "names of torchvision.models.list_models(module=torchvision.models)"


def torchvision_model(
    name: str, input_shape: Sequence[int], num_outputs: int, weights: str | None = None, **kwargs: Any
) -> nn.Module:
    """``torchvision.models.get_model(name, **kwargs)`` for the dataset: ``num_outputs`` classes, its input channels,
    and for images under 64 px the ResNet family's 3x3 stem without max-pooling (CIFAR-style) and a ViT's
    ``image_size``. ``weights`` (e.g. ``"IMAGENET1K_V1"``, ``"DEFAULT"``) loads pretrained weights from the torch hub
    cache (``TORCH_HOME``), downloading them when online; the head is then re-initialised for ``num_outputs`` and a
    first convolution of another channel count starts from the pretrained one's mean over RGB."""
    import torchvision

    builder = torchvision.models.get_model_builder(
        check_name("model.name", name, torchvision_names(), TORCHVISION_LISTING)
    )
    in_channels, height, width = input_shape
    if name in AUX_LOGITS:
        kwargs.setdefault("aux_logits", False)
        if weights is None:
            kwargs.setdefault("init_weights", True)  # torchvision's own default, without its warning
    if name.startswith("vit_") and weights is None:
        kwargs.setdefault("image_size", _vit_image_size(name, height, width))
    if weights is None:
        model = builder(num_classes=num_outputs, **kwargs)
    else:
        chosen = pretrained_weights(name, weights)
        model = builder(weights=chosen, **kwargs)
        _replace_head(model, len(chosen.meta["categories"]), num_outputs)
    if min(height, width) < SMALL_IMAGE and isinstance(model, torchvision.models.ResNet):
        model.conv1 = nn.Conv2d(in_channels, model.conv1.out_channels, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    else:
        _adapt_first_convolution(model, in_channels, pretrained=weights is not None)
    if getattr(model, "transform_input", False) and in_channels != 3:
        model.transform_input = False  # GoogLeNet/Inception re-normalise 3 ImageNet channels
    return model


def timm_model(
    name: str, input_shape: Sequence[int], num_outputs: int, pretrained: bool = False, **kwargs: Any
) -> nn.Module:
    """``timm.create_model(name, num_classes=num_outputs, in_chans=<the dataset's channels>, **kwargs)``.
    ``pretrained=true`` reads the weights from the Hugging Face cache (``HF_HOME``), downloading them when online."""
    import timm

    check_name("model.name", name.split(".")[0], timm.list_models(), "names of timm.list_models() (a tag may follow)")
    if pretrained:
        _check_hub_weights(name)
    return timm.create_model(name, pretrained=pretrained, num_classes=num_outputs, in_chans=input_shape[0], **kwargs)


class HuggingFaceClassifier(nn.Module):
    """A transformers image-classification model whose forward returns the logits (what the tasks read)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


def huggingface_model(model_type: str, input_shape: Sequence[int], num_outputs: int, **config: Any) -> nn.Module:
    """``AutoModelForImageClassification.from_config(AutoConfig.for_model(model_type, **config))`` with
    ``num_labels``, ``num_channels`` and (where the architecture has it) ``image_size`` from the dataset; new
    weights (no download). ``config``: the architecture's own settings (``hidden_size``, ``depths``...)."""
    from transformers import AutoConfig, AutoModelForImageClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES

    names = sorted(MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES)
    check_name("model.model_type", model_type, names, "image-classification model types of transformers")
    settings = AutoConfig.for_model(model_type, num_labels=num_outputs, **config)
    if hasattr(settings, "num_channels"):
        settings.num_channels = input_shape[0]
    if hasattr(settings, "image_size") and "image_size" not in config:
        settings.image_size = input_shape[1]
    return HuggingFaceClassifier(AutoModelForImageClassification.from_config(settings))


def torchvision_names() -> list[str]:
    """torchvision's classification builders (not its detection, segmentation, video or optical-flow ones)."""
    import torchvision

    return torchvision.models.list_models(module=torchvision.models)


def check_name(key: str, name: str, names: Sequence[str], listing: str) -> str:
    if name not in names:
        raise ConfigError(key, name, f"no such model{did_you_mean(name, names)}.", f"one of the {len(names)} {listing}")
    return name


def pretrained_weights(name: str, weights: str) -> Any:
    """torchvision's weights enum member for ``weights``; a ConfigError when the model has none of that name, or
    when they are not in the torch hub cache and their server cannot be reached (no minutes-long download wait)."""
    import torchvision

    members = torchvision.models.get_model_weights(name).__members__
    if weights not in members:
        raise ConfigError("model.weights", weights, f"{name} has no such weights.", ", ".join(members))
    chosen = members[weights]
    if not os.path.exists(_cached(chosen)):
        _check_online("model.weights", weights, chosen.url, _cached(chosen))
    return chosen


def _cached(weights: Any) -> str:
    """Where torch.hub keeps a weights file it downloaded (``load_state_dict_from_url``)."""
    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(weights.url).path))


def weights_on_disk(spec: dict[str, Any]) -> bool:
    """Whether a zoo model's pretrained weights load without a download (the driver then builds it to check the
    run); a ConfigError when they can be neither read nor downloaded. False for any other builder."""
    target = spec.get("_target_", "")
    if target.endswith(("torchvision_model", "torchvision_resnet")) and spec.get("weights"):
        return os.path.exists(_cached(pretrained_weights(spec.get("name") or spec["arch"], spec["weights"])))
    if target.endswith("timm_model") and spec.get("pretrained"):
        return _check_hub_weights(spec["name"])
    return False


def _check_hub_weights(name: str) -> bool:
    """True when timm's weights for ``name`` are in the Hugging Face cache; else a ConfigError unless the hub
    answers (HF_HUB_OFFLINE=1 counts as offline)."""
    import timm
    from huggingface_hub import constants, try_to_load_from_cache

    config = timm.models.get_pretrained_cfg(name.split(".")[0])
    repo = getattr(config, "hf_hub_id", None) if config is not None else None
    if not repo:
        return False  # weights served from a URL of the model's own: timm reports what fails
    for filename in ("model.safetensors", "pytorch_model.bin"):
        if isinstance(try_to_load_from_cache(repo, filename), str):
            return True
    where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(
            "model.pretrained",
            True,
            f"{name}'s weights ({repo}) are not in {where}, and HF_HUB_OFFLINE is set.",
            "the weights in that cache, or model.pretrained=false",
        )
    _check_online("model.pretrained", True, f"https://{urlparse(constants.ENDPOINT).netloc}/{repo}", where)
    return False


def _check_online(key: str, value: object, url: str, where: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=5).close()
    except OSError as error:
        raise ConfigError(
            key,
            value,
            f"the weights are not in {where} and {host} cannot be reached ({error.strerror or error}).",
            f"the file at {where} (download it where there is network, then copy it there), or {key}="
            + ("null" if key.endswith("weights") else "false"),
        ) from None


def _vit_image_size(name: str, height: int, width: int) -> int:
    patch = int(name.rsplit("_", 1)[1])
    if height != width or height % patch:
        raise ConfigError(
            "model.name",
            name,
            f"its {patch} px patches do not tile the dataset's {height}x{width} images.",
            f"square images of a multiple of {patch} px, or a ViT of another patch size",
        )
    return height


def _replace_head(model: nn.Module, categories: int, num_outputs: int) -> None:
    """The pretrained classifier's last layer (a Linear, or SqueezeNet's 1x1 convolution) re-initialised for
    ``num_outputs`` classes."""
    name, layer = [
        (name, module)
        for name, module in model.named_modules()
        if getattr(module, "out_features", getattr(module, "out_channels", None)) == categories
    ][-1]
    if isinstance(layer, nn.Linear):
        new: nn.Module = nn.Linear(layer.in_features, num_outputs, bias=layer.bias is not None)
    else:
        new = nn.Conv2d(layer.in_channels, num_outputs, layer.kernel_size, layer.stride, layer.padding)
    _set_submodule(model, name, new)


def _adapt_first_convolution(model: nn.Module, in_channels: int, pretrained: bool) -> None:
    name, first = next((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d))
    if first.in_channels == in_channels:
        return
    shape: dict[str, Any] = {key: getattr(first, key) for key in ("kernel_size", "stride", "padding", "dilation")}
    new = nn.Conv2d(in_channels, first.out_channels, **shape, bias=first.bias is not None)
    if pretrained:  # timm's rule: the RGB filters' mean, scaled to keep the activations' size
        with torch.no_grad():
            mean = first.weight.mean(dim=1, keepdim=True)
            new.weight.copy_(mean.expand(-1, in_channels, -1, -1) * first.in_channels / in_channels)
            if first.bias is not None and new.bias is not None:
                new.bias.copy_(first.bias)
    _set_submodule(model, name, new)


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)
