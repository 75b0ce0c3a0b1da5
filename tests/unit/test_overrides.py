"""The command line before Hydra composes: keys of the typed sections checked against the schema, with
suggestions; overrides Hydra cannot parse and option files that are not YAML, each in one message."""

import pytest

from hydra_raytrain.config import ConfigError
from hydra_raytrain.shell.overrides import check_command_line, check_override_keys


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


def test_an_override_hydra_cannot_parse_is_named_with_the_grammar():
    with pytest.raises(ConfigError) as caught:
        check_command_line(["model=mlp", "failure.retry_on=[[unclosed"])
    assert str(caught.value) == (
        "Invalid config: failure.retry_on='[[unclosed': Hydra's override grammar cannot parse "
        "'failure.retry_on=[[unclosed': no viable alternative at input '[[unclosed'. Valid: key=value in Hydra's "
        "override grammar (https://hydra.cc/docs/advanced/override_grammar/basic/): a list is [a,b], a dict {a:1}; "
        """quote a value that holds brackets, commas or spaces: 'key="[[x"'"""
    )


def test_an_option_file_that_is_not_yaml_is_named_with_its_line(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "good.yaml").write_text("_target_: my.Net\nhidden: [32, 64]\n")
    (tmp_path / "model" / "bad.yaml").write_text("_target_: my.Net\nhidden: [32\ninput_shape: ${dataset.input_shape}\n")
    check_command_line(["--config-dir", str(tmp_path / "model" / "missing"), "model=good"])  # Hydra's to report
    for flags in (["--config-dir", str(tmp_path)], [f"--config-dir={tmp_path}"], ["-cd", str(tmp_path)]):
        with pytest.raises(ConfigError) as caught:
            check_command_line([*flags, "model=good"])
        assert str(caught.value) == (
            f"Invalid config: {tmp_path / 'model' / 'bad.yaml'}, line 3, column 12: not valid YAML: expected ',' or "
            "']', but got ':' (while parsing a flow sequence that opens at line 2, column 9). Valid: YAML (a list is "
            "[a, b], a mapping is key: value)"
        )
