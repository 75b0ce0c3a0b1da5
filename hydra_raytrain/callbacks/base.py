"""The callback protocol, and the one place callbacks are built and called in a worker.

Every worker (rank) builds the ``callbacks`` config (name -> ``_target_`` node) and calls each hook in the order
the names were given. A hook runs the user's code in the training loop: an error it raises is the run's own (it
ends the run like an error in the task; :class:`StopTraining` says why the run stops, and is not retried).
A node whose class is a Ray Train ``UserCallback`` (``after_report``, ``after_exception``) is the driver's
instead: it joins Ray Train's ``RunConfig.callbacks``, on the controller.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import get_object, instantiate
from ray.train import UserCallback
from torch import nn

from hydra_raytrain.config.errors import one_line
from hydra_raytrain.messages.outcome import RunStatus

log = logging.getLogger(__name__)


class StopTraining(RuntimeError):
    """Raised by a hook to end the run with its message, at once: ``failure.max_failures`` does not retry it."""


@dataclass
class RunState:
    """What a hook sees of the run (read it; the loop owns it): this worker's rank, the unwrapped models and the
    optimizers by name (``model`` / ``optimizer`` for a task with one), the epoch being trained (1-based) and the
    optimizer steps taken so far."""

    rank: int
    world_size: int
    run_dir: str
    models: dict[str, nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    epoch: int = 0
    global_step: int = 0


class Callback:
    """Override the hooks you need; each runs on every rank (``run.rank`` says which). A callback with state to
    keep across a resume returns it from :meth:`state_dict` (rank 0's is saved in each full-state checkpoint and
    given back to every rank's :meth:`load_state_dict` when the run resumes)."""

    def on_run_start(self, run: RunState) -> None:
        """Once per worker process, after setup (and after a resume: ``run.epoch`` is where training goes on)."""

    def on_epoch_start(self, run: RunState) -> None:
        """Before the epoch's first batch (a resumed epoch: before the first batch left to train)."""

    def on_after_optimizer_step(self, run: RunState, sums: Mapping[str, torch.Tensor]) -> None:
        """After each optimizer step (the end of an accumulation window); ``sums``: the task's sums of the window's
        last micro-batch on this rank (``loss``: the batch's summed loss, ``count``: its samples)."""

    def on_validation_end(self, run: RunState, metrics: Mapping[str, Any]) -> Mapping[str, float] | None:
        """After the epoch's validation, with its metrics (exact over every worker). The figures returned join the
        epoch's report: loggers, ``metrics.jsonl``, Tune; a name the report has already is refused."""
        return None

    def on_epoch_end(self, run: RunState, metrics: Mapping[str, Any]) -> None:
        """After the epoch's report (and checkpoint, when one is due)."""

    def on_checkpoint(self, run: RunState, name: str) -> None:
        """After this rank's share of checkpoint ``name`` was handed to Ray Train (epoch_0003, step_00000120)."""

    def on_run_end(self, run: RunState, status: RunStatus) -> None:
        """Once, on every way out: completed, preempted, or failed."""

    def state_dict(self) -> dict[str, Any] | None:
        """What to keep in checkpoints (None: nothing)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state :meth:`state_dict` returned, when the run resumes from a checkpoint."""


class Callbacks:
    """The run's callbacks in their configured order; each call runs one hook of every callback."""

    def __init__(self, callbacks: Mapping[str, Callback]):
        self.callbacks = dict(callbacks)

    @classmethod
    def build(cls, nodes: Mapping[str, Any] | None) -> Callbacks:
        """The workers' callbacks of the ``callbacks`` config (not the driver's: :func:`driver_callbacks`)."""
        items = (nodes or {}).items()
        return cls({name: instantiate(node, _convert_="all") for name, node in items if not on_driver(node)})

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def call(self, hook: str, *args: Any) -> None:
        """Each callback's ``hook`` (one that has it: a class need not subclass :class:`Callback`)."""
        for callback in self.callbacks.values():
            if callable(getattr(callback, hook, None)):
                getattr(callback, hook)(*args)

    def validation_end(self, run: RunState, metrics: dict[str, Any]) -> dict[str, float]:
        """The figures the callbacks add to an epoch's report (a later callback sees an earlier one's)."""
        added: dict[str, float] = {}
        for name, callback in self.callbacks.items():
            if callable(getattr(callback, "on_validation_end", None)):
                figures = dict(callback.on_validation_end(run, {**metrics, **added}) or {})
                taken = sorted(set(figures) & (set(metrics) | set(added)))
                if taken:  # the run's own figures are agreed by every worker: early stopping reads them
                    raise ValueError(f"callbacks.{name} returned {', '.join(taken)}, which the report has already")
                added.update(figures)
        return added

    def state_dict(self) -> dict[str, Any]:
        stateful = {name: c for name, c in self.callbacks.items() if callable(getattr(c, "state_dict", None))}
        states = {name: callback.state_dict() for name, callback in stateful.items()}
        states = {name: state for name, state in states.items() if state is not None}
        for name, state in states.items():
            _check_loadable(name, state)
        return states

    def load_state_dict(self, states: Mapping[str, Any]) -> None:
        """A checkpoint's states; a callback added since (or renamed) starts afresh."""
        for name, state in states.items():
            if name in self.callbacks:
                self.callbacks[name].load_state_dict(state)


def _check_loadable(name: str, state: Any) -> None:
    """Checkpoints are read with ``torch.load(weights_only=True)``: a state it cannot read (a numpy value, an object
    of the callback's own) would make every checkpoint fail to load. Refused when saved instead."""
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception as error:  # noqa: BLE001  (pickle's or torch's error names the type)
        lines = str(error).splitlines()
        why = next((line.strip() for line in lines if "Unsupported global" in line), lines[0] if lines else "")
        raise TypeError(
            f"callbacks.{name}.state_dict() holds what a checkpoint cannot load ({why}). Keep it to tensors, "
            "Python numbers, strings, and lists or dicts of them."
        ) from None


def on_driver(node: Mapping[str, Any]) -> bool:
    """Whether a callback's ``_target_`` is a Ray Train ``UserCallback``: the driver's, not the workers'."""
    try:
        target = get_object(node["_target_"])
    except Exception:  # noqa: BLE001  (preflight names a target that does not import)
        return False
    return isinstance(target, type) and issubclass(target, UserCallback)


def driver_callbacks(nodes: Mapping[str, Any] | None) -> list[UserCallback]:
    """The ``callbacks`` config's Ray Train ``UserCallback``s, for ``RunConfig.callbacks`` (Ray's local mode,
    ``scaling.num_workers=0``, runs none). Each is a helper of the driver's: an error in one warns."""
    items = (nodes or {}).items()
    return [Warned(name, instantiate(node, _convert_="all")) for name, node in items if on_driver(node)]


class Warned(UserCallback):
    """A driver's callback whose errors are warnings: it must not decide the run's fate (Ray Train's controller
    would end the run at an error raised in a callback)."""

    def __init__(self, name: str, callback: UserCallback):
        self.name, self.callback = name, callback

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self._call("after_report", run_context, metrics, checkpoint)

    def after_exception(self, run_context: Any, worker_exceptions: Any) -> None:
        self._call("after_exception", run_context, worker_exceptions)

    def _call(self, hook: str, *args: Any) -> None:
        try:
            getattr(self.callback, hook)(*args)
        except Exception as error:  # noqa: BLE001
            log.warning(f"callbacks.{self.name}.{hook} failed: {one_line(error)}")
