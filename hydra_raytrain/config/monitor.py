"""The one rule for the metric that picks a run's best epoch (and its direction), used by the driver, the workers'
early stopping and checkpoint scores, and the sweeps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def monitored(
    trainer: Mapping[str, Any], task: Any, monitor: str | None = None, mode: str | None = None
) -> tuple[str, str]:
    """(metric, "max" | "min"): ``monitor`` / ``mode`` when given (early stopping's own, a sweep's), else
    ``trainer.monitor`` / ``trainer.monitor_mode``, else the task's ``monitor`` / ``mode`` (``task``: a Task class
    or instance). Each of the two falls back on its own."""
    return monitor or trainer["monitor"] or task.monitor, mode or trainer["monitor_mode"] or task.mode
