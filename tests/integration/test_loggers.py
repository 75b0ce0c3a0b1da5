"""Experiment trackers from rank 0: W&B offline (no account, no network) and TensorBoard event files."""

import struct

import pytest
from tensorboardX.proto import event_pb2

from hydra_raytrain import train
from hydra_raytrain.config import run_name, validate
from tests.conftest import WANDB_TEST_KEY, compose_config

pytestmark = pytest.mark.integration

WANDB = ["logger=wandb", "logger.wandb.mode=offline"]


def wandb_runs(run_dir):
    return sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def test_wandb_offline_run_from_rank_zero_with_config_and_metrics(ray_address, tmp_path):
    cfg = compose_config(*WANDB, "trainer.max_epochs=2")
    train(cfg, run_dir=str(tmp_path))
    (run,) = wandb_runs(tmp_path)  # one run: rank 0 only
    assert run.name == f"run-{run_name(validate(cfg, str(tmp_path)))}.wandb"  # the id is the run's identity
    content = run.read_bytes()
    assert b"val_accuracy" in content and b"train_loss" in content and b"hydra_raytrain.models.SimpleCNN" in content
    for path in tmp_path.rglob("*"):  # no secret in anything the run wrote
        if path.is_file():
            assert WANDB_TEST_KEY.encode() not in path.read_bytes(), path


def test_a_resumed_run_continues_the_same_wandb_run(ray_address, tmp_path):
    crash = ["model=mlp", "trainer.max_epochs=3", "failure.max_failures=1", "task._target_=tests.helpers.tasks.CrashOnce",
             "+task.at_step=30", f"+task.marker={tmp_path / 'crashed'}"]
    train(compose_config(*WANDB, *crash), run_dir=str(tmp_path))
    assert (tmp_path / "crashed").exists()
    runs = wandb_runs(tmp_path)
    assert len(runs) == 2 and len({run.name for run in runs}) == 1  # two attempts, one W&B run id


def read_scalars(folder):
    """TensorBoard's record format: length, crc, an Event protobuf, crc."""
    scalars = {}
    for path in folder.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_event_files_hold_the_epoch_scalars(ray_address, tmp_path):
    summary = train(compose_config("logger=[tensorboard,wandb]", "logger.wandb.mode=offline", "trainer.max_epochs=2", "debug=smoke"), run_dir=str(tmp_path))
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [step for step, _ in scalars["val_accuracy"]] == [1, 2]
    assert scalars["val_loss"][-1][1] == pytest.approx(summary["final"]["val_loss"], rel=1e-6)
    assert len(wandb_runs(tmp_path)) == 1  # both loggers at once
