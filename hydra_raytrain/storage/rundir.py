"""The run dir's files (the output contract, docs/outputs.md): metrics.jsonl, summary.json, model.pt."""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any

from hydra_raytrain.config.errors import redacted
from hydra_raytrain.messages.outcome import RunStatus

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model.pt"
CONFIG_FILE = "config.json"  # the resolved config, in the run dir and in every checkpoint
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # dataset.chat_template's text, as the run trained with it
SAMPLES_FILE = "samples.jsonl"  # a task's samples after each epoch (task=causal_lm: its prompts' completions)


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
    """A JSON-lines file's objects; none when it does not exist (yet). A last line cut short (a process killed
    while appending it, before this package wrote whole files only) is left out with a warning; a bad line before
    the last is an error naming the file and the line."""
    if not os.path.exists(path):
        return []
    with open(path) as file:
        lines = [(number, line) for number, line in enumerate(file, start=1) if line.strip()]
    rows = []
    for number, line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            if number != lines[-1][0]:
                raise ValueError(f"{path}: line {number} is not JSON: {line[:80]!r}") from None
            warnings.warn(
                f"{path}: its last line is cut short ({line.strip()[:60]!r}: a process killed while writing it); "
                "read without it",
                stacklevel=2,
            )
    return rows


def write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    """Whole or not at all: the rows into a sibling file, then renamed over ``path``."""
    partial = path + ".partial"
    with open(partial, "w") as file:
        file.writelines(json.dumps(row) + "\n" for row in rows)
    os.replace(partial, path)


def append_jsonl(path: str, row: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """``row`` after ``history`` (the file's rows as read): appended as one line where the file ends whole, else
    the file rewritten whole (``write_jsonl``), so a line cut short never has another glued to it."""
    ends_whole = True
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, "rb") as file:
            file.seek(-1, os.SEEK_END)
            ends_whole = file.read(1) == b"\n"
    if not ends_whole:
        write_jsonl(path, [*history, row])
        return
    with open(path, "a") as file:
        file.write(json.dumps(row) + "\n")


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
        "storage": redacted(storage),  # a URI's credentials written ***
    }
    if error:
        summary["error"] = redacted(error)
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
