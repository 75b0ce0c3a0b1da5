"""MLflow's settings as the driver resolves them: the config first, then MLflow's environment, then our defaults."""

import pytest

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.loggers.mlflow import (
    MlflowLogger,
    absolute_store,
    flat_params,
    forwarded_env,
    metric_key,
    plan,
    resolve,
)
from hydra_raytrain.runtime.reach import free_port

EMPTY = {"tracking_uri": None, "experiment_name": None, "run_id": None, "sweep_dir": None}


def test_null_settings_are_left_to_mlflows_environment_then_to_a_local_sqlite_store():
    assert resolve(EMPTY, {}, "/work/project") == {
        **EMPTY,
        "tracking_uri": "sqlite:////work/project/outputs/mlflow.db",
        "experiment_name": "hydra_raytrain",
        "experiment_id": None,
    }
    environ = {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_EXPERIMENT_NAME": "vision", "MLFLOW_RUN_ID": "r1"}
    resolved = resolve(EMPTY, environ, "/work/project")
    assert (resolved["tracking_uri"], resolved["experiment_name"], resolved["run_id"]) == (
        "http://mlflow:5000",
        "vision",
        "r1",
    )
    given = {**EMPTY, "tracking_uri": "http://ours:5000", "experiment_name": "ours"}  # the config's own win
    assert resolve(given, environ, "/")["tracking_uri"] == "http://ours:5000"
    assert resolve(given, environ, "/")["experiment_name"] == "ours"
    by_id = resolve(EMPTY, {"MLFLOW_EXPERIMENT_ID": "7"}, "/")
    assert by_id["experiment_id"] == "7" and by_id["experiment_name"] is None


def test_a_sweeps_trials_do_not_take_mlflow_run_id():
    """In a sweep, MLFLOW_RUN_ID is the parent run: every trial taking it would log into one run."""
    assert resolve({**EMPTY, "sweep_dir": "/s"}, {"MLFLOW_RUN_ID": "r1"}, "/")["run_id"] is None


def test_the_config_becomes_flat_params_within_mlflows_limits():
    params = flat_params({"optimizer": {"lr": 0.001, "betas": [0.9, 0.99]}, "run": {"init_from": None}, "x": {}})
    assert params == {"optimizer.lr": "0.001", "optimizer.betas": "[0.9, 0.99]", "run.init_from": "None", "x": "{}"}
    assert len(flat_params({"long": "a" * 7000})["long"]) == 6000


def test_credentials_and_the_run_id_are_not_forwarded_and_retries_are_short_unless_set():
    environ = {"MLFLOW_TRACKING_URI": "u", "MLFLOW_TRACKING_PASSWORD": "p", "MLFLOW_TRACKING_TOKEN": "t"}
    environ |= {"MLFLOW_RUN_ID": "r", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60", "HOME": "/root"}
    assert forwarded_env(environ) == {
        "MLFLOW_TRACKING_URI": "u",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    }


def test_an_unreachable_server_is_said_once_and_the_logger_dropped():
    said = []
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert plan({"tracking_uri": uri}, {}, "/", warn=said.append) is False
    [message] = said
    assert message.startswith(f"logger.mlflow: MLflow at {uri} cannot be used (") and "same command again" in message


def test_an_unknown_artifacts_choice_is_refused_by_name():
    with pytest.raises(ConfigError) as caught:
        MlflowLogger(log_artifacts="all")
    assert caught.value.key == "logger.mlflow.log_artifacts" and "none, best, last" in str(caught.value)


def test_local_stores_are_made_absolute_for_workers_that_run_elsewhere():
    assert absolute_store("sqlite:///mlflow.db", "/w") == "sqlite:////w/mlflow.db"
    assert absolute_store("sqlite:////data/mlflow.db", "/w") == "sqlite:////data/mlflow.db"
    assert absolute_store("./mlruns", "/w") == "/w/mlruns" and absolute_store("file:mlruns", "/w") == "file:///w/mlruns"
    for remote in ("http://mlflow:5000", "databricks", "databricks://profile", "postgresql://u@db/mlflow"):
        assert absolute_store(remote, "/w") == remote


def test_names_mlflow_refuses_are_mended_and_credentials_hidden():
    assert [metric_key(k) for k in ("val_accuracy", "acc@1", "top1(%)", "/a..b")] == [
        "val_accuracy",
        "acc_1",
        "top1___",
        "a._b",
    ]
    assert flat_params({"logger": {"uri": "http://me:secret@mlflow:5000"}}) == {"logger.uri": "http://***@mlflow:5000"}


def test_tags_must_be_names_and_values():
    with pytest.raises(ConfigError) as caught:
        MlflowLogger(tags=["vision"])
    assert caught.value.key == "logger.mlflow.tags"
    assert MlflowLogger(tags={"version": 2}).tags == {"version": "2"}
