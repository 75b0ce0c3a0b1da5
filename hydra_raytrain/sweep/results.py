"""What a sweep leaves: sweep_summary.json and .csv (one row per trial), best_config.yaml, sweep.png, and a
summary table on the terminal."""

from __future__ import annotations

import collections
import csv
import json
import os
import shutil
import sys
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from hydra_raytrain.config.redact import redact_text, redact_tree
from hydra_raytrain.config.sweeper import PAUSING
from hydra_raytrain.messages.outcome import RunStatus, TrialStatus
from hydra_raytrain.storage import rundir
from hydra_raytrain.sweep.lineage import bare, describe, final_values, read_lineage, typed
from hydra_raytrain.sweep.trial import TRIAL_FILE

if TYPE_CHECKING:
    from hydra_raytrain.sweep.job import Job

SUMMARY_FILE = "sweep_summary.json"
CSV_FILE = "sweep_summary.csv"
BEST_CONFIG_FILE = "best_config.yaml"
PLOT_FILE = "sweep.png"
FOLD_KEY = "dataset.fold"
TABLE_ROWS = 20  # a larger sweep's terminal table shows its best 20 trials (the files hold every one)
COLUMNS = ("index", "overrides", "status", "final", "best", "epochs", "wall_seconds", "run_dir", "error", "exploits")


