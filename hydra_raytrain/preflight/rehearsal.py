"""A rehearsal of the worker's first step, on the driver, before any worker starts: the dataset, the models, the
task and the loggers are built as a worker builds them, one training and one validation step run on 16 samples
spread over the training split (no optimizer step), and the LR schedule is built and stepped once.

What only building can tell is found here, each as one config error naming its key: a dataset argument its
builder refuses (a fraction out of range, a folder with another layout, ``num_outputs`` that disagrees with the
class folders), a model that does not fit the data or the task (``input_shape``), a schedule its class refuses,
and a metric the task does not report (``trainer.monitor=val_bogus``, early stopping's and the checkpoints'
metric). The builders are the workers' own, so the check cannot drift from what training does. Cost: one build of
the dataset (a scan of an ImageFolder, the bundled sets in milliseconds) and of the models, and a forward pass on
the CPU. The driver never downloads and never builds what it cannot hold: data left to the workers' download,
pretrained weights, models over MAX_REHEARSED_PARAMETERS, and (GPU workers) what fails on the CPU are warned about
and checked when the run starts.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from hydra_raytrain.config.errors import ConfigError, Problems, did_you_mean, one_line
from hydra_raytrain.config.finetuning import FinetuneConfig, PeftConfig
from hydra_raytrain.config.monitor import monitored
from hydra_raytrain.config.resolved import typed
from hydra_raytrain.data import tokenized
from hydra_raytrain.data.packing import check_text_models
from hydra_raytrain.data.streamed import Streamed
from hydra_raytrain.models.zoo import weights_on_disk
from hydra_raytrain.recipe import checkpoint, finetune, warm_start
from hydra_raytrain.recipe.augment import Augment
from hydra_raytrain.recipe.lightning_setup import (
    MODULE_LOADERS,
    check_module,
    import_lightning,
    is_lightning,
    one_device_trainer,
)
from hydra_raytrain.recipe.loaders import collate_of
from hydra_raytrain.recipe.parallel import matching_modules, module_classes
from hydra_raytrain.recipe.step import build_lr_scheduler
from hydra_raytrain.tasks.base import Task
from hydra_raytrain.tasks.lightning import Lightning

# What every epoch's metrics hold besides the task's own train_*/val_* (see recipe/loop.py).
RUNNER_METRICS = (
    "epoch",
    "lr",
    "world_size",
    "samples_per_second",
    "epoch_seconds",
    "param_bytes",
    "optimizer_state_bytes",
)
PROFILE_METRICS = ("time_data", "time_forward", "time_backward", "time_optimizer")


# A model with more parameters is not built on the driver (~1 GiB in float32): it is counted on the meta device.
MAX_REHEARSED_PARAMETERS = 250_000_000
# Samples of the training split the step runs on, spread over it (an ImageFolder is sorted by class).
REHEARSED_SAMPLES = 16
# Arguments that make a model builder download weights: such a model is not built on the driver.
WEIGHT_ARGUMENTS = ("weights", "pretrained")


def rehearse(
    cfg: Mapping[str, Any],
    schedule: bool = True,
    warm_start: bool = True,
    named: Mapping[str, str] | None = None,
    datasets: Datasets | None = None,
) -> set[str] | None:
    """Build and run what a worker would; return the metric names a run reports (None when the step could not be
    rehearsed here, with a warning). Raises ``ConfigError``. ``schedule``: also build the LR schedule (not when the
    optimizer's or the schedule's arguments were refused); ``warm_start``: also load ``run.init_from``'s weights
    (not when that setting was refused). ``datasets``: where the dataset is built (and kept for the run)."""
    on_gpu = cfg["scaling"]["use_gpu"]  # the workers' device is not the driver's CPU: what fails here may work there
    splits, models, task = _build_parts(cfg, on_gpu, datasets)
    if splits is None or models is None:
        return None
    check_module_classes(cfg, models)
    check_finetune(cfg, models)
    check_text_models(cfg["dataset"], splits, models)
    if warm_start and cfg["run"].get("init_from"):
        check_warm_start(cfg, models)
    batch = _augmented(cfg, _spread_samples(getattr(splits, "train", splits)))  # a Streamed has no .train
    model = models if "_target_" not in cfg["model"] else models["model"]
    task.on_setup(lambda: copy.deepcopy(model))  # the rehearsed weights are its starting ones
    try:
        train_sums, val_sums = step_sums(task, model, batch)
    except ConfigError:  # a setting the step itself refuses (task.metrics' top-k beyond the classes)
        raise
    except Exception as error:
        if on_gpu:
            warn(
                f"the model's first step was not rehearsed on the driver's CPU ({type(error).__name__}: {error}); "
                "the metrics that settings name are checked when the run starts."
            )
            return None
        raise _does_not_fit(cfg, batch, error) from None
    if schedule:
        check_lr_scheduler(cfg, next(iter(models.values())))
    try:
        names = {f"val_{name}" for name in task.compute(val_sums)} | {
            f"train_{name}" for name in task.compute(train_sums)
        }
    except Exception as error:  # a metric that needs more than a few samples (recall of an absent class)
        warn(
            f"{cfg['task']['_target_']}.compute failed on {len(_first(batch))} samples "
            f"({type(error).__name__}: {error}); "
            "the metrics that settings name are checked when the run starts."
        )
        return None
    names |= set(RUNNER_METRICS) | (set(PROFILE_METRICS) if cfg["trainer"]["profile"] else set())
    check_monitors(cfg, names, task, allow_any_train=type(task).train_batch is not Task.train_batch, named=named)
    return names


def rehearse_lightning(
    cfg: Mapping[str, Any], named: Mapping[str, str] | None = None, datasets: Datasets | None = None
) -> set[str] | None:
    """``task=lightning``: the module (a LightningModule) and the datamodule are built here. With the dataset
    group's splits, Lightning's ``fast_dev_run`` then runs one training and one validation batch of
    REHEARSED_SAMPLES samples on the driver's CPU (nothing is kept): what the module logs is what the settings
    that name a metric may name. A datamodule prepares its data in the workers (it may download): its run checks
    ``trainer.monitor`` after the first epoch."""
    import logging
    import warnings

    from torch.utils.data import DataLoader, Subset

    pl = import_lightning()
    module = _build("model", cfg["model"], _fits_dataset(cfg["dataset"]))
    check_module("model", cfg["model"]["_target_"], module, pl)
    if cfg["datamodule"]:
        check_module("datamodule", cfg["datamodule"]["_target_"], _build("datamodule", cfg["datamodule"]), pl)
        return None
    loaders: list[Any] = []  # dataset=module: the module's own (one batch each)
    if cfg["dataset"]["_target_"] != MODULE_LOADERS:
        splits = build_dataset(cfg["dataset"], datasets)
        if splits is None:
            return None
        count, parts = min(REHEARSED_SAMPLES, len(splits.train), len(splits.val)), (splits.train, splits.val)
        loaders = [DataLoader(Subset(s, range(count)), count, collate_fn=collate_of(s)) for s in parts]
    levels = {log: log.level for log in map(logging.getLogger, ("lightning.pytorch", "lightning.fabric"))}
    try:
        for log in levels:
            log.setLevel(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = one_device_trainer(pl, fast_dev_run=1, accelerator="cpu")
            trainer.fit(module, *loaders)
    except Exception as error:
        if cfg["scaling"]["use_gpu"]:
            warn(
                f"the module's first step was not rehearsed on the driver's CPU ({type(error).__name__}: {error}); "
                "the metrics that settings name are checked when the run starts."
            )
            return None
        if not loaders:
            raise _failed("model", cfg["model"]["_target_"], error, "a module that trains on its own loaders") from None
        raise _does_not_fit(cfg, next(iter(loaders[0])), error) from None
    finally:
        for log, level in levels.items():
            log.setLevel(level)
    logged = set(trainer.callback_metrics)
    names = logged | set(RUNNER_METRICS[:5]) | {"step"}  # no memory figures
    if not any(name.startswith("val_") for name in logged) and cfg["trainer"]["monitor"] is None:
        # A module that logs no validation metric (Lightning's demo modules log nothing) trains unchanged: its
        # last epoch is the run's best. The driver's config carries the choice to the workers and the summary.
        cfg["trainer"]["monitor"], cfg["trainer"]["monitor_mode"] = "epoch", "max"
        warn(
            f"{cfg['model']['_target_']} logs no validation metric (self.log('val_...')): the run's last epoch is "
            "its best (trainer.monitor=epoch); set trainer.monitor to a metric it logs to pick another."
        )
    check_monitors(cfg, names, Lightning, allow_any_train=False, reporter=cfg["model"]["_target_"], named=named)
    return names


def _build_parts(
    cfg: Mapping[str, Any], on_gpu: bool, datasets: Datasets | None
) -> tuple[Any, dict[str, Any] | None, Any]:
    """The dataset's splits (None when its files are not on the driver and the workers download them), the models
    by name (None when not built here, with a warning) and the task."""
    problems = Problems()
    splits = models = task = None
    with problems.collect():
        splits = build_dataset(cfg["dataset"], datasets)
    # The models are built from dataset.input_shape / num_outputs: when the dataset refused those, their failure
    # would only repeat the problem.
    if not any(error.key in ("dataset.input_shape", "dataset.num_outputs") for error in problems.errors):
        with problems.collect():
            models = _build_models(cfg, on_gpu)
    with problems.collect():
        task = _build("task", cfg["task"])
    for section in ("logger", "callbacks"):  # built only: a tracker starts its run in the worker
        for name, node in (cfg.get(section) or {}).items():
            with problems.collect():
                _build(f"{section}.{name}", node)
    problems.raise_any()
    return splits, models, task


class Datasets:
    """The datasets the checks built, by their node, held by whoever plans (a run, a sweep) and handed down: a run
    trains on the stream its rehearsal built, a sweep's trials share the one they name. The last one only."""

    def __init__(self) -> None:
        self.built: dict[str, Any] = {}

    def build(self, node: Mapping[str, Any]) -> Any:
        """The splits, built as a worker builds them but never downloading: a dataset whose files are not here
        while ``download`` is true is left to the workers (None, with a warning)."""
        key = json.dumps(node, sort_keys=True, default=str)
        if key not in self.built:
            splits = _built_here(node)
            if splits is None:
                return None
            self.built = {key: splits}
        return self.built[key]


