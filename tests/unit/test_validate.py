"""Driver-side checks of `_target_` nodes and paths, through the real composed config."""

import os

import pytest
import torch
from omegaconf import open_dict

from hydra_raytrain.config import ConfigError, ConfigErrors
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.preflight.validate import validate
from tests.conftest import compose_config
from tests.helpers.data import write_images, write_mnist


def test_unimportable_target_suggests_the_close_name(tmp_path):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("model._target_=hydra_raytrain.models.SimpleCNNN"), str(tmp_path))
    message = str(caught.value)
    assert caught.value.key == "model._target_"
    assert "SimpleCNNN" in message and "cannot be imported" in message and "did you mean 'SimpleCNN'" in message


def test_unknown_argument_names_it_and_lists_the_accepted_ones(tmp_path):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("+model.chanels=[8]"), str(tmp_path))
    message = str(caught.value)
    assert caught.value.key == "model.chanels"
    assert "did you mean 'channels'" in message and "input_shape, num_outputs, channels, hidden" in message


def test_unknown_optimizer_argument(tmp_path):
    with pytest.raises(ConfigError, match="optimizer.momentum.*torch.optim.Adam has no argument"):
        validate(compose_config("+optimizer.momentum=0.9"), str(tmp_path))


@pytest.mark.parametrize(
    "override, key",
    [
        ("optimizer.lr=-1", "optimizer.lr"),
        ("+optimizer.betas=[1.5,0.999]", "optimizer.betas"),
        ("+optimizer.eps=-1", "optimizer.eps"),
        ("optimizer.weight_decay=-0.1", "optimizer.weight_decay"),
        ("optimizer=sgd optimizer.momentum=-0.5", "optimizer.momentum"),
    ],
)
def test_an_optimizer_value_torch_rejects_names_its_key(tmp_path, override, key):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(*override.split()), str(tmp_path))
    assert caught.value.key == key and "rejects it: Invalid" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("other", ["foreach", "differentiable"])
def test_adamw_is_fused_and_a_second_implementation_names_the_way_out(tmp_path, other):
    assert compose_config("optimizer=adamw").optimizer.fused is True
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("optimizer=adamw", f"+optimizer.{other}=true"), str(tmp_path))
    assert caught.value.key == f"optimizer.{other}" and "optimizer.fused=null" in str(caught.value)
    validate(compose_config("optimizer=adamw", f"+optimizer.{other}=true", "optimizer.fused=null"), str(tmp_path))


class ParameterCheckingSGD(torch.optim.SGD):
    """An optimizer of a user's that checks its values once it holds its parameters."""

    def __init__(self, params, lr: float = 0.1, weight_decay: float = 0.0, max_norm: float = 1.0):
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        if max_norm <= 0:
            raise ValueError(f"Invalid max_norm value: {max_norm}")


def test_an_optimizer_of_a_users_own_is_checked_holding_a_parameter(tmp_path):
    """torch.optim's own optimizers are checked without a parameter (they check every value before taking one);
    another optimizer gets one, so that what it checks after taking it is checked too."""
    target = f"{__name__}.ParameterCheckingSGD"
    validate(compose_config(f"optimizer._target_={target}"), str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(f"optimizer._target_={target}", "+optimizer.max_norm=0"), str(tmp_path))
    assert caught.value.key == "optimizer.max_norm" and "rejects it: Invalid max_norm" in str(caught.value)


def test_per_model_optimizers_are_checked_too(tmp_path):
    cfg = compose_config("experiment=digits_gan")
    with open_dict(cfg):
        cfg.optimizer = {
            name: {"_target_": "torch.optim.Adam", "_partial_": True, "lr": lr}
            for name, lr in (("generator", 1e-3), ("discriminator", -1.0))
        }
    with pytest.raises(ConfigError) as caught:
        validate(cfg, str(tmp_path))
    assert caught.value.key == "optimizer.discriminator.lr" and caught.value.value == -1.0


def test_missing_required_argument(tmp_path):
    with pytest.raises(ConfigError, match="arguments do not fit.*missing"):
        validate(compose_config("~model.num_outputs"), str(tmp_path))


def test_missing_mandatory_value_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"dataset.root='\?\?\?': is required"):
        validate(compose_config("dataset=imagefolder"), str(tmp_path))


def test_imagefolder_root_must_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative root is the driver's: the folder the command runs in
    with pytest.raises(ConfigError) as caught:
        validate(
            compose_config("dataset=imagefolder", "dataset.root=no/such/folder", "dataset.num_outputs=3"), str(tmp_path)
        )
    assert caught.value.key == "dataset.root"
    assert str(tmp_path / "no/such/folder") in str(caught.value) and "no such folder" in str(caught.value)


