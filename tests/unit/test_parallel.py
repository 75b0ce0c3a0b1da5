"""The pure parts of sharding: which modules a class name picks, activation checkpointing's exactness in one
process, and a sharded checkpoint's completeness check and whole read (torch.distributed.checkpoint, no group)."""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from hydra_raytrain.models import torchvision_resnet
from hydra_raytrain.recipe import checkpoint
from hydra_raytrain.recipe.parallel import (
    checkpoint_activations,
    class_matches,
    local_bytes,
    matching_modules,
    module_classes,
    unwrap,
)


def test_a_class_is_named_by_its_name_or_dotted_path_and_the_root_is_never_picked():
    model = torchvision_resnet("resnet18", [3, 16, 16], 10)
    blocks = matching_modules(model, ["BasicBlock"])
    assert len(blocks) == 8 and blocks == matching_modules(model, ["torchvision.models.resnet.BasicBlock"])
    assert class_matches(model, ["ResNet"]) and matching_modules(model, ["ResNet"]) == []
    assert "BasicBlock" in module_classes(model) and "ResNet" not in module_classes(model)
    assert unwrap(model) is model


def test_activation_checkpointing_keeps_the_keys_the_gradients_and_batch_norm_statistics():
    torch.manual_seed(0)
    plain = torchvision_resnet("resnet18", [3, 16, 16], 10)
    recomputed = torchvision_resnet("resnet18", [3, 16, 16], 10)
    recomputed.load_state_dict(plain.state_dict())
    assert checkpoint_activations(recomputed, ["BasicBlock"]) == 8
    assert list(recomputed.state_dict()) == list(plain.state_dict())
    images, labels = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    for model in (plain, recomputed):
        nn.functional.cross_entropy(model(images), labels).backward()
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name
    # The recomputed forward must not update batch norm's running statistics a second time.
    for (name, a), b in zip(plain.named_buffers(), recomputed.buffers(), strict=True):
        assert torch.equal(a, b), name


def test_local_bytes_counts_plain_tensors_whole():
    assert local_bytes([torch.zeros(3, 4), torch.zeros(2, dtype=torch.float64)]) == 3 * 4 * 4 + 2 * 8


def test_a_sharded_checkpoint_reads_whole_and_a_truncated_shard_is_found(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    path = tmp_path / checkpoint.SHARDED_DIR
    dcp.save({"model": {"model": model.state_dict()}}, checkpoint_id=str(path), no_dist=True)
    checkpoint.check_sharded(str(path))
    weights = checkpoint.read_weights(str(tmp_path))["model"]  # model.pt's layout: one model's state_dict
    assert set(weights) == set(model.state_dict())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert checkpoint.has_weights(os.listdir(tmp_path))
    [shard] = [name for name in os.listdir(path) if name.endswith(".distcp")]
    with open(path / shard, "r+b") as file:
        file.truncate(os.path.getsize(path / shard) // 2)
    with pytest.raises(EOFError, match=f"{shard} is .* bytes, .* expected"):
        checkpoint.check_sharded(str(path))
