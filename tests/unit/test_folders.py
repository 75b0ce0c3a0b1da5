"""What an image folder tells on the driver: its classes and its images' shape (conf/dataset/imagefolder.yaml)."""

import numpy as np
import pytest
from PIL import Image

from hydra_raytrain.config import ConfigError
from hydra_raytrain.data.folders import class_count, image_shape
from hydra_raytrain.preflight.resolvers import run_identity
from hydra_raytrain.preflight.validate import validate
from tests.conftest import compose_config
from tests.helpers.data import write_images


def test_class_count_and_shape_from_torchvisions_layout(tmp_path):
    write_images(tmp_path, ["b", "a", "c"], 2, size=(10, 12))
    assert class_count(str(tmp_path)) == 3 and image_shape(str(tmp_path)) == [3, 10, 12]


def test_a_train_folder_is_read_and_grayscale_has_one_channel(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split / "x").mkdir(parents=True)
        Image.fromarray(np.zeros((7, 5), dtype=np.uint8), mode="L").save(tmp_path / split / "x" / "0.png")
    (tmp_path / "train" / "y").mkdir()
    assert class_count(str(tmp_path)) == 2 and image_shape(str(tmp_path)) == [1, 7, 5]


@pytest.mark.parametrize(
    "layout, problem", [("empty", "has no class folders"), ("no images", "no images"), ("missing", "no such folder")]
)
def test_a_folder_that_is_not_an_image_folder_says_the_layout(tmp_path, layout, problem):
    root = tmp_path / "root"
    if layout != "missing":
        root.mkdir()
    if layout == "no images":
        (root / "a").mkdir()
        (root / "a" / "notes.txt").write_text("not an image")
    with pytest.raises(ConfigError) as caught:
        image_shape(str(root))
    assert caught.value.key == "dataset.root" and problem in str(caught.value)


def test_imagefolder_needs_only_its_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_images(tmp_path / "pets", ["cat", "dog"], 3, size=(9, 11))
    resolved = validate(compose_config("dataset=imagefolder", "dataset.root=pets"), str(tmp_path))
    assert resolved.dataset["num_outputs"] == 2 and resolved.dataset["input_shape"] == [3, 9, 11]
    assert resolved.model["num_outputs"] == 2  # the model adapts to the inferred values
    resized = validate(
        compose_config("dataset=imagefolder", "dataset.root=pets", "dataset.input_shape=[1,16,16]"), str(tmp_path)
    )
    assert resized.dataset["input_shape"] == [1, 16, 16]


def test_one_identity_for_the_run_dir_and_the_driver_with_a_relative_root(tmp_path, monkeypatch):
    """The run dir's ${run_name:} (run_identity on the composed config) and Ray's RunConfig.name (run_name on the
    validated one) agree; the same relative root from another folder is another run."""
    monkeypatch.chdir(tmp_path)
    write_images(tmp_path / "pets", ["cat", "dog"], 2)
    cfg = compose_config("dataset=imagefolder", "dataset.root=pets")
    validated = validate(compose_config("dataset=imagefolder", "dataset.root=pets"), str(tmp_path))
    assert run_identity(cfg, str(tmp_path)) == validated.run_name()
    (tmp_path / "other").mkdir()
    write_images(tmp_path / "other" / "pets", ["cat", "dog"], 2)
    assert run_identity(cfg, str(tmp_path / "other")) != run_identity(cfg, str(tmp_path))


def test_a_root_under_home_is_read_as_validation_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_images(tmp_path / "pets", ["cat", "dog"], 2, size=(6, 7))
    assert class_count("~/pets") == 2 and image_shape("~/pets") == [3, 6, 7]
