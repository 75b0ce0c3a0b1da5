"""Experiment trackers from rank 0: W&B offline (no account, no network) and TensorBoard event files."""

import struct

import pytest
from tensorboardX.proto import event_pb2

from hydra_raytrain import train
from hydra_raytrain.config import run_name, validate
from tests.conftest import WANDB_TEST_KEY, compose_config
from tests.helpers.wandb_files import wandb_runs

pytestmark = pytest.mark.integration


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


def test_wandb_and_tensorboard_log_from_rank_zero_and_keep_no_secret(ray_address, tmp_path):
    """Both loggers at once. (That a resumed run continues the same W&B run is tested in test_resume.py.)"""
    cfg = compose_config("logger=[wandb,tensorboard]", "logger.wandb.mode=offline", "trainer.max_epochs=2", "debug=smoke")
    summary = train(cfg, run_dir=str(tmp_path))
    (run,) = wandb_runs(tmp_path)  # one W&B run: rank 0 only
    assert run.name == f"run-{run_name(validate(cfg, str(tmp_path)))}.wandb"  # the id is the run's identity
    content = run.read_bytes()
    assert b"val_accuracy" in content and b"train_loss" in content and b"hydra_raytrain.models.SimpleCNN" in content
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [step for step, _ in scalars["val_accuracy"]] == [1, 2]
    assert scalars["val_loss"][-1][1] == pytest.approx(summary["final"]["val_loss"], rel=1e-6)
    for path in tmp_path.rglob("*"):  # no secret in anything the run wrote
        if path.is_file():
            assert WANDB_TEST_KEY.encode() not in path.read_bytes(), path