def build_dataset(node: Mapping[str, Any], datasets: Datasets | None = None) -> Any:
    """The dataset of ``node`` (``Datasets.build``), from ``datasets`` when it holds it."""
    return (datasets or Datasets()).build(node)


def _built_here(node: Mapping[str, Any]) -> Any:
    local = {**node, "download": False} if node.get("download") else dict(node)
    if tokenized.is_text(node):  # its first rows: the run's Ray Data tokenizes them all (data/tokenized_ray.py)
        local["sample"] = tokenized.CHECKED_ROWS
    try:
        splits = _build("dataset", local)
    except ConfigError as error:
        if node.get("download") and error.key == "dataset.root":
            warn(
                f"dataset.root={node.get('root')}: no data on the driver, and the workers download it "
                "(dataset.download=true): the dataset, the models' fit to it and the metrics are checked "
                "when they do."
            )
            return None
        raise
    if isinstance(splits, Streamed):
        counts = splits.rows
    else:  # a test split only where one was asked for
        counts = {s: len(getattr(splits, s)) for s in ("train", "val", "test") if getattr(splits, s) is not None}
    for split in counts:
        if counts[split] == 0:
            raise ConfigError(
                "dataset", node["_target_"], f"its {split} split is empty.", "a dataset with samples in both splits"
            )
    return splits


