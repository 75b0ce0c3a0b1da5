"""The validated config is typed to the end, and its plain form (config.json, the workers, job.json) round-trips."""

import json

from hydra_raytrain.config.identity import run_name
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.config.schema import DataLoaderConfig, EarlyStoppingConfig, ScalingConfig, TrainerConfig
from hydra_raytrain.preflight.validate import validate
from hydra_raytrain.sweep.job import Job
from tests.conftest import compose_config


def test_validate_returns_the_schemas_dataclasses_and_plain_components(tmp_path):
    overrides = ("trainer.early_stopping.patience=2", "scaling.num_workers=4")
    resolved = validate(compose_config(*overrides), str(tmp_path))
    assert isinstance(resolved, Resolved)
    assert isinstance(resolved.trainer, TrainerConfig) and isinstance(resolved.scaling, ScalingConfig)
    assert isinstance(resolved.trainer.dataloader, DataLoaderConfig)
    assert isinstance(resolved.trainer.early_stopping, EarlyStoppingConfig)
    assert resolved.trainer.early_stopping.patience == 2 and resolved.scaling.num_workers == 4
    assert type(resolved.model) is dict and resolved.model["_target_"] == "hydra_raytrain.models.SimpleCNN"


def test_the_plain_form_round_trips_through_json_and_keeps_the_identity(tmp_path):
    resolved = validate(compose_config("optimizer.lr=0.01"), str(tmp_path))
    plain = json.loads(json.dumps(resolved.to_dict()))
    assert Resolved.from_dict(plain) == resolved
    assert resolved.run_name() == run_name(plain)


def test_a_sweep_job_round_trips_through_job_json(tmp_path):
    resolved = validate(compose_config(), str(tmp_path))
    job = Job(3, ["optimizer.lr=0.01"], {"optimizer.lr": 0.01}, resolved, resolved.run_name(), str(tmp_path))
    assert Job.from_dict(json.loads(json.dumps(job.to_dict()))) == job
