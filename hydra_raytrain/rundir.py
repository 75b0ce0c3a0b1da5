"""The run dir's files (the output contract, docs/outputs.md): metrics.jsonl, summary.json, model.pt."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ray.train import UserCallback

from hydra_raytrain.logfiles import link_process_logs
from hydra_raytrain.outcome import RunStatus

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model.pt"
CONFIG_FILE = "config.json"  # the resolved config, in the run dir and in every checkpoint


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
        entries from that epoch on, so the file is always the run's one history."""
        history = read_history(os.path.dirname(self.path))
        if history and history[-1]["epoch"] >= metrics["epoch"]:
            kept = [m for m in history if m["epoch"] < metrics["epoch"]]
            with open(self.path, "w") as file:
                file.writelines(json.dumps(m) + "\n" for m in kept)
        with open(self.path, "a") as file:
            file.write(json.dumps(metrics) + "\n")
        print(format_epoch(metrics, self.max_epochs), flush=True)


class EpochReportsOnly(UserCallback):
    """Another callback (Tune's ``TuneReportCallback`` in a sweep trial) given epoch reports only: a mid-epoch
    checkpoint's report is not a result for Tune's schedulers to count."""

    def __init__(self, callback: UserCallback):
        self.callback = callback

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if is_epoch_report(metrics[0]):
            self.callback.after_report(run_context, metrics, checkpoint)


def is_epoch_report(metrics: dict[str, Any]) -> bool:
    """An epoch's metrics, not a mid-epoch checkpoint's report (recipe/loop.py ``_save_mid_epoch``)."""
    return "epoch_progress" not in metrics


def format_epoch(metrics: dict[str, Any], max_epochs: int) -> str:
    shown = [f"epoch {metrics['epoch']}/{max_epochs}"]
    for name, value in metrics.items():
        if name.startswith(("train_", "val_")):
            shown.append(f"{name} {value:.4f}")
    shown.append(f"{metrics['samples_per_second']:.0f} samples/s  {metrics['epoch_seconds']:.1f}s")
    return "  ".join(shown)


def read_history(run_dir: str) -> list[dict[str, Any]]:
    return read_jsonl(os.path.join(run_dir, METRICS_FILE))


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """A JSON-lines file's objects; none when it does not exist (yet)."""
    if not os.path.exists(path):
        return []
    with open(path) as file:
        return [json.loads(line) for line in file if line.strip()]


def best_epoch(history: list[dict[str, Any]], monitor: str, mode: str) -> dict[str, Any] | None:
    """The epoch whose ``monitor`` is best (first one on ties); NaNs never win."""
    scored = [m for m in history if isinstance(m.get(monitor), (int, float)) and not math.isnan(m[monitor])]
    if not scored:
        return None
    pick = max if mode == "max" else min
    return pick(scored, key=lambda m: m[monitor])


def make_summary(
    status: RunStatus,
    history: list[dict[str, Any]],
    monitor: str,
    mode: str,
    run_dir: str,
    storage: str,
    wall_seconds: float,
    error: str | None = None,
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "status": status,
        "epochs_completed": len(history),
        "final": history[-1] if history else {},
        "best": best_epoch(history, monitor, mode) or {},
        "monitor": monitor,
        "monitor_mode": mode,
        "wall_seconds": round(wall_seconds, 3),
        "run_dir": run_dir,
        "storage": storage,
    }
    if error:
        summary["error"] = error
    return summary


def finished_summary(run_dir: str) -> dict[str, Any] | None:
    path = os.path.join(run_dir, SUMMARY_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as file:
        summary = json.load(file)
    return summary if summary.get("status") == "completed" else None


def already_complete(summary: dict[str, Any]) -> str:
    monitor, best = summary["monitor"], summary["best"]
    return (
        f"Run already complete: {summary['epochs_completed']} epochs, "
        f"best {monitor} {best.get(monitor, float('nan')):.4f} "
        f"(epoch {best.get('epoch')}). Nothing to do; run.resume=never trains it again.\nRun dir: {summary['run_dir']}"
    )


def write_json(path: str, payload: dict[str, Any]) -> None:
    """Whole or not at all: write a sibling file, then rename over the target."""
    partial = path + ".partial"
    with open(partial, "w") as file:
        json.dump(payload, file, indent=2)
    os.replace(partial, path)
