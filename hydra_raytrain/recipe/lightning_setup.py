"""Lightning's side of a ``task=lightning`` run that the driver needs before it knows Lightning is installed: the
install line of the extra, which ``lightning.Trainer`` arguments are ours, whether a config's task is Lightning's,
the class checks and a one-device Trainer. Nothing of Lightning is imported here (``recipe/lightning.py``, the
workers' loop, imports it on load).
"""

from __future__ import annotations

import importlib
import inspect
import tempfile
from typing import Any

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.tasks.lightning import Lightning

EXTRA = "pip install 'hydra_raytrain[lightning]'"

# lightning.Trainer's arguments that trainer.lightning_kwargs may not set: those our settings map onto (the key
# to set instead), and those the runner decides (why).
MAPPED_ARGUMENTS = {
    "max_epochs": "trainer.max_epochs",
    "precision": "trainer.precision",
    "accumulate_grad_batches": "trainer.accumulate_grad_batches",
    "gradient_clip_val": "trainer.gradient_clip_val",
    "limit_train_batches": "trainer.limit_train_batches",
    "limit_val_batches": "trainer.limit_val_batches",
    "deterministic": "trainer.deterministic",
    "enable_progress_bar": "trainer.progress_bar",
    "accelerator": "scaling.use_gpu",
    "devices": "scaling.num_workers (each worker drives its own device)",
}
RUNNER_ARGUMENTS = {
    "strategy": "Ray's RayDDPStrategy runs the workers",
    "plugins": "Ray's RayLightningEnvironment runs the workers",
    "logger": "the logger group logs each epoch",
    "enable_checkpointing": "checkpoints go to Ray storage at epoch ends",
    "callbacks": "the runner's callbacks report and checkpoint each epoch",
    "use_distributed_sampler": "the dataset group's loaders are sharded already; a datamodule's get Lightning's",
    "check_val_every_n_epoch": "every epoch's report holds that epoch's validation",
    "max_steps": "runs end on epochs (trainer.max_epochs)",
    "min_steps": "runs end on epochs (trainer.max_epochs)",
    "min_epochs": "early stopping is trainer.early_stopping",
    "max_time": "runs end on epochs (trainer.max_epochs)",
    "fast_dev_run": "the driver rehearses the module so already",
}


def is_lightning(task_target: str) -> bool:
    """Whether a task node's ``_target_`` is this task (the runner then trains with Lightning)."""
    from hydra.utils import get_object

    try:
        task = get_object(task_target)
    except Exception:
        return False
    return isinstance(task, type) and issubclass(task, Lightning)


# dataset=module: the LightningModule's own train_dataloader/val_dataloader feed it (conf/dataset/module.yaml).
MODULE_LOADERS = "hydra_raytrain.data.module_loaders"


def brings_loaders(target: Any) -> bool:
    """Whether a LightningModule class (``model._target_``) defines its own ``train_dataloader``: a class of its
    own line does, before Lightning's ``LightningModule`` (whose hook only raises). Lightning is not imported."""
    from hydra.utils import get_object

    try:
        cls = get_object(str(target))
    except Exception:
        return False
    if not inspect.isclass(cls):
        return False
    for klass in cls.__mro__:
        if klass.__name__ == "LightningModule" and klass.__module__.startswith(("lightning.", "pytorch_lightning.")):
            return False
        if "train_dataloader" in vars(klass):
            return True
    return False


def import_lightning() -> Any:
    """``lightning.pytorch``, or a ConfigError naming the extra that installs it."""
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError as error:
        raise ConfigError(
            "task",
            "lightning",
            f"needs the lightning package, which is not installed ({error}).",
            f"install the extra: {EXTRA}",
        ) from None


def check_module(key: str, target: str, built: Any, pl: Any) -> None:
    """A ConfigError naming ``key`` when what ``target`` built is not what Lightning trains: a LightningModule
    (``model``) or a LightningDataModule (``datamodule``)."""
    expected, valid = (
        (pl.LightningDataModule, "a LightningDataModule class, or no datamodule (the dataset group's splits)")
        if key == "datamodule"
        else (pl.LightningModule, "a LightningModule class; a plain nn.Module with another task (task=classification)")
    )
    if not isinstance(built, expected):
        raise ConfigError(
            f"{key}._target_",
            target,
            f"builds a {type(built).__name__}, not a lightning.{expected.__name__} (task=lightning).",
            valid,
        )


def one_device_trainer(pl: Any, **arguments: Any) -> Any:
    """A ``lightning.Trainer`` in this process on one device that writes nothing (no logger, no checkpoint, no
    bar or summary): the driver's rehearsal and ``evaluate``."""
    return pl.Trainer(
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.gettempdir(),
        **arguments,
    )
