"""Stop a run whose training loss is not finite (or spikes), at the step it happens, with the reason.

A loss of NaN or inf never comes back: every epoch after it is wasted, and its checkpoints hold broken weights.
The guard ends the run at once (not retried: the same step would diverge again) and says what to change::

    python -m hydra_raytrain callbacks=loss_guard
    python -m hydra_raytrain callbacks=loss_guard callbacks.loss_guard.spike_factor=10
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.distributed as dist

from hydra_raytrain.callbacks.base import Callback, RunState, StopTraining

ADVICE = "lower optimizer.lr, set trainer.gradient_clip_val, or train in trainer.precision=32 or bf16-mixed"


class LossGuard(Callback):
    """Every ``check_every_n_steps`` optimizer steps, the losses of the step's last micro-batch over every worker
    (every sum named ``loss*``: a GAN's ``loss_d`` and ``loss_g`` too; all-reduced, so that every rank decides the
    same). Reading them waits for the GPU: on a GPU, checking every step costs a little throughput. Not finite: the
    run stops. With ``spike_factor``, a loss above that many times its running mean (an exponential average with
    ``decay``, after ``warmup_checks`` checks) stops it too; the running means are kept in checkpoints, so a resumed
    run goes on comparing with the same ones."""

    def __init__(
        self,
        check_every_n_steps: int = 1,
        spike_factor: float | None = None,
        decay: float = 0.9,
        warmup_checks: int = 20,
    ):
        if check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps must be >= 1, got {check_every_n_steps}")
        if spike_factor is not None and spike_factor <= 1:
            raise ValueError(f"spike_factor must be > 1 (or null), got {spike_factor}")
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.every, self.spike_factor = check_every_n_steps, spike_factor
        self.decay, self.warmup_checks = decay, warmup_checks
        self.means: dict[str, float] = {}  # each loss's running mean over the checks
        self.checks = 0

    def on_after_optimizer_step(self, run: RunState, sums: Mapping[str, torch.Tensor]) -> None:
        if run.global_step % self.every:
            return
        names = sorted(name for name in sums if name.startswith("loss"))
        values = torch.stack([sums[name].detach().double() for name in [*names, "count"]])
        if run.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.all_reduce(values)  # every rank calls this hook at the same step
        totals = values.tolist()
        losses = {name: total / totals[-1] for name, total in zip(names, totals, strict=False)}
        where = f"epoch {run.epoch}, optimizer step {run.global_step}"
        for name, loss in losses.items():
            if not math.isfinite(loss):
                raise StopTraining(f"the training {name} is {loss} at {where}: the run stops. To fix: {ADVICE}.")
            mean = self.means.get(name)
            if self.spike_factor is not None and mean is not None and self.checks >= self.warmup_checks:
                if loss > self.spike_factor * mean > 0:
                    raise StopTraining(
                        f"the training {name} is {loss:.4g} at {where}, over spike_factor={self.spike_factor} times "
                        f"its running mean {mean:.4g}: the run stops. To fix: {ADVICE}."
                    )
            self.means[name] = loss if mean is None else self.decay * mean + (1 - self.decay) * loss
        self.checks += 1

    def state_dict(self) -> dict[str, object]:
        return {"means": dict(self.means), "checks": self.checks}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.means = dict(state["means"])  # type: ignore[call-overload]
        self.checks = int(state["checks"])  # type: ignore[call-overload]
