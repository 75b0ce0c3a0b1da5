"""Regression with mean squared error: reports ``loss`` (MSE), ``mae`` and ``r2``."""

from __future__ import annotations

from .base import StepOutput, Task


class Regression(Task):
    monitor = "val_loss"
    mode = "min"

    def training_step(self, model, batch) -> StepOutput:
        inputs, targets = batch
        errors = model(inputs) - targets
        squared = errors.pow(2)
        sums = {
            "loss": squared.detach().sum(),
            "mae": errors.detach().abs().sum(),
            # R^2 needs the targets' variance over the whole split: keep sums that add up across workers.
            "target_sum": targets.sum(),
            "target_sq_sum": targets.pow(2).sum(),
            "count": targets.new_full((), targets.numel()),
        }
        return StepOutput(squared.mean(), sums)

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        n = sums["count"]
        total_variance = sums["target_sq_sum"] - sums["target_sum"] ** 2 / n
        r2 = 1.0 - sums["loss"] / total_variance if total_variance > 0 else float("nan")
        return {"loss": sums["loss"] / n, "mae": sums["mae"] / n, "r2": r2}
