"""What a task's ``train_batch`` gets from the runner: the prepared model(s), optimizer(s) and how to step them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn


@dataclass
class TrainStep:
    model: nn.Module  # DDP-wrapped when there is more than one worker
    optimizer: torch.optim.Optimizer
    lr_scheduler: Optional[torch.optim.lr_scheduler.LRScheduler] = None
    step_scheduler_per_batch: bool = False

    def optimize(self, loss: torch.Tensor) -> None:
        """Backward (DDP all-reduces the gradients here) and one optimizer step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if self.lr_scheduler is not None and self.step_scheduler_per_batch:
            self.lr_scheduler.step()
