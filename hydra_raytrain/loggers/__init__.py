"""Experiment trackers. Each lives behind the small ``Logger`` protocol, runs on rank 0 inside the training
function (Ray Train V2 rejects Tune's logger callbacks), and is imported only when configured."""

from hydra_raytrain.loggers.base import Logger, build_loggers

__all__ = ["Logger", "build_loggers"]
