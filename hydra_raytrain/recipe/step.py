"""What a task's ``train_batch`` gets from the runner: the prepared models and optimizers, and how to step them.

The runner decides *when* (accumulation windows, DDP's ``no_sync`` on all but the last micro-batch, LR
schedules, the scaler's update); a task decides *what*: which loss goes to which optimizer. The default task
does ``with step.forward(): out = training_step(step.model, batch)`` then ``step.optimize(out.loss)``; a GAN
calls ``step.optimize`` once per optimizer (see tasks/gan.py).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hydra_raytrain.recipe.parallel import is_sharded, unwrap

AUTOCAST_DTYPES = {"64": None, "32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
# The dtype of parameters and floating inputs; the mixed precisions keep float32 weights under autocast.
PARAM_DTYPES = {"64": torch.float64}


@dataclass
class Precision:
    """``torch.autocast`` settings for the workers' device, and a ``torch.amp.GradScaler`` (enabled for fp16 only)."""

    device_type: str
    dtype: torch.dtype | None
    scaler: torch.amp.GradScaler
    param_dtype: torch.dtype = torch.float32  # float64 with trainer.precision=64 (Lightning's "64-true")

    @classmethod
    def build(cls, precision: str, device: torch.device) -> Precision:
        dtype = AUTOCAST_DTYPES[precision]
        scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
        return cls(device.type, dtype, scaler, PARAM_DTYPES.get(precision, torch.float32))

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def build_lr_scheduler(node: Any, optimizer: torch.optim.Optimizer, steps_per_epoch: int) -> Any:
    """``scheduler.lr_scheduler`` (a ``_partial_`` node) called with the optimizer, plus ``steps_per_epoch``
    (optimizer steps) when the target takes it (OneCycleLR)."""
    from hydra.utils import instantiate

    build = instantiate(node)
    accepted = inspect.signature(build).parameters
    return build(optimizer, **({"steps_per_epoch": steps_per_epoch} if "steps_per_epoch" in accepted else {}))


class StepTimer:
    """Seconds per phase (data, forward, backward, optimizer), added up over an epoch; a no-op unless enabled.
    On GPUs it synchronises around each phase, so the figures are true (and the run a little slower)."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled, self.cuda = enabled, device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self.cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds[phase] += time.perf_counter() - started

    def pop(self) -> dict[str, float]:
        """This epoch's figures as metrics (``time_data``, ...), and a fresh start for the next."""
        figures = {f"time_{phase}": seconds for phase, seconds in self.seconds.items()}
        self.seconds = defaultdict(float)
        return figures


UNIT_SCALE = (
    1024.0  # a summed loss's gradients are this much smaller until divided: fp16's scaler then skips fewer steps
)


def divide_gradients(optimizer: torch.optim.Optimizer, units: torch.Tensor, scale: float = 1.0) -> None:
    """Gradients of a sum over ``units`` (this worker's; divided by ``scale`` before backward) made the mean over
    every worker's units: summed over the workers (one all-reduce), times the number of workers (DDP's and FSDP's
    reductions averaged them)."""
    total = units.to(torch.float64)
    world = 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(total)
        world = torch.distributed.get_world_size()
    factor = world * scale / max(total.item(), 1.0)  # a window with no unit at all has zero gradients anyway
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, factor)  # one call for every gradient, as torch's own clip_grad_norm_ does


