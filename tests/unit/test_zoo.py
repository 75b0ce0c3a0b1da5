"""Model zoos by their own names (hydra_raytrain/models/zoo.py): every torchvision classification builder and a
sample of timm models, on a 3-channel and a 1-channel dataset; pretrained weights from the local cache only."""

import os
from contextlib import contextmanager

import pytest
import torch
import torchvision

from hydra_raytrain.check import check
from hydra_raytrain.config import ConfigError
from hydra_raytrain.models.zoo import torchvision_model, torchvision_names
from tests.conftest import compose_config

# Image sides these need at least (their stems or windows); every other builder takes the 32 px of dataset=fake.
SIDES = {"alexnet": 64, "inception_v3": 80, "maxvit_t": 224, "vit_h_14": 28}
# The small variants, trained one optimizer step for real (the others are checked on the meta device).
SMALL = ["mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1", "mnasnet0_5", "regnet_x_400mf"]
TIMM = ["resnet10t", "mobilenetv3_small_050", "efficientnet_b0", "convnext_atto", "regnetx_002", "lcnet_050"]


@contextmanager
def weights_on_meta():
    """Every parameter and buffer a module registers lands on the meta device; every other tensor stays on the CPU
    (RegNets compute their widths with tensor ops that torch.device("meta") could not read back)."""
    register_parameter, register_buffer = torch.nn.Module.register_parameter, torch.nn.Module.register_buffer

    def parameter(module, name, value):
        if value is not None:
            value = torch.nn.Parameter(value.to("meta"), requires_grad=value.requires_grad)
        register_parameter(module, name, value)

    def buffer(module, name, value, persistent=True):
        register_buffer(module, name, None if value is None else value.to("meta"), persistent)

    torch.nn.Module.register_parameter, torch.nn.Module.register_buffer = parameter, buffer
    try:
        yield
    finally:
        torch.nn.Module.register_parameter, torch.nn.Module.register_buffer = register_parameter, register_buffer


def one_step(model, channels, side=32):
    """One optimizer step on a batch of 4; the logits' shape. Every parameter gets a gradient: none is unused, which
    DDP would otherwise have to be told (the zoo's integration runs train in local mode on that ground)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    logits = model(torch.randn(4, channels, side, side))
    torch.nn.functional.cross_entropy(logits, torch.randint(0, 10, (4,))).backward()
    unused = [name for name, parameter in model.named_parameters() if parameter.grad is None]
    assert not unused, unused
    optimizer.step()
    return tuple(logits.shape)


@pytest.mark.slow
def test_every_torchvision_classification_builder_takes_the_datasets_channels_and_classes():
    """Every builder, alternately on a 3-channel and a 1-channel dataset (a family's neighbouring variants get both)."""
    names = torchvision_names()
    assert len(names) >= 80 and {"efficientnet_b0", "vit_b_16", "regnet_y_128gf"} <= set(names)
    shapes = {}
    for index, name in enumerate(names):
        side, channels = SIDES.get(name, 32), (3, 1)[index % 2]
        with weights_on_meta(), torch.no_grad():
            model = torchvision_model(name, [channels, side, side], 10)
            assert all(tensor.is_meta for tensor in (*model.parameters(), *model.buffers())), name
            shapes[name] = tuple(model(torch.empty(2, channels, side, side, device="meta")).shape)
    assert shapes == {name: (2, 10) for name in names}


@pytest.mark.parametrize("channels", [3, 1])
def test_the_small_variants_train_a_step(channels):
    assert {name: one_step(torchvision_model(name, [channels, 32, 32], 10), channels) for name in SMALL} == {
        name: (4, 10) for name in SMALL
    }
    resnet = torchvision_model("resnet18", [channels, 32, 32], 10)  # small images: a 3x3 stem, no max-pooling
    assert resnet.conv1.kernel_size == (3, 3) and isinstance(resnet.maxpool, torch.nn.Identity)


@pytest.mark.parametrize("channels", [3, 1])
def test_a_sample_of_timm_models_trains_a_step(channels):
    from hydra_raytrain.models.zoo import timm_model

    models = {name: timm_model(name, [channels, 32, 32], 10) for name in TIMM}
    models["vit_tiny_patch16_224"] = timm_model("vit_tiny_patch16_224", [channels, 32, 32], 10, img_size=32)
    assert {name: one_step(model, channels) for name, model in models.items()} == {name: (4, 10) for name in models}


def test_a_name_not_in_the_zoo_is_refused_with_the_closest_one():
    with pytest.raises(
        ConfigError, match=r"model.name='efficientnet_b9': no such model \(did you mean 'efficientnet_b"
    ):
        torchvision_model("efficientnet_b9", [3, 32, 32], 10)
    from hydra_raytrain.models.zoo import timm_model

    with pytest.raises(
        ConfigError, match=r"no such model \(did you mean 'resnet10t'\?\)\. Valid: one of the \d+ names"
    ):
        timm_model("resnet10x", [3, 32, 32], 10)
    with pytest.raises(ConfigError, match="its 14 px patches do not tile the dataset's 32x32 images"):
        torchvision_model("vit_h_14", [3, 32, 32], 10)


def test_pretrained_weights_load_from_the_torch_cache_and_adapt_to_the_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    weights = torchvision.models.SqueezeNet1_1_Weights.IMAGENET1K_V1
    pretrained = torchvision.models.squeezenet1_1()  # stands for the downloaded file: 1,000 ImageNet classes
    os.makedirs(tmp_path / "hub" / "checkpoints")
    torch.save(pretrained.state_dict(), tmp_path / "hub" / "checkpoints" / os.path.basename(weights.url))
    model = torchvision_model("squeezenet1_1", [1, 32, 32], 10, weights="IMAGENET1K_V1")
    # the body is the pretrained one; the head has the dataset's 10 classes; the grey stem is the RGB one's mean
    assert torch.equal(model.features[3].squeeze.weight, pretrained.features[3].squeeze.weight)
    assert model.classifier[1].out_channels == 10
    rgb = pretrained.features[0].weight
    assert torch.allclose(model.features[0].weight, rgb.mean(dim=1, keepdim=True) * 3)
    assert one_step(model, 1) == (4, 10)
    # The run's checks find them too, and rehearse the model on the driver (nothing to download)
    zoo = ("model=torchvision", "model.name=squeezenet1_1", "model.weights=IMAGENET1K_V1")
    resolved = check(compose_config(*zoo, "dataset=fake", "dataset.input_shape=[1,32,32]"))
    assert resolved.model["weights"] == "IMAGENET1K_V1"


def test_pretrained_weights_that_are_neither_cached_nor_reachable_fail_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))

    def offline(*args, **kwargs):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr("socket.create_connection", offline)
    cached = tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    with pytest.raises(ConfigError) as refused:
        torchvision_model("resnet18", [3, 32, 32], 10, weights="DEFAULT")
    assert str(refused.value) == (
        f"Invalid config: model.weights='DEFAULT': the weights are not in {cached} and download.pytorch.org cannot be "
        f"reached (Network is unreachable). Valid: the file at {cached} (download it where there is network, then "
        "copy it there), or model.weights=null"
    )
    with pytest.raises(ConfigError, match="resnet18 has no such weights. Valid: IMAGENET1K_V1, DEFAULT"):
        torchvision_model("resnet18", [3, 32, 32], 10, weights="IMAGENET1K_V9")
    # The run's checks refuse it before Ray starts: model=resnet18 and model=torchvision alike
    for option in (["model=resnet18"], ["model=torchvision", "model.name=resnet18"]):
        with pytest.raises(ConfigError, match="model.weights='DEFAULT': the weights are not in"):
            check(compose_config(*option, "model.weights=DEFAULT"))


