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
import os
from typing import Any

import torch

from hydra_raytrain.inference.finished import FinishedRun
from hydra_raytrain.inference.scoring import SPLITS, score, shown
from hydra_raytrain.shell.program import Command
from hydra_raytrain.storage.rundir import write_json

EVALUATION_FILE = "evaluation.json"


def load_model(path: str) -> torch.nn.Module | dict[str, torch.nn.Module]:
    """The model of a run dir or checkpoint, built from its saved config, with its weights, in eval mode.
    A task with several models (a GAN) gives ``{name: model}``."""
    return FinishedRun.read(path).checked("evaluate", finished=False).load_model()


def evaluate(path: str, split: str = "val") -> dict[str, Any]:
    """The run's (or checkpoint's) model scored on its whole ``split`` (val, or test where the run has one);
    written to ``evaluation.json`` (``evaluation_test.json`` for the test split)."""
    run = FinishedRun.read(path).checked("evaluate", finished=False)
    metrics = score(path, run.config, split)
    write_json(os.path.join(path, evaluation_file(split)), metrics)
    return metrics


def evaluation_file(split: str) -> str:
    return EVALUATION_FILE if split == "val" else EVALUATION_FILE.replace(".json", f"_{split}.json")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="path", help="a run dir, or one checkpoint folder inside its Ray storage")
    parser.add_argument("--split", default="val", choices=SPLITS, help="the split to score (default: val)")


def _evaluate(options: argparse.Namespace) -> None:
    metrics = evaluate(options.run, options.split)
    print(shown(metrics))
    print(f"Written: {os.path.join(options.run, evaluation_file(options.split))}")


COMMAND = Command("evaluate", __doc__, _options, _evaluate, refused="Cannot evaluate this run here")
main = COMMAND.run


if __name__ == "__main__":
    main()
