"""Shared fixtures. Ray starts once per session (``ray_address``); CLI subprocesses join that cluster."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

import hydra_raytrain  # noqa: F401  (registers the schemas in Hydra's ConfigStore)
from tests.helpers.s3 import CuttableProxy, s3_environment, start_moto_server

# The model hub is never asked: the text tests build their tokenizers and models here (HF_HUB_OFFLINE is read when
# huggingface_hub is first imported; Ray's processes and the CLI's inherit it).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WANDB_TEST_KEY = "0123456789abcdef0123456789abcdef01234567"
# Logical CPUs of the test cluster: enough for the 4-worker resnet18 run on a 2-core machine.
TEST_CLUSTER_CPUS = 4


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``workers`` is a declared list: a test that asks for the session's cluster without it stops the collection;
    so is ``long``: a test moved out of the gate says why (the gate's test that carries its capability).
    ``idle_cluster`` tests run first. ``gpu`` tests run where a CUDA GPU exists and are skipped, saying so,
    everywhere else."""
    import torch

    unexplained = [item.nodeid for item in items if (mark := item.get_closest_marker("long")) and not mark.args]
    if unexplained:
        raise pytest.UsageError(
            "these tests are in the long tier without saying why: "
            + ", ".join(unexplained)
            + '. Write @pytest.mark.long("the gate\'s test that carries this capability, or why this one is long").'
        )
    undeclared = [
        item.nodeid
        for item in items
        if "ray_address" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("workers")
    ]
    if undeclared:
        raise pytest.UsageError(
            "these tests use the session's Ray cluster (ray_address) without @pytest.mark.workers: "
            + ", ".join(undeclared)
            + ". Declare it, or drive train() in Ray Train's local mode (scaling.num_workers=0) without the cluster."
        )
    # Ray Train's elastic sizing reads the autoscaling coordinator's reservations, which a run whose controller was
    # killed (a preemption test, a sweep's stopped trial) keeps for up to 180 s: the tests that need the whole
    # cluster idle run first (stable: the rest keep their order).
    items.sort(key=lambda item: item.get_closest_marker("idle_cluster") is None)
    if torch.cuda.is_available():
        return
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)"))


def compose_config(*overrides: str) -> DictConfig:
    """The real config, composed as the CLI composes it."""
    with initialize_config_module("hydra_raytrain.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides))


def run_cli(
    args: Sequence[str], cwd: str, timeout: float = 180, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m hydra_raytrain ARGS`` in a fresh process, as a user runs it (``env``: variables of its own)."""
    # The repository root on the path, as for pytest itself: tests.helpers holds tasks that tests run.
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "hydra_raytrain", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_predict(run: object, data: object, output: str, cwd: object, address: str, *options: str) -> dict[str, list]:
    """``python -m hydra_raytrain.predict RUN DATA --output OUTPUT OPTIONS`` on the cluster at ``address``, run in
    ``cwd`` as a user runs it: the table it wrote (each column's values), after asserting it exited 0."""
    import pyarrow.parquet as pq

    command = [sys.executable, "-m", "hydra_raytrain.predict", str(run), str(data), "--output", output, *options]
    done = subprocess.run(
        [*command, "--address", address], capture_output=True, text=True, cwd=str(cwd),
        env={**os.environ, "PYTHONPATH": ROOT}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return pq.read_table(os.path.join(str(cwd), output)).to_pydict()


def unused_port(low: int = 20000, high: int = 30000) -> int:
    """A free port between Ray's worker ports (10002-19999) and the ephemeral range its other processes draw from,
    so that nothing of Ray's takes it before a server of the tests is started on it."""
    for port in random.Random().sample(range(low, high), 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


@pytest.fixture(scope="session")
def session_environment() -> str:
    """What every process of the session inherits, set before Ray starts: a dummy W&B key in every worker's
    environment (the logger tests prove it is never written), and the endpoint and dummy credentials of the S3
    server that ``s3_endpoint`` starts there when a test first needs it (Ray's processes read them at start)."""
    endpoint = f"http://127.0.0.1:{unused_port()}"
    os.environ.update({**s3_environment(endpoint), "WANDB_API_KEY": WANDB_TEST_KEY, "WANDB_SILENT": "true"})
    return endpoint


@pytest.fixture(scope="session")
def s3_network(session_environment):
    """A real S3-compatible server (moto) on loopback, reached through a TCP proxy of the tests' own at the endpoint
    the session's environment names (``CuttableProxy``: a test cuts the network to it); started by the first test
    that asks for it, so the Ray cluster and every other test do without it."""
    port = unused_port()
    server = start_moto_server(port)
    proxy = CuttableProxy(port, int(session_environment.rsplit(":", 1)[1]))
    yield proxy
    proxy.cut()
    server.terminate()
    server.wait()


@pytest.fixture(scope="session")
def s3_endpoint(session_environment, s3_network):
    return session_environment


@pytest.fixture(scope="session")
def ray_address(session_environment):
    import ray

    from hydra_raytrain.runtime.reach import local_cluster_environment

    # As hydra_raytrain starts a local cluster (its own state API address, no preemption watcher).
    ray.init(address="local", num_cpus=TEST_CLUSTER_CPUS, logging_level="WARNING", **local_cluster_environment(None))
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="session")
def ddp_float64_run(ray_address, tmp_path_factory):
    """SAME_RESULT on 2 workers at a global batch of 48 in float64, trained once for the session: a reference of
    both test_training_features (worker-count independence) and test_fsdp (FSDP's result). (run dir, summary)."""
    from hydra_raytrain import train
    from tests.helpers.same_result import GLOBAL_48, SAME_RESULT

    run_dir = tmp_path_factory.mktemp("ddp-float64")
    config = compose_config(*SAME_RESULT, "scaling.num_workers=2", *GLOBAL_48, "trainer.precision=64")
    return run_dir, train(config, run_dir=str(run_dir))
