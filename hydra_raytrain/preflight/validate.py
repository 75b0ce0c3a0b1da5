"""Everything that can be checked on the driver, checked before any worker starts.

``validate(cfg, cwd)`` returns the config resolved to a plain dict with absolute paths: what workers receive
(they run in Ray's session folder, where relative paths and ``${hydra:...}`` mean nothing).

First each section alone (the schema's range checks, every ``_target_`` and its arguments: ``targets.py``), then
``CHECKS``: the checks that read several sections, each run in one loop when the sections it needs passed their
own; the rehearsal of a validation step (``rehearsal.py``) comes last.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, InterpolationToMissingValueError, MissingMandatoryValue

from hydra_raytrain.config.errors import ConfigError, Problems, did_you_mean
from hydra_raytrain.config.resolved import Resolved, typed
from hydra_raytrain.config.schema import (
    TYPED_SECTIONS,
    FSDPConfig,
    ScalingConfig,
    TrainerConfig,
    checkpointed_modules,
    cluster_address,
)
from hydra_raytrain.data import roads
from hydra_raytrain.data.text_labels import check_reference, check_text_task
from hydra_raytrain.data.tokenized import embed_chat_template
from hydra_raytrain.preflight import rehearsal
from hydra_raytrain.preflight.targets import HYDRA_KEYS, absolute, check_targets
from hydra_raytrain.recipe.lightning_setup import (
    MAPPED_ARGUMENTS,
    MODULE_LOADERS,
    RUNNER_ARGUMENTS,
    brings_loaders,
    import_lightning,
    is_lightning,
)
from hydra_raytrain.recipe.loaders import per_worker_batch_size
from hydra_raytrain.recipe.warm_start import locate as locate_warm_start
from hydra_raytrain.runtime.internals import child_node
from hydra_raytrain.tasks.base import Task

# The free-form component nodes, each a `_target_` node (or a tree holding some).
COMPONENT_SECTIONS = ("model", "dataset", "optimizer", "task", "scheduler", "logger", "callbacks", "datamodule")
CROSS_SECTION = ("model", "dataset", "optimizer", "task", "trainer", "fsdp", "scaling", "checkpoint")


@dataclass
class Sections:
    """The resolved config as a check across sections reads it: the framework's sections typed by the schema (a
    check runs only when the sections it needs passed their own checks), the components as their plain nodes,
    which sections failed, and whether the step is rehearsed. Each typed view is built once, when first read."""

    plain: dict[str, Any]
    problems: Problems
    rehearse: bool
    named: Mapping[str, str]  # settings from outside the config that name a metric (a sweep's metric)
    datasets: rehearsal.Datasets  # where the rehearsal builds the dataset, kept for whoever plans the run

    @functools.cached_property
    def trainer(self) -> TrainerConfig:
        return typed(TrainerConfig, self.plain["trainer"])

    @functools.cached_property
    def scaling(self) -> ScalingConfig:
        return typed(ScalingConfig, self.plain["scaling"])

    @functools.cached_property
    def fsdp(self) -> FSDPConfig:
        return typed(FSDPConfig, self.plain["fsdp"])

    @functools.cached_property
    def lightning(self) -> bool:
        """Whether the task is Lightning's (read by checks that need the task section)."""
        return is_lightning(self.plain["task"]["_target_"])


@dataclass(frozen=True)
class Check:
    """A check that reads several sections: it runs when every section it ``needs`` passed its own checks and it
    ``applies`` to the config (and to whether the step is rehearsed)."""

    needs: tuple[str, ...]
    run: Callable[[Sections], object]
    applies: Callable[[Sections], bool] = lambda cfg: True


def validate(
    cfg: DictConfig,
    cwd: str,
    rehearse: bool = True,
    named: Mapping[str, str] | None = None,
    datasets: rehearsal.Datasets | None = None,
) -> Resolved:
    """Every check that can run on the driver, each independent one run even when another failed: the error
    (``ConfigErrors`` when there are several) lists every problem found. The last check, only for a config
    that passed the others, rehearses one validation step on the driver (``rehearsal.rehearse``); the metrics
    that ``named`` settings name (``{"hydra.sweeper.metric": "val_loss"}``) must be among those it reports; the
    dataset it builds is kept in ``datasets`` (the caller's: a run's plan, a sweep)."""
    problems = Problems()
    resolved = check_sections(cfg, cwd, problems)
    if any(section not in resolved for section in CROSS_SECTION):  # the checks below read these sections whole
        problems.raise_any()
    sections = Sections(resolved, problems, rehearse, named or {}, datasets or rehearsal.Datasets())
    for check in CHECKS:
        if not problems.failed(*check.needs) and check.applies(sections):
            with problems.collect():
                check.run(sections)
    problems.raise_any()
    return Resolved.from_dict(resolved)


