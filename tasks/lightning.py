"""``task=lightning``: the model is a ``lightning.LightningModule`` that owns its steps, its optimizers
(``configure_optimizers``) and its metrics (``self.log``); a ``lightning.Trainer`` runs it in the Ray Train workers
(``hydra_raytrain/recipe/lightning.py``). Needs the ``lightning`` extra: ``pip install 'hydra_raytrain[lightning]'``.

This module imports nothing of Lightning: the driver names the missing extra before anything starts.
"""

from __future__ import annotations

import importlib
from typing import Any

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.tasks.base import StepOutput, Task

EXTRA = "pip install 'hydra_raytrain[lightning]'"


class Lightning(Task):
    monitor = "val_loss"  # what a module logs with self.log("val_loss", ...); else set trainer.monitor
    mode = "min"

    def training_step(self, model: Any, batch: Any) -> StepOutput:
        raise TypeError("task=lightning runs the LightningModule's own training_step in a lightning.Trainer")


def is_lightning(task_target: str) -> bool:
    """Whether a task node's ``_target_`` is this task (the runner then trains with Lightning)."""
    from hydra.utils import get_object

    try:
        task = get_object(task_target)
    except Exception:
        return False
    return isinstance(task, type) and issubclass(task, Lightning)


def import_lightning() -> Any:
    """``lightning.pytorch``, or a ConfigError naming the extra that installs it."""
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError as error:
        raise ConfigError(
            "task",
            "lightning",
            f"needs the lightning package, which is not installed ({error}).",
            f"install the extra: {EXTRA}",
        ) from None


def check_module(key: str, target: str, built: Any, pl: Any) -> None:
    """A ConfigError naming ``key`` when what ``target`` built is not what Lightning trains: a LightningModule
    (``model``) or a LightningDataModule (``datamodule``)."""
    expected, valid = (
        (pl.LightningDataModule, "a LightningDataModule class, or no datamodule (the dataset group's splits)")
        if key == "datamodule"
        else (pl.LightningModule, "a LightningModule class; a plain nn.Module with another task (task=classification)")
    )
    if not isinstance(built, expected):
        raise ConfigError(
            f"{key}._target_",
            target,
            f"builds a {type(built).__name__}, not a lightning.{expected.__name__} (task=lightning).",
            valid,
        )