def _build_models(cfg: Mapping[str, Any], on_gpu: bool) -> dict[str, Any] | None:
    several = "_target_" not in cfg["model"]  # a task with several models (a GAN) names them
    specs = dict(cfg["model"]) if several else {"model": cfg["model"]}
    keys = {name: f"model.{name}" if several else "model" for name in specs}
    # A zoo model's weights: refused here when neither cached nor reachable; built here when cached.
    downloads = [
        keys[name]
        for name, spec in specs.items()
        if any(spec.get(arg) for arg in WEIGHT_ARGUMENTS) and not weights_on_disk(spec)
    ]
    if downloads:
        warn(
            f"{', '.join(downloads)}: pretrained weights are loaded by the workers, not on the driver; the model's fit "
            "to the data and the metrics that settings name are checked when the run starts."
        )
        return None
    large = {
        keys[name]: count
        for name, count in ((name, _parameter_count(spec)) for name, spec in specs.items())
        if count > MAX_REHEARSED_PARAMETERS
    }
    if large:
        warn(
            f"{', '.join(f'{key} has {count:,} parameters' for key, count in large.items())}: not built on the "
            "driver; its fit to the data and the metrics that settings name are checked when the run starts."
        )
        return None
    fits = _fits_dataset(cfg["dataset"])
    try:
        peft = typed(PeftConfig, cfg.get("peft") or {})
        return {name: finetune.add_adapters(_build(keys[name], spec, fits), peft) for name, spec in specs.items()}
    except ConfigError as error:
        if on_gpu and "building it on the driver failed" in error.problem:  # a model that builds on GPUs only
            warn(f"{error.key} was not built on the driver's CPU ({error.problem}); it is built on the workers' GPUs.")
            return None
        raise


