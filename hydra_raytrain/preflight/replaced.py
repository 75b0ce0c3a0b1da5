"""A ``_target_`` set on the command line starts its node afresh.

``python -m hydra_raytrain model._target_=my_models.MyNet`` means "train MyNet", not "MyNet with SimpleCNN's
settings": Hydra alone keeps the previous option's arguments in the node, so MyNet would fail on SimpleCNN's
``channels``, or worse, silently take its ``hidden: 128`` instead of MyNet's own default. The rule here:

- the node keeps what the command line sets for it (``model.hidden=64``, ``+model.depth=3``),
- and the arguments that wire it to other settings (``num_outputs: ${dataset.num_outputs}``) when the new target
  names them among its parameters (so a model of your own still adapts to the dataset); a target that takes
  ``**kwargs`` (torchvision's builders, ``timm.create_model``) may pass them on to a class that refuses them, so
  wiring it does not name is dropped too, and the run says so (``wiring_note``): set the zoo's own names,
  ``+model.num_classes=10``,
- every other argument of the option it replaces is dropped, and the run says which (``dropped_note``).

Applied before anything reads the config: by the ``${run_name:}`` resolver (the run dir's identity), by
``train()`` and ``check`` on the composed config, by a sweep on each trial's.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.plain import as_dict
from hydra_raytrain.preflight.targets import locate  # quiet: Hydra's own get_object logs an ERROR story

# Hydra's own keys of an instantiable node: they say how to call the target, so they stay.
KEPT_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_")


def parsed_overrides(overrides: Sequence[str]) -> list[Any]:
    """The overrides as Hydra's parser reads them; one it does not accept is left out (the CLI refused it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = []
    for override in overrides:
        try:
            parsed += OverridesParser.create().parse_overrides([override])
        except Exception:
            continue
    return parsed


def replaced_targets(overrides: Sequence[str]) -> dict[str, list[str]]:
    """``{node key: [argument names the command line sets in it]}`` for each node whose ``_target_`` it sets."""
    keys = [o.key_or_group for o in parsed_overrides(overrides) if not o.is_delete() and not o.package]
    nodes = {key[: -len("._target_")] for key in keys if key.endswith("._target_")}
    return {
        node: sorted({key[len(node) + 1 :].split(".")[0] for key in keys if key.startswith(node + ".")})
        for node in sorted(nodes)
    }


def drop_replaced_arguments(cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """Drop, in place, the arguments of each node whose ``_target_`` the overrides replace (see the module's
    rule); returns one note per node that lost arguments."""
    notes = []
    for key, kept in replaced_targets(overrides).items():
        node = OmegaConf.select(cfg, key, throw_on_missing=False)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        written = as_dict(node, resolve=False)  # interpolations as written: ${dataset.num_outputs}
        target = str(written["_target_"])
        accepted, var_keyword = _accepted_arguments(target)
        dropped: dict[str, object] = {}
        unnamed: dict[str, object] = {}
        for name, value in written.items():
            if name in KEPT_KEYS or name in kept:
                continue
            wiring = OmegaConf.is_interpolation(node, name)
            if wiring and (accepted is None or name in accepted):
                continue
            (unnamed if wiring and var_keyword else dropped)[name] = value
            with open_dict(node):
                del node[name]
        if dropped:
            notes.append(dropped_note(key, target, dropped))
        if unnamed:
            notes.append(wiring_note(key, target, unnamed))
    return notes


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """The command line's rules, in place: replaced targets start afresh (``drop_replaced_arguments``), and a
    LightningModule that brings its own loaders is fed by them when the command line picks no dataset
    (``use_module_loaders``). One note per change."""
    return drop_replaced_arguments(cfg, overrides) + use_module_loaders(cfg, overrides)


def use_module_loaders(cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """``task=lightning model._target_=...BoringModel`` is the whole command: the module's own
    ``train_dataloader``/``val_dataloader`` feed it (``dataset=module``) instead of the default dataset, unless
    the command line picks a dataset, or a datamodule feeds it."""
    # here, not at the top: the run name's resolver imports this module, and must not load torch (lightning_setup
    # reads the task classes)
    from hydra_raytrain.recipe.lightning_setup import MODULE_LOADERS, brings_loaders, is_lightning

    task, model = OmegaConf.select(cfg, "task._target_"), OmegaConf.select(cfg, "model._target_")
    if not task or not model or cfg.get("datamodule") or not is_lightning(str(task)):
        return []
    if _touches(overrides, "dataset") or OmegaConf.select(cfg, "dataset._target_") == MODULE_LOADERS:
        return []
    if not brings_loaders(model):
        return []
    with open_dict(cfg):
        cfg.dataset = OmegaConf.create({"_target_": MODULE_LOADERS, "name": "module"})
    return [
        f"Note: model._target_={model} brings its own train_dataloader: it feeds the run (dataset=module), sharded "
        "by Lightning's DistributedSampler; pick a dataset on the command line to feed it the dataset group's "
        "batches instead."
    ]


def _touches(overrides: Sequence[str], section: str) -> bool:
    """Whether an override picks the group or sets (adds, deletes) a key in it."""
    keys = [override.key_or_group for override in parsed_overrides(overrides)]
    return any(key == section or key.startswith(section + ".") for key in keys)


def apply_command_line_targets(cfg: DictConfig) -> list[str]:
    """A ``_target_`` set on the command line starts its node afresh (``preflight/replaced.py``); each dropped
    argument is said once. Under the CLI the overrides are Hydra's; a composed config passed to ``train()``
    from Python keeps what it holds."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    notes = apply_overrides(cfg, list(HydraConfig.get().overrides.task))
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    return notes


def dropped_note(key: str, target: str, dropped: dict[str, object]) -> str:
    return (
        f"Note: {key}._target_={target} starts {key} afresh: the replaced option's arguments {_shown(dropped)} were "
        f"dropped and {target} uses its own defaults; set one on the command line to pass it "
        f"(e.g. {key}.{next(iter(dropped))}=...)."
    )


def wiring_note(key: str, target: str, unnamed: dict[str, object]) -> str:
    return (
        f"Note: {key}._target_={target} takes **kwargs without naming {', '.join(unnamed)}: whether it consumes "
        f"them cannot be told, so the replaced option's wiring {_shown(unnamed)} is not passed; pass the target's "
        f"own argument names (e.g. +{key}.num_classes=${{dataset.num_outputs}})."
    )


def _shown(arguments: dict[str, object]) -> str:
    return ", ".join(f"{name}={value}" for name, value in arguments.items())


def _accepted_arguments(target: str) -> tuple[set[str] | None, bool]:
    """The parameter names the target takes (None when it cannot be told: not importable, which the validation
    reports, or no signature), and whether it also takes ``**kwargs``."""
    try:
        parameters = inspect.signature(locate("", target)).parameters
    except (ConfigError, TypeError, ValueError):
        return None, False
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return {name for name, p in parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}, var_keyword
