"""Every shipped config option composes and validates (no Ray): a broken YAML fails here, not in a user's run."""

import pathlib

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

import hydra_raytrain
from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.schema import TYPED_SECTIONS, TrainConfig
from hydra_raytrain.preflight.rehearsal import build_dataset
from hydra_raytrain.preflight.replaced import apply_overrides
from hydra_raytrain.preflight.validate import validate
from tests.conftest import compose_config
from tests.helpers.data import write_digits_parquet, write_images, write_mnist
from tests.helpers.text import write_jsonl, write_model

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
    ("dataset", "parquet"): ["dataset.path=table", "model=mlp"],
    ("dataset", "table"): ["dataset.path=table.csv", "model=mlp"],
    ("dataset", "images"): ["dataset.path=pets"],
    ("task", "lightning"): ["model=lit_classifier"],
    ("model", "lit_classifier"): ["task=lightning"],
    # a module that brings its loaders (the command line's rules drop the default model's arguments)
    ("dataset", "module"): ["task=lightning", "model._target_=lightning.pytorch.demos.boring_classes.BoringModel"],
}
# Text: a tiny causal LM and its tokenizer (written by the test under lm/) learning from text.jsonl.
TEXT = ["task=causal_lm", "model=causal_lm", "model.path=lm", "dataset=text", "dataset.path=text.jsonl"]
REQUIRED.update({option: TEXT for option in (("dataset", "text"), ("model", "causal_lm"), ("task", "causal_lm"))})
REQUIRED[("peft", "lora")] = TEXT
REQUIRED[("task", "dpo")] = [*TEXT[1:4], "dataset.path=pairs.jsonl", "dataset.format=preference"]
REQUIRED[("task", "reward_model")] = ["model=text_classifier", "model.path=lm", *REQUIRED[("task", "dpo")][2:]]
# A text classifier: a 1-layer BERT built from its type with that tokenizer, learning labelled.jsonl's two classes.
CLASSIFIER = ["task=text_classification", "model=text_classifier", "model.path=null", "model.model_type=bert"]
CLASSIFIER += ["model.tokenizer=lm", "+model.hidden_size=16", "+model.num_hidden_layers=1"]
CLASSIFIER += ["+model.num_attention_heads=2", "+model.intermediate_size=32"]
CLASSIFIER += ["dataset=text", "dataset.path=labelled.jsonl", "dataset.format=classification"]
REQUIRED.update({option: CLASSIFIER for option in (("model", "text_classifier"), ("task", "text_classification"))})
TEXT_MODELS = {"causal_lm", "text_classifier"}
# torchvision checks CIFAR-10's files by their checksums: no small stand-in exists. Without the files, the driver
# leaves them to the workers' download (download: true, a warning), and refuses them with download=false.
NO_DATA = {("dataset", "cifar10")}


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("lm"), "llama")


def test_every_group_is_found():
    groups = {group for group, _ in OPTIONS}
    assert {
        "model",
        "dataset",
        "optimizer",
        "scheduler",
        "task",
        "logger",
        "callbacks",
        "experiment",
        "debug",
    } <= groups


def test_the_schema_is_the_one_source_of_the_typed_sections_defaults():
    """The typed sections have no option files (their defaults live in the schema alone); scheduler options set
    only what differs from the schema's defaults; the composed default config is the schema's values."""
    typed = set(TYPED_SECTIONS) - {"scheduler", "peft"}  # their options: a schedule, an adapter method
    assert not typed & {group for group, _ in OPTIONS}
    defaults = OmegaConf.structured(TrainConfig)
    for option in (CONF / "scheduler").glob("*.yaml"):
        written = OmegaConf.load(option)
        assert all(written[key] != defaults.scheduler[key] for key in written if key != "lr_scheduler"), option
    composed = compose_config()
    for section in TYPED_SECTIONS:
        assert composed[section] == defaults[section], section


