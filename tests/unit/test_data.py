"""Dataset builders on data that ships offline or that the test writes (torchvision's real loaders)."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from hydra_raytrain.config import ConfigError
from hydra_raytrain.data import diabetes, digits, fake, imagefolder, torchvision_builtin
from hydra_raytrain.data.bundled import digits_arrays
from tests.helpers.data import write_images, write_mnist


def test_digits_shapes_and_split():
    splits = digits()
    assert (len(splits.train), len(splits.val)) == (1438, 359)
    image, label = splits.train[0]
    assert image.shape == (1, 8, 8) and 0 <= image.min() and image.max() <= 1 and 0 <= label < 10


def test_digits_are_load_digits_without_importing_sklearn_datasets(tmp_path):
    from sklearn.datasets import load_digits

    expected = load_digits()
    for images, target in (digits_arrays(), digits_arrays(package_dir=str(tmp_path))):  # the file; the fallback
        np.testing.assert_array_equal(images, expected.images)
        np.testing.assert_array_equal(target, expected.target)
    probe = (
        "import sys; from hydra_raytrain.data import digits; digits(); "
        "print(sorted(m for m in sys.modules if m.startswith('sklearn')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_digits_refuses_a_config_that_disagrees_with_its_shape():
    with pytest.raises(ValueError, match=r"input_shape=\[1, 8, 8\]"):
        digits(input_shape=(3, 8, 8))


def test_diabetes_is_standardised_on_the_training_split():
    splits = diabetes()
    x = torch.stack([splits.train[i][0] for i in range(len(splits.train))])
    assert x.shape == (354, 10) and torch.allclose(x.mean(0), torch.zeros(10), atol=1e-5)


def test_fake_data_is_deterministic_with_the_configured_shape():
    splits = fake(input_shape=(3, 16, 16), num_outputs=4, train_size=8, val_size=4)
    assert splits.train[0][0].shape == (3, 16, 16) and torch.equal(splits.train[3][0], splits.train[3][0])
    assert (len(splits.train), len(splits.val)) == (8, 4)


@pytest.mark.parametrize("name", ["MNIST", "FashionMNIST"])
def test_torchvision_mnist_family_reads_raw_files(tmp_path, name):
    write_mnist(tmp_path, name)
    splits = torchvision_builtin(name, str(tmp_path), input_shape=(1, 14, 14), num_outputs=10, mean=[0.5], std=[0.5])
    assert (len(splits.train), len(splits.val)) == (12, 5)
    assert splits.train[0][0].shape == (1, 14, 14)  # resized to the configured input_shape


def test_missing_torchvision_data_says_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="dataset.download=true"):
        torchvision_builtin("CIFAR10", str(tmp_path), input_shape=(3, 32, 32), num_outputs=10)


def test_imagefolder_with_train_and_val(tmp_path):
    write_images(tmp_path / "train", ["cat", "dog"], 3)
    write_images(tmp_path / "val", ["cat", "dog"], 1)
    splits = imagefolder(str(tmp_path), input_shape=(1, 8, 8), num_outputs=2)
    assert (len(splits.train), len(splits.val)) == (6, 2)
    assert splits.train[0][0].shape == (1, 8, 8)


def test_imagefolder_without_val_splits_train(tmp_path):
    write_images(tmp_path / "train", ["a", "b", "c"], 4)
    splits = imagefolder(str(tmp_path), input_shape=(3, 8, 8), num_outputs=3, val_fraction=0.25)
    assert (len(splits.train), len(splits.val)) == (9, 3)


def test_imagefolder_class_count_must_match(tmp_path):
    write_images(tmp_path / "train", ["a", "b"], 1)
    with pytest.raises(
        ConfigError, match=r"dataset.num_outputs=5: .* has 2 classes \(a, b\). Valid: dataset.num_outputs=2"
    ):
        imagefolder(str(tmp_path), input_shape=(3, 8, 8), num_outputs=5)


def test_imagefolder_takes_torchvisions_own_layout_class_folders_at_the_root(tmp_path):
    write_images(tmp_path, ["a", "b"], 4)
    splits = imagefolder(str(tmp_path), input_shape=(3, 8, 8), num_outputs=2, val_fraction=0.25)
    assert (len(splits.train), len(splits.val)) == (6, 2)


def test_imagefolder_without_images_names_the_root_and_the_layout(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as caught:
        imagefolder(str(tmp_path), input_shape=(3, 8, 8), num_outputs=2)
    assert caught.value.key == "dataset.root" and "root/<class>/<image>" in str(caught.value)


@pytest.mark.parametrize(
    "build, key",
    [
        (lambda: digits(val_fraction=1.5), "dataset.val_fraction"),
        (lambda: digits(num_outputs=4), "dataset.num_outputs"),
        (lambda: fake(input_shape=(16, 16)), "dataset.input_shape"),
        (lambda: fake(input_shape=(2, 8, 8)), "dataset.input_shape"),
        (lambda: fake(train_size=0), "dataset.train_size"),
        (lambda: torchvision_builtin("MNSIT", "/tmp", input_shape=(1, 28, 28), num_outputs=10), "dataset.name"),
    ],
)
def test_a_builder_refuses_its_own_bad_arguments_naming_the_key(build, key):
    with pytest.raises(ConfigError) as caught:
        build()
    assert caught.value.key == key, str(caught.value)
