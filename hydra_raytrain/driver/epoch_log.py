"""Ray Train callbacks on the driver's side: each epoch's metrics into the run dir as they arrive, and the reports
another callback (Tune's) is given."""

from __future__ import annotations

import os
from typing import Any

from ray.train import UserCallback

from hydra_raytrain.driver.storage import checkpoint_uri
from hydra_raytrain.storage.logfiles import link_process_logs
from hydra_raytrain.storage.rundir import METRICS_FILE, append_jsonl, format_epoch, read_history, write_jsonl


class EpochLog(UserCallback):
    """Appends each epoch's metrics to ``metrics.jsonl`` as they arrive and prints one line per epoch.

    Runs on Ray Train's controller, which Ray places on the driver's node, so the run dir is reachable.
    Every rank reports the same all-reduced metrics; rank 0's are written.
    """

    def __init__(self, run_dir: str, max_epochs: int):
        self.path = os.path.join(run_dir, METRICS_FILE)
        self.max_epochs = max_epochs
        self.linked = False

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if not self.linked:  # the controller's own stdout / stderr, linked into <run dir>/logs
            link_process_logs(os.path.dirname(self.path), "controller")
            self.linked = True
        if is_epoch_report(metrics[0]):
            self.write(metrics[0])

    def write(self, metrics: dict[str, Any]) -> None:
        """Append; an epoch a resumed run trains again (it failed after the last checkpoint) replaces the
        entries from that epoch on, so the file is always the run's one history. A rewrite is whole or not at all
        (``write_jsonl``): a run killed meanwhile keeps its history."""
        history = read_history(os.path.dirname(self.path))
        if history and history[-1]["epoch"] >= metrics["epoch"]:
            write_jsonl(self.path, [*(m for m in history if m["epoch"] < metrics["epoch"]), metrics])
        else:
            append_jsonl(self.path, metrics, history)
        print(format_epoch(metrics, self.max_epochs), flush=True)


class EpochReportsOnly(UserCallback):
    """Another callback (Tune's ``TuneReportCallback`` in a sweep trial) given epoch reports only: a mid-epoch
    checkpoint's report is not a result for Tune's schedulers to count."""

    def __init__(self, callback: UserCallback):
        self.callback = callback

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if is_epoch_report(metrics[0]):
            self.callback.after_report(run_context, metrics, checkpoint)


class QueueReports(UserCallback):
    """Each epoch's metrics and checkpoint path onto a Ray queue, which a PBT trial's own thread hands to Tune with a
    checkpoint of its own (sweep/pbt.py): Tune's ``TuneReportCallback`` passes a path only, nothing PBT can clone."""

    def __init__(self, queue: Any):
        self.queue = queue

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if is_epoch_report(metrics[0]):
            self.queue.put((dict(metrics[0]), checkpoint_uri(checkpoint) if checkpoint is not None else None))


def is_epoch_report(metrics: dict[str, Any]) -> bool:
    """An epoch's metrics, not a mid-epoch checkpoint's report (recipe/saving.py ``_save_mid_epoch``)."""
    return "epoch_progress" not in metrics
