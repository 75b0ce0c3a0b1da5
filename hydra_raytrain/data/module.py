"""``dataset=module``: a LightningModule's own ``train_dataloader``/``val_dataloader`` feed it. Nothing is built
from this node: the Lightning runner calls ``trainer.fit(module)`` and Lightning shards the module's loaders with
its DistributedSampler. Any other task has no module loaders to read."""

from __future__ import annotations

from typing import NoReturn

from hydra_raytrain.config.errors import ConfigError


def module_loaders(name: str = "module") -> NoReturn:  # name: the run name's dataset label
    raise ConfigError(
        "dataset",
        "module",
        "is a LightningModule's own train_dataloader/val_dataloader, which only task=lightning reads.",
        "a dataset option (dataset=digits, imagefolder, ...), or task=lightning with such a module",
    )