def step_sums(task: Any, model: Any, batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sums of one training step (train mode, gradients on: a loss may differentiate) and one validation
    step (eval mode, no gradients) on ``batch``; nothing is optimised."""
    import torch

    modules = list(model.values()) if isinstance(model, dict) else [model]
    for module in modules:
        module.eval()
    task.on_validation_start()  # as on a split scored after training: every metric the task has
    with torch.no_grad():
        val_sums = train_sums = task.validation_step(model, batch)
    ended = task.on_validation_end()
    if type(task).train_batch is Task.train_batch:  # the default step: training_step's sums are the train metrics
        for module in modules:
            module.train()
        train_sums = task.training_step(model, batch).sums
    return _floats(train_sums), {**_floats(val_sums), **ended}


def _parameter_count(spec: Mapping[str, Any]) -> int:
    """Parameters of the model ``spec`` builds, counted on the meta device (no memory); 0 when it cannot be built
    there (the real build then reports the problem). Pretrained weights are left out: the count is the same."""
    import torch
    from hydra.utils import instantiate

    unweighted = {key: value for key, value in spec.items() if key not in WEIGHT_ARGUMENTS}
    try:
        with torch.device("meta"):
            return sum(p.numel() for p in instantiate(unweighted, _convert_="all").parameters())
    except Exception:
        return 0


def warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


def check_module_classes(cfg: Mapping[str, Any], models: dict[str, Any]) -> None:
    """The module classes that FSDP shards and activation checkpointing recomputes: each in some model."""
    trainer, recomputed = cfg["trainer"], cfg["trainer"]["activation_checkpointing_modules"]
    full = trainer["activation_checkpointing"] == "full"
    named = {}
    if trainer["parallel_strategy"] == "fsdp" or (full and recomputed is None):
        named["fsdp.shard_modules"] = cfg["fsdp"]["shard_modules"]
    if full and recomputed is not None:
        named["trainer.activation_checkpointing_modules"] = recomputed
    for key, names in named.items():
        for name in names:
            if not any(matching_modules(model, [name]) for model in models.values()):
                classes = sorted({c for model in models.values() for c in module_classes(model)})
                raise ConfigError(
                    key,
                    name,
                    f"no submodule of the model is a {name}{did_you_mean(name, classes)}.",
                    ", ".join(classes),
                )


def check_warm_start(cfg: Mapping[str, Any], models: dict[str, Any]) -> None:
    """``run.init_from``'s weights loaded into the rehearsed models, as the workers load them: what does not fit
    is named here, key by key, before any worker starts."""
    run, several = cfg["run"], "_target_" not in cfg["model"]
    if warm_start.starts_built(cfg["peft"]["method"], run["init_from"], run.get("init_full_state", False)):
        if run.get("init_optimizer"):
            raise ConfigError(
                "run.init_optimizer", True, f"peft={cfg['peft']['method']} trains new adapters on run.init_from's "
                "weights: no optimizer state of the source fits them.", "run.init_optimizer=false",
            )  # fmt: skip
        warm_start.starting_model(cfg["model"], run["init_from"])  # its weights fit the model, or refused by name
        return
    saved = checkpoint.unpack_models(warm_start.read(run["init_from"], False)["model"], several)
    warm_start.check_fit(models, saved, run["init_from"], run["init_from_strict"])


def check_finetune(cfg: Mapping[str, Any], models: dict[str, Any]) -> None:
    """``finetune``'s patterns name modules of the built model(s), something still trains, and the optimizer takes
    each group's settings; the models are then frozen as the workers freeze them (the rehearsed step runs so)."""
    settings = typed(FinetuneConfig, cfg.get("finetune") or {})
    if not (settings.freeze or settings.param_groups):
        return
    finetune.check_patterns(models, settings)
    optimizers = cfg["optimizer"] if "_target_" not in cfg["optimizer"] else dict.fromkeys(models, cfg["optimizer"])
    for name, model in models.items():
        finetune.freeze(model, settings.freeze)
        target = optimizers[name]["_target_"]
        try:
            optimizer = finetune.build_optimizer(optimizers[name], model, settings)
        except Exception as error:
            valid = f"settings that {target} takes in a param group (lr, weight_decay, ...)"
            raise _failed("finetune.param_groups", settings.param_groups, error, valid) from None
        finetune.check_group_settings(settings.param_groups, optimizer.defaults, target)


def check_lr_scheduler(cfg: Mapping[str, Any], model: Any) -> None:
    """The LR schedule built on an optimizer of the first model, as the loop builds it, and stepped once: a value
    only the scheduler judges (StepLR's step_size=0 divides by it at its first step) fails here, naming the key."""
    import warnings

    from hydra.utils import instantiate

    node = cfg["scheduler"]["lr_scheduler"]
    if node is None:
        return
    optimizer_node = cfg["optimizer"] if "_target_" in cfg["optimizer"] else next(iter(cfg["optimizer"].values()))
    try:
        optimizer = instantiate(optimizer_node)(model.parameters())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build_lr_scheduler(node, optimizer, steps_per_epoch=1).step()
    except Exception as error:
        raise _failed("scheduler.lr_scheduler", node["_target_"], error) from None


def check_monitors(
    cfg: Mapping[str, Any],
    names: set[str],
    task: Any,
    allow_any_train: bool,
    reporter: str | None = None,
    named: Mapping[str, str] | None = None,
) -> None:
    """Every setting that names a metric names one the run reports. A task with its own ``train_batch`` may report
    train metrics its validation step does not: any ``train_*`` name is accepted there. ``reporter``: what reports
    the metrics (default: the task); ``named``: settings from outside the config (a sweep's metric)."""
    trainer, checkpoint = cfg["trainer"], cfg["checkpoint"]
    monitor, _ = monitored(task, (trainer["monitor"], trainer["monitor_mode"]))  # the task's default must exist too
    settings = {
        "trainer.monitor": monitor,
        "trainer.early_stopping.monitor": trainer["early_stopping"]["monitor"],
        "checkpoint.checkpoint_score_attribute": checkpoint["checkpoint_score_attribute"],
        **(named or {}),
    }
    problems = Problems()
    for key, metric in settings.items():
        if metric and metric not in names and not (allow_any_train and metric.startswith("train_")):
            problems.add(
                ConfigError(
                    key,
                    metric,
                    f"{reporter or cfg['task']['_target_']} does not report this metric{did_you_mean(metric, names)}.",
                    ", ".join(sorted(names)),
                )
            )
    score, every_n = checkpoint["checkpoint_score_attribute"], checkpoint["every_n_epochs"]
    n = reported_every(task, score)
    if every_n % n:
        problems.add(
            ConfigError(
                "checkpoint.every_n_epochs",
                every_n,
                f"the checkpoints are ordered by {score}, which the task "
                f"reports every {n} epochs only: a checkpoint of another epoch would have no score.",
                f"a multiple of {n}, or checkpoint.checkpoint_score_attribute of a metric reported every epoch",
            )  # fmt: skip
        )
    problems.raise_any()


def reported_every(task: Any, metric: str | None) -> int:
    """How many epochs apart ``task`` (an instance) reports ``metric`` (``val_``/``test_`` aside): 1, every epoch,
    unless it is among the task's ``occasional`` metrics."""
    names, n = getattr(task, "occasional", Task.occasional)
    return n if metric and metric.split("_", 1)[-1] in names else 1


def check_every_epoch(metric: str, tasks: Sequence[Mapping[str, Any]]) -> None:
    """Tune reads a sweep's metric in every epoch's result: one the trials' tasks (their config nodes) report on some
    epochs only is refused."""
    from hydra.utils import instantiate

    for node in tasks:
        n = 1 if is_lightning(node["_target_"]) else reported_every(instantiate(node), metric)
        if n > 1:
            raise ConfigError(
                "task.eval_generation_every", n, f"the sweep's metric {metric} is reported every {n} epochs only: "
                "Tune reads it in every epoch's result.", "1, or a hydra.sweeper.metric reported every epoch",
            )  # fmt: skip


def _build(key: str, node: Mapping[str, Any], valid: str | None = None) -> Any:
    """``instantiate(node)`` as a worker calls it; the builder's own ConfigError passes through, anything else it
    raises becomes one naming ``key`` and the target."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as error:
        cause = error.__cause__ or error
        if isinstance(cause, ConfigError):
            raise cause from None
        raise _failed(key, node["_target_"], cause, valid) from None
    except ConfigError:
        raise
    except Exception as error:
        raise _failed(key, node["_target_"], error, valid) from None


def _failed(key: str, target: str, error: BaseException, valid: str | None = None) -> ConfigError:
    return ConfigError(
        key,
        target,
        f"building it on the driver failed: {type(error).__name__}: {one_line(error)}",
        valid or f"arguments that {target} accepts",
    )


def _fits_dataset(dataset: Mapping[str, Any]) -> str:
    return (
        f"model settings that fit dataset.input_shape={dataset.get('input_shape')} and "
        f"dataset.num_outputs={dataset.get('num_outputs')}"
    )


def _augmented(cfg: Mapping[str, Any], batch: Any) -> Any:
    """``batch`` as ``trainer.augment`` hands it to the step (a ConfigError when the batch holds no images)."""
    import torch

    settings = cfg["trainer"]["augment"]
    augment = Augment(settings["random_crop_padding"], settings["horizontal_flip"], cfg["trainer"]["seed"])
    return augment(batch, 0, torch.arange(len(_first(batch)))) if augment.enabled else batch


def _spread_samples(dataset: Any) -> Any:
    """Up to REHEARSED_SAMPLES samples spread evenly over ``dataset``, collated as a DataLoader collates them."""
    from torch.utils.data import default_collate

    if isinstance(dataset, Streamed):  # read here, decoded as Ray Data's tasks decode
        return dataset.sample(REHEARSED_SAMPLES)
    count = min(REHEARSED_SAMPLES, len(dataset))
    indices = sorted({round(i * (len(dataset) - 1) / max(1, count - 1)) for i in range(count)})
    try:
        return (collate_of(dataset) or default_collate)([dataset[index] for index in indices])
    except Exception as error:
        raise ConfigError(
            "dataset",
            "",
            f"its samples could not be loaded and collated: {type(error).__name__}: {error}",
            "a dataset whose items torch's default_collate batches (tensors, numbers, or tuples / dicts of them)",
        ) from None


def _first(batch: Any) -> Any:
    return batch[0] if isinstance(batch, (list, tuple)) else batch


def _floats(sums: Mapping[str, Any]) -> dict[str, Any]:
    """Sums as the runner's totals hold them: a float per scalar, a CPU tensor per larger one (task.metrics')."""
    return {name: float(value) if not value.dim() else value.detach().double().cpu() for name, value in sums.items()}


def _does_not_fit(cfg: Mapping[str, Any], batch: Any, error: BaseException) -> ConfigError:
    return ConfigError(
        "model",
        cfg["model"].get("_target_", "the models"),
        f"does not fit the data or the task: one step on {len(_first(batch))} samples of {cfg['dataset']['_target_']} "
        f"(batch shapes {_shapes(batch)}) failed: {type(error).__name__}: {one_line(error)}",
        _fits_dataset(cfg["dataset"]),
    )


def _shapes(batch: Any) -> list[Any]:
    items = batch if isinstance(batch, (list, tuple)) else [batch]
    return [list(item.shape) if hasattr(item, "shape") else type(item).__name__ for item in items]
