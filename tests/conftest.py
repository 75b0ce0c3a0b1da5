"""Shared fixtures. Ray starts once per session (``ray_address``); CLI subprocesses join that cluster."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

import hydra_raytrain  # noqa: F401  (registers the schemas in Hydra's ConfigStore)
from hydra_raytrain.driver.cluster import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WANDB_TEST_KEY = "0123456789abcdef0123456789abcdef01234567"
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
        [sys.executable, "-m", "hydra_raytrain", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3-compatible server (moto) on loopback. Its endpoint and dummy credentials go into the
    environment before Ray starts, so the driver, Ray's controller and the workers all reach it."""
    port = free_port()
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            # A dummy W&B key in every worker's environment: the logger tests prove it is never written.
            "WANDB_API_KEY": WANDB_TEST_KEY,
            "WANDB_SILENT": "true",
        }
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield endpoint
    server.terminate()
    server.wait()


@pytest.fixture(scope="session")
def ray_address(s3_endpoint):
    import ray

    from hydra_raytrain.driver.cluster import local_cluster_environment

    # As hydra_raytrain starts a local cluster (its own state API address, no preemption watcher).
    ray.init(address="local", num_cpus=TEST_CLUSTER_CPUS, logging_level="WARNING", **local_cluster_environment(None))
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
