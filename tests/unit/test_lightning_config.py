"""task=lightning on the driver: our settings as lightning.Trainer's arguments, what is refused, the missing extra,
the rehearsal, run names that stay as they were."""

import sys

import pytest

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.identity import run_name
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.preflight.validate import validate
from hydra_raytrain.recipe.lightning import trainer_arguments
from hydra_raytrain.recipe.lightning_setup import EXTRA, MAPPED_ARGUMENTS, RUNNER_ARGUMENTS, import_lightning
from tests.conftest import compose_config


def test_our_settings_become_lightning_trainer_arguments(tmp_path):
    cfg = validate(
        compose_config(
            "experiment=digits_lightning",
            "trainer.precision=bf16-mixed",
            "trainer.accumulate_grad_batches=2",
            "trainer.gradient_clip_val=1.0",
            "trainer.limit_train_batches=5",
            "trainer.limit_val_batches=3",
            "trainer.max_epochs=4",
            "+trainer.lightning_kwargs.num_sanity_val_steps=0",
        ),
        str(tmp_path),
        rehearse=False,
    )
    arguments = trainer_arguments(cfg)
    expected = {
        "accelerator": "cpu",
        "precision": "bf16-mixed",
        "accumulate_grad_batches": 2,
        "gradient_clip_val": 1.0,
        "limit_train_batches": 5,
        "limit_val_batches": 3,
        "max_epochs": 4,
        "use_distributed_sampler": False,  # the dataset group's loaders are sharded already
        "enable_checkpointing": False,
        "logger": False,
    }
    assert {key: arguments[key] for key in expected} == expected
    # Every argument the runner sets is one that trainer.lightning_kwargs may not override, but these two.
    reserved = set(MAPPED_ARGUMENTS) | set(RUNNER_ARGUMENTS)
    assert set(arguments) - {"enable_model_summary", "default_root_dir"} <= reserved
    assert cfg.trainer.lightning_kwargs == {"num_sanity_val_steps": 0}
    with_datamodule = validate(
        compose_config("experiment=digits_lightning", "+datamodule._target_=tests.helpers.lit.DigitsDataModule"),
        str(tmp_path),
        rehearse=False,
    )
    assert trainer_arguments(with_datamodule)["use_distributed_sampler"] is True  # Lightning shards its loaders


@pytest.mark.parametrize(
    "override, key",
    [
        ("checkpoint.every_n_steps=10", "checkpoint.every_n_steps"),
        ("trainer.compile=true", "trainer.compile"),
        ("trainer.ema.decay=0.9", "trainer.ema.decay"),
        ("trainer.parallel_strategy=fsdp", "trainer.parallel_strategy"),
        ("scaling.num_workers=0", "scaling.num_workers"),
        ("+trainer.lightning_kwargs.max_epoch=3", "trainer.lightning_kwargs.max_epoch"),
        ("+trainer.lightning_kwargs.strategy=ddp", "trainer.lightning_kwargs.strategy"),
        ("+trainer.lightning_kwargs.max_epochs=3", "trainer.lightning_kwargs.max_epochs"),
        ("+trainer.lightning_kwargs.check_val_every_n_epoch=2", "trainer.lightning_kwargs.check_val_every_n_epoch"),
    ],
)
def test_settings_a_lightning_run_does_not_take_are_refused_by_name(tmp_path, override, key):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("experiment=digits_lightning", override), str(tmp_path), rehearse=False)
    assert key in [error.key for error in caught.value.errors], str(caught.value)
    if key.endswith("max_epoch"):
        assert "did you mean 'max_epochs'" in str(caught.value)
    if key.endswith("max_epochs"):
        assert "set trainer.max_epochs" in str(caught.value)


def test_the_missing_extra_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)  # import lightning.pytorch raises ImportError
    with pytest.raises(ConfigError) as caught:
        import_lightning()
    assert EXTRA in str(caught.value) and caught.value.key == "task"
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("experiment=digits_lightning"), str(tmp_path), rehearse=False)
    assert "pip install 'hydra_raytrain[lightning]'" in str(caught.value)


def test_a_plain_module_is_refused_by_the_rehearsal_and_the_example_passes(tmp_path):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("task=lightning"), str(tmp_path))  # simple_cnn: an nn.Module
    assert caught.value.key == "model._target_" and "not a lightning.LightningModule" in str(caught.value)
    validate(compose_config("experiment=digits_lightning"), str(tmp_path))  # fast_dev_run on the driver


def test_new_settings_left_unset_keep_earlier_run_names():
    cfg = validate(compose_config(), ".", rehearse=False).to_dict()
    before = {key: value for key, value in cfg.items() if key != "datamodule"}
    before["trainer"] = {key: value for key, value in cfg["trainer"].items() if key != "lightning_kwargs"}
    assert run_name(cfg) == run_name(before)
    assert run_name({**cfg, "datamodule": {"_target_": "my.DataModule"}}) != run_name(cfg)
    # A config written before them (a sweep's job file, a run's config.json) loads with their defaults.
    older = Resolved.from_dict(before)
    assert older.datamodule == {} and older.trainer.lightning_kwargs is None


def test_a_datamodule_that_does_not_import_is_the_one_problem(tmp_path):
    """The module is not rehearsed as a plain model when the datamodule fails (that added a second, wrong problem)."""
    with pytest.raises(ConfigError) as caught:
        validate(
            compose_config("experiment=digits_lightning", "+datamodule._target_=no_such_module.Data"), str(tmp_path)
        )
    assert caught.value.key == "datamodule._target_" and "cannot be imported" in str(caught.value)
    assert "problems" not in str(caught.value).splitlines()[0]
