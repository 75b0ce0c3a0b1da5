"""The one rule for the metric that picks a run's best epoch (and its direction), used by the driver, the workers'
early stopping and checkpoint scores, the sweeps and the rehearsal."""

from __future__ import annotations

from typing import Any


def monitored(task: Any, *settings: tuple[str | None, str | None]) -> tuple[str, str]:
    """(metric, "max" | "min"): the first metric set among ``settings`` — (monitor, mode) pairs, the most specific
    first: early stopping's or a sweep's, then ``(trainer.monitor, trainer.monitor_mode)`` — else the task's
    ``monitor``; the mode likewise, each of the two on its own, the task's ``modes`` naming the direction of a metric
    that is not its ``mode``'s (``task``: a Task class or instance)."""
    metric = next((monitor for monitor, _ in settings if monitor), task.monitor)
    mode = next((mode for _, mode in settings if mode), getattr(task, "modes", {}).get(metric, task.mode))
    return metric, mode
