"""Regression with mean squared error: reports ``loss`` (MSE), ``mae`` and ``r2``, and on validation the
``metrics`` named (tasks/metrics.py: mae, rmse, r2, mape)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import StepOutput, Task
from .metrics import MetricStates


class Regression(Task):
    monitor = "val_loss"
    mode = "min"

    def __init__(self, metrics: Sequence[str] = ()):
        self.metrics = MetricStates(metrics, "regression") if metrics else None

    def training_step(self, model, batch) -> StepOutput:
        inputs, targets = batch
        predictions = model(inputs)
        errors = predictions - targets
        squared = errors.pow(2)
        sums = {
            "loss": squared.detach().sum(),
            "mae": errors.detach().abs().sum(),
            # R^2 needs the targets' variance over the whole split: keep sums that add up across workers.
            "target_sum": targets.sum(),
            "target_sq_sum": targets.pow(2).sum(),
            "count": targets.new_full((), targets.numel()),
        }
        return StepOutput(squared.mean(), sums, (predictions.detach(), targets))

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        n = sums["count"]
        total_variance = sums["target_sq_sum"] - sums["target_sum"] ** 2 / n
        r2 = 1.0 - sums["loss"] / total_variance if total_variance > 0 else float("nan")
        values = {"loss": sums["loss"] / n, "mae": sums["mae"] / n, "r2": r2}
        return {**values, **self.metrics.compute(sums)} if self.metrics is not None else values
