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

from hydra_raytrain import load_model, train
from tests.conftest import ROOT, compose_config, run_cli
from tests.helpers.loggers import read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The GAN under fp16: two models, two optimizers, the GradScaler, and every rank's own noise (RNG) must all
# come back for the resumed run to match. 8 micro-batches per epoch: micro-batch 20 is in epoch 3, after the
# epoch-2 checkpoint.
EXACT = [
    "experiment=digits_gan",
    "trainer.max_epochs=4",
    "trainer.limit_train_batches=8",
    "trainer.precision=16-mixed",
    "failure.max_failures=1",
    "task._target_=tests.helpers.tasks.CrashOnceGAN",
    "+task.at_step=20",
]


def epochs(run_dir):
    return [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def max_difference(a, b):
    """Largest absolute difference between two model.pt files ({name: state_dict} for several models)."""
    return max((a[name][k].float() - b[name][k].float()).abs().max().item() for name in a for k in a[name])


def test_a_killed_worker_resumes_and_ends_exactly_like_an_uninterrupted_run(ray_address, tmp_path):
    """The crashed run also logs to W&B (offline): its two attempts must be one W&B run."""
    (tmp_path / "no_crash").touch()
    uninterrupted = train(compose_config(*EXACT, f"+task.marker={tmp_path / 'no_crash'}"), run_dir=str(tmp_path / "a"))
    crashed = train(
        compose_config(*EXACT, f"+task.marker={tmp_path / 'crashed'}", "logger=wandb", "logger.wandb.mode=offline"),
        run_dir=str(tmp_path / "b"),
    )
    assert (tmp_path / "crashed").exists()  # the worker really was killed
    attempts = sorted((tmp_path / "b").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(attempts) == 2 and len({run.name for run in attempts}) == 1  # a resumed run continues the same W&B run
    assert epochs(tmp_path / "b") == [1, 2, 3, 4]
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    assert set(a) == {"generator", "discriminator"} and max_difference(a, b) <= 1e-6
    for name in ("train_loss_d", "train_loss_g", "val_loss_d", "val_loss_g", "val_d_real"):
        assert abs(uninterrupted["final"][name] - crashed["final"][name]) <= 1e-6
    # The GAN trained: its discriminator tells real from generated, and each epoch left a sample grid.
    assert crashed["final"]["val_d_real"] > crashed["final"]["val_d_fake"]
    assert sorted(p.name for p in (tmp_path / "b" / "samples").glob("*.png")) == [
        f"epoch_{n:04d}.png" for n in range(1, 5)
    ]
    models = load_model(str(tmp_path / "b"))  # both models, rebuilt from the run dir alone
    assert models["generator"](torch.randn(5, 32)).shape == (5, 1, 8, 8)


def test_a_killed_driver_resumes_when_the_same_command_runs_again(ray_address, tmp_path):
    args = [
        f"ray.address={ray_address}",
        "trainer.max_epochs=4",
        "task._target_=tests.helpers.tasks.Slow",
        "+task.seconds_per_batch=0.1",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    driver = subprocess.Popen(
        [sys.executable, "-m", "hydra_raytrain", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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

    # A logger added to a finished run (loggers are not part of its identity) gets its epochs from metrics.jsonl.
    logged = run_cli([*args, "logger=tensorboard"], cwd=str(tmp_path))
    assert logged.returncode == 0 and "Run already complete: 4 epochs" in logged.stdout, logged.stderr[-3000:]
    assert "Logged the finished run's 4 epochs (metrics.jsonl) to: tensorboard" in logged.stdout
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert read_scalars(run_dir / "tensorboard")["val_accuracy"] == [
        (m["epoch"], pytest.approx(m["val_accuracy"], rel=1e-6)) for m in history
    ]
    assert json.loads((run_dir / "summary.json").read_text())["loggers"] == ["tensorboard"]
    once_more = run_cli([*args, "logger=tensorboard"], cwd=str(tmp_path))
    assert "Logged the finished run" not in once_more.stdout and len(list((run_dir / "tensorboard").iterdir())) == 1


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(ray_address, tmp_path):
    shared = [f"storage.path={tmp_path / 'storage'}", "storage.name=shared", "debug=smoke"]
    train(compose_config(*shared, "trainer.max_epochs=2"), run_dir=str(tmp_path / "first"))
    newest = tmp_path / "storage" / "shared" / "epoch_0002" / "model.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as by a crash mid-copy
    summary = train(compose_config(*shared, "trainer.max_epochs=3"), run_dir=str(tmp_path / "second"))
    assert summary["status"] == "completed"
    assert epochs(tmp_path / "second") == [2, 3]  # resumed after epoch 1, not after the broken epoch 2


def test_top_k_retention_keeps_the_best_and_the_latest(ray_address, tmp_path):
    overrides = [
        "trainer.max_epochs=5",
        "trainer.limit_train_batches=3",
        "checkpoint.num_to_keep=2",
        "checkpoint.checkpoint_score_attribute=val_accuracy",
        "checkpoint.checkpoint_score_order=max",
    ]
    summary = train(compose_config(*overrides), run_dir=str(tmp_path))
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    best_two = sorted(history, key=lambda m: m["val_accuracy"], reverse=True)[:2]
    expected = {f"epoch_{m['epoch']:04d}" for m in best_two} | {"epoch_0005"}  # Ray never deletes the latest
    kept = {p.name for p in (tmp_path / "ray_storage").glob("*/epoch_*")}
    assert kept == expected, (kept, [(m["epoch"], m["val_accuracy"]) for m in history])
    assert os.path.isdir(summary["storage"])
