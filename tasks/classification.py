"""Cross-entropy classification: reports ``loss`` and ``accuracy`` (as ``train_*`` and ``val_*``), and on
validation the ``metrics`` named (tasks/metrics.py: f1, precision, recall, auroc, top<k>_accuracy)."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F

from .base import StepOutput, Task
from .metrics import MetricStates, plain


class Classification(Task):
    monitor = "val_accuracy"
    mode = "max"

    def __init__(self, label_smoothing: float = 0.0, metrics: Sequence[str] = ()):
        self.label_smoothing = label_smoothing
        self.metrics = MetricStates(metrics, "classification") if metrics else None

    def training_step(self, model, batch) -> StepOutput:
        inputs, labels = batch
        logits = model(inputs)
        logits = getattr(logits, "logits", logits)  # a Hugging Face model's output holds them: taken as it is
        losses = F.cross_entropy(logits, labels, reduction="none", label_smoothing=self.label_smoothing)
        correct = (logits.argmax(dim=1) == labels).sum()
        sums = {"loss": losses.detach().sum(), "accuracy": correct, "count": labels.new_full((), len(labels))}
        return StepOutput(losses.mean(), sums, (logits.detach(), labels))

    def compute(self, sums):
        values = super().compute(plain(sums))
        return {**values, **self.metrics.compute(sums)} if self.metrics is not None else values
