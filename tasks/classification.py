"""Cross-entropy classification: reports ``loss`` and ``accuracy`` (as ``train_*`` and ``val_*``), and on
validation the ``metrics`` named (tasks/metrics.py: f1, precision, recall, auroc, top<k>_accuracy).

``Classification`` takes ``(inputs, labels)`` batches (images, tables); ``TextClassification`` a text classifier's
batches (``dataset=text dataset.format=classification``: token ids, their mask and types, and the class indices)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
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
        return self.scored(getattr(logits, "logits", logits), labels)  # a Hugging Face model's output holds them

    def scored(self, logits: torch.Tensor, labels: torch.Tensor) -> StepOutput:
        """The loss, the sums and the metrics' outputs of a batch's logits ``(batch, classes)``."""
        losses = F.cross_entropy(logits, labels, reduction="none", label_smoothing=self.label_smoothing)
        correct = (logits.argmax(dim=1) == labels).sum()
        sums = {"loss": losses.detach().sum(), "accuracy": correct, "count": labels.new_full((), len(labels))}
        return StepOutput(losses.mean(), sums, (logits.detach(), labels))

    def compute(self, sums):
        values = super().compute(plain(sums))
        return {**values, **self.metrics.compute(sums)} if self.metrics is not None else values


class TextClassification(Classification):
    """A text classifier's step: the model reads the batch's token ids, attention mask and token types (BERT's;
    none for GPT-2 or Llama), and its logits are scored against ``labels`` as any classification's."""

    def training_step(self, model, batch) -> StepOutput:
        inputs = {name: batch[name] for name in ("input_ids", "attention_mask", "token_type_ids") if name in batch}
        return self.scored(model(**inputs).logits, batch["labels"])
