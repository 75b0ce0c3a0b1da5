"""Experiment trackers from rank 0: W&B offline (no account, no network) and TensorBoard event files."""

import pytest

from hydra_raytrain import train
from hydra_raytrain.preflight.validate import validate
from hydra_raytrain.reach import free_port
from tests.conftest import WANDB_TEST_KEY, compose_config
from tests.helpers.loggers import read_scalars
from tests.helpers.wandb_files import run_record, wandb_runs

pytestmark = [pytest.mark.integration, pytest.mark.workers]


def test_wandb_and_tensorboard_log_from_rank_zero_follow_wandbs_environment_and_keep_no_secret(
    ray_address, tmp_path, monkeypatch
):
    """Both loggers at once. WANDB_MODE / WANDB_PROJECT in the driver's environment work as with wandb.init: the
    config leaves them to W&B, and the driver forwards them to the workers (which did not inherit this process's
    environment). (logger.wandb.mode=offline in the config: the resume, sweep and Lightning tests; that a resumed
    run continues the same W&B run: test_resume.py.)"""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "from-the-environment")
    cfg = compose_config("logger=[wandb,tensorboard]", "trainer.max_epochs=2", "debug=smoke")
    summary = train(cfg, run_dir=str(tmp_path))
    (run,) = wandb_runs(tmp_path)  # one W&B run: rank 0 only
    assert run_record(run).project == "from-the-environment"
    assert run.name == f"run-{validate(cfg, str(tmp_path)).run_name()}.wandb"  # the id is the run's identity
    content = run.read_bytes()
    assert b"val_accuracy" in content and b"train_loss" in content and b"hydra_raytrain.models.SimpleCNN" in content
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [step for step, _ in scalars["val_accuracy"]] == [1, 2]
    assert scalars["val_loss"][-1][1] == pytest.approx(summary["final"]["val_loss"], rel=1e-6)
    for path in tmp_path.rglob("*"):  # no secret in anything the run wrote
        if path.is_file():
            assert WANDB_TEST_KEY.encode() not in path.read_bytes(), path


def test_an_unreachable_wandb_server_or_a_failing_tracker_never_stops_training(
    ray_address, tmp_path, monkeypatch, capfd
):
    """W&B online (no WANDB_MODE) with its server unreachable: the driver says so once and the run logs offline.
    A tracker that raises when it starts, and one that raises when it logs, are dropped with a warning each."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    cfg = compose_config(
        "logger=wandb",
        "debug=smoke",
        "trainer.max_epochs=2",
        "+logger.down={_target_: tests.helpers.loggers.Broken, fail_in: start}",
        "+logger.flaky={_target_: tests.helpers.loggers.Broken, fail_in: log}",
    )
    summary = train(cfg, run_dir=str(tmp_path))
    assert summary["status"] == "completed" and summary["epochs_completed"] == 2
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    # Logged offline from the start (an offline run never contacts the server, so never waits out W&B's 90 s
    # init timeout), not online after a failed init.
    (run,) = wandb_runs(tmp_path)
    assert not list(tmp_path.glob("wandb/run-*"))
    assert b"val_accuracy" in run.read_bytes()
    driver = capfd.readouterr().err
    assert driver.count("cannot be reached") == 1 and "wandb sync" in driver
    worker = "".join(path.read_text() for path in (tmp_path / "logs").glob("rank0*.err"))
    assert (
        "logger.down could not start (RuntimeError: tracker server unavailable); training goes on without it" in worker
    )
    assert worker.count("logger.flaky failed to log") == 1  # dropped after the first failure