def check_sections(cfg: DictConfig, cwd: str, problems: Problems) -> dict[str, Any]:
    """Each section on its own: the schema's range checks, values that resolve, every ``_target_`` and its
    arguments; paths made absolute. Returns the sections that resolve, as plain containers."""
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
    if "ray" in resolved:  # Ray's convention: RAY_ADDRESS names the cluster when ray.address does not
        resolved["ray"]["address"] = cluster_address(resolved["ray"].get("address"), os.environ)
    if resolved.get("storage", {}).get("path"):
        resolved["storage"]["path"] = absolute(resolved["storage"]["path"], cwd)
    if isinstance(resolved.get("dataset"), dict):  # a chat template's file: its text, what every node renders with
        with problems.collect():
            embed_chat_template(resolved["dataset"], cwd)
    run = resolved.get("run") or {}
    if run.get("init_from"):
        with problems.collect():
            run["init_from"] = locate_warm_start(
                run["init_from"], cwd, run["init_optimizer"], run.get("init_full_state", False)
            )
    return resolved


def _models_and_optimizers(cfg: Sections) -> None:
    values = not cfg.problems.failed("optimizer")  # each optimizer is built only when its arguments passed
    check_models_and_optimizers(cfg.plain["model"], cfg.plain["optimizer"], cfg.plain["task"], values=values)


def _trainer(cfg: Sections) -> None:
    """The trainer's switches and the batch split: each reported, even when the other fails."""
    with cfg.problems.collect():
        check_trainer_switches(cfg.trainer, cfg.scaling, cfg.fsdp)
    check_batch_split(cfg.trainer, cfg.scaling)


def check_batch_split(trainer: TrainerConfig, scaling: ScalingConfig) -> None:
    """The batch splits evenly over every worker count the run may have (an elastic run's too)."""
    smallest = max(1, scaling.num_workers)
    for world_size in range(smallest, max(smallest, scaling.max_workers or 0) + 1):
        per_worker_batch_size(trainer.batch_size, trainer.batch_size_per_worker, world_size)


def _rehearse_step(cfg: Sections) -> None:
    schedule, warm_start = not cfg.problems.failed("scheduler", "optimizer"), not cfg.problems.failed("run")
    rehearsal.rehearse(cfg.plain, schedule=schedule, warm_start=warm_start, named=cfg.named, datasets=cfg.datasets)


CHECKS = (
    Check(("dataset", "task"), lambda cfg: check_text_task(cfg.plain["dataset"], cfg.plain["task"])),
    Check(
        ("model", "task", "peft", "run"),
        lambda cfg: check_reference(
            cfg.plain["task"], cfg.plain["model"], cfg.plain["peft"]["method"], cfg.plain["run"].get("init_from")
        ),
    ),
    Check(("model", "task"), _models_and_optimizers),
    Check(
        ("trainer", "dataset", "scaling"), lambda cfg: check_streamed(cfg.plain["dataset"], cfg.trainer, cfg.scaling)
    ),
    Check(("task",), lambda cfg: check_lightning(cfg.plain), applies=lambda cfg: cfg.lightning),
    Check(("trainer", "scaling", "fsdp"), _trainer),
    Check(
        ("model", "dataset", "task", "trainer", "datamodule"),
        lambda cfg: rehearsal.rehearse_lightning(cfg.plain, named=cfg.named, datasets=cfg.datasets),
        applies=lambda cfg: cfg.rehearse and cfg.lightning,
    ),
    Check(
        ("model", "dataset", "task", "trainer", "checkpoint", "logger", "callbacks", "finetune"),
        _rehearse_step,
        applies=lambda cfg: cfg.rehearse and not cfg.lightning,
    ),
)


