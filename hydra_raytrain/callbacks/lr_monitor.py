"""Every optimizer's learning rate (and momentum), each parameter group's, in each epoch's report.

The report's ``lr`` is the first optimizer's first group only; with ``finetune.param_groups`` (a backbone at its
own rate) or several optimizers (a GAN) this shows them all::

    python -m hydra_raytrain callbacks=lr_monitor
    python -m hydra_raytrain experiment=digits_gan callbacks=lr_monitor callbacks.lr_monitor.log_momentum=true
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra_raytrain.callbacks.base import Callback, RunState


class LearningRateMonitor(Callback):
    """Adds ``lr_<optimizer>`` per optimizer (``lr_<optimizer>_group<i>`` where it has several parameter groups),
    and ``momentum_<...>`` alike with ``log_momentum`` (SGD's ``momentum``, Adam's first beta), as they are at the
    epoch's end."""

    def __init__(self, log_momentum: bool = False):
        self.log_momentum = log_momentum

    def on_validation_end(self, run: RunState, metrics: Mapping[str, Any]) -> dict[str, float]:
        figures = {}
        for name, optimizer in run.optimizers.items():
            groups = optimizer.param_groups
            for index, group in enumerate(groups):
                suffix = f"{name}_group{index}" if len(groups) > 1 else name
                figures[f"lr_{suffix}"] = float(group["lr"])
                momentum = group.get("momentum", group.get("betas", (None,))[0])
                if self.log_momentum and momentum is not None:
                    figures[f"momentum_{suffix}"] = float(momentum)
        return figures
