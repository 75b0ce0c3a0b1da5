"""The settings of a fine-tune: which of the model's parameters train and at which learning rate
(``finetune``), and the adapters trained instead of the model's own weights (``peft``). Typed sections of the
root config (``config/schema.py``'s ``TrainConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra_raytrain.config.errors import ConfigError


@dataclass
class FinetuneConfig:
    """Which of the model's parameters train, and at which learning rate, by module name: a pattern (fnmatch:
    ``layer*``, ``features.0``) names modules of ``model.named_modules()``, and everything inside them
    (docs/model-zoo.md)::

        python -m hydra_raytrain model=resnet18 model.weights=DEFAULT 'finetune.freeze=[conv1,bn1,layer1]'
        python -m hydra_raytrain model=resnet18 'finetune.param_groups=[{modules: [layer*], lr: 1e-4}]'

    A parameter in several groups belongs to the first; the others train with the optimizer's own settings.
    """

    freeze: list[str] = field(default_factory=list)  # modules whose parameters do not train
    # [{modules: [PATTERN, ...], lr: ..., any other setting of a torch.optim param group}, ...]
    param_groups: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for index, group in enumerate(self.param_groups):
            modules = group.get("modules")
            if not modules or isinstance(modules, str) or len(group) < 2:
                raise ConfigError(
                    f"finetune.param_groups[{index}]",
                    dict(group),
                    "a group names its modules (a list of patterns) and at least one setting of its own.",
                    "{modules: [layer4, fc], lr: 0.01}",
                )


PEFT_METHODS = ("none", "lora")


@dataclass
class PeftConfig:
    """Adapters trained instead of the model's weights, through the peft library (``peft=lora``): the model's
    own weights stay frozen, only the adapters' reach the optimizer and the checkpoints (docs/text.md)::

        python -m hydra_raytrain task=causal_lm model=causal_lm model.path=models/base dataset=text \\
            dataset.path=data/train.jsonl peft=lora peft.r=16 'peft.target_modules=[q_proj,v_proj]'

    ``target_modules``: module names (peft matches them at the end of each module's name), ``all-linear``, or
    null for peft's default for the model's architecture.
    """

    method: str = "none"  # none | lora
    r: int = 8  # the rank of each adapter's update
    alpha: int = 16  # the update is scaled by alpha / r (peft's lora_alpha)
    dropout: float = 0.0  # on the adapter's input, in training
    target_modules: Any = None  # [q_proj, v_proj] | all-linear | null (peft's default for the architecture)

    def __post_init__(self) -> None:
        if self.method not in PEFT_METHODS:
            raise ConfigError("peft.method", self.method, "unknown method.", ", ".join(PEFT_METHODS))
        if self.r < 1:
            raise ConfigError("peft.r", self.r, "an adapter's rank is at least 1.", "e.g. peft.r=8")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("peft.dropout", self.dropout, "must be in [0, 1).")
        modules = self.target_modules
        if not (modules is None or isinstance(modules, str) or (modules and all(isinstance(m, str) for m in modules))):
            raise ConfigError(
                "peft.target_modules",
                modules,
                "names the modules that get adapters.",
                "[q_proj, v_proj], all-linear, or null",
            )
