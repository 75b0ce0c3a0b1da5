"""One redaction for everything a run writes, prints, logs or uploads: its config (``config.json`` in the run dir
and every checkpoint, Hydra's ``.hydra/`` files, what W&B, MLflow and TensorBoard record), its command line
(``summary.json``'s provenance, the run dir's lock) and its storage location.

- A value under a secret-looking name (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*CREDENTIAL*``, ``KEY`` or
  ``*_KEY``: ``scaling.worker_env.HF_TOKEN``, ``API_KEY``) is written ``***``.
- A URI's credentials are written ``***``: ``s3://KEY:SECRET@host/bucket`` -> ``s3://***@host/bucket``.
- A value the config takes from the environment (``${oc.env:HF_TOKEN}``) is saved as that interpolation,
  unresolved, wherever the config is saved.

The run itself uses the real values: the workers receive them, and the run's identity (its name) is computed from
them, as before. No torch or Ray at import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hydra_raytrain.config.errors import redacted

MASK = "***"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(?:^|_)KEY$", re.IGNORECASE)
FROM_ENVIRONMENT = re.compile(r"\$\{oc\.env:")
# ``NAME=value`` and ``NAME: value`` in a command line or an override (the value up to a space, comma or brace);
# a value that is an interpolation (``${...}``) is kept: it holds no secret
PAIR = re.compile(r"(?P<name>[\w.\-]+)(?P<sep>\s*[=:]\s*)(?P<value>(?!\$\{)[^\s,{}\[\]'\"]+)")


def secret_name(name: str) -> bool:
    """Whether a setting's name (its last part: ``scaling.worker_env.HF_TOKEN`` -> ``HF_TOKEN``) looks secret."""
    return bool(SECRET_NAME.search(str(name).rsplit(".", 1)[-1]))


def redact_text(text: str) -> str:
    """A command line or override with its secrets written ``***``: URI credentials, and the value of every
    ``NAME=value`` or ``NAME: value`` whose name looks secret."""

    def pair(match: re.Match[str]) -> str:
        if not secret_name(match["name"]):
            return match[0]
        return f"{match['name']}{match['sep']}{MASK}"

    return PAIR.sub(pair, redacted(text))


def redact_tree(node: Any, unresolved: Any = None, name: str = "") -> Any:
    """A config tree as it is saved: a value from the environment as its unresolved interpolation (``unresolved``:
    the same tree before resolution, where known), a secret-looking name's value ``***``, URI credentials ``***``."""
    if isinstance(node, Mapping):
        return {
            key: redact_tree(value, unresolved.get(key) if isinstance(unresolved, Mapping) else None, str(key))
            for key, value in node.items()
        }
    if isinstance(node, (list, tuple)):
        aligned = unresolved if isinstance(unresolved, (list, tuple)) and len(unresolved) == len(node) else None
        return [redact_tree(value, aligned[i] if aligned else None, name) for i, value in enumerate(node)]
    if isinstance(unresolved, str) and FROM_ENVIRONMENT.search(unresolved):
        return unresolved
    if isinstance(node, str):
        if node and secret_name(name) and not node.startswith("${"):
            return MASK
        return redacted(node)
    return node


def redact_yaml(path: str, overrides: bool = False) -> None:
    """A YAML file Hydra wrote (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``) rewritten redacted, its
    interpolations kept as written; ``overrides``: a list of override strings, each redacted as a command line."""
    import os

    from omegaconf import OmegaConf

    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if overrides and isinstance(loaded, list):
        cleaned: Any = [redact_text(item) if isinstance(item, str) else item for item in loaded]
    else:
        cleaned = _redact_strings(redact_tree(loaded))
    if cleaned != loaded:  # whole or not at all: a sibling file renamed over it
        with open(path + ".partial", "w") as file:
            file.write(OmegaConf.to_yaml(OmegaConf.create(cleaned)))
        os.replace(path + ".partial", path)


def _redact_strings(node: Any) -> Any:
    """Every string of a tree redacted as a command line (``hydra.yaml``'s overrides and job name hold them)."""
    if isinstance(node, Mapping):
        return {key: _redact_strings(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_redact_strings(value) for value in node]
    return redact_text(node) if isinstance(node, str) else node
