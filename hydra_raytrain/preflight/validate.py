"""Everything that can be checked on the driver, checked before any worker starts.

``validate(cfg, cwd)`` returns the config resolved to a plain dict with absolute paths: what workers receive
(they run in Ray's session folder, where relative paths and ``${hydra:...}`` mean nothing).
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
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, InterpolationToMissingValueError, MissingMandatoryValue

from hydra_raytrain.config.errors import ConfigError, Problems, did_you_mean, one_line
from hydra_raytrain.config.paths import PathArg
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.config.schema import TYPED_SECTIONS, checkpointed_modules
from hydra_raytrain.config.typecheck import wrong_type
from hydra_raytrain.internals import child_node
from hydra_raytrain.tasks.lightning import MAPPED_ARGUMENTS, RUNNER_ARGUMENTS, is_lightning

# The free-form component nodes, each a `_target_` node (or a tree holding some).
COMPONENT_SECTIONS = ("model", "dataset", "optimizer", "task", "scheduler", "logger", "datamodule")
HYDRA_KEYS = ("_target_", "_args_", "_partial_", "_convert_", "_recursive_")
# What the runner passes to a section's `_partial_` node at run time: a node without `_partial_: true` misses it.
RUNTIME_ARGUMENTS = {"optimizer": "params", "scheduler": "optimizer"}
CROSS_SECTION = ("model", "dataset", "optimizer", "task", "trainer", "fsdp", "scaling", "checkpoint")


def validate(cfg: DictConfig, cwd: str, rehearse: bool = True) -> Resolved:
    """Every check that can run on the driver, each independent one run even when another failed: the error
    (``ConfigErrors`` when there are several) lists every problem found. The last check, only for a config
    that passed the others, rehearses one validation step on the driver (``rehearsal.rehearse``)."""
    problems = Problems()
    for section in TYPED_SECTIONS:
        with problems.collect():
            try:
                OmegaConf.to_object(cfg[section])  # runs each schema's __post_init__ range checks
            except (MissingMandatoryValue, InterpolationResolutionError):
                pass  # a missing value or an interpolation that does not resolve: reported by resolve() below
    resolved = resolve(cfg, problems)
    for section in COMPONENT_SECTIONS:
        if section in resolved:
            check_targets(section, resolved[section], cwd, problems)
    if resolved.get("storage", {}).get("path"):
        resolved["storage"]["path"] = absolute(resolved["storage"]["path"], cwd)
    run = resolved.get("run") or {}
    if run.get("init_from"):
        from hydra_raytrain.recipe.warm_start import locate

        with problems.collect():
            run["init_from"] = locate(run["init_from"], cwd, run["init_optimizer"])
    if any(section not in resolved for section in CROSS_SECTION):  # the checks below read these sections whole
        problems.raise_any()
    from hydra_raytrain.recipe.loaders import per_worker_batch_size

    # Each check below reads several sections: it runs only when they passed their own checks.
    trainer, scaling = resolved["trainer"], resolved["scaling"]
    if not problems.failed("model", "task"):
        with problems.collect():
            check_models_and_optimizers(
                resolved["model"], resolved["optimizer"], resolved["task"], values=not problems.failed("optimizer")
            )
    if not problems.failed("trainer", "dataset", "scaling"):
        with problems.collect():
            check_streamed(resolved["dataset"], trainer, scaling)
    lightning = not problems.failed("task") and is_lightning(resolved["task"]["_target_"])
    if lightning:
        with problems.collect():
            check_lightning(resolved)
    if not problems.failed("trainer", "scaling", "fsdp"):
        with problems.collect():
            check_trainer_switches(trainer, scaling, resolved["fsdp"])
        with problems.collect():
            for world_size in range(
                max(1, scaling["num_workers"]), max(1, scaling["num_workers"], scaling["max_workers"] or 0) + 1
            ):
                per_worker_batch_size(trainer["batch_size"], trainer["batch_size_per_worker"], world_size)
    if rehearse and lightning and not problems.failed("model", "dataset", "task", "trainer", "datamodule"):
        from hydra_raytrain.config.rehearsal import rehearse_lightning

        with problems.collect():
            rehearse_lightning(resolved)
    elif rehearse and not problems.failed("model", "dataset", "task", "trainer", "checkpoint", "logger"):
        from hydra_raytrain.config.rehearsal import rehearse as rehearse_step

        with problems.collect():
            rehearse_step(
                resolved, schedule=not problems.failed("scheduler", "optimizer"), warm_start=not problems.failed("run")
            )
    problems.raise_any()
    return Resolved.from_dict(resolved)


def check_streamed(dataset: dict[str, Any], trainer: dict[str, Any], scaling: dict[str, Any]) -> None:
    """What a dataset that Ray Data streams (``data/streamed.py``) cannot do: FSDP (its validation forwards are
    collectives, and a streamed validation shard's length is known only once read), the device-resident path
    (the data never sits in one worker), Ray Train's local mode (no cluster to read it)."""
    from hydra_raytrain.data import streamed

    if not streamed.streams(dataset["_target_"]):
        return
    refused = [  # key, value, whether it is refused, what is valid
        ("trainer.parallel_strategy", trainer["parallel_strategy"], trainer["parallel_strategy"] == "fsdp", "ddp"),
        ("trainer.data_on_device", trainer["data_on_device"], trainer["data_on_device"] is True, "null or false"),
        ("scaling.num_workers", scaling["num_workers"], scaling["num_workers"] == 0, "1 or more"),
    ]
    for key, value, wrong, valid in refused:
        if wrong:
            problem = f"is not available with a dataset Ray Data streams ({dataset['_target_']})."
            raise ConfigError(key, value, problem, f"{key}={valid}")


# What task=lightning leaves to the module and to lightning.Trainer, or does not map (yet): key, its unset value.
LIGHTNING_UNMAPPED = (
    ("trainer.parallel_strategy", "ddp"),
    ("trainer.augment.random_crop_padding", 0),
    ("trainer.augment.horizontal_flip", False),
    ("trainer.data_on_device", None),
    ("trainer.compile", False),
    ("trainer.channels_last", False),
    ("trainer.profile", False),
    ("trainer.profiler_steps", 0),
    ("trainer.sync_debug_mode", None),
    ("checkpoint.every_n_steps", None),
    ("checkpoint.every_n_minutes", None),
    ("scheduler.warmup_steps", 0),
    ("run.init_from", None),
)


def check_lightning(cfg: dict[str, Any]) -> None:
    """``task=lightning``: the extra is installed; the settings that Lightning runs do not take are unset; a
    dataset Ray Data streams and Ray Train's local mode are refused; ``trainer.lightning_kwargs`` are Trainer's."""
    from hydra_raytrain.data import streamed
    from hydra_raytrain.tasks.lightning import import_lightning

    pl = import_lightning()
    problems = Problems()
    for key, unset in LIGHTNING_UNMAPPED:
        section, *path = key.split(".")
        value = cfg.get(section) or {}
        for name in path:
            value = value.get(name) if isinstance(value, dict) else None
        if value != unset and not (unset is None and value is False):
            problems.add(ConfigError(key, value, "is not available with task=lightning.", f"{key}={_plain(unset)}"))
    if streamed.streams(cfg["dataset"]["_target_"]):
        problems.add(
            ConfigError(
                "dataset",
                cfg["dataset"]["_target_"],
                "is streamed by Ray Data, which task=lightning does not read.",
                "a dataset the workers build (dataset=digits, imagefolder, ...); with a datamodule, leave dataset "
                "at its default (it is not read)",
            )
        )
    if cfg["scaling"]["num_workers"] == 0:
        problems.add(
            ConfigError(
                "scaling.num_workers", 0, "task=lightning runs in Ray Train workers, not local mode.", "1 or more"
            )
        )
    accepted = _keyword_names(pl.Trainer.__init__)
    for name, value in (cfg["trainer"]["lightning_kwargs"] or {}).items():
        key = f"trainer.lightning_kwargs.{name}"
        if name in MAPPED_ARGUMENTS:
            problems.add(ConfigError(key, value, "is set from our settings.", f"set {MAPPED_ARGUMENTS[name]}"))
        elif name in RUNNER_ARGUMENTS:
            problems.add(ConfigError(key, value, f"is the runner's: {RUNNER_ARGUMENTS[name]}.", _open(accepted)))
        elif name not in accepted:
            problems.add(
                ConfigError(
                    key,
                    value,
                    f"is not an argument of lightning.Trainer{did_you_mean(name, accepted)}.",
                    _open(accepted),
                )
            )
    problems.raise_any()


def _open(accepted: list[str]) -> str:
    """lightning.Trainer's arguments that trainer.lightning_kwargs may set."""
    return ", ".join(name for name in accepted if name not in MAPPED_ARGUMENTS and name not in RUNNER_ARGUMENTS)


def _plain(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def check_models_and_optimizers(
    model: dict[str, Any], optimizer: dict[str, Any], task: dict[str, Any], values: bool = True
) -> None:
    """``model`` is one ``_target_`` node, or several named ones (a GAN) for a task that owns its step;
    ``optimizer`` is one node for every model, or one per model name. ``values``: also build each optimizer
    (not when its arguments were already refused)."""
    from hydra_raytrain.tasks.base import Task

    names = sorted(model) if "_target_" not in model else ["model"]
    task_cls = get_object(task["_target_"])
    if len(names) > 1 and getattr(task_cls, "train_batch", None) is Task.train_batch:
        raise ConfigError(
            "model",
            names,
            f"names several models, but {task['_target_']} trains one (it keeps Task.train_batch).",
            "a task that overrides train_batch and steps each model, e.g. task=gan; or one model",
        )
    if "_target_" in optimizer:
        if values:
            check_optimizer_values("optimizer", optimizer)
        return
    if sorted(optimizer) != names:
        raise ConfigError(
            "optimizer",
            sorted(optimizer),
            "names optimizers that do not match the models (one optimizer node for all models, or one per model).",
            f"optimizer.<name> for each of: {', '.join(names)}",
        )
    for name in names if values else []:
        check_optimizer_values(f"optimizer.{name}", optimizer[name])


# How torch.optim words its argument checks, where the message does not use the argument's own name.
_OPTIMIZER_WORDS = {"lr": "learning rate", "eps": "epsilon", "betas": "beta"}


def check_optimizer_values(key: str, node: dict[str, Any]) -> None:
    """torch's own checks of an optimizer's values (lr < 0, a beta outside [0, 1), eps < 0...), run here on one
    dummy parameter as the training loop builds it (``instantiate(node)(parameters)``): a bad value is a config
    error naming its key before any worker starts, not a failure in every worker."""
    import torch
    from hydra.utils import instantiate

    target = get_object(node["_target_"])
    if not (node.get("_partial_") and inspect.isclass(target) and issubclass(target, torch.optim.Optimizer)):
        return
    try:
        instantiate(node)([torch.nn.Parameter(torch.zeros(2, 2))])
    except Exception as error:  # torch.optim raises ValueError for a value out of range, RuntimeError for a combination
        reason = str(error).strip()
        named = [
            name
            for name in node
            if name not in HYDRA_KEYS and (name in reason or _OPTIMIZER_WORDS.get(name, name) in reason)
        ]
        if named:
            raise ConfigError(
                f"{key}.{named[0]}", node[named[0]], f"{node['_target_']} rejects it: {reason}."
            ) from None
        raise ConfigError(key, node["_target_"], f"rejects its arguments: {reason}.") from None


def _keyword_names(function: Callable) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name not in ("self", "model", "module")]


def check_fsdp(trainer: dict[str, Any], fsdp: dict[str, Any], on_gpu: bool) -> None:
    if trainer["parallel_strategy_kwargs"]:
        name = next(iter(trainer["parallel_strategy_kwargs"]))
        raise ConfigError(
            f"trainer.parallel_strategy_kwargs.{name}",
            trainer["parallel_strategy_kwargs"][name],
            "these are DDP's arguments; FSDP's settings are the fsdp section.",
            "fsdp.shard_modules, fsdp.reshard_after_forward, fsdp.cpu_offload",
        )
    if fsdp["cpu_offload"] and not on_gpu:
        raise ConfigError(
            "fsdp.cpu_offload",
            True,
            "moves sharded state from GPU memory to host memory; these workers have no GPU (scaling.use_gpu=false).",
            "scaling.use_gpu=true, or fsdp.cpu_offload=false",
        )


def check_trainer_switches(trainer: dict[str, Any], scaling: dict[str, Any], fsdp: dict[str, Any]) -> None:
    import torch

    on_gpu = scaling["use_gpu"]
    if trainer["parallel_strategy"] == "fsdp":
        check_fsdp(trainer, fsdp, on_gpu)
    accepted = _keyword_names(torch.nn.parallel.DistributedDataParallel.__init__)
    for name, value in (trainer["parallel_strategy_kwargs"] or {}).items():
        if name not in accepted:
            raise ConfigError(
                f"trainer.parallel_strategy_kwargs.{name}",
                value,
                f"DistributedDataParallel has no argument {name!r}{did_you_mean(name, accepted)}.",
                ", ".join(accepted),
            )
    named = trainer["activation_checkpointing_modules"]
    if trainer["activation_checkpointing"] == "full" and not checkpointed_modules(named, fsdp["shard_modules"]):
        raise ConfigError(
            "trainer.activation_checkpointing_modules",
            named,
            "trainer.activation_checkpointing=full needs the module classes whose activations are recomputed"
            + (" (fsdp.shard_modules names none either)." if named is None else "."),
            "e.g. 'trainer.activation_checkpointing_modules=[BasicBlock]' (the model's repeated blocks)",
        )
    accepted = _keyword_names(torch.compile)
    for name, value in (trainer["compile_kwargs"] or {}).items():
        if name not in accepted:
            raise ConfigError(
                f"trainer.compile_kwargs.{name}",
                value,
                f"torch.compile has no argument {name!r}{did_you_mean(name, accepted)}.",
                ", ".join(accepted),
            )
    if trainer["precision"] == "16-mixed" and not on_gpu and not _cpu_supports_fp16_autocast():
        raise ConfigError(
            "trainer.precision",
            "16-mixed",
            f"this torch ({torch.__version__}) has no float16 autocast on CPU.",
            "trainer.precision=bf16-mixed on CPU workers, or scaling.use_gpu=true",
        )


def _cpu_supports_fp16_autocast() -> bool:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autocast("cpu", dtype=torch.float16):
                return torch.is_autocast_enabled("cpu")
        except (RuntimeError, TypeError):
            return False


def resolve(cfg: DictConfig, problems: Problems) -> dict[str, Any]:
    """The config as plain containers, section by section: a missing value (``???``) or an interpolation that
    cannot be resolved is a problem of its own section; the sections that resolve are returned."""
    missing = _missing_keys(cfg)
    for key in missing:
        problems.add(ConfigError(key, "???", "is required and has no value.", f"set it: {key}=VALUE"))
    resolved: dict[str, Any] = {}
    for section in map(str, cfg.keys()):
        try:
            node = cfg[section]
            resolved[section] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except InterpolationResolutionError as error:
            cause = _config_error_cause(error)
            if cause is not None:  # a resolver of ours refused a value (an image folder it infers from)
                if not any(e.detail == cause.detail for e in problems.errors):
                    problems.add(cause)
            elif not (isinstance(error, InterpolationToMissingValueError) and missing):
                reason = (error.msg or str(error)).splitlines()[0]
                problems.add(ConfigError(error.full_key or section, "${...}", f"cannot be resolved: {reason}"))
    return resolved


def _config_error_cause(error: BaseException | None) -> ConfigError | None:
    while error is not None and not isinstance(error, ConfigError):
        error = error.__cause__ or error.__context__
    return error


def _missing_keys(node: Any, prefix: str = "") -> list[str]:
    """Keys set to ``???`` (without resolving interpolations, which would fail on them first)."""
    found = []
    if isinstance(node, DictConfig):
        for key in map(str, node.keys()):
            if OmegaConf.is_missing(node, key):
                found.append(f"{prefix}{key}")
            elif not OmegaConf.is_interpolation(node, key):
                found += _missing_keys(child_node(node, key), f"{prefix}{key}.")
    return found


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
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = [name for name, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    problems = Problems()
    hints = _type_hints(target)
    for name, value in kwargs.items():
        if name not in params and not takes_any:
            problems.add(
                ConfigError(
                    f"{key}.{name}",
                    value,
                    f"{node['_target_']} has no argument {name!r}{did_you_mean(name, accepted)}.",
                    ", ".join(accepted) or "(no arguments)",
                )
            )
        elif name in params and value != "???":  # a missing value is reported as such
            expected = wrong_type(value, hints.get(name), params[name].default)
            if expected:
                default = params[name].default
                example = (
                    f", e.g. {key}.{name}={default}"
                    if default is not inspect.Parameter.empty and default is not None
                    else ""
                )
                problems.add(
                    ConfigError(
                        f"{key}.{name}",
                        value,
                        f"{node['_target_']} takes {expected} for {name!r}, not {type(value).__name__}.",
                        f"{expected}{example}",
                    )
                )
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
