"""The command line: ``python -m hydra_raytrain [overrides]`` (or ``hydra-raytrain``). A thin wrapper on ``train``."""

from __future__ import annotations

import os
import shutil
import sys

import hydra
from omegaconf import DictConfig

from hydra_raytrain.config import ConfigError
from hydra_raytrain.driver.run import TrainingFailed, hydra_run_dir, train
from hydra_raytrain.notice import PREEMPTED_EXIT_CODE
from hydra_raytrain.overrides import check_command_line
from hydra_raytrain.program import end_quickly

# What Hydra itself writes into a run dir before our code runs.
HYDRA_FILES = {".hydra", "train.log"}


@hydra.main(version_base="1.3", config_path="pkg://hydra_raytrain.conf", config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    try:
        summary = train(cfg)
    except ConfigError as error:
        _remove_untouched_run_dir()
        print(error, file=sys.stderr)
        sys.exit(2)
    except TrainingFailed as error:
        print(error, file=sys.stderr)
        sys.exit(1)
    if summary["status"] == "preempted":
        sys.exit(PREEMPTED_EXIT_CODE)
    monitor = summary["monitor"]
    return summary["best"].get(monitor)  # what a Hydra sweeper optimises


def _remove_untouched_run_dir() -> None:
    """A refused config leaves nothing behind: drop the run dir if it holds only what Hydra wrote."""
    run_dir = hydra_run_dir()
    if run_dir and os.path.isdir(run_dir) and set(os.listdir(run_dir)) <= HYDRA_FILES:
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    end_quickly()
    try:
        check_command_line(sys.argv[1:])
    except ConfigError as error:
        print(error, file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()