def check_streamed(dataset: dict[str, Any], trainer: TrainerConfig, scaling: ScalingConfig) -> None:
    """What a dataset that Ray Data streams (``data/streamed.py``) cannot do: FSDP (its validation forwards are
    collectives, and a streamed validation shard's length is known only once read), the device-resident path
    (the data never sits in one worker), Ray Train's local mode (no cluster to read it)."""
    if not roads.streams(dataset):
        return
    refused = [  # key, value, whether it is refused, what is valid
        ("trainer.parallel_strategy", trainer.parallel_strategy, trainer.parallel_strategy == "fsdp", "ddp"),
        ("trainer.data_on_device", trainer.data_on_device, trainer.data_on_device is True, "null or false"),
        ("scaling.num_workers", scaling.num_workers, scaling.num_workers == 0, "1 or more"),
    ]
    for key, value, wrong, valid in refused:
        if wrong:
            problem = f"is not available with a dataset Ray Data streams ({dataset['_target_']})."
            raise ConfigError(key, value, problem, f"{key}={valid}")


# What task=lightning leaves to the module and to lightning.Trainer, or does not map (yet): key, its unset value.
LIGHTNING_UNMAPPED: tuple[tuple[str, Any], ...] = (
    ("trainer.parallel_strategy", "ddp"),
    ("trainer.augment.random_crop_padding", 0),
    ("trainer.augment.horizontal_flip", False),
    ("trainer.data_on_device", None),
    ("trainer.compile", False),
    ("trainer.channels_last", False),
    ("trainer.profile", False),
    ("trainer.profiler_steps", 0),
    ("trainer.sync_debug_mode", None),
    ("trainer.ema.decay", None),
    ("checkpoint.every_n_steps", None),
    ("checkpoint.every_n_minutes", None),
    ("scheduler.warmup_steps", 0),
    ("run.init_from", None),
    ("finetune.freeze", []),  # a LightningModule's configure_optimizers says what trains
    ("finetune.param_groups", []),
)


def check_lightning(cfg: dict[str, Any]) -> None:
    """``task=lightning``: the extra is installed; the settings that Lightning runs do not take are unset; a
    dataset Ray Data streams and Ray Train's local mode are refused; ``trainer.lightning_kwargs`` are Trainer's."""
    pl = import_lightning()
    problems = Problems()
    for key, unset in LIGHTNING_UNMAPPED:
        section, *path = key.split(".")
        value = cfg.get(section) or {}
        for name in path:
            value = value.get(name) if isinstance(value, dict) else None
        if value != unset and not (unset is None and value is False):
            problems.add(ConfigError(key, value, "is not available with task=lightning.", f"{key}={_plain(unset)}"))
    if cfg.get("callbacks"):
        problems.add(
            ConfigError(
                "callbacks",
                ",".join(cfg["callbacks"]),
                "run in the framework's loop, not in lightning.Trainer's.",
                "callbacks=none; a LightningModule's own callbacks come from its configure_callbacks()",
            )
        )
    with problems.collect():
        check_lightning_data(cfg)
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


def check_lightning_data(cfg: dict[str, Any]) -> None:
    """What cannot feed a LightningModule: a dataset Ray Data streams; ``dataset=module`` for a module without
    loaders of its own."""
    target = cfg["dataset"]["_target_"]
    if roads.streams(cfg["dataset"]):
        raise ConfigError(
            "dataset",
            target,
            "is streamed by Ray Data, which task=lightning does not read.",
            "a dataset the workers build (dataset=digits, imagefolder, ...); with a datamodule, leave dataset "
            "at its default (it is not read)",
        )
    if target == MODULE_LOADERS and not brings_loaders(cfg["model"]["_target_"]):
        raise ConfigError(
            "dataset",
            "module",
            f"{cfg['model']['_target_']} defines no train_dataloader to feed it.",
            "a module with train_dataloader/val_dataloader, a dataset option (dataset=digits, ...), or a datamodule",
        )


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
EMPTY_PARAMETERS = "optimizer got an empty parameter list"  # torch.optim.Optimizer's, once the values are checked


