"""Check configs without training: ``hydra-raytrain check [overrides]`` (``python -m hydra_raytrain.check``), for CI.

    python -m hydra_raytrain.check model=resnet18 scaling.num_workers=4
    python -m hydra_raytrain.check -m 'experiment=glob(*)'          # every shipped experiment
    python -m hydra_raytrain.check -m model=mlp,simple_cnn optimizer.lr=1e-3,1e-2

Each config is composed as the training command composes it and goes through the same driver-side checks
(every ``_target_`` imports and takes its arguments, values and ranges, the dataset, models and task built and
rehearsed on a few samples, the metrics that settings name; see preflight/rehearsal.py), then the resources: a local
cluster this machine could start for it, or a ``ray.address`` that answers. No Ray cluster starts, nothing trains,
no run dir is written.
Exit 0 when every config passes, 2 when one does not (each problem printed). ``-m`` expands the sweep with
Hydra's basic sweeper, whatever ``hydra/sweeper`` the command names.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.shell.overrides import check_command_line
from hydra_raytrain.shell.program import BAD_INPUT, end_quickly, refuse


def check(cfg: DictConfig, cwd: str | None = None, datasets: Any = None) -> Resolved:
    """Every check ``train(cfg)`` makes before Ray starts (its plan: ``driver/plan.py``); returns the resolved
    config. Raises ``ConfigError``. ``datasets``: the datasets built by the configs checked before (a ``-m``'s)."""
    from hydra_raytrain.driver.plan import preflight

    return preflight(cfg, cwd or os.getcwd(), datasets=datasets).resolved


def _check_one(cfg: DictConfig, failed: list[str], datasets: Any) -> None:
    label = " ".join(HydraConfig.get().overrides.task) or "(the default config)"
    try:
        check(cfg, datasets=datasets)
    except Exception as error:  # a ConfigError, or a check that itself broke: the other configs are still checked
        failed.append(label)
        message = str(error) if isinstance(error, ConfigError) else f"{type(error).__name__}: {error}"
        print(f"FAIL {label}\n{message}", file=sys.stderr, flush=True)
        return
    print(f"ok   {label}", flush=True)


# Hydra writes nothing a check would leave behind: its run and sweep dirs go to a temporary folder.
def _quiet_hydra(folder: str) -> list[str]:
    return [
        f"hydra.run.dir={folder}",
        f"hydra.sweep.dir={folder}",
        "hydra.sweep.subdir=${hydra.job.num}",
        "hydra.output_subdir=null",
        "hydra/job_logging=disabled",
        "hydra/hydra_logging=disabled",
        "hydra/sweeper=basic",
    ]


def main() -> None:
    end_quickly()
    args = [arg for arg in sys.argv[1:] if not arg.startswith(("hydra/sweeper=", "hydra.sweeper."))]
    try:
        check_command_line(args)
    except ConfigError as error:
        refuse(error)
    from hydra_raytrain.preflight.rehearsal import Datasets

    failed: list[str] = []
    datasets = Datasets()  # the configs of a -m, checked one after another, build a dataset they share once

    def check_each(cfg: DictConfig) -> None:
        _check_one(cfg, failed, datasets)

    with tempfile.TemporaryDirectory(prefix="hydra_raytrain_check_") as folder:
        sys.argv = [sys.argv[0], *args, *_quiet_hydra(folder)]
        hydra.main(version_base="1.3", config_path="pkg://hydra_raytrain.conf", config_name="train")(check_each)()
    if failed:
        print(f"{len(failed)} config(s) invalid.", file=sys.stderr)
        sys.exit(BAD_INPUT)


if __name__ == "__main__":
    main()