HF_SMALL = {  # the architecture's own settings, kept small (defaults: ImageNet sizes)
    "mobilevit": {},
    "mobilenet_v2": {},
    "vit": {
        "patch_size": 8,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    },
    "convnext": {"depths": [1, 1, 1, 1], "hidden_sizes": [8, 16, 32, 64]},
    "resnet": {"depths": [1, 1, 1, 1], "hidden_sizes": [8, 16, 32, 64], "embedding_size": 8},
}


@pytest.mark.parametrize("channels", [3, 1])
def test_hugging_face_architectures_build_from_their_config_and_train_a_step(channels):
    from hydra_raytrain.models.zoo import huggingface_model

    models = {name: huggingface_model(name, [channels, 32, 32], 10, **config) for name, config in HF_SMALL.items()}
    assert {name: one_step(model, channels) for name, model in models.items()} == {name: (4, 10) for name in models}
    with pytest.raises(ConfigError, match=r"model.model_type='vitt': no such model \(did you mean 'vit'\?\)"):
        huggingface_model("vitt", [3, 32, 32], 10)


def test_a_hugging_face_model_as_its_zoo_builds_it_trains_with_the_classification_task():
    """``model._target_=transformers.AutoModelForImageClassification.from_config`` with the zoo's own names: the
    task reads the logits from the model's output."""
    from hydra.utils import instantiate

    from hydra_raytrain.tasks.classification import Classification

    config = {"_target_": "transformers.AutoConfig.for_model", "_args_": ["vit"], "num_labels": 10, "num_channels": 1}
    config.update(image_size=32, **HF_SMALL["vit"])
    model = instantiate({"_target_": "transformers.AutoModelForImageClassification.from_config", "config": config})
    output = Classification().training_step(model, (torch.randn(4, 1, 32, 32), torch.randint(0, 10, (4,))))
    output.loss.backward()
    assert output.sums["count"] == 4 and all(p.grad is not None for p in model.classifier.parameters())
