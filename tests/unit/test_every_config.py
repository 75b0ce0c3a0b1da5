"""Every shipped config option composes and validates (no Ray): a broken YAML fails here, not in a user's run."""

import pathlib

import pytest

import hydra_raytrain
from hydra_raytrain.config import ConfigError, validate
from tests.conftest import compose_config
from tests.helpers.data import write_images, write_mnist

CONF = pathlib.Path(hydra_raytrain.__file__).parent.parent / "conf"
OPTIONS = sorted(
    (group.name, option.stem)
    for group in CONF.iterdir()
    if group.is_dir() and not group.name.startswith("_")
    for option in group.glob("*.yaml")
)
# Options that need a user's value to be complete; data sets on disk are made by the test (nothing downloads here).
REQUIRED = {
    ("dataset", "imagefolder"): ["dataset.root=pets"],
    ("model", "dcgan"): ["task=gan"],
    ("task", "gan"): ["model=dcgan"],
    ("dataset", "diabetes"): ["model=mlp", "task=regression"],
    ("task", "regression"): ["dataset=diabetes", "model=mlp"],
    ("dataset", "mnist"): ["dataset.root=data"],
    ("dataset", "fashion_mnist"): ["dataset.root=data"],
}
# torchvision checks CIFAR-10's files by their checksums: no small stand-in exists. Without the files, the driver
# leaves them to the workers' download (download: true, a warning), and refuses them with download=false.
NO_DATA = {("dataset", "cifar10")}


def test_every_group_is_found():
    groups = {group for group, _ in OPTIONS}
    assert {
        "model",
        "dataset",
        "optimizer",
        "scheduler",
        "scaling",
        "storage",
        "failure",
        "trainer",
        "task",
        "logger",
        "experiment",
        "debug",
    } <= groups


@pytest.mark.parametrize("group, option", OPTIONS)
def test_option_composes_and_validates(group, option, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths are the driver's: dataset.root=pets is read where the CLI runs
    write_images(tmp_path / "pets", ["cat", "dog"], 2)
    for name in ("MNIST", "FashionMNIST"):
        write_mnist(tmp_path / "data", name)
    cfg = compose_config(f"{group}={option}", *REQUIRED.get((group, option), []))
    if (group, option) in NO_DATA:
        with pytest.raises(ConfigError) as caught:
            validate(compose_config(f"{group}={option}", "dataset.download=false"), str(tmp_path))
        assert caught.value.key == "dataset.root" and "dataset.download=true on a machine with internet" in str(
            caught.value
        )
        validate(cfg, str(tmp_path))
        assert "no data on the driver, and the workers download it" in capsys.readouterr().err
        assert not (tmp_path / "data").joinpath("cifar10").exists()  # nothing downloaded or written on the driver
        return
    resolved = validate(cfg, str(tmp_path))
    models = resolved["model"] if "_target_" not in resolved["model"] else {"model": resolved["model"]}
    assert models and all(node["_target_"] for node in models.values()) and resolved["dataset"]["_target_"]


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
def test_every_model_fits_every_bundled_image_dataset(option, tmp_path):
    validate(compose_config(f"model={option}", "dataset=fake", *REQUIRED.get(("model", option), [])), str(tmp_path))


def test_every_yaml_opens_with_a_usage_comment():
    for path in CONF.rglob("*.yaml"):
        lines = [line for line in path.read_text().splitlines() if not line.startswith("# @package")]
        assert lines[0].startswith("#"), path
        assert "python -m hydra_raytrain" in path.read_text(), path
