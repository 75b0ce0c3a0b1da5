"""Experiment trackers from rank 0: W&B offline (no account, no network) and TensorBoard event files."""

import base64
import hashlib

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.api_pb2 import Status
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from hydra_raytrain import train
from hydra_raytrain.preflight.validate import validate
from hydra_raytrain.runtime.reach import free_port
from tests.conftest import WANDB_TEST_KEY, compose_config
from tests.helpers.wandb_files import records, run_record, wandb_runs

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
    cfg = compose_config(
        "logger=[wandb,tensorboard]", "trainer.max_epochs=2", "debug=smoke", "logger.wandb.log_model=last"
    )
    summary = train(cfg, run_dir=str(tmp_path))
    # One W&B run (its id the run's identity): rank 0's metrics, then the driver's model artifact into the same run
    # (offline, W&B writes each process's part to a folder of its own; `wandb sync` joins them by the id)
    run_id, parts = validate(cfg, str(tmp_path)).run_name(), wandb_runs(tmp_path)
    [trained] = [part for part in parts if b"val_accuracy" in part.read_bytes()]  # rank 0 only logged metrics
    [model] = [part for part in parts if part != trained]
    assert trained.name == model.name == f"run-{run_id}.wandb" and run_record(trained).project == "from-the-environment"
    content = trained.read_bytes()
    assert b"train_loss" in content and b"hydra_raytrain.models.SimpleCNN" in content
    [artifact] = [record.artifact for record in records(model) if record.HasField("artifact")]
    files = {entry.path: entry.digest for entry in artifact.manifest.contents}
    assert (artifact.type, artifact.name, list(artifact.aliases)) == ("model", f"model-{run_id}", ["latest"])
    assert files["model.pt"] == base64.b64encode(hashlib.md5((tmp_path / "model.pt").read_bytes()).digest()).decode()
    assert set(files) == {"model.pt", "config.json"}
    # TensorBoard's own reader: the scalars, and the run as an HParams session (its settings, its end)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [scalar.step for scalar in events.Scalars("val_accuracy")] == [1, 2]
    assert events.Scalars("val_loss")[-1].value == pytest.approx(summary["final"]["val_loss"], rel=1e-6)
    plugin = {
        tag: HParamsPluginData.FromString(content) for tag, content in events.PluginTagToContent("hparams").items()
    }
    started = plugin["_hparams_/session_start_info"].session_start_info.hparams
    assert started["optimizer.lr"].number_value == pytest.approx(cfg.optimizer.lr)
    assert started["model._target_"].string_value == "hydra_raytrain.models.SimpleCNN"
    assert plugin["_hparams_/session_end_info"].session_end_info.status == Status.Value("STATUS_SUCCESS")
    for path in tmp_path.rglob("*"):  # no secret in anything the run wrote
        if path.is_file():
            assert WANDB_TEST_KEY.encode() not in path.read_bytes(), path


@pytest.mark.long("a failure variant: a tracker that cannot reach its server is test_mlflow's in the gate")
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
