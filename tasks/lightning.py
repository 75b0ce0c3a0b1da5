"""``task=lightning``: the model is a ``lightning.LightningModule`` that owns its steps, its optimizers
(``configure_optimizers``) and its metrics (``self.log``); a ``lightning.Trainer`` runs it in the Ray Train workers
(``hydra_raytrain/recipe/lightning.py``). Needs the ``lightning`` extra: ``pip install 'hydra_raytrain[lightning]'``.

This module is the task's marker and imports nothing of Lightning; what the runner needs to know of Lightning's
Trainer before it imports Lightning is in ``hydra_raytrain/recipe/lightning_setup.py``.
"""

from __future__ import annotations

from typing import Any

from .base import StepOutput, Task


class Lightning(Task):
    monitor = "val_loss"  # what a module logs with self.log("val_loss", ...); else set trainer.monitor
    mode = "min"

    def training_step(self, model: Any, batch: Any) -> StepOutput:
        raise TypeError("task=lightning runs the LightningModule's own training_step in a lightning.Trainer")
