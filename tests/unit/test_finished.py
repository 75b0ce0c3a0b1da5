"""``inference.finished.FinishedRun``: a finished run read once, and checked before a command uses it."""

import json

import pytest

from hydra_raytrain.config import ConfigError
from hydra_raytrain.inference.finished import FinishedRun

MODEL = {"_target_": "hydra_raytrain.models.MLP", "input_shape": [64], "num_outputs": 10}
CONFIG = {"model": MODEL, "dataset": {"input_shape": [64], "num_outputs": 10}}


def write_run(folder, status, weights=True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "summary.json").write_text(json.dumps({"status": status, "launched_from": "/home/me/project"}))
    if weights:
        (folder / "model.pt").write_bytes(b"weights")


def test_a_run_dir_is_read_once_with_its_status_weights_and_origin(tmp_path):
    write_run(tmp_path / "run", "completed")
    run = FinishedRun.read(str(tmp_path / "run"))
    assert (run.status, run.has_weights, run.launched_from) == ("completed", True, "/home/me/project")
    assert run.dataset == CONFIG["dataset"] and run.models == CONFIG["model"]
    assert run.checked("export") is run  # its targets import, it completed


@pytest.mark.parametrize("status, weights", [("failed", True), ("preempted", True), ("completed", False)])
def test_a_run_dir_that_did_not_finish_is_refused_by_name(tmp_path, status, weights):
    write_run(tmp_path / "run", status, weights)
    with pytest.raises(ConfigError, match=f"is not a finished run \\(summary.json: status '{status}'"):
        FinishedRun.read(str(tmp_path / "run")).check_finished()


def test_a_checkpoint_folder_is_used_as_it_is_and_knows_its_run_dirs_origin(tmp_path):
    write_run(tmp_path / "run", "failed", weights=False)  # a checkpoint of an interrupted run is usable
    checkpoint = tmp_path / "run" / "ray_storage" / "mlp-digits-0123456789" / "epoch_0002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(json.dumps(CONFIG))
    run = FinishedRun.read(str(checkpoint)).checked("predict")
    assert (run.status, run.launched_from) == (None, "/home/me/project")


def test_a_module_that_does_not_import_here_says_where_the_run_was_trained(tmp_path):
    write_run(tmp_path / "run", "completed")
    (tmp_path / "run" / "config.json").write_text(json.dumps({**CONFIG, "model": {"_target_": "my_models.Net"}}))
    with pytest.raises(ConfigError) as refused:
        FinishedRun.read(str(tmp_path / "run")).checked("serve")
    message = str(refused.value)
    assert "cannot be imported" in message and "run this from /home/me/project" in message
    assert f"PYTHONPATH=/home/me/project python -m hydra_raytrain.serve {tmp_path / 'run'}" in message


class Hyper:  # an object in a checkpoint's hyperparameters: only pickle reads it back
    pass


def test_a_lightning_checkpoint_is_read_without_pickle_unless_it_holds_objects_and_then_says_so(tmp_path):
    import warnings

    import pytest
    import torch

    from hydra_raytrain.inference.scoring import lightning_state

    weights = {"layer.weight": torch.ones(2, 2)}
    torch.save({"state_dict": weights, "epoch": 3, "hyper_parameters": {"lr": 0.1}}, tmp_path / "plain.ckpt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: weights_only=True read it
        assert torch.equal(lightning_state(str(tmp_path / "plain.ckpt"))["layer.weight"], weights["layer.weight"])
    torch.save({"state_dict": weights, "hyper_parameters": {"thing": Hyper()}}, tmp_path / "objects.ckpt")
    with pytest.warns(UserWarning, match=r"objects.ckpt holds Python objects .*read only checkpoints you trust"):
        assert torch.equal(lightning_state(str(tmp_path / "objects.ckpt"))["layer.weight"], weights["layer.weight"])
