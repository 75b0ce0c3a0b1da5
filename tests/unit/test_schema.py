"""Typed schemas: Hydra's composition errors and our range checks, each naming the key and the value."""

import pytest
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import OmegaConf

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.schema import TrainerConfig
from hydra_raytrain.preflight.validate import validate
from tests.conftest import compose_config


@pytest.mark.parametrize(
    "override, key, value",
    [
        ("scaling.num_workers=-1", "scaling.num_workers", "-1"),
        ("trainer.max_epochs=0", "trainer.max_epochs", "0"),
        ("trainer.batch_size=0", "trainer.batch_size", "0"),
        ("failure.max_failures=-2", "failure.max_failures", "-2"),
        ("failure.preemption_grace_s=-1", "failure.preemption_grace_s", "-1"),
        ("scheduler.interval=sometimes", "scheduler.interval", "sometimes"),
        ("scaling.placement_strategy=NEAR", "scaling.placement_strategy", "NEAR"),
        ("checkpoint.checkpoint_score_order=up", "checkpoint.checkpoint_score_order", "up"),
        ("checkpoint.every_n_steps=0", "checkpoint.every_n_steps", "0"),
        ("failure.retry_on=['(']", "failure.retry_on", "("),
        ("checkpoint.every_n_minutes=0", "checkpoint.every_n_minutes", "0"),
        ("checkpoint.checkpoint_upload_mode=LAZY", "checkpoint.checkpoint_upload_mode", "LAZY"),
        ("trainer.dataloader.prefetch_factor=0", "trainer.dataloader.prefetch_factor", "0"),
        ("trainer.num_threads=0", "trainer.num_threads", "0"),
        ("trainer.sync_debug_mode=loud", "trainer.sync_debug_mode", "loud"),
        ("trainer.augment.random_crop_padding=-1", "trainer.augment.random_crop_padding", "-1"),
        ("trainer.precision=fp8", "trainer.precision", "fp8"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches", "0"),
        ("trainer.gradient_clip_val=0", "trainer.gradient_clip_val", "0"),
        ("trainer.early_stopping.patience=0", "trainer.early_stopping.patience", "0"),
        ("trainer.early_stopping.mode=up", "trainer.early_stopping.mode", "up"),
        ("trainer.parallel_strategy=zero3", "trainer.parallel_strategy", "zero3"),
        ("trainer.activation_checkpointing=some", "trainer.activation_checkpointing", "some"),
        ("+trainer.parallel_strategy_kwargs.bucket_cap=5", "trainer.parallel_strategy_kwargs.bucket_cap", "5"),
        ("trainer.compile_kwargs={backnd: eager}", "trainer.compile_kwargs.backnd", "eager"),
        ("trainer.compile_kwargs=3", "trainer.compile_kwargs", "3"),
        ("scaling.worker_env=[A]", "scaling.worker_env", "A"),
        ("scheduler.warmup_start_factor=0", "scheduler.warmup_start_factor", "0"),
    ],
)
def test_out_of_range_values_name_key_and_value(override, key, value, tmp_path):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(override), str(tmp_path))
    assert caught.value.key == key
    assert f"{key}=" in str(caught.value) and value in str(caught.value)


def test_persistent_loader_workers_without_loader_processes_are_refused(tmp_path):
    cfg = compose_config("trainer.dataloader.persistent_workers=true", "trainer.dataloader.num_workers=0")
    with pytest.raises(
        ConfigError, match="persistent_workers and prefetch_factor need loader worker processes"
    ) as caught:
        validate(cfg, str(tmp_path))
    assert caught.value.key == "trainer.dataloader.num_workers"
    validate(compose_config("trainer.dataloader.persistent_workers=true"), str(tmp_path))  # null: sized per worker


def test_both_batch_sizes_set_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of trainer.batch_size"):
        validate(compose_config("trainer.batch_size_per_worker=8"), str(tmp_path))


def test_global_batch_must_split_over_workers(tmp_path):
    with pytest.raises(ConfigError, match="split evenly over 3 workers"):
        validate(compose_config("trainer.batch_size=64", "scaling.num_workers=3"), str(tmp_path))
    validate(
        compose_config("trainer.batch_size=null", "trainer.batch_size_per_worker=10", "scaling.num_workers=3"),
        str(tmp_path),
    )


def test_misspelt_key_fails_composition():
    with pytest.raises(ConfigCompositionException, match="max_epoch"):
        compose_config("trainer.max_epoch=3")


def test_wrong_type_fails_composition():
    with pytest.raises(ConfigCompositionException) as caught:
        compose_config("scaling.num_workers=two")
    assert "two" in str(caught.value.__cause__) and "num_workers" in str(caught.value.__cause__)


def test_unknown_option_lists_valid_ones():
    with pytest.raises(HydraException, match="resnet18"):
        compose_config("model=resnet19")


def test_defaults_match_the_schema_defaults():
    cfg = compose_config()
    assert OmegaConf.to_object(cfg.trainer).batch_size == TrainerConfig().batch_size
    assert (
        cfg.scaling.num_workers == 2
        and cfg.model._target_.endswith("SimpleCNN")
        and cfg.dataset._target_.endswith("digits")
    )


def test_resources_per_worker_from_the_command_line(tmp_path):
    resolved = validate(compose_config("scaling.resources_per_worker={CPU: 2, memory: 1000}"), str(tmp_path))
    assert resolved.scaling.resources_per_worker == {"CPU": 2, "memory": 1000}
    with pytest.raises(ConfigError, match="scaling.resources_per_worker.CPU='two'"):
        validate(compose_config("scaling.resources_per_worker={CPU: two}"), str(tmp_path))


def test_elastic_global_batch_must_split_over_every_possible_world_size(tmp_path):
    with pytest.raises(ConfigError, match="split evenly over 3 workers"):
        validate(
            compose_config("scaling.num_workers=2", "scaling.max_workers=4", "trainer.batch_size=64"), str(tmp_path)
        )
    with pytest.raises(ConfigError, match="scaling.max_workers=1"):
        validate(compose_config("scaling.num_workers=2", "scaling.max_workers=1"), str(tmp_path))
