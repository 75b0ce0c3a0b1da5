"""Every ``_target_`` of a config imports and takes its arguments; path arguments become absolute.

Read by ``validate`` (every component section), by the run's identity (``resolvers.py``: the paths as the driver
will make them), by ``replaced.py`` (which arguments a new target takes) and by ``evaluate`` (a run dir's config).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import typing
from collections.abc import Callable
from typing import Any

from hydra.utils import get_object

from hydra_raytrain.config.errors import ConfigError, Problems, did_you_mean, one_line
from hydra_raytrain.config.paths import PathArg
from hydra_raytrain.preflight.typecheck import wrong_type

HYDRA_KEYS = ("_target_", "_args_", "_partial_", "_convert_", "_recursive_")
# What the runner passes to a section's `_partial_` node at run time: a node without `_partial_: true` misses it.
RUNTIME_ARGUMENTS = {"optimizer": "params", "scheduler": "optimizer"}


def check_targets(key: str, node: Any, cwd: str, problems: Problems) -> None:
    """Every `_target_` in the tree imports and accepts its arguments; path arguments become absolute."""
    if isinstance(node, dict):
        if "_target_" in node:
            with problems.collect():
                check_call(key, node, cwd)
        for name, value in node.items():
            if name not in HYDRA_KEYS:
                check_targets(f"{key}.{name}", value, cwd, problems)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            check_targets(f"{key}[{index}]", value, cwd, problems)


def locate(key: str, path: str) -> Callable:
    hydra_log = logging.getLogger("hydra.utils")  # it logs the failure as an ERROR too; ours is the one message
    try:
        hydra_log.disabled = True
        return get_object(path)
    except Exception as error:  # Hydra raises ImportError or ValueError with a multi-line story
        module_name, _, attribute = str(path).rpartition(".")
        hint = ""
        try:
            module = importlib.import_module(module_name)
            hint = did_you_mean(attribute, [name for name in dir(module) if not name.startswith("_")])
        except Exception:
            pass
        raise ConfigError(
            f"{key}._target_",
            path,
            f"cannot be imported{hint}: {one_line(error)}",
            "the dotted path of an importable class or function, e.g. torch.optim.SGD.",
        ) from None
    finally:
        hydra_log.disabled = False


def check_call(key: str, node: dict[str, Any], cwd: str) -> None:
    """The node's arguments against its target's signature: names, values of a plainly wrong type, required
    ones, then paths. Every argument's problem is reported, not the first one only."""
    target = locate(key, node["_target_"])
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # some builtins have no signature to check against
        return
    kwargs = {name: value for name, value in node.items() if name not in HYDRA_KEYS}
    params = signature.parameters
    accepted = [name for name, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    problems, hints = Problems(), _type_hints(target)
    for name, value in kwargs.items():
        with problems.collect():
            check_argument(key, node["_target_"], name, value, signature, hints)
    problems.raise_any()
    bind = signature.bind_partial if node.get("_partial_") else signature.bind
    try:
        bind(*node.get("_args_", []), **kwargs)
    except TypeError as error:
        passed = RUNTIME_ARGUMENTS.get(key.split(".")[0])
        if passed and not node.get("_partial_") and f"'{passed}'" in str(error):
            raise ConfigError(
                f"{key}._partial_",
                None,
                f"{node['_target_']} needs {passed!r}, which the runner passes at run time.",
                f"add `_partial_: true` to {key} (on the command line: +{key}._partial_=true)",
            ) from None
        raise ConfigError(
            key,
            node["_target_"],
            f"its arguments do not fit: {error}.",
            f"arguments of {node['_target_']}: {', '.join(accepted)}",
        ) from None
    _check_paths(key, target, node, cwd)


def check_argument(
    key: str, target: str, name: str, value: Any, signature: inspect.Signature, hints: dict[str, Any]
) -> None:
    """One argument: a name the target takes, a value not of a plainly wrong type (a missing ``???`` value is
    reported as such)."""
    params = signature.parameters
    accepted = [name for name, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if name not in params:
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return
        raise ConfigError(
            f"{key}.{name}",
            value,
            f"{target} has no argument {name!r}{did_you_mean(name, accepted)}.",
            ", ".join(accepted) or "(no arguments)",
        )
    expected = wrong_type(value, hints.get(name), params[name].default) if value != "???" else None
    if expected:
        default = params[name].default
        example = (
            f", e.g. {key}.{name}={default}" if default is not inspect.Parameter.empty and default is not None else ""
        )
        raise ConfigError(
            f"{key}.{name}",
            value,
            f"{target} takes {expected} for {name!r}, not {type(value).__name__}.",
            f"{expected}{example}",
        )


def _type_hints(target: Callable) -> dict[str, Any]:
    try:
        return typing.get_type_hints(target.__init__ if inspect.isclass(target) else target, include_extras=True)
    except Exception:  # a hint that does not evaluate: nothing to check by
        return {}


def _check_paths(key: str, target: Callable, node: dict[str, Any], cwd: str) -> None:
    for name, must_exist in absolute_paths(target, node, cwd):
        if must_exist and not os.path.isdir(node[name]):
            raise ConfigError(f"{key}.{name}", node[name], "no such folder.", "the path of an existing folder.")


def absolute_paths(target: Callable, node: dict[str, Any], cwd: str) -> list[tuple[str, bool]]:
    """Make the node's path arguments (``LocalPath`` / ``ExistingDir``) absolute against ``cwd``, in place;
    returns each one's name and whether it must exist."""
    paths = []
    for name, hint in _type_hints(target).items():
        markers = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, PathArg)]
        if markers and isinstance(node.get(name), str):
            node[name] = absolute(node[name], cwd)
            paths.append((name, markers[0].must_exist))
    return paths


def absolute_target_paths(node: Any, cwd: str) -> None:
    """``absolute_paths`` for every importable ``_target_`` node in a tree (the run identity's view of a config)."""
    if isinstance(node, dict):
        if isinstance(node.get("_target_"), str):
            try:
                absolute_paths(locate("", node["_target_"]), node, cwd)
            except ConfigError:
                pass  # not importable: validation reports it
        for name, value in node.items():
            if name not in HYDRA_KEYS:
                absolute_target_paths(value, cwd)
    elif isinstance(node, list):
        for value in node:
            absolute_target_paths(value, cwd)


def absolute(path: str, cwd: str) -> str:
    """Local paths become absolute against the driver's cwd; URIs (s3://...) stay as they are."""
    if "://" in path:
        return path
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
