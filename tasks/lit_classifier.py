"""An example ``LightningModule``, laid out like lightning-hydra-template's: a network, a partial optimizer and an
optional partial LR scheduler, each built from config; cross-entropy loss; ``train_*`` / ``val_*`` loss and accuracy
logged per epoch (``sync_dist``: averaged over the workers). Nothing in it knows about Ray or this framework.

    python -m hydra_raytrain experiment=digits_lightning
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn


class LitClassifier(pl.LightningModule):
    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
    ):
        super().__init__()
        self.net = net
        self.make_optimizer, self.make_scheduler = optimizer, scheduler

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)

    def _step(self, batch: Any, stage: str) -> torch.Tensor:
        inputs, labels = batch
        logits = self(inputs)
        loss = F.cross_entropy(logits, labels)
        accuracy = (logits.argmax(dim=1) == labels).float().mean()
        self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log(f"{stage}_accuracy", accuracy, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def configure_optimizers(self) -> Any:
        optimizer = self.make_optimizer(self.parameters())
        if self.make_scheduler is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self.make_scheduler(optimizer), "interval": "epoch"},
        }
