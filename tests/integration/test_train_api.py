"""hydra_raytrain.train(cfg) on the session's real local Ray cluster (CPU workers, gloo)."""

import json
import os
import time

import pytest
import ray
import torch

from hydra_raytrain import train
from hydra_raytrain.models import torchvision_resnet
from tests.conftest import TEST_CLUSTER_CPUS, compose_config

pytestmark = pytest.mark.integration


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_local_mode_runs_in_process(tmp_path):
    probe = tmp_path / "probe.json"
    summary = train(
        compose_config(
            "scaling.num_workers=0",
            "trainer.max_epochs=2",
            "trainer.limit_train_batches=5",
            "task._target_=tests.helpers.tasks.Probe",
            f"+task.path={probe}",
            "+task.variable=HYDRA_RAYTRAIN_PROBE",
        ),
        run_dir=str(tmp_path / "run"),
    )
    history = read_metrics(tmp_path / "run")
    assert [m["epoch"] for m in history] == [1, 2] and history[0]["world_size"] == 1
    assert summary["final"] == history[-1] and (tmp_path / "run" / "model.pt").stat().st_size > 0
    seen = json.loads(probe.read_text())
    assert seen["pid"] == os.getpid() and seen["wrapper"] == "SimpleCNN"  # trained here, unwrapped: no worker, no DDP


def test_regression_experiment_learns(ray_address, tmp_path):
    summary = train(compose_config("experiment=diabetes_regression", "trainer.max_epochs=15"), run_dir=str(tmp_path))
    history = read_metrics(tmp_path)
    assert history[-1]["val_loss"] < history[0]["val_loss"]
    assert summary["final"]["val_r2"] > 0.3  # sklearn's linear regression gets ~0.45 on this split
    assert summary["monitor"] == "val_loss" and summary["best"]["val_loss"] == min(m["val_loss"] for m in history)


def idle_cpus(expected: float, timeout: float = 60) -> float:
    """The cluster's free CPUs once the earlier tests' actors have gone (``expected`` of them), ``timeout`` at most."""
    deadline = time.monotonic() + timeout
    while (free := ray.available_resources().get("CPU", 0)) < expected and time.monotonic() < deadline:
        time.sleep(0.5)
    return free


@pytest.mark.slow
def test_elastic_resnet18_takes_what_the_cluster_holds(ray_address, tmp_path):
    """resnet18 (the mission command's model), min 2, max 4 workers on the idle 4-CPU test cluster: it takes all 4;
    the global batch (48) stays 48 at that size, every sample counted."""
    assert idle_cpus(TEST_CLUSTER_CPUS) == TEST_CLUSTER_CPUS
    summary = train(
        compose_config(
            "model=resnet18",
            "scaling.num_workers=2",
            "scaling.max_workers=4",
            "trainer.batch_size=48",
            "debug=smoke",
            "task._target_=tests.helpers.tasks.Counted",
        ),
        run_dir=str(tmp_path),
    )
    assert summary["status"] == "completed"
    assert summary["final"]["world_size"] == 4  # all the idle cluster holds, not the minimum
    model = torchvision_resnet("resnet18", (1, 8, 8), 10)
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))  # unwrapped: no "module." prefix
    assert summary["final"]["train_samples"] == 2 * 48  # 2 batches of a global 48: 12 samples a worker a batch