@pytest.mark.parametrize("group, option", OPTIONS)
def test_option_composes_and_validates(group, option, tmp_path, capsys, monkeypatch, text_model):
    monkeypatch.chdir(tmp_path)  # relative paths are the driver's: dataset.root=pets is read where the CLI runs
    (tmp_path / "lm").symlink_to(text_model)
    write_jsonl(tmp_path / "text.jsonl", [{"text": "def f(a):"}, {"text": "return a + 1"}] * 5)
    write_jsonl(tmp_path / "labelled.jsonl", [{"text": "def f(a):", "label": "f"}, {"text": "a + 1", "label": "e"}] * 5)
    write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "def f(a):", "chosen": " a", "rejected": " b"}] * 10)
    write_images(tmp_path / "pets", ["cat", "dog"], 2)
    for name in ("MNIST", "FashionMNIST"):
        write_mnist(tmp_path / "data", name)
    write_digits_parquet(tmp_path / "table", files=2)
    rows = "".join(f"{i % 5},{i % 7},{['a', 'b'][i % 2]}\n" for i in range(40))
    (tmp_path / "table.csv").write_text("x,y,label\n" + rows)
    overrides = [f"{group}={option}", *REQUIRED.get((group, option), [])]
    cfg = compose_config(*overrides)
    apply_overrides(cfg, overrides)  # as the CLI does
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
    models = resolved.model if "_target_" not in resolved.model else {"model": resolved.model}
    assert models and all(node["_target_"] for node in models.values()) and resolved.dataset["_target_"]


MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml") if p.stem not in TEXT_MODELS)
# Every image dataset that ships or that the test writes (CIFAR-10 needs its real files, checked by checksum).
IMAGE_DATASETS = ["digits", "fake", "mnist", "fashion_mnist", "imagefolder"]


@pytest.mark.parametrize("dataset", IMAGE_DATASETS)
def test_every_model_runs_a_forward_pass_on_every_image_dataset(dataset, tmp_path, monkeypatch):
    """Each shipped model, built as a worker builds it (from the dataset's input_shape and num_outputs), maps a
    batch of that dataset's own samples to outputs of the right shape; dcgan's generator draws images of the
    dataset's shape and its discriminator scores them."""
    monkeypatch.chdir(tmp_path)
    write_images(tmp_path / "pets", ["cat", "dog", "emu"], 2, size=(16, 12))  # dcgan: sides that are multiples of 4
    for name in ("MNIST", "FashionMNIST"):
        write_mnist(tmp_path / "data", name)
    for option in MODELS:
        overrides = [*REQUIRED.get(("model", option), []), *REQUIRED.get(("dataset", dataset), [])]
        resolved = validate(compose_config(f"model={option}", f"dataset={dataset}", *overrides), str(tmp_path), False)
        splits = build_dataset(resolved.dataset)
        images = torch.stack([splits.train[i][0] for i in range(4)])
        shape, classes = tuple(resolved.dataset["input_shape"]), resolved.dataset["num_outputs"]
        assert images.shape == (4, *shape), (option, dataset)
        with torch.no_grad():
            if option == "dcgan":
                generator = instantiate(resolved.model["generator"]).eval()
                discriminator = instantiate(resolved.model["discriminator"]).eval()
                drawn = generator(torch.randn(4, resolved.task["latent_dim"]))
                assert drawn.shape == images.shape, (option, dataset)
                scores = discriminator(torch.cat([images, drawn]))
                assert scores.shape[0] == 8 and torch.isfinite(scores).all(), (option, dataset)
            else:
                outputs = instantiate(resolved.model).eval()(images)
                assert outputs.shape == (4, classes) and torch.isfinite(outputs).all(), (option, dataset)


def test_the_tabular_dataset_fits_the_mlp():
    resolved = validate(compose_config("experiment=diabetes_regression"), ".", False)
    rows = torch.stack([build_dataset(resolved.dataset).train[i][0] for i in range(4)])
    with torch.no_grad():
        outputs = instantiate(resolved.model).eval()(rows)
    assert outputs.shape == (4, resolved.dataset["num_outputs"]) and torch.isfinite(outputs).all()


def test_every_yaml_opens_with_a_usage_comment():
    for path in CONF.rglob("*.yaml"):
        lines = [line for line in path.read_text().splitlines() if not line.startswith("# @package")]
        assert lines[0].startswith("#"), path
        assert "python -m hydra_raytrain" in path.read_text(), path
