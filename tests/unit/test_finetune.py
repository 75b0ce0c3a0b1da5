"""Fine-tuning by module name (hydra_raytrain/recipe/finetune.py): pure functions on a real model."""

import pytest
import torch
import torchvision

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.finetuning import FinetuneConfig
from hydra_raytrain.recipe.finetune import build_optimizer, check_patterns, freeze, module_names, param_groups


def test_a_parameter_sits_in_every_module_on_its_path_and_wrappers_are_left_out():
    assert module_names("layer1.0.conv1.weight") == ["layer1", "layer1.0", "layer1.0.conv1"]
    assert module_names("layer1._checkpoint_wrapped_module.conv1.weight") == ["layer1", "layer1.conv1"]
    assert module_names("bias") == []


def test_freezing_and_groups_by_pattern_first_group_wins():
    model = torchvision.models.resnet18(num_classes=10)
    frozen = freeze(model, ["conv1", "bn1", "layer1"])
    assert frozen == 3 + 12 and not model.conv1.weight.requires_grad and model.layer2[0].conv1.weight.requires_grad
    groups = param_groups(model, [{"modules": ["layer[23]*"], "lr": 1e-4}, {"modules": ["layer*", "fc"], "lr": 1e-2}])
    # the rest (none here) first; layer2 and layer3 in the first group; layer4 and fc in the second; layer1 in none
    ids = [{id(p) for p in group["params"]} for group in groups]
    assert ids[0] == set() and [group.get("lr") for group in groups] == [None, 1e-4, 1e-2]
    assert ids[1] == {id(p) for m in (model.layer2, model.layer3) for p in m.parameters()}
    assert ids[2] == {id(p) for m in (model.layer4, model.fc) for p in m.parameters()}
    optimizer = build_optimizer(
        {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1},
        model,
        FinetuneConfig(freeze=["conv1"], param_groups=[{"modules": ["fc"], "lr": 0.5}]),
    )
    assert [group["lr"] for group in optimizer.param_groups] == [0.1, 0.5]
    assert sum(len(group["params"]) for group in optimizer.param_groups) == sum(
        p.requires_grad for p in model.parameters()
    )


def test_a_pattern_that_names_no_module_or_freezes_everything_is_refused():
    models = {"model": torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))}
    with pytest.raises(ConfigError, match=r"finetune.param_groups\[0\].modules=\['2'\]: '2' names no module"):
        check_patterns(models, FinetuneConfig(param_groups=[{"modules": ["2"], "lr": 0.1}]))
    with pytest.raises(ConfigError, match="freezes every parameter: nothing would train"):
        check_patterns(models, FinetuneConfig(freeze=["*"]))
    check_patterns(models, FinetuneConfig(freeze=["0"], param_groups=[{"modules": ["1"], "lr": 0.1}]))
