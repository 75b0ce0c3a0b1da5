"""A finished run as ``evaluate``, ``export``, ``predict`` and ``serve`` read it: a run dir, or one checkpoint folder
inside its Ray storage. Read once (its config, its summary's status, the folder it was trained from), then checked
before use: its model, dataset and task import here, and a run dir completed and wrote its weights."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from hydra_raytrain.config.errors import ConfigError, Problems
from hydra_raytrain.config.plain import as_dict
from hydra_raytrain.preflight.resolvers import register_resolvers
from hydra_raytrain.preflight.targets import check_targets
from hydra_raytrain.storage.rundir import CONFIG_FILE, MODEL_FILE, SUMMARY_FILE


@dataclass(frozen=True)
class FinishedRun:
    path: str
    config: dict[str, Any]  # the resolved config it trained with
    status: str | None  # summary.json's; None for a checkpoint folder (it has none)
    has_weights: bool  # model.pt is there
    launched_from: str | None  # the folder the run was trained from (its own summary's, or its run dir's)

    @classmethod
    def read(cls, path: str) -> FinishedRun:
        summary = _summary(path)
        return cls(
            path=path,
            config=load_config(path),
            status=summary.get("status") if summary is not None else None,
            has_weights=os.path.exists(os.path.join(path, MODEL_FILE)),
            launched_from=summary.get("launched_from") if summary is not None else _launched_from(path),
        )

    @property
    def dataset(self) -> dict[str, Any]:
        return self.config["dataset"]

    @property
    def models(self) -> dict[str, Any]:
        """The ``model`` node: one ``_target_``, or one node per model (a GAN's)."""
        return self.config.get("model") or {}

    def load_model(self) -> Any:
        """Its model built from its config, with its weights, in eval mode (``{name: model}`` for several)."""
        from hydra_raytrain.inference.scoring import load_weights

        return load_weights(self.path, self.models, self.config.get("peft"))

    def checked(self, command: str, finished: bool = True) -> FinishedRun:
        """This run, once its targets import here (and, with ``finished``, a run dir completed); else one
        ``ConfigError`` that says what to do."""
        self.check_importable(command)
        if finished:
            self.check_finished()
        return self

    def check_importable(self, command: str = "evaluate") -> None:
        """The run's model, dataset and task import here and take their arguments, or one ``ConfigError`` that says
        how to make a module of the user's own importable (using the run from another folder than the training's)."""
        problems = Problems()
        for section in ("model", "dataset", "task", "datamodule"):
            check_targets(section, self.config.get(section) or {}, os.getcwd(), problems)
        hint = (
            (
                f"run this from {self.launched_from}, where the run was trained, or put that folder on the path: "
                f"PYTHONPATH={self.launched_from} python -m hydra_raytrain.{command} {self.path}"
            )
            if self.launched_from
            else "the module on the path (run this from the folder the run was trained in, or set PYTHONPATH to it)"
        )
        problems.errors = [
            ConfigError(e.key, e.value, f"{e.problem} (in {os.getcwd()})", hint)
            if "cannot be imported" in e.problem
            else e
            for e in problems.errors
        ]
        problems.raise_any()

    def check_finished(self) -> None:
        """A run dir is used (exported, predicted with, served) once its run completed and wrote model.pt; a
        checkpoint folder as it is."""
        if self.status is None:
            return  # a checkpoint folder (config.json and its weights): load_model reads it
        if self.status != "completed" or not self.has_weights:
            raise ConfigError(
                "RUN_DIR",
                self.path,
                f"is not a finished run (summary.json: status {self.status!r}, no model.pt).",
                "a completed run dir (the same training command resumes this one), or one checkpoint folder inside "
                "its Ray storage (<run>/ray_storage/<name>/<checkpoint>)",
            )


def load_config(path: str) -> dict[str, Any]:
    """The resolved config of a run dir (``.hydra/config.yaml``) or of a checkpoint folder (``config.json``)."""
    if os.path.exists(os.path.join(path, CONFIG_FILE)):
        with open(os.path.join(path, CONFIG_FILE)) as file:
            return json.load(file)
    hydra_config = os.path.join(path, ".hydra", "config.yaml")
    if os.path.exists(hydra_config):
        register_resolvers()  # a dataset's ${class_count:...} and the like, outside Hydra
        return as_dict(OmegaConf.load(hydra_config))
    raise FileNotFoundError(f"{path} is neither a run dir (no .hydra/config.yaml) nor a checkpoint (no {CONFIG_FILE}).")


def _summary(folder: str) -> dict[str, Any] | None:
    path = os.path.join(folder, SUMMARY_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as file:
        return json.load(file)


def _launched_from(path: str) -> str | None:
    """The folder the run was started from (summary.json's ``launched_from``), for a checkpoint folder: its run
    dir's."""
    folder = os.path.abspath(path)
    for _ in range(4):  # <run dir>/ray_storage/<name>/<checkpoint>
        summary = _summary(folder)
        if summary is not None:
            return summary.get("launched_from")
        folder = os.path.dirname(folder)
    return None
