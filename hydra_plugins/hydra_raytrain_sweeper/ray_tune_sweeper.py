"""``hydra/sweeper=ray_tune``: the jobs of a multirun as concurrent Ray Tune trials on the cluster.

    python -m hydra_raytrain -m hydra/sweeper=ray_tune optimizer.lr=1e-3,1e-2 model=mlp,simple_cnn
    python -m hydra_raytrain -m hydra/sweeper=ray_tune hydra.sweeper.scheduler=asha \\
        'optimizer.lr=tag(log,interval(1e-4,1e-1))' hydra.sweeper.num_samples=8
    python -m hydra_raytrain -m hydra/sweeper=ray_tune hydra.sweeper.search_alg=optuna hydra.sweeper.num_samples=12 \
        'optimizer.lr=tag(log,interval(1e-4,1e-1))' model=mlp,simple_cnn

The work is in hydra_raytrain/sweep (this is Hydra's entry point only). No ``from __future__ import
annotations`` here: Hydra loads plugin modules without registering them, and dataclasses then fail.
"""

import sys
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hydra_raytrain.config.sweeper import SweepSettings


@dataclass
class RayTuneSweeperConf(SweepSettings):
    _target_: str = "hydra_plugins.hydra_raytrain_sweeper.ray_tune_sweeper.RayTuneSweeper"
    params: dict[str, str] | None = None  # a search space in config, as for Hydra's basic sweeper


ConfigStore.instance().store(group="hydra/sweeper", name="ray_tune", node=RayTuneSweeperConf, provider="hydra_raytrain")


class RayTuneSweeper(Sweeper):
    def __init__(self, params: dict[str, str] | None = None, **settings: Any) -> None:
        self.params = params or {}
        self.settings = SweepSettings(**settings)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config

    def sweep(self, arguments: list[str]) -> Any:
        from hydra_raytrain.config import ConfigError
        from hydra_raytrain.sweep.tuner import run_sweep

        assert self.config is not None and self.hydra_context is not None
        try:
            summary = run_sweep(
                self.config,
                self.hydra_context.config_loader,
                [f"{k}={v}" for k, v in self.params.items()] + list(arguments),
                self.settings,
            )
        except ConfigError as error:
            print(error, file=sys.stderr)
            sys.exit(2)
        failed = [row for row in summary["trials"] if row["status"] == "failed"]
        if len(failed) == len(summary["trials"]):
            print(f"Every trial failed; first error: {failed[0]['error']}", file=sys.stderr)
            sys.exit(1)
        return summary
