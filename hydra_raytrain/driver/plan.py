"""Everything a run checks before Ray starts, reported together: the config (``hydra_raytrain.preflight``) and the
resources (a local cluster this machine can start for the request, or a ``ray.address`` that answers).
``train`` and ``python -m hydra_raytrain.check`` both call it."""

from __future__ import annotations

import os

import ray
from omegaconf import DictConfig

from hydra_raytrain.config.errors import Problems
from hydra_raytrain.config.plain import as_dict
from hydra_raytrain.config.resolved import Resolved, typed
from hydra_raytrain.config.schema import RayConfig, ScalingConfig, cluster_address
from hydra_raytrain.driver import cluster
from hydra_raytrain.preflight.validate import validate


def preflight(cfg: DictConfig, cwd: str, rehearse: bool = True) -> Resolved:
    """The resolved config, or a ``ConfigError`` naming every problem found. ``rehearse=False``: a config that
    was rehearsed already (a sweep trial's, on the sweep's driver). A Ray already initialised in this process
    (a notebook, a sweep trial) is checked against when the run connects, not this machine."""
    problems = Problems()
    resolved = None
    with problems.collect():
        resolved = validate(cfg, cwd, rehearse=rehearse)
    if not ray.is_initialized() and not problems.failed("scaling", "ray"):
        # Checked even when another section failed: the two sections, typed, from the composed config.
        sections: tuple[ScalingConfig, RayConfig] | None
        try:
            sections = (
                (resolved.scaling, resolved.ray)
                if resolved
                else (
                    typed(ScalingConfig, as_dict(cfg.scaling)),
                    typed(RayConfig, {**as_dict(cfg.ray), "address": cluster_address(cfg.ray.address, os.environ)}),
                )
            )
        except Exception:  # an interpolation of these sections that does not resolve is reported by validate
            sections = None
        with problems.collect():
            request = cluster.resource_request(sections[0]) if sections else None
            if sections and request is not None and request.num_workers:  # 0: Ray Train's local mode, no cluster
                cluster.check_request(sections[1], request)
    problems.raise_any()
    assert resolved is not None
    return resolved
