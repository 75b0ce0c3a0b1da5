"""MLflow from rank 0: the local sqlite store by default, a real ``mlflow server`` on 127.0.0.1 (sqlite backend,
proxied artifacts) started here, a sweep nested in a parent run, and an MLflow that cannot be reached."""

import glob
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request

import mlflow
import mlflow.pytorch
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from hydra_raytrain import load_model, train
from hydra_raytrain.preflight.validate import validate
from tests.conftest import compose_config, run_cli, unused_port

pytestmark = pytest.mark.integration

FILES = ["config.json", "curves.png", "model.pt", "summary.json"]
SHORT = ("trainer.max_epochs=2", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2")


SERVER_FOLDERS: dict[str, str] = {}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on a free port of 127.0.0.1, its runs in sqlite, its artifacts in a folder; its URI."""
    folder = tmp_path_factory.mktemp("mlflow_server")
    port = unused_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination", str(folder)]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(folder / "server.log", "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    SERVER_FOLDERS[uri] = str(folder)
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, (folder / "server.log").read_text()[-3000:]
        time.sleep(0.5)
    yield uri
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


class dropping_every_connection:
    """A port on 127.0.0.1 that accepts every connection and resets it at once, counting them (``count``): an
    unreachable server whose clients' attempts can be counted."""

    def __enter__(self):
        self.listener, self.count = socket.create_server(("127.0.0.1", 0)), 0
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._drop, daemon=True).start()
        return self

    def _drop(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.count += 1
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
            connection.close()

    def __exit__(self, *exc):
        self.listener.close()


def runs(client, experiment_name):
    experiment = client.get_experiment_by_name(experiment_name)
    return client.search_runs([experiment.experiment_id]) if experiment else []


def steps(client, run, key="val_loss"):
    return [metric.step for metric in client.get_metric_history(run.info.run_id, key)]


def validation_digits(cfg, rows=16):
    """The first validation inputs of the run's dataset, as its model takes them."""
    from hydra_raytrain.inference.scoring import split_loader

    inputs, _ = next(iter(split_loader(OmegaConf.to_container(cfg, resolve=True), "val")))
    return inputs[:rows].numpy()


def artifacts(client, run):
    return sorted(item.path for item in client.list_artifacts(run.info.run_id))


@pytest.mark.long("a kill/resume variant: MLflow in the gate is the secrets and unreachable-server runs")
@pytest.mark.workers
def test_a_restarted_run_continues_its_mlflow_run_in_the_local_store_and_logs_each_epoch_once(
    ray_address, tmp_path, monkeypatch
):
    """No MLflow variable: the store is outputs/mlflow.db under the launch folder. Checkpoints every 2 epochs and a
    worker killed early in epoch 4: the run resumes from epoch 2's checkpoint and trains epoch 3 again, whose figures
    the MLflow run already has."""
    for variable in [name for name in os.environ if name.startswith("MLFLOW_")]:
        monkeypatch.delenv(variable)
    monkeypatch.chdir(tmp_path)
    cfg = compose_config(
        "logger=mlflow",
        *SHORT,
        "trainer.max_epochs=4",
        "checkpoint.every_n_epochs=2",
        "failure.max_failures=1",
        "task._target_=tests.helpers.tasks.CrashOnce",
        f"+task.marker={tmp_path / 'crashed'}",
        "+task.at_step=13",  # rank 1's first micro-batch of epoch 4
    )
    summary = train(cfg, run_dir=str(tmp_path / "run"))
    assert (tmp_path / "crashed").exists() and summary["status"] == "completed"
    assert [failure["retried"] for failure in summary["failures"]] == [True]
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    [run] = runs(client, "hydra_raytrain")  # one run, rank 0's, the same after the restart
    assert run.info.status == "FINISHED" and run.info.run_name == validate(cfg, str(tmp_path)).run_name()
    assert steps(client, run) == [1, 2, 3, 4] and steps(client, run, "train_loss") == [1, 2, 3, 4]
    last = client.get_metric_history(run.info.run_id, "val_loss")[-1].value
    assert last == pytest.approx(summary["final"]["val_loss"], rel=1e-6)
    assert run.data.params["optimizer.lr"] == "0.002" and run.data.params["checkpoint.every_n_epochs"] == "2"
    assert run.data.params["model._target_"] == "hydra_raytrain.models.SimpleCNN"
    assert run.data.tags["provenance.command"] and run.data.tags["hydra_raytrain.run_dir"] == str(tmp_path / "run")
    assert artifacts(client, run) == FILES
    assert (tmp_path / "outputs" / "mlartifacts").is_dir()  # the store's artifacts beside it, not in a worker's cwd
    # The model as an MLflow Model: MLflow's pyfunc loader predicts what load_model predicts, on validation digits
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    served = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    [signature] = served.metadata.get_input_schema().inputs
    assert signature.shape == (-1, 1, 8, 8) and str(signature.type) == "float32"
    digits = validation_digits(cfg)
    with torch.no_grad():
        expected = load_model(str(tmp_path / "run"))(torch.from_numpy(digits)).numpy()
    assert np.abs(served.predict(digits) - expected).max() < 1e-6


@pytest.mark.long("a sweep variant: MLflow nesting in the gate is the plain multirun's")
@pytest.mark.workers
def test_a_sweep_on_an_mlflow_server_is_a_parent_run_with_each_trial_nested(
    ray_address, tmp_path, mlflow_server, monkeypatch
):
    """MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME from the environment, through the real CLI."""
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        f"ray.address={ray_address}",
        "model=mlp",
        "scaling.num_workers=1",
        "optimizer.lr=1e-3,1e-2",
        *SHORT,
        "logger=mlflow",
        "logger.mlflow.log_artifacts=best",
        "logger.mlflow.registered_model_name=sweep-digits",
        "hydra.sweep.dir=sweep-m1",
    ]
    env = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": "sweeps"}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # for MLflow's loaders below
    done = run_cli(args, cwd=str(tmp_path), timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(mlflow_server)
    found = runs(client, "sweeps")
    [parent] = [run for run in found if "mlflow.parentRunId" not in run.data.tags]
    trials = [run for run in found if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(found) == 3 and len(trials) == 2
    assert parent.info.run_name == "sweep-m1" and parent.info.status == "FINISHED"
    assert sorted(run.data.params["optimizer.lr"] for run in trials) == ["0.001", "0.01"]
    scores = [m.value for run in trials for m in client.get_metric_history(run.info.run_id, "val_accuracy")]
    assert parent.data.metrics["best_val_accuracy"] == pytest.approx(max(scores), rel=1e-6)  # the best epoch's
    for run in trials:
        assert run.info.status == "FINISHED" and steps(client, run) == [1, 2]
        assert artifacts(client, run) == FILES  # uploaded through the server
        # log_artifacts=best: the model of the checkpoint of the trial's best epoch, not the final one
        run_dir = run.data.tags["hydra_raytrain.run_dir"]
        best = json.loads(open(os.path.join(run_dir, "summary.json")).read())["best"]["epoch"]
        [kept] = glob.glob(os.path.join(run_dir, "ray_storage", "*", f"epoch_{best:04d}", "model.pt"))
        logged = client.download_artifacts(run.info.run_id, "model.pt", str(tmp_path))
        assert open(logged, "rb").read() == open(kept, "rb").read()
        # ... and that checkpoint's weights are the trial's MLflow Model, registered as a version of sweep-digits
        model = mlflow.pytorch.load_model(f"runs:/{run.info.run_id}/model")
        best_weights = torch.load(kept, weights_only=True)
        assert all(torch.equal(value, best_weights[name]) for name, value in model.state_dict().items())
    versions = client.search_model_versions("name = 'sweep-digits'")
    assert sorted(v.run_id for v in versions) == sorted(run.info.run_id for run in trials)


def test_an_unreachable_mlflow_warns_and_the_same_command_later_logs_the_finished_run(
    tmp_path, mlflow_server, monkeypatch, capfd
):
    """Nothing answers at MLFLOW_TRACKING_URI (every connection dropped): the run trains and says so once, after one
    request and one retry, not MLflow's 7 retries over minutes. The same command, with MLflow up and MLFLOW_RUN_ID
    naming a run the user started, logs the finished run's epochs and files into that run."""
    cfg = compose_config("logger=mlflow", *SHORT, "scaling.num_workers=0")
    with dropping_every_connection() as dropped:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{dropped.port}")
        summary = train(cfg, run_dir=str(tmp_path / "run"))
    assert summary["status"] == "completed" and summary["loggers"] == []
    # One request and its one retry (MLFLOW_HTTP_REQUEST_MAX_RETRIES=1), besides a connection opened with no request
    assert dropped.count <= 3, dropped.count
    warned = capfd.readouterr().err
    assert (
        warned.count("logger.mlflow: MLflow at http://127.0.0.1:") == 1
        and "cannot be used" in warned
        and "Run the same command again" in warned
    )
    client = MlflowClient(mlflow_server)
    experiment = client.create_experiment("theirs")
    theirs = client.create_run(experiment, run_name="started-by-the-user").info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "theirs")
    monkeypatch.setenv("MLFLOW_RUN_ID", theirs)
    again = train(cfg, run_dir=str(tmp_path / "run"))
    assert again["loggers"] == ["mlflow"]
    assert "Logged the finished run's 2 epochs (metrics.jsonl) to: mlflow" in capfd.readouterr().out
    [run] = runs(client, "theirs")
    assert run.info.run_id == theirs and run.info.status == "FINISHED"
    assert steps(client, run) == [1, 2] and artifacts(client, run) == FILES
    # run.resume=never trains the run over: a new MLflow run; the earlier one keeps its figures, set aside
    monkeypatch.delenv("MLFLOW_RUN_ID")
    train(
        compose_config("logger=mlflow", *SHORT, "scaling.num_workers=0", "run.resume=never"),
        run_dir=str(tmp_path / "run"),
    )
    earlier, new = sorted(runs(client, "theirs"), key=lambda run: run.info.run_id != theirs)
    assert earlier.info.run_id == theirs and "(replaced " in earlier.data.tags["hydra_raytrain.run_dir"]
    assert new.data.tags["hydra_raytrain.run_dir"] == str(tmp_path / "run") and steps(client, new) == [1, 2]


def test_a_plain_multirun_nests_its_jobs_in_the_run_that_mlflow_run_id_names(tmp_path, mlflow_server):
    """Hydra's basic sweeper, jobs one after another in local mode: MLFLOW_RUN_ID is the sweep's parent run, each job
    its own run nested in it (not every job logging into the one run)."""
    client = MlflowClient(mlflow_server)
    experiment = client.create_experiment("plain")
    parent = client.create_run(experiment, run_name="the-users").info.run_id
    env = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": "plain", "MLFLOW_RUN_ID": parent}
    args = ["-m", "optimizer.lr=1e-3,1e-2", "logger=mlflow", "scaling.num_workers=0", *SHORT]
    done = run_cli(args, cwd=str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = runs(client, "plain")
    jobs = [run for run in found if run.data.tags.get("mlflow.parentRunId") == parent]
    assert len(found) == 3 and sorted(run.data.params["optimizer.lr"] for run in jobs) == ["0.001", "0.01"]
    assert all(steps(client, run) == [1, 2] and run.info.status == "FINISHED" for run in jobs)
    [theirs] = [run for run in found if run.info.run_id == parent]
    assert theirs.info.status == "FINISHED" and steps(client, theirs) == []


@pytest.mark.workers
def test_secrets_reach_the_workers_and_no_file_a_run_writes_or_uploads_holds_them(ray_address, tmp_path, mlflow_server):
    """Secrets as users hand them over: a worker variable from the environment (``${oc.env:...}``, the documented
    way), another typed on the command line, and the MLflow server's password in its tracking URI; the run logs to
    W&B (offline) and that MLflow server. The worker sees the real value; in every file of the run dir (config.json,
    each checkpoint's, Hydra's .hydra/, summary.json, driver.log, the W&B run, TensorBoard's none) and of the MLflow
    server (its database and artifacts) no secret appears: the environment's stays ``${oc.env:...}``, the others
    ``***``. The same command again finds the same run, complete (its identity is unchanged)."""
    env_secret, typed_secret, password = "env-secret-7e1f", "typed-secret-93ab", "pw-secret-44c2"
    host = mlflow_server.split("://", 1)[1]
    probe = tmp_path / "probe.json"  # outside the run dir: it holds what the worker saw
    args = [
        f"ray.address={ray_address}",
        "scaling.num_workers=1",
        "debug=smoke",
        "checkpoint.every_n_epochs=1",
        "scaling.worker_env={HF_TOKEN: ${oc.env:TEST_HF_TOKEN}, API_KEY: " + typed_secret + "}",
        "task._target_=tests.helpers.tasks.Probe",
        f"+task.path={probe}",
        "+task.variable=HF_TOKEN",
        "hydra.run.dir=run",
    ]
    env = {
        "TEST_HF_TOKEN": env_secret,
        "MLFLOW_TRACKING_URI": f"http://hydra:{password}@{host}",
        "MLFLOW_EXPERIMENT_NAME": "secrets",
        "WANDB_MODE": "offline",
    }
    done = run_cli([*args, "logger=[wandb,mlflow]"], cwd=str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(probe.read_text())["env"] == env_secret  # the worker got the real value
    run_dir = tmp_path / "run"
    assert any(run_dir.glob("wandb/**/*.wandb")) and any(run_dir.glob("ray_storage/*/epoch_0001/config.json"))
    config = json.loads((run_dir / "config.json").read_text())
    assert config["scaling"]["worker_env"] == {"HF_TOKEN": "${oc.env:TEST_HF_TOKEN}", "API_KEY": "***"}
    client = MlflowClient(mlflow_server)
    [run] = runs(client, "secrets")
    assert run.data.params["scaling.worker_env.API_KEY"] == "***" and run.info.status == "FINISHED"
    again = run_cli([*args, "logger=[wandb,mlflow]"], cwd=str(tmp_path), env=env)  # the same run, found again
    assert again.returncode == 0 and "Run already complete: 1 epochs" in again.stdout, again.stderr[-3000:]
    secrets = [env_secret.encode(), typed_secret.encode(), password.encode()]
    server_folder = SERVER_FOLDERS[mlflow_server]  # its database and artifacts
    written = [p for folder in (run_dir, server_folder) for p in glob.glob(f"{folder}/**/*", recursive=True)]
    written += glob.glob(f"{run_dir}/.hydra/*") + [str(run_dir / ".lock")]
    assert len(written) > 50
    for path in written:
        if os.path.isfile(path):
            content = open(path, "rb").read()
            assert not any(secret in content for secret in secrets), (path, [s for s in secrets if s in content])
