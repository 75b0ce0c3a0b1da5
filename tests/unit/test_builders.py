"""cfg -> Ray Train config objects, without a cluster."""

import pytest
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

from hydra_raytrain.config import ConfigError, schema
from hydra_raytrain.driver import builders
from hydra_raytrain.preflight.validate import validate
from tests.conftest import compose_config


def resolved(tmp_path, *overrides):
    return validate(compose_config(*overrides), str(tmp_path))


def test_scaling_config_uses_rays_names(tmp_path):
    cfg = resolved(tmp_path, "scaling.num_workers=3", "scaling.resources_per_worker={CPU: 2}", "trainer.batch_size=63")
    scaling = builders.scaling_config(cfg.scaling)
    assert isinstance(scaling, ScalingConfig)
    assert (scaling.num_workers, scaling.use_gpu, scaling.resources_per_worker) == (3, False, {"CPU": 2})


def test_failure_config_has_a_finite_controller_limit(tmp_path):
    failure = builders.failure_config(resolved(tmp_path, "failure.max_failures=2").failure)
    assert isinstance(failure, FailureConfig)
    assert failure.max_failures == 2 and failure.controller_failure_limit == 3
    assert (failure.max_preemption_failures, failure.preemption_grace_s) == (-1, 0.0)  # Ray's defaults
    failure = builders.failure_config(
        resolved(tmp_path, "failure.max_preemption_failures=2", "failure.preemption_grace_s=30").failure
    )
    assert (failure.max_preemption_failures, failure.preemption_grace_s) == (2, 30.0)


def test_checkpoint_config(tmp_path):
    cfg = resolved(
        tmp_path,
        "checkpoint.num_to_keep=2",
        "checkpoint.checkpoint_score_attribute=val_loss",
        "checkpoint.checkpoint_score_order=min",
    )
    checkpoint = builders.checkpoint_config(cfg.checkpoint)
    assert isinstance(checkpoint, CheckpointConfig)
    assert (checkpoint.num_to_keep, checkpoint.checkpoint_score_attribute, checkpoint.checkpoint_score_order) == (
        2,
        "val_loss",
        "min",
    )


def test_run_config(tmp_path):
    cfg = resolved(tmp_path)
    run = builders.run_config(cfg, str(tmp_path / "storage"), cfg.run_name(), worker_env={"A": "1"})
    assert isinstance(run, RunConfig)
    assert run.storage_path == str(tmp_path / "storage") and run.name == cfg.run_name()
    assert run.worker_runtime_env == {"env_vars": {"A": "1"}} and run.failure_config.controller_failure_limit == 3


def test_run_name_is_deterministic_and_tracks_result_changing_keys(tmp_path):
    name = resolved(tmp_path).run_name()
    assert name == resolved(tmp_path).run_name()
    assert name.startswith("simplecnn-digits-")
    assert resolved(tmp_path, "optimizer.lr=0.01").run_name() != name
    assert resolved(tmp_path, "trainer.seed=1").run_name() != name
    # Where results go and how Ray is reached do not change what is learned.
    assert resolved(tmp_path, "ray.address=auto", "storage.path=/elsewhere").run_name() == name
    assert resolved(tmp_path, "callbacks=[lr_monitor,loss_guard]").run_name() == name  # watched, not changed
    assert resolved(tmp_path, "storage.name=mine").run_name() == "mine"
    assert resolved(tmp_path, "model=resnet18").run_name().startswith("resnet18-digits-")


def test_only_data_held_as_drawn_once_names_another_run(tmp_path):
    name = resolved(tmp_path).run_name()
    assert resolved(tmp_path, "trainer.data_on_device=false").run_name() == name  # the same batches
    assert resolved(tmp_path, "trainer.data_on_device=true").run_name() != name  # transforms drawn once


def test_run_identity_ignores_resume_policy_and_checkpoint_retention(tmp_path):
    name = resolved(tmp_path).run_name()
    same = resolved(tmp_path, "run.resume=never", "checkpoint.num_to_keep=1", "checkpoint.every_n_epochs=2")
    assert same.run_name() == name


def test_the_default_run_dir_is_the_run_name():
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from hydra_raytrain.config.identity import run_name

    with initialize_config_module("hydra_raytrain.conf", version_base="1.3"):
        cfg = compose("train", overrides=["optimizer.lr=0.01"], return_hydra_config=True)
    without_hydra = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in cfg if k != "hydra"}
    assert OmegaConf.select(cfg, "hydra.run.dir") == f"outputs/runs/{run_name(without_hydra)}"


def test_elastic_scaling_maps_onto_rays_range(tmp_path):
    cfg = resolved(tmp_path, "scaling.num_workers=2", "scaling.max_workers=4", "trainer.batch_size=48")
    assert builders.scaling_config(cfg.scaling).num_workers == (2, 4)
    assert builders.scaling_config(resolved(tmp_path, "scaling.max_workers=2").scaling).num_workers == 2


def test_worker_env_merges_runner_path_determinism_and_user(tmp_path):
    cfg = validate(
        compose_config("trainer.deterministic=true", "scaling.worker_env={OMP_NUM_THREADS: 1, A: x}"), str(tmp_path)
    )
    env = builders.worker_env(cfg, {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "A": "runner"}, "/code")
    assert env == {
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
        "A": "x",
        "PYTHONPATH": "/code",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "OMP_NUM_THREADS": "1",
    }
    plain = builders.worker_env(validate(compose_config(), str(tmp_path)), {}, None)
    assert plain == {}


@pytest.mark.parametrize(
    "use_gpu, resources, given, backend",
    [
        (False, None, None, None),  # Ray's own choice: gloo on CPU workers
        (True, None, None, None),  # nccl on GPU workers
        (True, {"GPU": 0.5}, None, "gloo"),  # two workers on one GPU: NCCL refuses them
        (True, {"GPU": 0.5}, {"backend": "nccl"}, "nccl"),  # the user's word stands
        (False, None, {"backend": "gloo", "timeout_s": 60}, "gloo"),
    ],
)
def test_torch_config_is_rays_and_gloo_where_workers_share_a_gpu(use_gpu, resources, given, backend):
    scaling = schema.ScalingConfig(2, use_gpu=use_gpu, resources_per_worker=resources, torch_config=given)
    built = builders.torch_config(scaling)
    assert built.backend == backend
    assert built.timeout_s == (given or {}).get("timeout_s", 1800)


def test_a_misspelt_torch_config_key_is_named():
    with pytest.raises(ConfigError, match="TorchConfig has no 'backnd'.*did you mean 'backend'") as caught:
        schema.ScalingConfig(2, torch_config={"backnd": "gloo"})
    assert caught.value.key == "scaling.torch_config.backnd"