def check_optimizer_values(key: str, node: dict[str, Any]) -> None:
    """torch's own checks of an optimizer's values (lr < 0, a beta outside [0, 1), eps < 0...), run here as the
    training loop builds it (``instantiate(node)(parameters)``): a bad value is a config error naming its key before
    any worker starts, not a failure in every worker. torch.optim's own optimizers check their values before they
    take a parameter, so they get none (a parameter would import torch._dynamo, over a second of the driver's
    start; what they check after it, ``fused`` with ``foreach`` or ``differentiable``, is then the workers' error);
    any other optimizer gets one dummy parameter."""
    target = get_object(node["_target_"])
    if not (node.get("_partial_") and inspect.isclass(target) and issubclass(target, torch.optim.Optimizer)):
        return
    torch_own = target.__module__.startswith("torch.optim.")
    if node.get("fused"):  # torch checks these at its first parameter: here, with the way out (adamw's fused: true)
        for other in ("foreach", "differentiable"):
            if node.get(other):
                raise ConfigError(
                    f"{key}.{other}", node[other], f"{node['_target_']} takes it only without {key}.fused: "
                    f"add {key}.fused=null (or set {key}.{other}=false)."
                )  # fmt: skip
    try:
        instantiate(node)([] if torch_own else [torch.nn.Parameter(torch.zeros(2, 2))])
    except Exception as error:  # torch.optim raises ValueError for a value out of range, RuntimeError for a combination
        reason = str(error).strip()
        if torch_own and isinstance(error, ValueError) and EMPTY_PARAMETERS in reason:  # every value passed
            return
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


def check_fsdp(trainer: TrainerConfig, fsdp: FSDPConfig, on_gpu: bool) -> None:
    if trainer.parallel_strategy_kwargs:
        name = next(iter(trainer.parallel_strategy_kwargs))
        raise ConfigError(
            f"trainer.parallel_strategy_kwargs.{name}",
            trainer.parallel_strategy_kwargs[name],
            "these are DDP's arguments; FSDP's settings are the fsdp section.",
            "fsdp.shard_modules, fsdp.reshard_after_forward, fsdp.cpu_offload",
        )
    if fsdp.cpu_offload and not on_gpu:
        raise ConfigError(
            "fsdp.cpu_offload",
            True,
            "moves sharded state from GPU memory to host memory; these workers have no GPU (scaling.use_gpu=false).",
            "scaling.use_gpu=true, or fsdp.cpu_offload=false",
        )


def check_trainer_switches(trainer: TrainerConfig, scaling: ScalingConfig, fsdp: FSDPConfig) -> None:
    on_gpu = scaling.use_gpu
    if trainer.parallel_strategy == "fsdp":
        check_fsdp(trainer, fsdp, on_gpu)
    ddp = torch.nn.parallel.DistributedDataParallel
    _check_keywords("trainer.parallel_strategy_kwargs", trainer.parallel_strategy_kwargs, ddp.__init__, ddp)
    named = trainer.activation_checkpointing_modules
    if trainer.activation_checkpointing == "full" and not checkpointed_modules(named, fsdp.shard_modules):
        raise ConfigError(
            "trainer.activation_checkpointing_modules",
            named,
            "trainer.activation_checkpointing=full needs the module classes whose activations are recomputed"
            + (" (fsdp.shard_modules names none either)." if named is None else "."),
            "e.g. 'trainer.activation_checkpointing_modules=[BasicBlock]' (the model's repeated blocks)",
        )
    _check_keywords("trainer.compile_kwargs", trainer.compile_kwargs, torch.compile, torch.compile, "torch.")
    if trainer.precision == "16-mixed" and not on_gpu and not _cpu_supports_fp16_autocast():
        raise ConfigError(
            "trainer.precision",
            "16-mixed",
            f"this torch ({torch.__version__}) has no float16 autocast on CPU.",
            "trainer.precision=bf16-mixed on CPU workers, or scaling.use_gpu=true",
        )


def _check_keywords(key: str, kwargs: dict[str, Any] | None, function: Callable, named: Any, prefix: str = "") -> None:
    """``key``'s entries are keyword arguments of ``function`` (``named``: what the message calls it)."""
    accepted = _keyword_names(function)
    for name, value in (kwargs or {}).items():
        if name not in accepted:
            raise ConfigError(
                f"{key}.{name}",
                value,
                f"{prefix}{named.__name__} has no argument {name!r}{did_you_mean(name, accepted)}.",
                ", ".join(accepted),
            )


def _cpu_supports_fp16_autocast() -> bool:
    import warnings

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