def test_relative_paths_become_absolute_against_the_driver_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_images(tmp_path / "pets", ["a", "b", "c"], 2)
    write_mnist(tmp_path / "data" / "mnist")
    resolved = validate(
        compose_config("dataset=imagefolder", "dataset.root=pets", "dataset.num_outputs=3", "storage.path=results"),
        str(tmp_path),
    )
    assert resolved.dataset["root"] == str(tmp_path / "pets")
    assert resolved.storage.path == str(tmp_path / "results")
    resolved = validate(compose_config("dataset=mnist"), str(tmp_path))
    assert resolved.dataset["root"] == os.path.join(str(tmp_path), "data", "mnist")


def test_uris_are_left_alone(tmp_path):
    resolved = validate(compose_config("storage.path=s3://bucket/prefix"), str(tmp_path))
    assert resolved.storage.path == "s3://bucket/prefix"


def test_resolved_config_is_plain_and_interpolated(tmp_path):
    resolved = validate(
        compose_config("dataset=fake", "dataset.input_shape=[3,16,16]", "dataset.num_outputs=5"), str(tmp_path)
    )
    assert resolved.model["input_shape"] == [3, 16, 16] and resolved.model["num_outputs"] == 5
    assert isinstance(resolved, Resolved) and type(resolved.model["input_shape"]) is list


def test_a_bad_ddp_option_gets_a_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'bucket_cap_mb'"):
        validate(compose_config("trainer.parallel_strategy_kwargs={bucket_cap: 5}"), str(tmp_path))


FSDP = "trainer.parallel_strategy=fsdp"
FULL = "trainer.activation_checkpointing=full"


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        ([FSDP, "fsdp.shard_modules=[Linea]"], "fsdp.shard_modules", "did you mean 'Linear'"),
        ([FSDP, "fsdp.cpu_offload=true"], "fsdp.cpu_offload", "scaling.use_gpu=true"),
        (
            [FSDP, "trainer.parallel_strategy_kwargs={bucket_cap_mb: 5}"],
            "trainer.parallel_strategy_kwargs.bucket_cap_mb",
            "fsdp.",
        ),
        ([FULL], "trainer.activation_checkpointing_modules", "BasicBlock"),
        (
            [FULL, "trainer.activation_checkpointing_modules=[Block]"],
            "trainer.activation_checkpointing_modules",
            "Valid: Flatten, Linear, ReLU",
        ),
    ],
)
def test_fsdp_and_activation_checkpointing_settings_are_checked(tmp_path, overrides, key, words):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("model=mlp", *overrides), str(tmp_path))
    assert caught.value.key == key and words in str(caught.value), str(caught.value)


def test_the_modules_fsdp_shards_are_named_by_class_or_dotted_path(tmp_path):
    for name in ("Linear", "torch.nn.modules.linear.Linear"):
        resolved = validate(
            compose_config("model=mlp", "trainer.parallel_strategy=fsdp", f"fsdp.shard_modules=[{name}]"), str(tmp_path)
        )
        assert resolved.fsdp.shard_modules == [name] and resolved.fsdp.reshard_after_forward


def test_several_models_need_a_task_that_steps_them(tmp_path):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("model=dcgan", "model.generator.latent_dim=32"), str(tmp_path))
    assert caught.value.key == "model" and "task=gan" in str(caught.value)


def test_optimizers_per_model_must_name_the_models(tmp_path):
    adam, sgd = (
        {"_target_": "torch.optim.Adam", "_partial_": True},
        {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1},
    )
    cfg = compose_config("experiment=digits_gan")
    with open_dict(cfg):  # as an optimizer YAML with one node per model would compose
        cfg.optimizer = {"generator": adam}
    with pytest.raises(ConfigError, match="discriminator, generator"):
        validate(cfg, str(tmp_path))
    with open_dict(cfg):
        cfg.optimizer = {"generator": adam, "discriminator": sgd}
    assert validate(cfg, str(tmp_path)).optimizer["discriminator"]["lr"] == 0.1


def test_a_config_error_survives_pickling_and_copying():
    """Ray pickles (and copies) an exception raised in one of its processes, e.g. a sweep trial's train()."""
    import copy
    import pickle

    error = ConfigError("optimizer.lr", -1.0, "must be > 0.", "a positive float")
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(clone) is ConfigError and str(clone) == str(error) and clone.key == "optimizer.lr"


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("optimizer.lr=abc", "optimizer.lr", "takes a number for 'lr', not str"),
        ("+optimizer.betas=[0.9]", "optimizer.betas", "a list of 2"),
        ("+optimizer.amsgrad=1", "optimizer.amsgrad", "true or false"),
        ("model.hidden=many", "model.hidden", "an integer"),
        ("task.label_smoothing=[0.1]", "task.label_smoothing", "a number"),
    ],
)
def test_a_value_of_the_wrong_type_in_a_target_node_names_its_key(tmp_path, override, key, words):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(override), str(tmp_path))
    assert caught.value.key == key and words in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.monitor=val_bogus", "trainer.monitor"),
        ("trainer.early_stopping.monitor=val_acc", "trainer.early_stopping.monitor"),
        ("checkpoint.checkpoint_score_attribute=accuracy", "checkpoint.checkpoint_score_attribute"),
    ],
)
def test_a_metric_the_task_does_not_report_is_refused(tmp_path, override, key):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(override), str(tmp_path))
    assert caught.value.key == key and "val_accuracy" in caught.value.valid


