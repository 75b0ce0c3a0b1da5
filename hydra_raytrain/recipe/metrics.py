"""Exact epoch metrics across workers: add sums locally, all-reduce the sums once, divide once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist


class SumMeter:
    """Adds per-batch sums without a host sync per step (values stay tensors until :meth:`totals`)."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}

    def add(self, sums: Mapping[str, torch.Tensor]) -> None:
        for name, value in sums.items():
            value = value.detach().to(torch.float64)
            self._sums[name] = self._sums[name] + value if name in self._sums else value

    @classmethod
    def resumed(cls, totals: Mapping[str, Any], rank: int, device: torch.device) -> SumMeter:
        """A meter that continues an epoch from a mid-epoch checkpoint's all-reduced ``totals``: rank 0 holds
        them, the other ranks zeros under the same names (so every rank's all-reduce has the same shape)."""
        meter = cls()
        for name, value in totals.items():
            total = torch.as_tensor(value, dtype=torch.float64, device=device)
            meter._sums[name] = total if rank == 0 else torch.zeros_like(total)
        return meter

    def totals(self, uneven: bool = False, device: torch.device | None = None) -> dict[str, Any]:
        """The sums over every batch of every worker: a float per scalar sum, a CPU tensor per larger one (a
        metric's per-class counts). A collective: every rank must call it. ``uneven``: some rank may have added
        nothing (a streamed validation shard): the ranks first agree on the names and shapes (zeros on
        ``device``)."""
        distributed = dist.is_available() and dist.is_initialized()
        if uneven and distributed:
            everyone: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, {name: tuple(value.shape) for name, value in self._sums.items()})
            for shapes in everyone:
                for name, shape in shapes.items():
                    if name not in self._sums:
                        self._sums[name] = torch.zeros(shape, dtype=torch.float64, device=device)
        names = sorted(self._sums)  # the same order on every rank
        if not names:
            return {}
        flat = torch.cat([self._sums[name].reshape(-1) for name in names])
        if distributed:
            # Sums, not means: workers may hold different sample counts (validation is not padded).
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat, totals, start = flat.cpu(), {}, 0
        for name in names:
            shape = self._sums[name].shape
            part = flat[start : start + self._sums[name].numel()]
            start += part.numel()
            totals[name] = float(part[0]) if not shape else part.reshape(shape)
        return totals


@torch.no_grad()
def validation_totals(
    task: Any,
    model: Any,
    batches: Iterable[Any],
    to_device: Callable[[Any], Any],
    extra: int = 0,
    uneven: bool = False,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """The task's validation sums over ``batches``, added over workers (a collective when distributed). ``extra``
    more steps on the last batch, uncounted, keep this rank in step with ranks that hold more batches (FSDP's
    forward is a collective); ``uneven``: a rank may hold no batch (see ``SumMeter.totals``). The task's
    ``on_validation_start`` was called before; what its ``on_validation_end`` returns joins the totals."""
    for module in model.values() if isinstance(model, dict) else [model]:
        module.eval()
    meter, batch = SumMeter(), None
    for batch in batches:
        batch = to_device(batch)
        meter.add(task.validation_step(model, batch))
    for _ in range(extra):
        task.validation_step(model, batch)
    totals = meter.totals(uneven, device)
    return {**totals, **task.on_validation_end()}


def reported(history: Sequence[Mapping[str, Any]], monitor: str) -> list[Any]:
    """``monitor``'s value in each epoch of ``history`` that reports it: early stopping's patience counts those
    epochs (a metric a task reports every n epochs: every n-th)."""
    return [metrics[monitor] for metrics in history if monitor in metrics]


def should_stop(scores: Sequence[float | None], mode: str, patience: int, min_delta: float = 0.0) -> bool:
    """Early stopping: True when the last ``patience`` scores brought no improvement of more than ``min_delta``
    over the best one before them (Lightning's EarlyStopping rule). Missing scores (None) count as no improvement."""
    best, waited = None, 0
    for score in scores:
        better = score is not None and (
            best is None or (score > best + min_delta if mode == "max" else score < best - min_delta)
        )
        if better:
            best, waited = score, 0
        else:
            waited += 1
    return waited >= patience


def rates(totals: dict[str, float], before: dict[str, float], seconds: float) -> dict[str, float]:
    """Samples (and a task's supervised ``tokens``) per second of this attempt's share of the epoch: its totals
    less what a resumed epoch had ``before``."""
    figures = {"samples_per_second": (totals["count"] - before.get("count", 0)) / seconds}
    if "tokens" in totals:
        figures["tokens_per_second"] = (totals["tokens"] - before.get("tokens", 0)) / seconds
    return figures
