"""The command line: ``hydra-raytrain [COMMAND] ...`` (or ``python -m hydra_raytrain``), one console script for
every command; without a command word it trains (``hydra-raytrain model=mlp`` is ``hydra-raytrain train
model=mlp``). Each command also has its own address (``python -m hydra_raytrain.predict ...``), and they share one
shell (``shell/program.py``): its refusals, its exit codes (bad input 2, refused or failed 1, preempted 75), its end.
Nothing heavy is imported before the command is known."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.shell.program import FAILED, end_quickly, refuse

# The commands, by the word that names them: (module, function called with the rest of the command line, what it does)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("hydra_raytrain.cli", "train_main", "train a config (Hydra overrides; -m: a sweep), the default"),
    "check": ("hydra_raytrain.check", "main", "check configs without training (CI)"),
    "evaluate": ("hydra_raytrain.inference.evaluate", "main", "score a finished run on its validation or test split"),
    "export": ("hydra_raytrain.inference.export", "main", "write a finished run's model as ONNX, torch.export, ..."),
    "predict": ("hydra_raytrain.inference.predict", "main", "predict a file's rows with Ray Data"),
    "serve": ("hydra_raytrain.inference.serve", "main", "serve a finished run over HTTP with Ray Serve"),
}

# What Hydra itself writes into a run dir before our code runs, and the run's hold of it (storage/locks.py).
HYDRA_FILES = {".hydra", "train.log", ".lock"}


def main() -> None:
    """``hydra-raytrain [COMMAND] ...``: the command named by the first word (train when it names none)."""
    args = sys.argv[1:]
    name = args[0] if args and args[0] in COMMANDS else "train"
    rest = args[1:] if args and args[0] == name else args
    module, function, _ = COMMANDS[name]
    if name in ("train", "check"):  # Hydra reads sys.argv itself
        sys.argv = [sys.argv[0], *rest]
        _load(module, function)()
    else:
        script = os.path.basename(sys.argv[0])
        shown = "python -m hydra_raytrain" if script == "__main__.py" else script
        _load(module, function)(rest, f"{shown} {name}")


def _load(module: str, function: str) -> Any:
    import importlib

    return getattr(importlib.import_module(module), function)


def train_main() -> None:
    """``hydra-raytrain [train] [overrides]``: the command line checked, then ``train`` under Hydra."""
    import hydra

    from hydra_raytrain.shell.overrides import check_command_line

    end_quickly()
    try:
        check_command_line(sys.argv[1:])
    except ConfigError as error:
        refuse(error)
    from hydra_raytrain.preflight.rehearsal import Datasets

    datasets = Datasets()  # a multirun's jobs, one after another in this process, build a dataset they share once

    def train_job(cfg: Any) -> float | None:
        return _train(cfg, datasets)

    hydra.main(version_base="1.3", config_path="pkg://hydra_raytrain.conf", config_name="train")(train_job)()


def _train(cfg: Any, datasets: Any) -> float | None:
    from hydra_raytrain.driver.run import TrainingFailed, train
    from hydra_raytrain.messages.notice import PREEMPTED_EXIT_CODE
    from hydra_raytrain.storage.locks import Held

    try:
        summary = train(cfg, datasets=datasets)
    except ConfigError as error:
        _remove_untouched_run_dir()
        refuse(error)
    except Held as error:
        print(f"Cannot train: {error}", file=sys.stderr)
        sys.exit(FAILED)
    except TrainingFailed as error:
        print(error, file=sys.stderr)
        sys.exit(FAILED)
    if summary["status"] == "preempted":
        sys.exit(PREEMPTED_EXIT_CODE)
    monitor = summary["monitor"]
    return summary["best"].get(monitor)  # what a Hydra sweeper optimises


def _remove_untouched_run_dir() -> None:
    """A refused config leaves nothing behind: drop the run dir if it holds only what Hydra wrote."""
    from hydra_raytrain.driver.run import hydra_run_dir
    from hydra_raytrain.storage.locks import held

    run_dir = hydra_run_dir()
    if run_dir and os.path.isdir(run_dir) and set(os.listdir(run_dir)) <= HYDRA_FILES and not held(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)  # not a live run's, in its first seconds


if __name__ == "__main__":
    main()