def test_the_metrics_a_run_reports_are_found_on_the_driver(tmp_path):
    validate(
        compose_config(
            "trainer.monitor=train_accuracy", "trainer.profile=true", "checkpoint.checkpoint_score_attribute=time_data"
        ),
        str(tmp_path),
    )
    validate(compose_config("experiment=diabetes_regression", "trainer.monitor=val_r2"), str(tmp_path))


def test_the_trainer_switches_and_the_batch_split_are_both_reported(tmp_path):
    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config("+trainer.compile_kwargs.mod=x", "trainer.batch_size=33"), str(tmp_path))
    assert [error.key for error in caught.value.errors] == ["trainer.compile_kwargs.mod", "trainer.batch_size"]
    assert "did you mean 'mode'" in str(caught.value)


def test_every_independent_problem_is_reported_at_once(tmp_path):
    with pytest.raises(ConfigErrors) as caught:
        validate(
            compose_config(
                "dataset=imagefolder",
                "dataset.root=/no/such/folder",
                "trainer.max_epochs=0",
                "optimizer.lr=abc",
                "+task.smoothing=0.5",
            ),
            str(tmp_path),
        )
    keys = [error.key for error in caught.value.errors]
    # dataset.root once, though the model's input_shape and num_outputs are read from the same folder.
    assert keys == ["trainer.max_epochs", "dataset.root", "optimizer.lr", "task.smoothing"], keys
    assert str(caught.value).startswith("Invalid config: 4 problems\n  - trainer.max_epochs=0: must be >= 1.")


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["scheduler=step", "scheduler.lr_scheduler.step_size=0"], "scheduler.lr_scheduler"),  # StepLR divides by it
        (["scheduler=onecycle", "scheduler.lr_scheduler.epochs=0"], "scheduler.lr_scheduler"),
    ],
)
def test_an_lr_schedule_is_built_and_stepped_on_the_driver(tmp_path, overrides, key):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(*overrides), str(tmp_path))
    assert caught.value.key == key and caught.value.value == compose_config(*overrides).scheduler.lr_scheduler._target_


def test_a_model_too_large_for_the_driver_is_counted_not_built(tmp_path, monkeypatch, capsys):
    from hydra_raytrain.preflight import rehearsal

    monkeypatch.setattr(rehearsal, "MAX_REHEARSED_PARAMETERS", 1000)
    validate(compose_config("trainer.monitor=val_bogus"), str(tmp_path))  # not checked: the step was not rehearsed
    assert "model has 151,306 parameters: not built on the driver" in capsys.readouterr().err


def test_a_step_that_needs_the_workers_gpus_is_not_refused_on_a_cpu_driver(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only driver, on any machine
    cfg = compose_config("task._target_=tests.helpers.tasks.CudaOnly", "scaling.use_gpu=true")
    validate(cfg, str(tmp_path))
    assert "not rehearsed on the driver's CPU (RuntimeError: this kernel runs on CUDA only)" in capsys.readouterr().err
    with pytest.raises(ConfigError) as caught:  # CPU workers would fail the same way: refused
        validate(compose_config("task._target_=tests.helpers.tasks.CudaOnly"), str(tmp_path))
    assert caught.value.key == "model" and "this kernel runs on CUDA only" in str(caught.value)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["~optimizer._partial_"], "optimizer._partial_"),
        (["scheduler=step", "~scheduler.lr_scheduler._partial_"], "scheduler.lr_scheduler._partial_"),
    ],
)
def test_a_forgotten_partial_says_to_add_it(tmp_path, overrides, key):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(*overrides), str(tmp_path))
    assert (
        caught.value.key == key
        and "add `_partial_: true`" in caught.value.valid
        and "which the runner passes" in str(caught.value)
    )


def test_augmentations_of_data_that_holds_no_images_are_refused_on_the_driver(tmp_path):
    with pytest.raises(ConfigError) as caught:
        validate(
            compose_config("experiment=diabetes_regression", "trainer.augment.horizontal_flip=true"), str(tmp_path)
        )
    assert caught.value.key == "trainer.augment" and "[16, 10]" in caught.value.problem
    validate(
        compose_config("trainer.augment.random_crop_padding=2", "trainer.augment.horizontal_flip=true"), str(tmp_path)
    )
