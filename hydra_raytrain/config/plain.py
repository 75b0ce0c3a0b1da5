"""OmegaConf nodes as the plain containers the rest of the code reads, typed as such."""

from __future__ import annotations

from typing import Any, cast

from omegaconf import OmegaConf


def as_dict(node: Any, resolve: bool = True) -> dict[str, Any]:
    """A config mapping (DictConfig) as a plain dict, interpolations resolved unless ``resolve=False``."""
    return cast(dict[str, Any], OmegaConf.to_container(node, resolve=resolve))
