"""Shared fixtures. Ray starts once per session (``ray_address``); CLI subprocesses join that cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

import hydra_raytrain  # noqa: F401  (registers the schemas in Hydra's ConfigStore)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Logical CPUs of the test cluster: enough for the 4-worker resnet18 run on a 2-core machine.
TEST_CLUSTER_CPUS = 4


def compose_config(*overrides: str) -> DictConfig:
    """The real config, composed as the CLI composes it."""
    with initialize_config_module("hydra_raytrain.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides))


def run_cli(args: Sequence[str], cwd: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m hydra_raytrain ARGS`` in a fresh process, as a user runs it."""
    # The repository root on the path, as for pytest itself: tests.helpers holds tasks that tests run.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "hydra_raytrain", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def ray_address():
    import ray

    ray.init(address="local", num_cpus=TEST_CLUSTER_CPUS, logging_level="WARNING")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
