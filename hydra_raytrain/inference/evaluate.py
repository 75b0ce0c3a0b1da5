"""Use a trained run: rebuild its model, or score it on its validation or test split.

    python -m hydra_raytrain.evaluate outputs/runs/<name>                          # a run dir
    python -m hydra_raytrain.evaluate outputs/runs/<name>/ray_storage/<name>/epoch_0004   # one checkpoint
    python -m hydra_raytrain.evaluate outputs/runs/<name> --split test             # its test split

Prints the metrics (the names metrics.jsonl uses: val_loss, val_accuracy, ...; test_loss, ... for the test
split) and writes them to ``evaluation.json`` (``evaluation_test.json``) in that folder. Evaluation runs in this
process on the CPU (or the first GPU) over the whole split, so the validation figures equal what training reported
when ``trainer.limit_val_batches`` was unset, and the test figures of the best checkpoint equal summary.json's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch
from omegaconf import OmegaConf

from hydra_raytrain.config.errors import ConfigError, Problems
from hydra_raytrain.config.plain import as_dict
from hydra_raytrain.inference.scoring import SPLITS, load_weights, score, shown
from hydra_raytrain.preflight.resolvers import register_resolvers
from hydra_raytrain.preflight.targets import check_targets
from hydra_raytrain.program import end_quickly
from hydra_raytrain.rundir import CONFIG_FILE, MODEL_FILE, SUMMARY_FILE, write_json

EVALUATION_FILE = "evaluation.json"


def load_config(path: str) -> dict[str, Any]:
    """The resolved config of a run dir (``.hydra/config.yaml``) or of a checkpoint folder (``config.json``)."""
    if os.path.exists(os.path.join(path, CONFIG_FILE)):
        with open(os.path.join(path, CONFIG_FILE)) as file:
            return json.load(file)
    hydra_config = os.path.join(path, ".hydra", "config.yaml")
    if os.path.exists(hydra_config):
        register_resolvers()  # a dataset's ${class_count:...} and the like, outside Hydra
        return as_dict(OmegaConf.load(hydra_config))
    raise FileNotFoundError(f"{path} is neither a run dir (no .hydra/config.yaml) nor a checkpoint (no {CONFIG_FILE}).")


def check_config(cfg: dict[str, Any], path: str, command: str = "evaluate") -> None:
    """The run's model, dataset and task import here and take their arguments, or one ``ConfigError`` that says
    how to make a module of the user's own importable (evaluating from another folder than the training's)."""
    problems = Problems()
    for section in ("model", "dataset", "task", "datamodule"):
        check_targets(section, cfg.get(section) or {}, os.getcwd(), problems)
    launched_from = _launched_from(path)
    hint = (
        (
            f"run this from {launched_from}, where the run was trained, or put that folder on the path: "
            f"PYTHONPATH={launched_from} python -m hydra_raytrain.{command} {path}"
        )
        if launched_from
        else "the module on the path (run this from the folder the run was trained in, or set PYTHONPATH to it)"
    )
    problems.errors = [
        ConfigError(e.key, e.value, f"{e.problem} (in {os.getcwd()})", hint) if "cannot be imported" in e.problem else e
        for e in problems.errors
    ]
    problems.raise_any()


def check_finished(run: str) -> None:
    """A run dir is read (exported, predicted with) once its run completed and wrote model.pt; a checkpoint folder
    as it is."""
    summary = os.path.join(run, SUMMARY_FILE)
    if not os.path.exists(summary):
        return  # a checkpoint folder (config.json and its weights): load_model reads it
    with open(summary) as file:
        status = json.load(file).get("status")
    if status != "completed" or not os.path.exists(os.path.join(run, MODEL_FILE)):
        raise ConfigError(
            "RUN_DIR",
            run,
            f"is not a finished run (summary.json: status {status!r}, no model.pt).",
            "a completed run dir (the same training command resumes this one), or one checkpoint folder inside "
            "its Ray storage (<run>/ray_storage/<name>/<checkpoint>)",
        )


def _launched_from(path: str) -> str | None:
    """The folder the run was started from (summary.json's ``launched_from``), for a run dir or a checkpoint in it."""
    folder = os.path.abspath(path)
    for _ in range(4):  # <run dir>/ray_storage/<name>/<checkpoint>
        summary = os.path.join(folder, SUMMARY_FILE)
        if os.path.exists(summary):
            with open(summary) as file:
                return json.load(file).get("launched_from")
        folder = os.path.dirname(folder)
    return None


def load_model(path: str) -> torch.nn.Module | dict[str, torch.nn.Module]:
    """The model of a run dir or checkpoint, built from its saved config, with its weights, in eval mode.
    A task with several models (a GAN) gives ``{name: model}``."""
    cfg = load_config(path)
    check_config(cfg, path)
    return load_weights(path, cfg["model"])


def evaluate(path: str, split: str = "val") -> dict[str, Any]:
    """The run's (or checkpoint's) model scored on its whole ``split`` (val, or test where the run has one);
    written to ``evaluation.json`` (``evaluation_test.json`` for the test split)."""
    cfg = load_config(path)
    check_config(cfg, path)
    metrics = score(path, cfg, split)
    write_json(os.path.join(path, evaluation_file(split)), metrics)
    return metrics


def evaluation_file(split: str) -> str:
    return EVALUATION_FILE if split == "val" else EVALUATION_FILE.replace(".json", f"_{split}.json")


def main() -> None:
    end_quickly()
    parser = argparse.ArgumentParser(prog="python -m hydra_raytrain.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a run dir, or one checkpoint folder inside its Ray storage")
    parser.add_argument("--split", default="val", choices=SPLITS, help="the split to score (default: val)")
    options = parser.parse_args()
    path = options.path
    if not os.path.isdir(path):
        parser.error(f"{path}: no such folder")
    try:
        metrics = evaluate(path, options.split)
    except ConfigError as error:
        print(str(error).replace("Invalid config", "Cannot evaluate this run here", 1), file=sys.stderr)
        sys.exit(2)
    print(shown(metrics))
    print(f"Written: {os.path.join(path, evaluation_file(options.split))}")


if __name__ == "__main__":
    main()
