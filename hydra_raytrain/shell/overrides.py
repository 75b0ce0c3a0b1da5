"""Command-line keys checked against the typed schema before Hydra composes, so a misspelt key gets a
"did you mean" and the list of valid keys (Hydra only says the key is not in the struct). The same for
``hydra.sweeper.*`` under ``hydra/sweeper=ray_tune``, and ``sweep.*`` is pointed there."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Sequence

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.config.schema import TYPED_SECTIONS, TrainConfig
from hydra_raytrain.config.sweeper import SweepSettings

# What hydra/sweeper=ray_tune's node holds besides SweepSettings (hydra_plugins/.../ray_tune_sweeper.py).
SWEEPER_KEYS = [field.name for field in dataclasses.fields(SweepSettings)] + ["params"]
VALID_SWEEPER_KEYS = ", ".join(f"hydra.sweeper.{key}" for key in SWEEPER_KEYS)


def check_command_line(args: Sequence[str]) -> None:
    """What can be told from the command line before Hydra composes: the YAML files of the config folders it
    names, then each override."""
    check_config_files(args)
    check_override_keys(args)


def check_override_keys(args: Sequence[str]) -> None:
    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue  # Hydra's own flags (-m, --cfg job, ...)
        try:
            (override,) = parser.parse_overrides([arg])
        except Exception as error:  # Hydra's own report: a paragraph, and a pointer to HYDRA_FULL_ERROR
            key, value = arg.split("=", 1)
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(
                key, value, f"Hydra's override grammar cannot parse {arg!r}: {reason}.", OVERRIDE_GRAMMAR
            ) from None
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


OVERRIDE_GRAMMAR = (
    "key=value in Hydra's override grammar (https://hydra.cc/docs/advanced/override_grammar/basic/): a list is "
    "[a,b], a dict {a:1}; quote a value that holds brackets, commas or spaces: 'key=\"[[x\"'"
)
CONFIG_DIR_FLAGS = ("--config-dir", "-cd", "--config-path", "-cp")


class ConfigFileError(ConfigError):
    """A config file that is not valid YAML: the file, the line and column, and the parser's reason."""

    def __init__(self, path: str, line: int, column: int, problem: str):
        self.path, self.line, self.column = path, line, column
        super().__init__(path, line, problem, "YAML (a list is [a, b], a mapping is key: value)")

    @property
    def detail(self) -> str:
        return f"{self.path}, line {self.line}, column {self.column}: {self.problem} Valid: {self.valid}"

    def __reduce__(self):
        return type(self), (self.path, self.line, self.column, self.problem)


def config_dirs(args: Sequence[str]) -> list[str]:
    """The folders ``--config-dir``/``-cd`` and ``--config-path``/``-cp`` name (``--flag DIR``, ``--flag=DIR``)."""
    folders = []
    for index, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if flag in CONFIG_DIR_FLAGS:
            folders.append(value if equals else (args[index + 1] if index + 1 < len(args) else ""))
    return [folder for folder in folders if folder and os.path.isdir(folder)]


def check_config_files(args: Sequence[str]) -> None:
    """Every YAML file in the config folders the command line names parses (Hydra would fail on it with a
    parser traceback, or not until a sweep reaches the option that holds it)."""
    for folder in config_dirs(args):
        for root, _, names in sorted(os.walk(folder)):
            for name in sorted(names):
                if name.endswith((".yaml", ".yml")):
                    check_yaml_file(os.path.join(root, name))


def check_yaml_file(path: str) -> None:
    try:
        with open(path) as file:
            yaml.safe_load(file)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        context = ""
        if error.context and error.context_mark:
            opened = error.context_mark
            context = f" ({error.context} that opens at line {opened.line + 1}, column {opened.column + 1})"
        raise ConfigFileError(path, line, column, f"not valid YAML: {error.problem}{context}.") from None


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
