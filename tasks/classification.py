"""Cross-entropy classification: reports ``loss`` and ``accuracy`` (as ``train_*`` and ``val_*``)."""

from __future__ import annotations

import torch.nn.functional as F

from .base import StepOutput, Task


class Classification(Task):
    monitor = "val_accuracy"
    mode = "max"

    def __init__(self, label_smoothing: float = 0.0):
        self.label_smoothing = label_smoothing

    def training_step(self, model, batch) -> StepOutput:
        inputs, labels = batch
        logits = model(inputs)
        logits = getattr(logits, "logits", logits)  # a Hugging Face model's output holds them: taken as it is
        losses = F.cross_entropy(logits, labels, reduction="none", label_smoothing=self.label_smoothing)
        correct = (logits.argmax(dim=1) == labels).sum()
        return StepOutput(
            losses.mean(),
            {"loss": losses.detach().sum(), "accuracy": correct, "count": labels.new_full((), len(labels))},
        )
