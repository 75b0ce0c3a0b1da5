"""Everything a run checks before Ray starts, reported together: the config (``config.validate``) and the
resources (a local cluster this machine can start for the request, or a ``ray.address`` that answers).
``train`` and ``python -m hydra_raytrain.check`` both call it."""

from __future__ import annotations

from typing import Any

import ray
from omegaconf import DictConfig

from hydra_raytrain.config import validate
from hydra_raytrain.config.errors import Problems
from hydra_raytrain.config.plain import as_dict
from hydra_raytrain.driver import cluster


def preflight(cfg: DictConfig, cwd: str, rehearse: bool = True) -> dict[str, Any]:
    """The resolved config, or a ``ConfigError`` naming every problem found. ``rehearse=False``: a config that
    was rehearsed already (a sweep trial's, on the sweep's driver). A Ray already initialised in this process
    (a notebook, a sweep trial) is checked against when the run connects, not this machine."""
    problems = Problems()
    resolved = None
    with problems.collect():
        resolved = validate(cfg, cwd, rehearse=rehearse)
    if not ray.is_initialized() and not problems.failed("scaling", "ray"):
        sections: dict[str, Any] | None
        try:
            sections = resolved or {name: as_dict(cfg[name]) for name in ("scaling", "ray")}
        except Exception:  # an interpolation of these sections that does not resolve is reported by validate
            sections = None
        with problems.collect():
            request = cluster.resource_request(sections["scaling"]) if sections else None
            if sections and request is not None and request.num_workers:  # 0: Ray Train's local mode, no cluster
                cluster.check_request(sections["ray"], request)
    problems.raise_any()
    assert resolved is not None
    return resolved