class TrainStep:
    def __init__(
        self,
        models: dict[str, nn.Module],
        optimizers: dict[str, torch.optim.Optimizer],
        lr_schedulers: dict[str, list[Any]],
        precision: Precision,
        *,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        step_scheduler_per_batch: bool = False,
        warmups: dict[str, Any] | None = None,
        timer: StepTimer | None = None,
    ):
        self.models = models  # DDP-wrapped when there is more than one worker, or sharded by FSDP2
        self.unwrapped = {name: unwrap(model) for name, model in models.items()}
        # FSDP's gradient sync is a setting, not a context: each sharded model's current one, changed only on change
        self.gradient_sync = {name: True for name, model in models.items() if is_sharded(model)}
        self.optimizers, self.lr_schedulers, self.warmups = optimizers, lr_schedulers, warmups or {}
        self.precision, self.accumulate, self.clip = precision, accumulate_grad_batches, gradient_clip_val
        self.step_scheduler_per_batch = step_scheduler_per_batch
        self.timer = timer or StepTimer(False, torch.device("cpu"))
        self.sync = True  # False on all but the last micro-batch of an accumulation window (set by the runner)
        self.units: dict[str, torch.Tensor] = {}  # per optimizer: the window's normalizer units so far (optimize)
        self.plain: dict[str, bool] = {}  # per optimizer: the window's micro-batches so far came without units

    @property
    def model(self) -> nn.Module:
        return self._single(self.models, "model")

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._single(self.optimizers, "optimizer")

    @staticmethod
    def _single(named: dict[str, Any], what: str) -> Any:
        if len(named) != 1:
            raise AttributeError(f"this task has several of them ({', '.join(named)}): use step.{what}s[name]")
        return next(iter(named.values()))

    def forward(self) -> contextlib.ExitStack:
        """Wrap a task's forward pass: autocast (trainer.precision), timed as ``forward``."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.timer("forward"))
        stack.enter_context(self.precision.autocast())
        return stack

    def no_sync(self) -> contextlib.ExitStack:
        """While ``sync`` is False, gradients accumulate locally on every model: no all-reduce (DDP's ``no_sync``),
        no reduce-scatter (FSDP's ``set_requires_gradient_sync``)."""
        stack = contextlib.ExitStack()
        for name, model in self.models.items():
            if name in self.gradient_sync:
                if self.gradient_sync[name] != self.sync:
                    model.set_requires_gradient_sync(self.sync)  # type: ignore[operator]
                    self.gradient_sync[name] = self.sync
            elif not self.sync and isinstance(model, DistributedDataParallel):
                stack.enter_context(model.no_sync())
        return stack

    def optimize(self, loss: torch.Tensor, name: str | None = None, normalizer: torch.Tensor | None = None) -> None:
        """Backward (scaled for fp16, divided over the accumulation window); on a window's last micro-batch, also
        unscale, clip, step optimizer ``name`` and its per-step schedules, and zero its gradients.

        ``normalizer`` (a task's units: supervised tokens): ``loss`` is a sum over them; the window's units are
        added up, summed over the workers once at the window's end, and the gradients divided by that total (times
        the workers, as DDP and FSDP average): each step's loss is exact per unit, however the units fall."""
        name = name or self._single_name()
        if (normalizer is None) == (name in self.units) and (normalizer is None or self.plain.get(name)):
            raise ValueError(f"optimizer {name!r}: a window's micro-batches either all pass a normalizer or none")
        with self.timer("backward"):
            # A sum over units is made smaller by a power of two (exact) before fp16's scaler scales it
            self.precision.scaler.scale(loss / (UNIT_SCALE if normalizer is not None else self.accumulate)).backward()
        if normalizer is not None:
            self.units[name] = self.units.get(name, 0) + normalizer.detach()
        else:
            self.plain[name] = True
        if not self.sync:
            return
        optimizer, scaler = self.optimizers[name], self.precision.scaler
        self.plain.pop(name, None)
        with self.timer("optimizer"):
            if name in self.units:
                divide_gradients(optimizer, self.units.pop(name), UNIT_SCALE)
            if self.clip is not None:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                parameters = [p for group in optimizer.param_groups for p in group["params"]]
                torch.nn.utils.clip_grad_norm_(parameters, self.clip)
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
            if self.step_scheduler_per_batch:
                for lr_scheduler in self.lr_schedulers.get(name, []):
                    lr_scheduler.step()
            if self.warmups.get(name) is not None:
                self.warmups[name].step()

    def _single_name(self) -> str:
        if len(self.optimizers) != 1:
            raise ValueError(
                f"this task has several optimizers ({', '.join(self.optimizers)}): pass step.optimize(loss, name)"
            )
        return next(iter(self.optimizers))

    def end_iteration(self) -> None:
        """After a window's last micro-batch (every optimizer has stepped): the fp16 scaler adapts once."""
        if self.sync:
            self.precision.scaler.update()

    def end_epoch(self) -> None:
        if not self.step_scheduler_per_batch:
            for schedulers in self.lr_schedulers.values():
                for lr_scheduler in schedulers:
                    lr_scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """The step's own state: LR schedules, warm-ups and the fp16 scaler (models and optimizers are saved apart)."""
        return {
            "lr_schedulers": {
                name: [s.state_dict() for s in schedulers] for name, schedulers in self.lr_schedulers.items()
            },
            "warmups": {name: w.state_dict() for name, w in self.warmups.items() if w is not None},
            "scaler": self.precision.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, states in state["lr_schedulers"].items():
            for lr_scheduler, saved in zip(self.lr_schedulers[name], states, strict=True):
                lr_scheduler.load_state_dict(saved)
        for name, saved in state["warmups"].items():
            self.warmups[name].load_state_dict(saved)
        if state["scaler"]:
            self.precision.scaler.load_state_dict(state["scaler"])


@contextlib.contextmanager
def sync_debug(mode: str | None, device: torch.device) -> Any:
    """``trainer.sync_debug_mode`` on GPU workers: ``torch.cuda.set_sync_debug_mode`` warns of (or raises at) each
    operation inside that makes the host wait for the GPU."""
    if mode is None or device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
