"""Command-line keys of the typed sections are checked against the schema, with suggestions."""

import pytest

from hydra_raytrain.config import ConfigError
from hydra_raytrain.overrides import check_override_keys


def test_misspelt_key_suggests_the_right_one_and_lists_valid_keys():
    with pytest.raises(ConfigError) as caught:
        check_override_keys(["model=mlp", "trainer.max_epoch=3"])
    message = str(caught.value)
    assert caught.value.key == "trainer.max_epoch" and "did you mean 'max_epochs'" in message
    assert "trainer.max_epochs, trainer.seed" in message


def test_nested_typed_keys_are_checked():
    with pytest.raises(ConfigError, match="trainer.dataloader has no setting 'num_worker'"):
        check_override_keys(["trainer.dataloader.num_worker=2"])


def test_sweep_keys_are_pointed_to_the_sweeper():
    with pytest.raises(ConfigError) as caught:  # the spelling of the sweep issue, before the sweeper existed
        check_override_keys(["-m", "optimizer.lr=1e-3,1e-2", "sweep.keep_checkpoints=1"])
    assert (
        caught.value.key == "sweep.keep_checkpoints"
        and "Valid: hydra/sweeper=ray_tune hydra.sweeper.keep_checkpoints=1" in str(caught.value)
    )
    with pytest.raises(ConfigError) as caught:
        check_override_keys(["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.keep_checkpoint=1"])
    assert "did you mean 'keep_checkpoints'" in str(caught.value) and "hydra.sweeper.reduction_factor" in str(
        caught.value
    )


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "trainer.max_epochs=1,2", "scaling.num_workers=1"],
        ["--cfg", "job", "hydra.run.dir=x"],
        ["+trainer.extra=1", "model.whatever=1", "scaling.resources_per_worker.CPU=2"],
        ["optimizer=sgd", "ray.runtime_env.env_vars.A=1"],
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=asha", "hydra.sweeper.params.optimizer.lr=1e-3,1e-2"],
        ["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3"],  # another sweeper's own keys are Hydra's to check
    ],
)
def test_valid_or_unchecked_arguments_pass(args):
    check_override_keys(args)
