"""Checkpoint contents: RNG states round-trip, every file loads with weights_only, broken folders are skipped."""

import logging
import os
import random
import tempfile
import types

import numpy as np
import pytest
import torch
from ray.train import Checkpoint

from hydra_raytrain.recipe import checkpoint


def draw():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    draw()
    checkpoint.write(str(tmp_path), rank=0, model_state={"w": torch.ones(2)}, train_state={"epoch": 3}, config={"a": 1})
    expected = draw()
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    state = checkpoint.read(str(tmp_path), rank=0)
    checkpoint.set_rng_state(state["rng"])
    assert draw() == expected
    assert state["train"] == {"epoch": 3} and torch.equal(state["model"]["w"], torch.ones(2))


def test_a_rank_without_its_rng_file_gets_none(tmp_path):
    checkpoint.write(str(tmp_path), rank=0, model_state={}, train_state={}, config={})
    assert checkpoint.read(str(tmp_path), rank=1)["rng"] is None


def test_newest_loadable_skips_a_truncated_checkpoint(tmp_path):
    folders = []
    for epoch in (1, 2):
        folder = tmp_path / f"epoch_{epoch}"
        folder.mkdir()
        checkpoint.write(
            str(folder),
            rank=0,
            model_state={"w": torch.full((2,), float(epoch))},
            train_state={"epoch": epoch},
            config={},
        )
        folders.append(folder)
    model_file = folders[1] / "model.pt"
    model_file.write_bytes(model_file.read_bytes()[:50])
    warnings = []
    state = checkpoint.read_newest_loadable(
        [Checkpoint.from_directory(str(f)) for f in reversed(folders)], 0, warnings.append
    )
    assert state["train"]["epoch"] == 1 and len(warnings) == 1 and "epoch_2" in warnings[0]


def test_no_loadable_checkpoint_gives_none(tmp_path):
    (tmp_path / "empty").mkdir()
    assert (
        checkpoint.read_newest_loadable([Checkpoint.from_directory(str(tmp_path / "empty"))], 0, lambda m: None) is None
    )


def test_storage_that_is_away_is_not_taken_for_a_broken_checkpoint(tmp_path):
    """A download that ran out of storage.retry_window_s ends the search: the previous checkpoint is as far away."""
    import pyarrow.fs

    from hydra_raytrain.storage.retry import RetryingHandler, StorageUnavailable

    class Away(RetryingHandler):
        def _call(self, what, function):
            raise StorageUnavailable(f"storage {self.window.uri} did not answer")

    away = pyarrow.fs.PyFileSystem(Away(pyarrow.fs.LocalFileSystem(), "s3://b/runs", 1))
    (tmp_path / "epoch_1").mkdir()
    warnings = []
    with pytest.raises(StorageUnavailable, match="did not answer"):
        checkpoint.read_newest_loadable([Checkpoint(str(tmp_path / "epoch_1"), away)], 0, warnings.append)
    assert warnings == []


def test_a_checkpoint_waiting_for_the_previous_upload_warns_once_and_only_past_a_second(tmp_path, monkeypatch, caplog):
    """Sub-second waits are Ray Train collecting each report (the default run's): no warning. A wait of a second or
    more is storage slower than the checkpoints: said once."""
    uploads = checkpoint.Uploads("ASYNC", str(tmp_path / "staging"))
    waits = iter([0.05, checkpoint.WAIT_WARNING_S + 0.05, checkpoint.WAIT_WARNING_S + 0.05])
    clock = [0.0]  # the module's clock, moved by the waits alone: no sleep, no dependence on the machine's pace

    def wait(**_):
        clock[0] += next(waits)

    monkeypatch.setattr(checkpoint, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(checkpoint.ray.train, "get_all_reported_checkpoints", wait)
    for name in ("epoch_0002", "epoch_0003", "epoch_0004"):
        uploads.uploading = str(tmp_path / name)  # the previous upload still in flight
        os.makedirs(uploads.uploading)
        with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
            uploads._wait_for_previous(name)
        assert not os.path.exists(uploads.uploading)
    warned = [r.getMessage() for r in caplog.records if "for the previous one to be stored" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("checkpoint epoch_0003 waited 1."), warned


def test_one_run_name_in_two_run_dirs_stages_apart_and_a_restart_empties_its_own(tmp_path, monkeypatch):
    """Two runs of one config (one run name) at once on a node: the second's start leaves the first's staged
    checkpoint (an upload in flight) alone; a restarted worker of the first removes what its predecessor left."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "local_disk"))
    os.makedirs(tempfile.gettempdir())
    first = checkpoint.Uploads("ASYNC", checkpoint.staging_folder("mlp-digits-0a1b2c3d4e", str(tmp_path / "a"), 0))
    in_flight = tempfile.mkdtemp(dir=first.staging)
    checkpoint.Uploads("ASYNC", checkpoint.staging_folder("mlp-digits-0a1b2c3d4e", str(tmp_path / "b"), 0))
    assert os.path.isdir(in_flight)
    checkpoint.Uploads("ASYNC", checkpoint.staging_folder("mlp-digits-0a1b2c3d4e", str(tmp_path / "a"), 0))
    assert not os.path.exists(in_flight)


def test_staging_lives_in_the_users_private_folder_and_a_link_there_is_refused(tmp_path, monkeypatch):
    import os
    import tempfile

    import pytest

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / f"hydra_raytrain-{os.getuid()}"
    staged = checkpoint.staging_folder("mlp-digits-0a1b2c3d4e", str(tmp_path / "run"), 1)
    assert os.path.dirname(staged) == str(folder) and oct(folder.stat().st_mode & 0o777) == "0o700"
    folder.chmod(0o755)  # this user's own, opened by hand: closed again
    checkpoint.private_temp()
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    folder.rmdir()
    (tmp_path / "elsewhere").mkdir()
    folder.symlink_to(tmp_path / "elsewhere")  # a link someone put where the folder goes
    with pytest.raises(PermissionError, match="is not this user's private folder"):
        checkpoint.private_temp()
