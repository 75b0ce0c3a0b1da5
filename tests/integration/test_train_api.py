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


def test_regression_experiment_learns(tmp_path):
    """What the experiment learns does not depend on Ray: Ray Train's local mode, in this process."""
    config = compose_config("experiment=diabetes_regression", "trainer.max_epochs=15", "scaling.num_workers=0")
    summary = train(config, run_dir=str(tmp_path))
    history = read_metrics(tmp_path)
    assert history[-1]["val_loss"] < history[0]["val_loss"]
    assert summary["final"]["val_r2"] > 0.3  # sklearn's linear regression gets ~0.45 on this split
    assert summary["monitor"] == "val_loss" and summary["best"]["val_loss"] == min(m["val_loss"] for m in history)


def reservable_cpus(expected: int, timeout: float = 240) -> float:
    """The CPUs Ray's autoscaling coordinator would reserve for a new training run, once it could hold ``expected``.

    Ray Train's elastic policy sizes the worker group from the coordinator's reservations, not from
    ``ray.available_resources()``: a run whose controller was killed (an earlier test's preemption, a sweep's
    stopped trial) keeps its request there for up to 180 s. A probe request of our own, cancelled at the end,
    sees what the next run will see, so the test waits for the earlier tests' requests to go, ``timeout`` at most.
    """
    from ray.data._internal.cluster_autoscaler.base_autoscaling_coordinator import ResourceRequestPriority
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    coordinator, probe = get_or_create_autoscaling_coordinator(), "tests-reservable-cpus"
    ray.get(
        coordinator.request_resources.remote(
            requester_id=probe,
            resources=[{"CPU": 1}] * expected,
            expire_after_s=timeout,
            priority=ResourceRequestPriority.HIGH,  # Ray Train's own priority: earlier requests go first
        )
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            held = ray.get(coordinator.get_reserved_resources.remote(probe, recompute=True))
            cpus = sum(node.get("CPU", 0) for node in held.values())
            if cpus >= expected or time.monotonic() > deadline:
                return cpus
            time.sleep(2)
    finally:
        ray.get(coordinator.cancel_request.remote(probe))


@pytest.mark.long("the gate's budget: elastic sizing runs in the long tier only (4 workers of resnet18)")
@pytest.mark.workers
@pytest.mark.idle_cluster
@pytest.mark.slow
def test_elastic_resnet18_takes_what_the_cluster_holds(ray_address, tmp_path):
    """resnet18 (the mission command's model), min 2, max 4 workers on the idle 4-CPU test cluster: it takes all 4;
    the global batch (48) stays 48 at that size, every sample counted."""
    assert reservable_cpus(TEST_CLUSTER_CPUS) == TEST_CLUSTER_CPUS
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
