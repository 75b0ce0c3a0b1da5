"""Checkpoints and resumption on the session's real local Ray cluster: a killed worker, a killed driver,
a finished run re-run, a corrupt newest checkpoint, top-k retention."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from hydra_raytrain import train
from tests.conftest import ROOT, compose_config, run_cli

pytestmark = pytest.mark.integration

# mlp with dropout: the resumed run must also restore every rank's RNG to match.
EXACT = ["model=mlp", "model.dropout=0.2", "trainer.max_epochs=4", "failure.max_failures=1", "task._target_=tests.helpers.tasks.CrashOnce", "+task.at_step=55"]


def epochs(run_dir):
    return [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_killed_worker_resumes_and_ends_exactly_like_an_uninterrupted_run(ray_address, tmp_path):
    """23 steps per epoch: step 55 is in epoch 3, after the epoch-2 checkpoint. The crashed run also logs to
    W&B (offline): its two attempts must be one W&B run."""
    (tmp_path / "no_crash").touch()
    uninterrupted = train(compose_config(*EXACT, f"+task.marker={tmp_path / 'no_crash'}"), run_dir=str(tmp_path / "a"))
    crashed = train(compose_config(*EXACT, f"+task.marker={tmp_path / 'crashed'}", "logger=wandb", "logger.wandb.mode=offline"), run_dir=str(tmp_path / "b"))
    assert (tmp_path / "crashed").exists()  # the worker really was killed
    attempts = sorted((tmp_path / "b").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(attempts) == 2 and len({run.name for run in attempts}) == 1  # a resumed run continues the same W&B run
    assert epochs(tmp_path / "b") == [1, 2, 3, 4]
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    for name in ("train_loss", "val_loss", "val_accuracy"):
        assert abs(uninterrupted["final"][name] - crashed["final"][name]) <= 1e-6


def test_a_killed_driver_resumes_when_the_same_command_runs_again(ray_address, tmp_path):
    args = [f"ray.address={ray_address}", "trainer.max_epochs=4", "task._target_=tests.helpers.tasks.Slow", "+task.seconds_per_batch=0.1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    driver = subprocess.Popen([sys.executable, "-m", "hydra_raytrain", *args], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    metrics = None
    while time.time() < deadline and driver.poll() is None:
        metrics = next(tmp_path.glob("outputs/runs/*/metrics.jsonl"), None)
        if metrics and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    run_dir = metrics.parent
    killed_at = epochs(run_dir)
    assert 2 <= len(killed_at) < 4 and not (run_dir / "summary.json").exists()

    done = run_cli(args, cwd=str(tmp_path))  # the identical command
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Run dir: {run_dir}" in done.stdout  # the same run dir, found from the config alone
    trained_again = [n for n in range(1, 5) if f"epoch {n}/4" in done.stdout]
    assert trained_again and min(trained_again) > max(killed_at) - 1  # nothing before the last checkpoint
    assert epochs(run_dir) == [1, 2, 3, 4]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"

    again = run_cli(args, cwd=str(tmp_path))  # a finished run: reported, not retrained
    assert again.returncode == 0 and "Run already complete: 4 epochs" in again.stdout
    assert "epoch 1/4" not in again.stdout and epochs(run_dir) == [1, 2, 3, 4]


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(ray_address, tmp_path):
    shared = [f"storage.path={tmp_path / 'storage'}", "storage.name=shared", "debug=smoke"]
    train(compose_config(*shared, "trainer.max_epochs=2"), run_dir=str(tmp_path / "first"))
    newest = tmp_path / "storage" / "shared" / "epoch_0002" / "model.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as by a crash mid-copy
    summary = train(compose_config(*shared, "trainer.max_epochs=3"), run_dir=str(tmp_path / "second"))
    assert summary["status"] == "completed"
    assert epochs(tmp_path / "second") == [2, 3]  # resumed after epoch 1, not after the broken epoch 2


def test_top_k_retention_keeps_the_best_and_the_latest(ray_address, tmp_path):
    overrides = ["trainer.max_epochs=5", "trainer.limit_train_batches=3", "checkpoint.num_to_keep=2",
                 "checkpoint.checkpoint_score_attribute=val_accuracy", "checkpoint.checkpoint_score_order=max"]
    summary = train(compose_config(*overrides), run_dir=str(tmp_path))
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    best_two = sorted(history, key=lambda m: m["val_accuracy"], reverse=True)[:2]
    expected = {f"epoch_{m['epoch']:04d}" for m in best_two} | {"epoch_0005"}  # Ray never deletes the latest
    kept = {p.name for p in (tmp_path / "ray_storage").glob("*/epoch_*")}
    assert kept == expected, (kept, [(m["epoch"], m["val_accuracy"]) for m in history])
    assert os.path.isdir(summary["storage"])
