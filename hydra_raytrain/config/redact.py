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
# An environment variable's name (HF_TOKEN, WANDB_API_KEY, DB_PASSWORD): any with one of these words in it
SECRET_VARIABLE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|KEY")
# A setting's name in lower case: these words as the whole name or its last words (not pad_token, image_key, tokenizer)
SECRET_SETTING = re.compile(
    r"^token$|(^|_)(password|passwd|secret|credentials?|api_key|access_key|secret_key|private_key|access_token"
    r"|auth_token|hf_token)$"
)
FROM_ENVIRONMENT = re.compile(r"\$\{oc\.env:")
# ``NAME=value`` and ``NAME: value`` in a command line or an override: the value quoted, or up to a space, comma or
# brace; a value that is an interpolation (``${...}``) is kept: it holds no secret
PAIR = re.compile(r"(?P<name>[\w.\-]+)(?P<sep>\s*[=:]\s*)(?P<value>\"[^\"]*\"|'[^']*'|(?!\$\{)[^\s,{}\[\]'\"]+)")


def secret_name(name: str) -> bool:
    """Whether a setting's name (its last part: ``scaling.worker_env.HF_TOKEN`` -> ``HF_TOKEN``) looks secret: an
    environment variable's with TOKEN, SECRET, PASSWORD, CREDENTIAL or KEY in it, or a setting called ``password``,
    ``api_key``, ``access_token`` and the like."""
    last = str(name).rsplit(".", 1)[-1]
    if last.isupper() or (last.upper() == last and any(c.isalpha() for c in last)):
        return bool(SECRET_VARIABLE.search(last))
    return bool(SECRET_SETTING.search(last.lower()))


def redact_text(text: str) -> str:
    """A command line or override with its secrets written ``***``: URI credentials, and the value of every
    ``NAME=value`` or ``NAME: value`` whose name looks secret (quoted or not)."""

    def pair(match: re.Match[str]) -> str:
        if not secret_name(match["name"]) or match["value"].strip("'\"").startswith("${"):
            return match[0]
        return f"{match['name']}{match['sep']}{MASK}"

    return PAIR.sub(pair, redacted(text))


def redact_tree(node: Any, unresolved: Any = None, name: str = "", in_env: bool = False) -> Any:
    """A config tree as it is saved: a secret-looking name's value ``***`` (or, where it came from the
    environment, its unresolved interpolation: ``unresolved`` is the same tree before resolution, where known;
    likewise every value of an environment map such as ``scaling.worker_env``), URI credentials ``***``; every other
    value as resolved."""
    if isinstance(node, Mapping):
        env = str(name).lower().endswith("env") or str(name).lower() == "env_vars"
        return {
            key: redact_tree(value, unresolved.get(key) if isinstance(unresolved, Mapping) else None, str(key), env)
            for key, value in node.items()
        }
    if isinstance(node, (list, tuple)):
        aligned = unresolved if isinstance(unresolved, (list, tuple)) and len(unresolved) == len(node) else None
        return [redact_tree(value, aligned[i] if aligned else None, name) for i, value in enumerate(node)]
    secret = secret_name(name)
    if (secret or in_env) and isinstance(unresolved, str) and FROM_ENVIRONMENT.search(unresolved):
        return unresolved
    if secret and node is not None and node != "" and not isinstance(node, bool):
        return node if isinstance(node, str) and node.startswith("${") else MASK
    return redacted(node) if isinstance(node, str) else node


def redact_yaml(path: str, overrides: bool = False) -> None:
    """A YAML file Hydra wrote (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``, a sweep's
    ``multirun.yaml``) rewritten redacted, its interpolations kept as written; ``overrides``: a list of override
    strings, each redacted as a command line."""
    from omegaconf import OmegaConf

    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if overrides and isinstance(loaded, list):
        cleaned: Any = [redact_text(item) if isinstance(item, str) else item for item in loaded]
    else:
        cleaned = _redact_strings(redact_tree(loaded))
    if cleaned != loaded:
        write_yaml(path, cleaned)


def save_redacted(path: str, tree: Any) -> None:
    """A config tree (unresolved: its interpolations as written) saved as YAML with its secrets ``***``, written
    whole or not at all, never in clear on the way."""
    write_yaml(path, _redact_strings(redact_tree(tree)))


def write_yaml(path: str, tree: Any) -> None:
    import os

    from omegaconf import OmegaConf

    with open(path + ".partial", "w") as file:  # a sibling file renamed over it
        file.write(OmegaConf.to_yaml(OmegaConf.create(tree)))
    os.replace(path + ".partial", path)


def _redact_strings(node: Any) -> Any:
    """Every string of a tree redacted as a command line (``hydra.yaml``'s overrides and job name hold them)."""
    if isinstance(node, Mapping):
        return {key: _redact_strings(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_redact_strings(value) for value in node]
    return redact_text(node) if isinstance(node, str) else node


def masked(tree: Any, saved: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    """What ``saved`` (``tree`` as ``redact_tree`` saves it) hides: each leaf whose saved form differs, by its path
    (keys, list items by index), with its real value. ``unmasked`` puts them back."""
    if isinstance(tree, Mapping) and isinstance(saved, Mapping):
        return {
            found: value
            for key, item in tree.items()
            for found, value in masked(item, saved.get(key), (*path, key)).items()
        }
    if isinstance(tree, (list, tuple)) and isinstance(saved, (list, tuple)) and len(tree) == len(saved):
        return {
            found: value for i, item in enumerate(tree) for found, value in masked(item, saved[i], (*path, i)).items()
        }
    return {} if tree == saved else {path: tree}


def unmasked(saved: Any, hidden: Mapping[tuple[Any, ...], Any]) -> Any:
    """A saved tree with the values ``masked`` found put back (a copy)."""
    import copy

    tree = copy.deepcopy(saved)
    for path, value in hidden.items():
        if not path:
            return value
        node = tree
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return tree
