"""What a run hands back, typed: a run's status, and what rank 0 of the workers returns to the driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# summary.json's "status": trained to the end (or stopped early), failed, or stopped by a preemption notice
# (checkpointed: the same command resumes it).
RunStatus = Literal["completed", "failed", "preempted"]
# A sweep trial's row: its run's status, "stopped" (ended early by the scheduler: ASHA, HyperBand), "interrupted"
# (the sweep ended while it ran or was paused: a re-run continues it), or "not run".
TrialStatus = Literal["completed", "failed", "preempted", "stopped", "interrupted", "not run"]


@dataclass(frozen=True)
class WorkerResult:
    """Rank 0's ``Result.return_value`` (the other ranks return None): Ray's local mode persists no checkpoint and
    runs no callbacks, so this is how the driver gets ``model.pt`` and the epochs in every mode."""

    status: RunStatus
    history: list[dict[str, Any]]  # one row of metrics per epoch trained (metrics.jsonl's rows)
    steps: int  # optimizer steps taken
    weights: bytes | None  # the final weights as torch.save bytes (Ray refuses tensors here); None unless completed
    notice: str | None = None  # the preemption notice that stopped the run
