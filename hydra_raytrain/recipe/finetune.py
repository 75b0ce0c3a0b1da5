"""Fine-tuning by module name (``finetune.freeze``, ``finetune.param_groups``): which parameters train, and in
which of the optimizer's param groups; adapters trained instead of the weights (``peft``). Pure functions of a
model and the settings; the loop and the driver's rehearsal build the optimizer through ``build_optimizer``
alike."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

from torch import nn

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.config.finetuning import FinetuneConfig, PeftConfig
from hydra_raytrain.recipe.parallel import unwrap

# What wrappers put into parameter names: DDP's module, activation checkpointing's wrapper, torch.compile's.
WRAPPER_NAMES = ("_checkpoint_wrapped_module", "_orig_mod")


def module_names(parameter: str) -> list[str]:
    """The modules a parameter sits in, outermost first: ``layer1.0.conv1.weight`` -> ``layer1``, ``layer1.0``,
    ``layer1.0.conv1`` (wrapper names left out)."""
    parts = [part for part in parameter.split(".")[:-1] if part not in WRAPPER_NAMES]
    return [".".join(parts[: end + 1]) for end in range(len(parts))]


def first_match(parameter: str, patterns: Sequence[Sequence[str]]) -> int | None:
    """The index of the first pattern list that names a module the parameter sits in."""
    modules = module_names(parameter)
    for index, group in enumerate(patterns):
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in group for module in modules):
            return index
    return None


def freeze(model: nn.Module, patterns: Sequence[str]) -> int:
    """Parameters inside the named modules stop training (``requires_grad=False``); how many tensors."""
    frozen = [p for name, p in unwrap(model).named_parameters() if first_match(name, [patterns]) is not None]
    for parameter in frozen:
        parameter.requires_grad_(False)
    return len(frozen)


def param_groups(model: nn.Module, groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The optimizer's param groups: the parameters no group names first (the optimizer's own settings: the LR a
    run reports), then each configured group with its settings; frozen parameters in none."""
    patterns = [group["modules"] for group in groups]
    members: list[list[nn.Parameter]] = [[] for _ in range(len(groups) + 1)]
    for name, parameter in unwrap(model).named_parameters():
        if parameter.requires_grad:
            index = first_match(name, patterns)
            members[0 if index is None else index + 1].append(parameter)
    settings = [{key: value for key, value in group.items() if key != "modules"} for group in groups]
    return [{"params": members[0]}] + [
        {"params": params, **setting} for params, setting in zip(members[1:], settings, strict=True) if params
    ]


def build_optimizer(spec: Any, model: nn.Module, finetune: FinetuneConfig | None) -> Any:
    """``instantiate(optimizer)(parameters)`` as the run builds it: the trainable parameters, in the configured
    param groups."""
    from hydra.utils import instantiate

    if finetune is None or not (finetune.freeze or finetune.param_groups):
        return instantiate(spec)(model.parameters())
    groups = param_groups(model, finetune.param_groups)
    return instantiate(spec)([group for group in groups if group["params"]])


def check_group_settings(groups: Sequence[dict[str, Any]], defaults: dict[str, Any], target: str) -> None:
    """Each group's settings are settings of the optimizer's param groups, of the type of its defaults (torch
    takes any key and any value into a group, and fails only at its first step, if at all)."""
    for index, group in enumerate(groups):
        for key, value in group.items():
            where = f"finetune.param_groups[{index}].{key}"
            if key == "modules":
                continue
            if key not in defaults:
                raise ConfigError(
                    where,
                    value,
                    f"is not a setting of {target}'s param groups{did_you_mean(key, list(defaults))}.",
                    ", ".join(sorted(k for k in defaults if not k.startswith("_"))),
                )
            default = defaults[key]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if isinstance(default, (int, float)) and not isinstance(default, bool) and not number:
                raise ConfigError(where, value, f"{target} takes a number for {key!r}.", f"e.g. {key}={default}")
            if key == "lr" and number and value < 0:
                raise ConfigError(where, value, "a learning rate is >= 0.")


def check_patterns(models: dict[str, nn.Module], finetune: FinetuneConfig) -> None:
    """Each pattern names a module of the run's model(s), and something still trains: a ConfigError naming the
    setting otherwise (with the model's top-level modules and a did-you-mean)."""
    names = {module for m in models.values() for p, _ in m.named_parameters() for module in module_names(p)}
    top = sorted({name.split(".")[0] for name in names})
    settings = [("finetune.freeze", finetune.freeze)] + [
        (f"finetune.param_groups[{index}].modules", group["modules"])
        for index, group in enumerate(finetune.param_groups)
    ]
    for key, patterns in settings:
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                raise ConfigError(
                    key,
                    list(patterns),
                    f"{pattern!r} names no module of the model{did_you_mean(pattern, sorted(names))}.",
                    f"module names or fnmatch patterns of model.named_modules(); its top level: {', '.join(top)}",
                )
    trainable = [
        name
        for m in models.values()
        for name, _ in m.named_parameters()
        if first_match(name, [finetune.freeze]) is None
    ]
    if not trainable:
        raise ConfigError("finetune.freeze", list(finetune.freeze), "freezes every parameter: nothing would train.")


def add_adapters(model: nn.Module, settings: PeftConfig) -> nn.Module:
    """``peft=lora``: the model inside peft's ``PeftModel`` with LoRA adapters, its own weights frozen (a Hugging
    Face causal LM as a ``PeftModelForCausalLM``, which generates; a text classifier as a
    ``PeftModelForSequenceClassification``, whose new head trains whole and is saved with the adapters); the model
    as it is for ``peft=none``."""
    if settings.method == "none":
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ConfigError(
            "peft.method", settings.method, "needs the peft library.", "pip install 'hydra_raytrain[text]'"
        ) from None
    modules = settings.target_modules
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(modules) if isinstance(modules, (list, tuple)) else modules,
        task_type=peft_task(model),
    )
    try:
        return get_peft_model(model, config)
    except ValueError as error:  # peft: no module of these names, or no default for this architecture
        adaptable = ("Linear", "Conv1D", "Conv1d", "Conv2d", "Embedding")  # the layers peft's LoRA adapts
        names = sorted(
            {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if type(module).__name__ in adaptable}
        )
        raise ConfigError(
            "peft.target_modules",
            modules,
            f"{str(error).splitlines()[0]}",
            f"names of the model's modules (e.g. {', '.join(names[:12])}), or all-linear",
        ) from None


def peft_task(model: nn.Module) -> str | None:
    """peft's task type for a Hugging Face model: ``SEQ_CLS`` for a sequence classifier (peft then trains and saves
    its head, ``classifier`` or ``score``), ``CAUSAL_LM`` for a model that generates; None for any other."""
    if not hasattr(model, "config"):
        return None
    if type(model).__name__.endswith("ForSequenceClassification"):
        return "SEQ_CLS"
    return "CAUSAL_LM" if hasattr(model, "generate") else None