def read_previous(sweep_dir: str) -> dict[str, dict[str, Any]]:
    """The rows of an earlier run of this sweep, by run name (empty for a new sweep)."""
    path = os.path.join(sweep_dir, SUMMARY_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as file:
        return {os.path.basename(row["run_dir"]): row for row in json.load(file)["trials"]}


def trial_status(
    summary: dict[str, Any] | None, history: list[dict[str, Any]], error: str | None, ended: bool = True
) -> TrialStatus:
    """completed / stopped (by the scheduler, between epochs) / interrupted / failed / not run. ``ended``: Tune
    ended the trial (not the sweep's end while it ran or was paused)."""
    if error is not None:
        return "failed"
    if summary is not None:
        status: RunStatus = summary["status"]
        return status
    if not history:
        return "not run"
    # Tune ended it after an epoch (the scheduler's decision; at a rung on the last epoch too, before the run
    # could write its summary), or the sweep ended first (Ctrl-C): a re-run continues it.
    return "stopped" if ended else "interrupted"


def collect(
    jobs: list[Job],
    errors: dict[int, Any],
    previous: dict[str, dict[str, Any]],
    metric: str,
    mode: str,
    sweep_dir: str,
    scheduler: str,
    interrupted: Collection[int] = (),
) -> dict[str, Any]:
    """The sweep's rows and best trial. ``interrupted``: the trials this run started that Tune did not end."""
    rows, swept = [], _swept_keys(jobs)
    for job in jobs:
        run_dir = job.run_dir
        if job.index not in errors and previous.get(job.name, {}).get("status") == "stopped":
            kept = {"index": job.index, "configuration": configuration_of(job, swept)}  # not re-run: what it was
            rows.append({**previous[job.name], **kept})
            continue
        history = rundir.read_history(run_dir)
        summary = _read_json(os.path.join(run_dir, rundir.SUMMARY_FILE))
        error = errors.get(job.index)
        status = trial_status(summary, history, None if error is None else str(error), job.index not in interrupted)
        best = rundir.best_epoch(history, metric, mode) or {}
        started = (_read_json(os.path.join(run_dir, TRIAL_FILE)) or {}).get("started")
        lineage = read_lineage(run_dir)  # PBT's exploits of this trial
        finished = os.path.getmtime(os.path.join(run_dir, rundir.METRICS_FILE)) if history else None
        rows.append(
            {
                "index": job.index,
                "overrides": " ".join(o for o in job.overrides if o.split("=", 1)[0] in swept),
                "configuration": configuration_of(job, swept),
                "status": status,
                "final": history[-1].get(metric) if history else None,
                "best": best.get(metric),
                "epochs": len(history),
                "wall_seconds": round(summary["wall_seconds"], 3)
                if summary
                else (round(finished - started, 3) if started and finished else None),
                "started": started,
                "finished": finished,
                "run_dir": run_dir,
                "error": _one_line(error) if error is not None else (summary or {}).get("error"),
                **({"exploits": [describe(r) for r in lineage], "values": final_values(lineage)} if lineage else {}),
            }
        )
    ordered = best_first(rows, mode)
    best_row = ordered[0] if ordered else None
    ranked = rank_configurations(rows, mode) if any(job.cfg.dataset.get("folds") for job in jobs) else []
    return {
        "metric": metric,
        "mode": mode,
        "scheduler": scheduler,
        "sweep_dir": sweep_dir,
        "best": best_row,
        **({"configurations": ranked, "best_configuration": ranked[0] if ranked else None} if ranked else {}),
        "trials": rows,
    }


def best_first(rows: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """The rows with a best value of the metric, best first (ties in trial order)."""
    scored = [row for row in rows if isinstance(row["best"], (int, float))]
    return sorted(scored, key=lambda row: -row["best"] if mode == "max" else row["best"])


def configuration_of(job: Job, swept: set) -> str:
    """What a trial tries, folds aside: its swept overrides but ``dataset.fold`` (the trials of one configuration
    under cross-validation share it)."""
    return " ".join(o for o in job.overrides if o.split("=", 1)[0] in swept and key_of(o) != FOLD_KEY)


def key_of(override: str) -> str:
    """An override's key without Hydra's ``+`` / ``++`` / ``~`` prefix."""
    return override.split("=", 1)[0].lstrip("+~")


def rank_configurations(rows: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """Cross-validation's result: per configuration, the mean and standard deviation (over its folds, ddof 0 as
    scikit-learn's ``cv_results_``) of each fold's best value of the metric, best mean first. A configuration
    with a fold that has no value (failed, not run) ranks after those whose every fold has one."""
    import statistics

    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["configuration"], []).append(row)
    ranked: list[dict[str, Any]] = []
    for name, members in grouped.items():
        values = [row["best"] for row in members if isinstance(row["best"], (int, float))]
        ranked.append(
            {
                "configuration": name,
                "folds": len(members),
                "scored": len(values),
                "mean": statistics.fmean(values) if values else None,
                "std": statistics.pstdev(values) if values else None,
                "trials": [row["index"] for row in members],
            }
        )
    sign = -1 if mode == "max" else 1
    ranked.sort(key=lambda c: (c["scored"] < c["folds"], c["mean"] is None, sign * (c["mean"] or 0.0)))
    return ranked


def _swept_keys(jobs: list[Job]) -> set:
    """The keys whose value differs between trials (all of them for a one-trial sweep): what a row shows."""
    values: dict[str, set] = {}
    for job in jobs:
        for override in job.overrides:
            key, _, value = override.partition("=")
            values.setdefault(key, set()).add(value)
    varying = {key for key, seen in values.items() if len(seen) > 1}
    return varying or set(values)


def write_all(summary: dict[str, Any], jobs: list[Job], sweep_dir: str, keep_checkpoints: int | None) -> None:
    os.makedirs(sweep_dir, exist_ok=True)
    rundir.write_json(os.path.join(sweep_dir, SUMMARY_FILE), summary)
    with open(os.path.join(sweep_dir, CSV_FILE), "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**row, "exploits": "; ".join(row.get("exploits", []))} for row in summary["trials"])
    chosen = summary.get("best_configuration")
    if chosen is not None and chosen["mean"] is not None:  # cross-validated: the best mean over the folds
        best = next(job for job in jobs if job.index == chosen["trials"][0])
        write_best_config(best, os.path.join(sweep_dir, BEST_CONFIG_FILE), chosen)
    elif summary["best"] is not None:
        best = next(job for job in jobs if job.index == summary["best"]["index"])
        write_best_config(best, os.path.join(sweep_dir, BEST_CONFIG_FILE), schedule=summary["best"].get("exploits"))
    unfinished = any(row["status"] not in ("completed", "stopped") for row in summary["trials"])
    if keep_checkpoints and not (summary["scheduler"] in PAUSING and unfinished):  # a re-run continues paused trials
        drop_checkpoints(summary, keep_checkpoints)
    plot(summary, os.path.join(sweep_dir, PLOT_FILE))
    from rich.console import Console

    Console().print(table(summary))
    if summary.get("configurations"):
        Console().print(configurations_table(summary))


def write_best_config(
    job: Job, path: str, cross_validated: dict[str, Any] | None = None, schedule: list[str] | None = None
) -> None:
    """A primary config that reproduces the best trial with the plain CLI:
    ``python -m hydra_raytrain --config-dir <sweep dir> --config-name best_config``. Cross-validated: the best
    configuration, on the dataset's usual train/val split (``dataset.folds`` unset). Under PBT: the best trial's
    final values, and in the header the schedule of exploits that produced them."""
    import yaml

    config = {
        "defaults": ["train_schema", "_self_"],
        "hydra": {"run": {"dir": "outputs/runs/${run_name:}"}, "job": {"name": "train", "chdir": False}},
        **redact_tree(job.cfg.to_dict()),  # its secrets *** (config/redact.py): set them again to reproduce it
    }
    overrides = redact_text(" ".join(job.overrides))
    heading = f"# The best trial of this sweep ({overrides}), as a complete config. Reproduce it:\n"
    if cross_validated is not None:
        config["dataset"] = {**config["dataset"], "folds": None, "fold": 0}
        heading = (
            f"# The best configuration of this sweep ({cross_validated['configuration'] or 'the only one'}: "
            f"mean {cross_validated['mean']:.4f}, std {cross_validated['std']:.4f} over "
            f"{cross_validated['folds']} folds), on the dataset's usual split. Train it:\n"
        )
    lineage = read_lineage(job.run_dir) if schedule else []
    if lineage:
        for key, value in final_values(lineage).items():
            section, *rest = bare(key).split(".")
            node = config[section] = dict(config[section])
            for part in rest[:-1]:
                node = node[part] = dict(node[part])
            node[rest[-1]] = typed(key, value)
        steps = "\n".join(f"#   {step}" for step in schedule or [])
        heading = (
            f"# The best trial of this PBT sweep ({overrides}) ended with these values, after this "
            f"schedule of exploits (generation, epoch: donor trial, its step, changes):\n{steps}\n"
            "# Trained by the plain CLI, they apply from the first epoch (no schedule). Train it:\n"
        )
    with open(path, "w") as file:
        file.write(heading)
        file.write(f"#   python -m hydra_raytrain --config-dir {os.path.dirname(path)} --config-name best_config\n")
        yaml.safe_dump(config, file, sort_keys=False)


def drop_checkpoints(summary: dict[str, Any], keep: int) -> None:
    """``keep_checkpoints=K``: the checkpoints of every trial but the best K go (their metrics stay): the run dir's
    ``ray_storage``. A trial stored elsewhere (``storage.path``: a folder, ``s3://...``) keeps them there, and they
    are named: that folder is the config's, shared by every run of the same config (another sweep's best, say), so
    it is not this sweep's to delete."""
    kept = {row["run_dir"] for row in best_first(summary["trials"], summary["mode"])[:keep]}
    elsewhere = []
    for row in summary["trials"]:
        if row["run_dir"] in kept:
            continue
        own = os.path.join(row["run_dir"], "ray_storage")
        shutil.rmtree(own, ignore_errors=True)
        place = (_read_json(os.path.join(row["run_dir"], rundir.SUMMARY_FILE)) or {}).get("storage")
        if place and not os.path.abspath(place).startswith(own + os.sep):
            elsewhere.append(place)
    if elsewhere:
        print(
            f"keep_checkpoints={keep}: {_count(len(elsewhere), 'trial')} stored elsewhere keep their checkpoints (the "
            f"folder is shared by runs of the same config; remove it when no run needs it): {', '.join(elsewhere)}",
            file=sys.stderr,
        )


def plot(summary: dict[str, Any], path: str) -> None:
    """Left: each trial's metric against epoch. Right: each trial's best value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, rows = summary["metric"], summary["trials"]
    figure, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for row in rows:
        history = rundir.read_history(row["run_dir"])
        if history:
            (line,) = curves.plot(
                [m["epoch"] for m in history],
                [m.get(metric) for m in history],
                "-o",
                markersize=3,
                label=f"{row['index']}: {row['overrides']}"[:60],
            )
            # PBT: where the trial took another's checkpoint (its curve before that point is the donor's)
            at = {m["epoch"]: m.get(metric) for m in history}
            exploits = [r["epoch"] for r in read_lineage(row["run_dir"]) if r["epoch"] in at]
            if exploits:
                curves.plot(exploits, [at[e] for e in exploits], "D", color=line.get_color(), markersize=7)
    curves.set_xlabel("epoch")
    curves.set_title(
        f"{metric} per trial" + (" (diamonds: PBT exploits)" if summary["scheduler"] in ("pbt", "pb2") else "")
    )
    curves.grid(alpha=0.3)
    if rows:
        curves.legend(fontsize=6)
    values = [row["best"] if isinstance(row["best"], (int, float)) else 0.0 for row in rows]
    colours = [
        "tab:green" if row is summary["best"] else ("tab:red" if row["status"] == "failed" else "tab:blue")
        for row in rows
    ]
    bars.bar(range(len(rows)), values, color=colours)
    bars.set_xticks(range(len(rows)), [str(row["index"]) for row in rows])
    bars.set_xlabel("trial")
    bars.set_title(f"best {metric} ({summary['mode']}; green: best, red: failed)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def table(summary: dict[str, Any]):
    from rich.table import Table

    # The overrides are what tells the trials apart: they fold onto more lines rather than lose their values to
    # an ellipsis on a narrow (or non-terminal, 80-column) console; the metric's name is in the title.
    result = Table(
        title=(
            f"hydra_raytrain sweep: {len(summary['trials'])} trials, {summary['scheduler']}; "
            f"{summary['metric']} ({summary['mode']})"
        ),
        title_justify="left",
    )
    for column in ("#", "overrides", "status", "epochs", "final", "best", "wall s"):
        if column == "overrides":
            result.add_column(column, overflow="fold", ratio=1)
        else:
            result.add_column(column, justify="left" if column == "status" else "right", no_wrap=True)
    shown = shown_rows(summary)
    for row in shown:
        mark = " *" if row is summary["best"] else ""
        exploits = row.get("exploits")
        exploits = f" (PBT: {_count(len(exploits), 'exploit')}, now {_values(row['values'])})" if exploits else ""
        result.add_row(
            str(row["index"]) + mark,
            row["overrides"] + exploits,
            row["status"],
            str(row["epochs"]),
            _fmt(row["final"]),
            _fmt(row["best"]),
            _fmt(row["wall_seconds"], ".1f"),
        )
    more = len(summary["trials"]) - len(shown)
    counts = collections.Counter(row["status"] for row in summary["trials"])
    statuses = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    rest = f" The {TABLE_ROWS} best of {len(summary['trials'])} ({statuses}); all in {CSV_FILE}." if more else ""
    result.caption = f"* best.{rest} Sweep dir: {summary['sweep_dir']}"
    result.caption_justify = "left"
    return result


def configurations_table(summary: dict[str, Any]):
    """Cross-validation's ranking: each configuration's mean and std over its folds, best first."""
    from rich.table import Table

    result = Table(
        title=f"cross-validated: {summary['metric']} per configuration, over its folds (best first)",
        title_justify="left",
    )
    result.add_column("configuration", overflow="fold", ratio=1)
    for column in ("folds", "mean", "std", "trials"):
        result.add_column(column, justify="right", no_wrap=column != "trials")
    for rank in summary["configurations"]:
        folds = f"{rank['scored']}/{rank['folds']}" if rank["scored"] < rank["folds"] else str(rank["folds"])
        trials = " ".join(str(index) for index in rank["trials"])
        result.add_row(rank["configuration"] or "-", folds, _fmt(rank["mean"]), _fmt(rank["std"]), trials)
    return result


def shown_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Every trial of a sweep of up to TABLE_ROWS; of a larger one the TABLE_ROWS best by the metric (then the
    unscored: failed, not run), in trial order, so the table stays readable at 64 trials."""
    rows = summary["trials"]
    if len(rows) <= TABLE_ROWS:
        return rows
    best = best_first(rows, summary["mode"])
    unscored = [row for row in rows if not isinstance(row["best"], (int, float))]
    return sorted((best + unscored)[:TABLE_ROWS], key=lambda row: row["index"])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _values(values: dict[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in values.items())


def _fmt(value: Any, spec: str = ".4f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def _read_json(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as file:
        return json.load(file)


def _one_line(error: Any) -> str:
    """The cause of a failed trial in one line: our TrainingFailed line when the traceback holds one."""
    lines = [line.strip() for line in redact_text(str(error)).splitlines() if line.strip()]
    ours = [line.split("Training failed: ", 1)[1] for line in lines if "Training failed: " in line and "{" not in line]
    if ours:
        return ours[-1]
    return lines[-1][-500:] if lines else type(error).__name__
