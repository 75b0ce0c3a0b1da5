"""More validation metrics by name (``task.metrics``), computed with torchmetrics, exact across workers.

    python -m hydra_raytrain '+task.metrics=[f1,auroc,top3_accuracy]' trainer.monitor=val_f1
    python -m hydra_raytrain experiment=diabetes_regression '+task.metrics=[rmse,mape]'

A torchmetrics metric keeps sum-reduced states (true/false positives per class, a binned confusion matrix, sums
of errors). After each validation batch those states join the batch's sums (``<name>:<state>``); the runner adds
them over the batches and the workers as it adds every sum (every validation sample counted once, whatever the
number of workers), and each metric is computed once from the totals: the figure torchmetrics gives on the whole
split in one process. They are reported as ``val_<name>`` (and ``test_<name>``), usable as ``trainer.monitor``, a
sweep's metric, and by ``evaluate``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hydra_raytrain.config.errors import ConfigError

# macro averages over the classes; the confusion matrix is no scalar: given where a whole split is scored
CLASSIFICATION = ("f1", "precision", "recall", "auroc", "top<k>_accuracy", "confusion_matrix")
MATRICES = ("confusion_matrix",)  # rows: the true class, columns: the predicted one (torchmetrics' layout)
REGRESSION = ("mae", "rmse", "r2", "mape")
AUROC_THRESHOLDS = 200  # AUROC from a confusion matrix at this many thresholds: a sum, exact across workers
_TOP_K = re.compile(r"top(\d+)_accuracy")


class MetricStates:
    """The metrics ``names`` of a ``kind`` of task ("classification" or "regression"): their states of a batch
    as sums, and their values from the totals."""

    def __init__(self, names: Sequence[str], kind: str):
        valid = CLASSIFICATION if kind == "classification" else REGRESSION
        if isinstance(names, str) or not all(isinstance(name, str) for name in names):
            raise ConfigError("task.metrics", names, "is a list of metric names.", f"e.g. [{valid[0]}]")
        for name in names:
            if name not in valid and not (kind == "classification" and _TOP_K.fullmatch(name)):
                raise ConfigError("task.metrics", list(names), f"{name!r} is no {kind} metric.", ", ".join(valid))
        if len(set(names)) < len(names):
            raise ConfigError("task.metrics", list(names), "names a metric twice.")
        self.names, self.kind = tuple(names), kind
        self._metrics: dict[str, Any] = {}  # a metric object per name, on the batches' device

    def sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each metric's states after ``outputs`` (class scores, or predicted values) and ``targets``."""
        outputs = outputs.detach().float()
        if self.kind == "classification":
            outputs = outputs.softmax(dim=1)  # AUROC reads probabilities; the others, their argmax
        else:  # every output a value, as the task's own loss and r2 count them
            outputs, targets = outputs.reshape(-1), targets.reshape(-1)
        sums = {}
        for name in self.names:
            metric = self._metrics.get(name)
            if metric is None or metric.device != outputs.device:
                classes = outputs.shape[1] if self.kind == "classification" else 0
                metric = self._metrics[name] = _metric(name, classes).to(outputs.device)
            metric.update(outputs, targets)
            sums.update({f"{name}:{state}": getattr(metric, state).clone() for state in metric._defaults})
            metric.reset()
        return sums

    def compute(self, totals: Mapping[str, Any]) -> dict[str, float]:
        """The scalar metrics whose states ``totals`` holds (validation's; training's have none)."""
        return {name: float(value) for name, value in self._computed(totals, scalar=True).items()}

    def matrices(self, totals: Mapping[str, Any]) -> dict[str, list[list[int]]]:
        """The matrices (``confusion_matrix``) whose states ``totals`` holds, as lists of rows of counts."""
        return {name: value.long().tolist() for name, value in self._computed(totals, scalar=False).items()}

    def _computed(self, totals: Mapping[str, Any], scalar: bool) -> dict[str, torch.Tensor]:
        values = {}
        for name in self.names:
            states = {key.split(":", 1)[1]: value for key, value in totals.items() if key.startswith(f"{name}:")}
            if not states or (name in MATRICES) == scalar:
                continue
            metric = _metric(name, _classes(name, states))
            for state, value in states.items():
                default = getattr(metric, state)
                total = torch.as_tensor(value, dtype=torch.float64)
                setattr(metric, state, total.to(default.dtype).reshape(default.shape))
            metric._update_count = 1  # its states were set, not updated here
            values[name] = metric.compute()
        return values


def plain(totals: Mapping[str, Any]) -> dict[str, Any]:
    """The totals without the metrics' states."""
    return {name: value for name, value in totals.items() if ":" not in name}


def _metric(name: str, classes: int) -> Any:
    """One torchmetrics metric. Its own sync stays off: the runner all-reduces its states with the other sums
    (torchmetrics' would gather them again, and CPU states through NCCL fail); so does its argument checking,
    a host sync on every batch (the task's own loss has checked the labels)."""
    from torchmetrics import classification, regression

    own: dict[str, Any] = {"sync_on_compute": False, "validate_args": False}
    if name in REGRESSION:
        if name == "rmse":
            return regression.MeanSquaredError(squared=False, sync_on_compute=False)
        kind = {"mae": "MeanAbsoluteError", "r2": "R2Score", "mape": "MeanAbsolutePercentageError"}[name]
        return getattr(regression, kind)(sync_on_compute=False)
    if name == "confusion_matrix":
        return classification.MulticlassConfusionMatrix(classes, **own)
    if name == "auroc":
        return classification.MulticlassAUROC(classes, average="macro", thresholds=AUROC_THRESHOLDS, **own)
    if name in ("f1", "precision", "recall"):
        kind = {"f1": "MulticlassF1Score", "precision": "MulticlassPrecision", "recall": "MulticlassRecall"}[name]
        return getattr(classification, kind)(classes, average="macro", **own)
    k = int(_TOP_K.fullmatch(name).group(1))  # type: ignore[union-attr]
    if not 1 <= k <= classes:
        raise ConfigError(
            "task.metrics", name, f"the model scores {classes} classes.", f"top1_accuracy to top{classes}_accuracy"
        )
    return classification.MulticlassAccuracy(classes, top_k=k, average="micro", **own)


def _classes(name: str, states: Mapping[str, Any]) -> int:
    """The number of classes a metric's states are for (its per-class counts' length); 0 for a regression."""
    if name in REGRESSION:
        return 0
    if name in ("auroc", "confusion_matrix"):  # a [classes, classes] matrix; binned AUROC's [thresholds, classes, 2, 2]
        return int(torch.as_tensor(states["confmat"]).shape[-3 if name == "auroc" else 0])
    # Per-class counts: their length. Top-1's micro counts are one total ([1]), whatever the classes: any will do.
    shaped = [torch.as_tensor(value) for value in states.values() if torch.as_tensor(value).dim()]
    return max(int(shaped[0].shape[0]) if shaped else 0, 2)
