"""The trackers' driver side (loggers/base.py's DriverSide): the orchestrators loop over trackers and name none,
and a run's config is never changed in place."""

import ast
import pathlib
import re

import pytest
from tensorboard.plugins.hparams import plugin_data_pb2  # TensorBoard's own reader of the plugin's data

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.loggers import base as trackers
from hydra_raytrain.loggers.tensorboard import hparams, session_end, session_start
from hydra_raytrain.loggers.wandb import WandbLogger

ROOT = pathlib.Path(__file__).resolve().parents[2]
WANDB = {"_target_": "hydra_raytrain.loggers.wandb.WandbLogger", "mode": "offline"}
TENSORBOARD = {"_target_": "hydra_raytrain.loggers.tensorboard.TensorBoardLogger"}
MLFLOW = {"_target_": "hydra_raytrain.loggers.mlflow.MlflowLogger", "tracking_uri": "http://127.0.0.1:1"}


def test_the_orchestrators_name_no_tracker():
    """driver/run.py and sweep/tuner.py reach the trackers through their driver side only: no name, import or
    string of their code (docstrings aside) names one."""
    for module in ("driver/run.py", "sweep/tuner.py"):
        tree = ast.parse((ROOT / "hydra_raytrain" / module).read_text())
        docstrings = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        words = [
            getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "module", None) or node.value
            for node in ast.walk(tree)
            if isinstance(node, (ast.Name, ast.Attribute, ast.ImportFrom))
            or (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings)
        ]
        words += [
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        ]
        named = [word for word in words if re.search(r"mlflow|wandb|tensorboard", str(word), re.IGNORECASE)]
        assert named == [], (module, named)
        assert "driver_side" in str(words) or "trackers" in words  # the words were read


def test_a_tracker_that_cannot_be_reached_is_dropped_and_the_nodes_stay_as_they_were(monkeypatch, capsys):
    """MLflow at a port where nothing listens is dropped with one warning; W&B is prepared (its mode kept) with its
    variables forwarded; TensorBoard asks nothing. The nodes handed in are not changed."""
    monkeypatch.setenv("WANDB_PROJECT", "p")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    nodes = {"wandb": dict(WANDB), "tensorboard": dict(TENSORBOARD), "mlflow": dict(MLFLOW)}
    kept, env = trackers.prepare_all(nodes)
    assert sorted(kept) == ["tensorboard", "wandb"] and env["WANDB_PROJECT"] == "p"
    assert "logger.mlflow: MLflow at http://127.0.0.1:1 cannot be used" in capsys.readouterr().err
    assert nodes == {"wandb": WANDB, "tensorboard": TENSORBOARD, "mlflow": MLFLOW}


def test_a_sweeps_trials_are_grouped_by_each_tracker_and_only_mlflow_opens_a_record(tmp_path):
    sweep_dir = str(tmp_path / "multirun" / "sweep_1")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nodes = {"wandb": dict(WANDB), "tensorboard": dict(TENSORBOARD), "mlflow": {**MLFLOW, "tracking_uri": uri}}
    trial = trackers.for_trial(nodes, sweep_dir)
    assert trial["wandb"]["group"] == "sweep_1" and trial["tensorboard"] == TENSORBOARD
    assert trial["mlflow"]["sweep_dir"] == sweep_dir and trial["mlflow"]["experiment_name"] == "hydra_raytrain"
    assert trackers.for_trial({"wandb": {**WANDB, "group": "mine"}}, sweep_dir)["wandb"]["group"] == "mine"
    assert [trackers.driver_side(node).in_sweep(node) for node in trial.values()] == [False, False, True]
    kept, handles = trackers.open_sweeps(nodes, sweep_dir)
    assert sorted(kept) == ["mlflow", "tensorboard", "wandb"] and nodes["mlflow"]["tracking_uri"] == uri
    assert handles["wandb"] is None and handles["tensorboard"] is None and isinstance(handles["mlflow"], str)
    trackers.close_sweeps(kept, handles, {"best_val_loss": 0.5}, failed=False)
    from mlflow.tracking import MlflowClient

    parent = MlflowClient(uri).get_run(handles["mlflow"])
    assert parent.info.status == "FINISHED" and parent.data.metrics == {"best_val_loss": 0.5}


def test_a_runs_settings_become_hparams_values_and_unset_ones_are_left_out():
    cfg = {"optimizer": {"lr": 0.01, "betas": [0.9, 0.99]}, "trainer": {"amp": True, "monitor": None}, "tags": {}}
    assert hparams(cfg) == {"optimizer.lr": 0.01, "optimizer.betas": "[0.9, 0.99]", "trainer.amp": True}
    [start], [end] = session_start(cfg).value, session_end("failed").value
    read = plugin_data_pb2.HParamsPluginData.FromString(start.metadata.plugin_data.content).session_start_info
    assert read.hparams["optimizer.lr"].number_value == 0.01 and read.hparams["trainer.amp"].bool_value is True
    ended = plugin_data_pb2.HParamsPluginData.FromString(end.metadata.plugin_data.content).session_end_info
    assert (start.tag, end.tag, ended.status) == (
        "_hparams_/session_start_info",
        "_hparams_/session_end_info",
        2,
    )  # FAILURE


def test_wandbs_log_model_takes_best_last_or_false():
    for choice in ("best", "last", False, None):
        WandbLogger(mode="offline", log_model=choice)
    with pytest.raises(ConfigError) as caught:
        WandbLogger(mode="offline", log_model="all")
    assert caught.value.key == "logger.wandb.log_model" and "best, last, or false" in str(caught.value)
