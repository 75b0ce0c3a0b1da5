"""The task API: what the loss and the metrics of one batch are.

The runner owns everything distributed (DDP, sharded sampling, all-reduce, reporting). A task only turns one
batch into a loss and into *sums* (total loss, number correct, ..., and ``count``, the number of samples).
The runner adds the sums over batches and over workers, then calls :meth:`Task.compute` once, so epoch
metrics are exact whatever the number of workers (a mean of per-worker means would not be).

A task with several models or optimizers (a GAN) overrides :meth:`Task.train_batch`, which receives the
runner's step (:class:`Step`: ``hydra_raytrain/recipe/step.py``'s ``TrainStep``) and decides itself what to step; its
``training_step`` / ``validation_step`` then receive the dict of models (``config.model`` names them).
The runner still provides DDP for every model, autocast and the fp16 scaler, accumulation, clipping,
checkpoints and resume of every model and optimizer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

Sums = dict[str, torch.Tensor]


class Step(Protocol):
    """What :meth:`Task.train_batch` may use of the runner's step: the models (DDP-wrapped or FSDP-sharded, and
    unwrapped), the forward context (autocast; no gradient sync inside an accumulation window) and ``optimize``
    (backward, then at the end of an accumulation window: unscale, clip, step, zero the gradients)."""

    models: dict[str, nn.Module]
    unwrapped: dict[str, nn.Module]

    @property
    def model(self) -> nn.Module: ...

    def forward(self) -> contextlib.AbstractContextManager: ...

    def optimize(self, loss: torch.Tensor, name: str | None = None, normalizer: torch.Tensor | None = None) -> None: ...


@dataclass
class StepOutput:
    loss: torch.Tensor  # what backward() runs on: a mean over the batch (a sum, with a normalizer)
    sums: Sums  # detached per-batch sums the metrics are made of; must include "count"
    outputs: tuple[torch.Tensor, torch.Tensor] | None = None  # (the model's outputs, the targets): task.metrics'
    # When set, ``loss`` is a sum over this many units (supervised tokens): the runner divides each optimizer
    # step's gradients by the units of its whole accumulation window on every worker (exact per unit), instead
    # of averaging per-batch means.
    normalizer: torch.Tensor | None = None


class Task:
    monitor: str = "val_loss"  # the metric that picks the best epoch unless trainer.monitor says otherwise
    mode: str = "min"
    modes: dict[str, str] = {}  # the direction of a metric the task reports that is not ``mode``'s (val_accuracy: max)
    # (names, n): metrics reported every n epochs only (and at the last); on the other epochs they are absent
    occasional: tuple[frozenset[str], int] = (frozenset(), 1)

    # ``model`` is the model, or the dict of models of a task with several (``config.model`` names them).
    def training_step(self, model: Any, batch: Any) -> StepOutput:
        raise NotImplementedError

    def validation_step(self, model: Any, batch: Any) -> Sums:
        """``training_step``'s sums (under no_grad), and the states of the task's ``metrics`` (tasks/metrics.py's
        ``MetricStates``, when it has them) of the outputs it returned."""
        output = self.training_step(model, batch)
        metrics = getattr(self, "metrics", None)
        if metrics is None or output.outputs is None:
            return output.sums
        return {**output.sums, **metrics.sums(*output.outputs)}

    def on_setup(
        self,
        starting: Callable[[], Any],
        splits: Any = None,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Every rank, once, before the first step (and before a split is scored after training): ``starting()``
        builds the run's model as the run started it (its builder's weights, or ``run.init_from``'s), on the CPU,
        without adapters: what a task compares the trained model with (DPO's reference). ``splits``: the dataset's
        splits the worker reads (None where Ray Data streams them, or no run trains), before any loader iterates
        them; ``device`` and ``dtype``: the models' (a collective may run here, on every rank)."""

    def on_validation_start(self, epoch: int | None = None, max_epochs: int | None = None) -> bool:
        """Every rank, before a pass over a split (``epoch``: the epoch just trained, 1-based, of ``max_epochs``;
        None: a split scored after training). True when the pass's forwards may differ in number between ranks (a
        generation's steps): under FSDP the runner then gathers every unit's parameters for the pass."""
        return False

    def on_validation_end(self) -> dict[str, float]:
        """Every rank, after the pass (a collective may run here): figures that are no sums, computed once from what
        the pass's steps kept (every worker's rows); they join the totals :meth:`compute` receives."""
        return {}

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        """Metrics from sums added over every batch and worker. Default: each sum divided by ``count``."""
        count = sums["count"]
        return {name: value / count for name, value in sums.items() if name != "count"}

    def train_batch(self, step: Step, batch: Any) -> Sums:
        """One micro-batch: forward under autocast, then backward and (at the end of an accumulation window)
        an optimizer step. Override for several models or optimizers."""
        with step.forward():
            output = self.training_step(step.model, batch)
        step.optimize(output.loss, normalizer=output.normalizer)
        return output.sums

    def on_epoch_end(self, model: Any, epoch: int, run_dir: str) -> None:
        """Rank 0, after each epoch, with the unwrapped model (or dict of models): write pictures, samples..."""
