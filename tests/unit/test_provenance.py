"""Where a run came from: the command as typed, the launch folder's git state, versions, host, accelerator."""

from __future__ import annotations

import os
import subprocess

from hydra_raytrain.driver.provenance import command_line, git_state, provenance
from hydra_raytrain.loggers.tensorboard import TensorBoardLogger


def test_the_command_is_recorded_as_typed():
    main = os.path.join("site-packages", "hydra_raytrain", "__main__.py")
    assert command_line([main, "model=mlp", "optimizer.lr=1e-3,1e-2"]) == (
        "python -m hydra_raytrain model=mlp optimizer.lr=1e-3,1e-2"
    )
    assert (
        command_line(["/usr/bin/hydra-raytrain", "-m", "dataset.path=my data"])
        == "hydra-raytrain -m 'dataset.path=my data'"
    )


def test_a_repository_gives_its_commit_and_whether_it_has_uncommitted_changes(tmp_path):
    assert git_state(str(tmp_path)) is None  # not a repository
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@b",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@b",
    }
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        (tmp_path / "train.py").write_text("x = 1\n")
        subprocess.run(["git", "-C", str(tmp_path), *command], check=True, env=env)
    state = git_state(str(tmp_path))
    assert state is not None and len(state["commit"]) == 40 and state["dirty"] is False
    (tmp_path / "train.py").write_text("x = 2\n")
    assert git_state(str(tmp_path)) == {"commit": state["commit"], "dirty": True}


def test_versions_host_and_accelerator_and_a_tensorboard_text_entry(tmp_path):
    found = provenance("timm.create_model", str(tmp_path))
    assert set(found) == {"command", "launch_dir", "git", "versions", "python", "host", "accelerator"}
    assert found["versions"]["torch"] and found["versions"]["ray"] and found["versions"]["hydra"]
    assert found["versions"]["timm"] and found["git"] is None and found["accelerator"]
    logger = TensorBoardLogger()
    logger.start({"run_name": "r", "provenance": found}, str(tmp_path), None)
    logger.finish("completed")
    [events] = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    assert b"provenance/text_summary" in events.read_bytes() and found["host"].encode() in events.read_bytes()
