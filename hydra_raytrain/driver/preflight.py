"""Everything a run checks before Ray starts, reported together: the config (``config.validate``) and the
resources (a local cluster this machine can start for the request, or a ``ray.address`` that answers).
``train`` and ``python -m hydra_raytrain.check`` both call it."""

from __future__ import annotations

from typing import Any, Dict

from omegaconf import DictConfig, OmegaConf

from hydra_raytrain.config import validate
from hydra_raytrain.config.errors import Problems
from hydra_raytrain.driver import cluster


def preflight(cfg: DictConfig, cwd: str) -> Dict[str, Any]:
    """The resolved config, or a ``ConfigError`` naming every problem found."""
    problems = Problems()
    resolved = None
    with problems.collect():
        resolved = validate(cfg, cwd)
    if not any(error.key.split(".")[0] in ("scaling", "ray") for error in problems.errors):
        with problems.collect():
            sections = resolved or {name: OmegaConf.to_container(cfg[name], resolve=True) for name in ("scaling", "ray")}
            request = cluster.resource_request(sections["scaling"])
            if request.num_workers:  # 0: Ray Train's local mode, no cluster
                cluster.check_request(sections["ray"], request)
    problems.raise_any()
    assert resolved is not None
    return resolved
