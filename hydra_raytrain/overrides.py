"""Command-line keys checked against the typed schema before Hydra composes, so a misspelt key gets a
"did you mean" and the list of valid keys (Hydra only says the key is not in the struct). The same for
``hydra.sweeper.*`` under ``hydra/sweeper=ray_tune``, and ``sweep.*`` is pointed there."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.config.schema import TYPED_SECTIONS, TrainConfig
from hydra_raytrain.sweep.settings import SweepSettings

# What hydra/sweeper=ray_tune's node holds besides SweepSettings (hydra_plugins/.../ray_tune_sweeper.py).
SWEEPER_KEYS = [field.name for field in dataclasses.fields(SweepSettings)] + ["params"]
VALID_SWEEPER_KEYS = ", ".join(f"hydra.sweeper.{key}" for key in SWEEPER_KEYS)


def check_override_keys(args: Sequence[str]) -> None:
    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue  # Hydra's own flags (-m, --cfg job, ...)
        try:
            (override,) = parser.parse_overrides([arg])
        except Exception:
            continue  # Hydra reports its own syntax errors
        if override.is_add() or override.is_delete() or override.is_force_add():
            continue
        parts, value = override.key_or_group.split("."), arg.split("=", 1)[1]
        if len(parts) > 1 and parts[0] in TYPED_SECTIONS:
            _check_path(parts, value)
        elif len(parts) == 2 and parts[0] == "sweep":  # not a section of ours: the sweeper's settings
            raise ConfigError(
                override.key_or_group,
                value,
                "sweep settings are the sweeper's: they live under hydra.sweeper.",
                f"hydra/sweeper=ray_tune hydra.sweeper.{parts[1]}={value}"
                if parts[1] in SWEEPER_KEYS
                else f"hydra/sweeper=ray_tune and one of {VALID_SWEEPER_KEYS}",
            )
        elif (
            len(parts) == 3
            and parts[:2] == ["hydra", "sweeper"]
            and "hydra/sweeper=ray_tune" in args
            and parts[2] not in SWEEPER_KEYS
        ):
            raise ConfigError(
                override.key_or_group,
                value,
                f"hydra/sweeper=ray_tune has no setting {parts[2]!r}{did_you_mean(parts[2], SWEEPER_KEYS)}.",
                VALID_SWEEPER_KEYS,
            )


def _check_path(parts: list[str], value: str) -> None:
    schema: typing.Any = TrainConfig
    for depth, part in enumerate(parts):
        if not dataclasses.is_dataclass(schema):
            return  # a free-form value (a dict of resources, a runtime_env): nothing typed to check
        hints = typing.get_type_hints(schema)
        if part not in hints:
            section = ".".join(parts[:depth])
            valid = [f"{section}.{name}" for name in hints]
            raise ConfigError(
                ".".join(parts),
                value,
                f"{section} has no setting {part!r}{did_you_mean(part, list(hints))}.",
                ", ".join(valid),
            )
        schema = hints[part]
