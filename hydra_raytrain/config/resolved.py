"""The validated config, typed to the end: what ``validate`` returns and the driver, the sweep and the workers read.

The framework's sections are the schema's dataclasses (``resolved.trainer.max_epochs``, checked by the type
checker); the components (model, dataset, optimizer, task, logger) stay the plain ``_target_`` nodes their
builders take. ``to_dict()`` is the plain form written to ``config.json``, hashed into the run's identity and sent
to the workers, which rebuild the object with ``from_dict``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydra_raytrain.config.identity import run_name
from hydra_raytrain.config.schema import (
    CheckpointConfig,
    FailureConfig,
    FinetuneConfig,
    FSDPConfig,
    PeftConfig,
    RayConfig,
    RunSettings,
    ScalingConfig,
    SchedulerConfig,
    StorageConfig,
    TrainerConfig,
)


@dataclass(frozen=True)
class Resolved:
    model: dict[str, Any]  # one _target_ node, or several named ones (a GAN)
    dataset: dict[str, Any]
    optimizer: dict[str, Any]  # one _target_ node for every model, or one per model name
    task: dict[str, Any]
    logger: dict[str, Any]  # name -> _target_ node; {} for none
    scheduler: SchedulerConfig
    scaling: ScalingConfig
    storage: StorageConfig
    failure: FailureConfig
    checkpoint: CheckpointConfig
    trainer: TrainerConfig
    fsdp: FSDPConfig
    ray: RayConfig
    run: RunSettings
    # task=lightning: a LightningDataModule's node; {}: the dataset's splits (absent from older config.json files)
    datamodule: dict[str, Any] = dataclasses.field(default_factory=dict)
    finetune: FinetuneConfig = dataclasses.field(default_factory=FinetuneConfig)  # absent from older config.json files
    callbacks: dict[str, Any] = dataclasses.field(default_factory=dict)  # name -> _target_ node; absent from older
    peft: PeftConfig = dataclasses.field(default_factory=PeftConfig)  # absent from older config.json files

    @classmethod
    def from_dict(cls, plain: Mapping[str, Any]) -> Resolved:
        """From the plain form (validated sections; the schema's range checks run again, and pass)."""
        return typed(cls, plain)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def run_name(self) -> str:
        return run_name(self.to_dict())


def typed(cls: Any, plain: Mapping[str, Any]) -> Any:
    """A schema dataclass (nested ones too) from its plain form."""
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        defaulted = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        if field.name not in plain and defaulted:
            continue  # a setting added since the plain form was written (a sweep's job file): its default
        value = plain[field.name]
        if dataclasses.is_dataclass(hints[field.name]) and isinstance(value, Mapping):
            value = typed(hints[field.name], value)
        values[field.name] = value
    return cls(**values)
