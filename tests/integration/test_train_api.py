"""hydra_raytrain.train(cfg) on the session's real local Ray cluster (CPU workers, gloo)."""

import json

import pytest
import torch

from hydra_raytrain import train
from hydra_raytrain.models import torchvision_resnet
from tests.conftest import compose_config

pytestmark = pytest.mark.integration


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_local_mode_runs_in_process(tmp_path):
    summary = train(
        compose_config("scaling.num_workers=0", "trainer.max_epochs=2", "trainer.limit_train_batches=5"),
        run_dir=str(tmp_path),
    )
    history = read_metrics(tmp_path)
    assert [m["epoch"] for m in history] == [1, 2] and history[0]["world_size"] == 1
    assert summary["final"] == history[-1] and (tmp_path / "model.pt").stat().st_size > 0


def test_regression_experiment_learns(ray_address, tmp_path):
    summary = train(compose_config("experiment=diabetes_regression", "trainer.max_epochs=15"), run_dir=str(tmp_path))
    history = read_metrics(tmp_path)
    assert history[-1]["val_loss"] < history[0]["val_loss"]
    assert summary["final"]["val_r2"] > 0.3  # sklearn's linear regression gets ~0.45 on this split
    assert summary["monitor"] == "val_loss" and summary["best"]["val_loss"] == min(m["val_loss"] for m in history)


@pytest.mark.slow
def test_elastic_resnet18_takes_what_the_cluster_holds(ray_address, tmp_path):
    """resnet18 (the mission command's model), min 2, max 4 workers on the 4-CPU test cluster; the global
    batch (48) stays whatever the size."""
    summary = train(
        compose_config(
            "model=resnet18", "scaling.num_workers=2", "scaling.max_workers=4", "trainer.batch_size=48", "debug=smoke"
        ),
        run_dir=str(tmp_path),
    )
    assert summary["status"] == "completed"
    assert 2 <= summary["final"]["world_size"] <= 4  # 4 when the cluster is idle
    model = torchvision_resnet("resnet18", (1, 8, 8), 10)
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))  # unwrapped: no "module." prefix
    # 2 batches of a global 48: exactly 96 samples trained, whatever the world size.
    correct = summary["final"]["train_accuracy"] * 96
    assert abs(correct - round(correct)) < 1e-9
