"""The state a worker's run holds, named once for the recipe (``loop.py``) and for its parts that live in modules of
their own: where the run starts from (``resuming.py``) and what it saves (``saving.py``). The recipe sets it up."""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel

from hydra_raytrain.callbacks.base import Callbacks, RunState
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.recipe.cadence import Cadence
from hydra_raytrain.recipe.checkpoint import Uploads
from hydra_raytrain.recipe.step import TrainStep
from hydra_raytrain.tasks.base import Task


class RecipeState:
    cfg: Resolved
    run_dir: str
    run_name: str
    saved: dict[str, Any]  # the config as the run saves and logs it (redacted)
    rank: int
    world_size: int
    device: torch.device
    several_models: bool  # config.model names several models (a GAN)
    trained_only: bool  # checkpoints hold what trains (peft's adapters), not the weights the builder gives again
    task: Task
    batch_size: int
    train_batches: int
    step: TrainStep
    sharded: bool  # some model is sharded by FSDP
    averages: dict[str, AveragedModel]  # trainer.ema's moving averages, by model
    start_epoch: int  # the epoch to train first (0-based)
    global_step: int  # optimizer steps
    position: dict[str, Any] | None  # where in start_epoch a mid-epoch checkpoint left off
    history: list[dict[str, Any]]  # the epochs' metrics
    tracker_ids: dict[str, str]
    callbacks: Callbacks
    run_state: RunState
    uploads: Uploads
    cadence: Cadence

    def _hook(self, hook: str, *args: Any) -> None:
        """Every callback's ``hook`` (hydra_raytrain/callbacks/base.py), with the run as it stands."""
        if self.callbacks:
            self.run_state.global_step = self.global_step
            self.callbacks.call(hook, self.run_state, *args)
