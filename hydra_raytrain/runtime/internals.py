"""The private names of the libraries we wrap, in one place, each with the version it was read from: an upgrade of
Ray or OmegaConf checks this module. Nothing else in the package reaches into their internals.

Import-light (no torch, no Ray at import): the driver, the workers and Ray Train's controller all use it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

# Ray 2.60, Train V2: a worker's "Error in training function:" log line with its traceback
# (ray/train/v2/_internal/util.py), which the driver filters (logfiles.quiet_ray_train).
RAY_TRAIN_USER_ERROR_LOGGER = "ray.train.v2._internal.util"
# Ray 2.60, Train V2: the controller's loop, which logs "Error in control loop iteration" with a traceback when a
# callback raises (driver/failures.py ends a run that way, and filters that line: the driver says it once).
RAY_TRAIN_CONTROLLER_LOGGER = "ray.train.v2._internal.execution.controller.controller"
# Ray 2.60, Train V2: the controller's placement-group cleaner, which warns every few seconds without a state API.
RAY_TRAIN_PLACEMENT_GROUP_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def ray_train_context_logger() -> logging.Logger | None:
    """Ray 2.60 names one Train V2 logger by file path (``logging.getLogger(__file__)`` in
    ray/train/v2/_internal/execution/context.py: "Reporting training result ..."), so filtering ``ray.train.*``
    misses it. None when that module is not there (another Ray version)."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:
        return None
    return logging.getLogger(context.__file__)


def ray_logs_dir() -> str:
    """Ray 2.60: the logs folder of this process's Ray node (``ray._private.worker._global_node``); raises
    outside a Ray process."""
    import ray

    return ray._private.worker._global_node.get_logs_dir_path()


def resources_per_worker(scaling_config: Any) -> dict[str, float]:
    """Ray 2.60: what one worker of a ScalingConfig asks Ray for, defaults filled in (``CPU: 1`` or ``GPU: 1``):
    ``ScalingConfig._resources_per_worker_not_none``, the value Ray Train itself schedules with."""
    return {name: float(amount) for name, amount in scaling_config._resources_per_worker_not_none.items()}


def child_node(node: Any, key: str) -> Any:
    """OmegaConf 2.3: a config's child node as it is, without resolving it (``DictConfig._get_node``); the public
    ``node[key]`` resolves interpolations, which fail on ``???`` values."""
    return node._get_node(key)


def ray_jemalloc() -> str | None:
    """Ray 2.60: the jemalloc Ray runs its raylet on, found as Ray finds it (``ray._private.services``: the
    environment's ``RAY_JEMALLOC_LIB_PATH``, else ``JEMALLOC_SO``, the one in Ray's wheel where it is there); None
    where there is none."""
    from ray._private import services

    return os.environ.get(services.RAY_JEMALLOC_LIB_PATH, services.JEMALLOC_SO) or None
