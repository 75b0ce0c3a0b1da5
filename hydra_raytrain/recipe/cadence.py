"""When a mid-epoch checkpoint is due, and whether the run must stop: decided after every optimizer step, the
same on every rank (``ray.train.report`` is a barrier that every rank must reach the same number of times).

``checkpoint.every_n_steps`` is the same on every rank by construction. ``checkpoint.every_n_minutes`` and a
preemption notice are rank 0's to see (its clock; the driver's notice board), so rank 0 broadcasts what it saw
over a gloo group: a few bytes between CPU processes per step, no device synchronisation. The broadcast runs in
the background during the next step and is acted on after it (one step later): no step waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Decision:
    checkpoint: bool = False
    stop: bool = False  # a preemption notice: checkpoint, then stop


class Cadence:
    def __init__(
        self,
        every_n_steps: int | None,
        every_n_minutes: float | None,
        notice: Callable[[], bool] | None,
        rank: int,
        world_size: int,
        watch_notice: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``notice`` is rank 0's reader of the preemption notice (None on the other ranks); ``watch_notice`` says,
        on every rank alike, that there is one."""
        self.every_n_steps, self.notice, self.rank, self.clock = every_n_steps, notice, rank, clock
        self.every_seconds = every_n_minutes * 60 if every_n_minutes else None
        # Only rank 0 looks; the others learn its decision. Nothing to agree on without a clock or a notice.
        self.group = control_group() if world_size > 1 and (self.every_seconds or watch_notice) else None
        self.pending: tuple[Any, torch.Tensor] | None = None  # the broadcast in flight, and its buffer
        self.saved_at = clock()

    def after_step(self, step: int) -> Decision:
        due = self.every_n_steps is not None and step % self.every_n_steps == 0
        if self.group is None:
            flags = self._seen()
        elif self.pending is None:  # the first step: nothing broadcast yet
            flags = torch.zeros(2, dtype=torch.int32)
        else:
            work, flags = self.pending
            work.wait()
        timed, stop = bool(flags[0]), bool(flags[1])
        decision = Decision(checkpoint=due or timed or stop, stop=stop)
        if decision.checkpoint:  # the caller writes it now: the minutes count from here
            self.saved()
        if self.group is not None:
            buffer = self._seen()
            self.pending = (dist.broadcast(buffer, src=0, group=self.group, async_op=True), buffer)
        return decision

    def _seen(self) -> torch.Tensor:
        """Rank 0's view: is a timed checkpoint due, has a notice come (zeros on the other ranks)."""
        flags = torch.zeros(2, dtype=torch.int32)
        if self.rank == 0 and (self.every_seconds is not None or self.notice is not None):
            flags[0] = self.every_seconds is not None and self.clock() - self.saved_at >= self.every_seconds
            flags[1] = self.notice is not None and self.notice()
        return flags

    def saved(self) -> None:
        """A checkpoint was written (mid-epoch or at an epoch's end): the minutes count from now."""
        self.saved_at = self.clock()

    def close(self) -> None:
        """Wait for the broadcast in flight (every rank, at the end of training)."""
        if self.pending is not None:
            self.pending[0].wait()
            self.pending = None


def control_group() -> Any:
    """The default group when it is gloo already (CPU workers); a gloo group beside NCCL otherwise."""
    if not dist.is_initialized():
        return None
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo")
