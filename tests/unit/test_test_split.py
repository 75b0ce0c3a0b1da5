"""The test split of every dataset kind: held out of training (validation keeps its own rows), disjoint, asked
for by ``test_fraction`` / ``test_path`` / ``test_size``, and absent otherwise (the run's name unchanged); how the
summary shows it and how a run without one is refused."""

from __future__ import annotations

import pytest
import torch
from rich.console import Console

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.identity import run_name
from hydra_raytrain.data import digits, fake, imagefolder, images, parquet, torchvision_builtin
from hydra_raytrain.data.splits import split_indices
from hydra_raytrain.driver.report import summary_table
from hydra_raytrain.inference.scoring import has_test_split, split_loader
from hydra_raytrain.preflight.resolvers import register_resolvers
from tests.conftest import compose_config
from tests.helpers.data import write_digits_parquet, write_images, write_mnist


def test_a_test_split_takes_its_rows_from_training_and_leaves_validation_as_it_was():
    train, val, test = split_indices(100, 0.2, 3, test_fraction=0.1)
    old_train, old_val, none = split_indices(100, 0.2, 3)
    assert val == old_val and none == [] and (len(train), len(test)) == (70, 10)
    assert set(test) <= set(old_train) and sorted(train + val + test) == list(range(100))
    with pytest.raises(ConfigError, match=r"dataset.test_fraction=0.8: must be at least 0 and below 1 - dataset"):
        split_indices(100, 0.2, 3, test_fraction=0.8)
    splits = digits(test_fraction=0.1)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (1258, 359, 180) and digits().test is None
    assert torch.equal(splits.val.tensors[0], digits().val.tensors[0])


def test_image_folders_test_from_a_test_folder_or_a_fraction_and_fake_data_by_size(tmp_path):
    write_images(tmp_path / "a" / "train", ["cat", "dog"], 5)
    write_images(tmp_path / "a" / "val", ["cat", "dog"], 1)
    write_images(tmp_path / "a" / "test", ["cat", "dog"], 2)
    assert imagefolder(str(tmp_path / "a"), input_shape=(1, 8, 8), num_outputs=2).test is None  # only when asked
    test = str(tmp_path / "a" / "test")
    splits = imagefolder(str(tmp_path / "a"), input_shape=(1, 8, 8), num_outputs=2, test_path=test)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (10, 2, 4)
    with pytest.raises(ConfigError, match="is the test split already"):
        imagefolder(str(tmp_path / "a"), input_shape=(1, 8, 8), num_outputs=2, test_fraction=0.2, test_path=test)
    write_images(tmp_path / "b", ["cat", "dog"], 6)  # torchvision's layout: both splits drawn from the images
    splits = imagefolder(str(tmp_path / "b"), input_shape=(1, 8, 8), num_outputs=2, test_fraction=0.25)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (7, 2, 3)
    assert fake(num_outputs=2, train_size=4, val_size=2, test_size=3).test is not None
    assert len(fake(num_outputs=2, train_size=4, val_size=2, test_size=3).test) == 3
    write_mnist(tmp_path / "m")  # the official test set validates; the test split is held out of training
    held = torchvision_builtin("MNIST", str(tmp_path / "m"), (1, 28, 28), 10, download=False, test_fraction=0.25)
    assert (len(held.train), len(held.val), len(held.test)) == (9, 5, 3)


def test_streamed_files_test_from_a_path_or_a_fraction_of_the_training_files(tmp_path):
    write_digits_parquet(tmp_path / "t", files=5)
    write_digits_parquet(tmp_path / "held", files=1)
    plain = parquet(str(tmp_path / "t"), (1, 8, 8), 10)
    held = parquet(str(tmp_path / "t"), (1, 8, 8), 10, test_fraction=0.3)
    assert held.val_files == plain.val_files and "test" not in plain.rows
    assert set(held.test_files) | set(held.train_files) == set(plain.train_files) and len(held.test_files) == 1
    assert sum(held.rows.values()) == sum(plain.rows.values()) and held.rows["test"] > 0
    by_path = parquet(str(tmp_path / "t"), (1, 8, 8), 10, test_path=str(tmp_path / "held"))
    assert by_path.train_files == plain.train_files and len(by_path.test_files) == 1
    x, y = (torch.cat(parts) for parts in zip(*by_path.read("test", batch_size=500), strict=True))
    assert x.shape[1:] == (1, 8, 8) and len(y) == by_path.rows["test"]
    with pytest.raises(ConfigError, match="dataset.test_fraction=0.2: dataset.test_path .* is the test split"):
        parquet(str(tmp_path / "t"), (1, 8, 8), 10, test_path=str(tmp_path / "held"), test_fraction=0.2)
    write_images(tmp_path / "i", ["a", "b"], 6)
    write_images(tmp_path / "it", ["a", "c"], 1)
    assert images(str(tmp_path / "i"), (3, 8, 8), 2, test_fraction=0.2).rows == {"train": 8, "val": 2, "test": 2}
    with pytest.raises(ConfigError, match="dataset.test_path=.* has class folders that .* has not: c"):
        images(str(tmp_path / "i"), (3, 8, 8), 2, test_path=str(tmp_path / "it"))


def test_a_test_split_is_part_of_the_run_name_only_when_asked_for():
    register_resolvers()
    names = {}
    for extra in ([], ["dataset.test_fraction=0.0"], ["dataset.test_fraction=0.1"]):
        cfg = compose_config("storage.name=null", *extra)
        names[tuple(extra)] = run_name(__import__("omegaconf").OmegaConf.to_container(cfg, resolve=True))
    assert names[()] == names[("dataset.test_fraction=0.0",)] != names[("dataset.test_fraction=0.1",)]
    assert not has_test_split({"_target_": "hydra_raytrain.data.digits", "test_fraction": 0.0})
    assert has_test_split({"_target_": "hydra_raytrain.data.parquet", "test_path": "x", "test_fraction": 0})
    assert not has_test_split({"_target_": "hydra_raytrain.data.imagefolder", "root": "x", "test_path": None})


def test_a_run_without_a_test_split_is_refused_by_name_and_the_summary_shows_one_beside_validation():
    cfg = {
        "dataset": {"_target_": "hydra_raytrain.data.digits"},
        "trainer": {"val_batch_size_per_worker": None, "batch_size_per_worker": 32, "batch_size": None},
    }
    with pytest.raises(ConfigError, match=r"--split='test': the run's dataset \(hydra_raytrain.data.digits\) has no"):
        split_loader(cfg, "test")
    summary = {
        "status": "completed",
        "final": {"train_loss": 0.5, "val_loss": 0.4, "val_accuracy": 0.9},
        "best": {"epoch": 2, "val_loss": 0.3, "val_accuracy": 0.91},
        "monitor": "val_loss",
        "epochs_completed": 3,
        "wall_seconds": 1.0,
        "test": {"test_loss": 0.35, "test_accuracy": 0.875, "checkpoint": "c", "epoch": 2},
    }
    console = Console(width=120, record=True)
    console.print(summary_table(summary))
    lines = console.export_text().splitlines()
    assert "test (best checkpoint)" in lines[2]
    assert [line.split("│")[4].strip() for line in lines if line.startswith("│ val_")] == ["0.8750", "0.3500"]
