"""``trainer.ema.decay``: an exponential moving average of each model's weights (buffers too), updated after
every optimizer step with torch's ``AveragedModel`` and ``get_ema_multi_avg_fn``. The averages are what is
validated and saved as the run's model; the raw weights go on training, and a full-state checkpoint keeps both.

Every rank holds the same raw weights after a step (DDP), so each averages its own copy alike, with no
communication; FSDP's sharded weights are refused (config/schema.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


def averaged(models: dict[str, nn.Module], decay: float) -> dict[str, AveragedModel]:
    """An average per model (unwrapped), empty until the first update copies the weights in. Floating-point
    weights and buffers are averaged; whole-number buffers (a BatchNorm's batch count, position ids) are copied:
    averaging would truncate them."""
    averages = {}
    for name, model in models.items():
        average = AveragedModel(model, multi_avg_fn=_floats_averaged(decay), use_buffers=True)
        average.requires_grad_(False)
        averages[name] = average
    return averages


def _floats_averaged(decay: float) -> Callable[..., None]:
    ema = get_ema_multi_avg_fn(decay)

    def update(averages: list[torch.Tensor], current: list[torch.Tensor], steps: Any) -> None:
        # torch groups the tensors by device and dtype: one call holds one dtype
        if averages and (averages[0].is_floating_point() or averages[0].is_complex()):
            ema(averages, current, steps)
        else:
            torch._foreach_copy_(averages, current)

    return update


@torch.no_grad()
def update(averages: dict[str, AveragedModel], models: dict[str, nn.Module]) -> None:
    for name, average in averages.items():
        average.update_parameters(models[name])


def states(averages: dict[str, AveragedModel]) -> dict[str, dict[str, Any]]:
    """Each average's weights, keyed as its model's own state_dict (what ``model.pt`` holds), on the CPU."""
    return {name: {k: v.detach().cpu() for k, v in a.module.state_dict().items()} for name, a in averages.items()}


def counts(averages: dict[str, AveragedModel]) -> dict[str, int]:
    """How many steps each average has taken in (0: none yet, the next update copies the weights)."""
    return {name: int(average.n_averaged.item()) for name, average in averages.items()}


def load(averages: dict[str, AveragedModel], saved: dict[str, Any], taken: dict[str, int]) -> None:
    """A checkpoint's averages back (their weights, and how many steps they hold)."""
    for name, average in averages.items():
        average.module.load_state_dict(saved[name])
        average.n_averaged.fill_(taken[name])
