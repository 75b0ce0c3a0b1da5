"""``run.init_from``: a new run (its own identity) that starts from another run's weights — fine-tuning, or a
longer schedule — instead of a fresh initialisation::

    python -m hydra_raytrain run.init_from=outputs/runs/<name>                      # a run dir: its model.pt
    python -m hydra_raytrain run.init_from=<storage>/<name>/epoch_0012 run.init_optimizer=true
    python -m hydra_raytrain run.init_from=s3://bucket/runs/<name>/step_00004000 run.init_from_strict=false

A run dir or a checkpoint folder, local or at a URI Ray Train's storage reads (``s3://``, ``gs://``). The weights
must fit the model: every shape equal, and (``run.init_from_strict``, the default) the same keys. With
``run.init_optimizer`` the optimizers' state comes too (a checkpoint folder's ``train_state.pt``: moments, step
counts), while their settings (``optimizer.lr``...) stay the configured ones. A run that resumes from its own
checkpoint ignores ``init_from``: its checkpoint is newer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.recipe.checkpoint import STATE_FILE, has_weights
from hydra_raytrain.storage.rundir import CONFIG_FILE, SUMMARY_FILE

KEY = "run.init_from"


def locate(source: str, cwd: str, init_optimizer: bool, init_full_state: bool = False) -> str:
    """The source as workers read it (a local path made absolute against the driver's folder); a ConfigError
    when it holds no model.pt, or no train_state.pt for ``run.init_optimizer`` / ``run.init_full_state``."""
    source = source_path(source, cwd)
    names = _listing(source)
    if names is None or not has_weights(names):
        raise ConfigError(
            KEY,
            source,
            "no model.pt (or sharded checkpoint) there." if names is not None else "not found.",
            "a run dir (outputs/runs/<name>) or a checkpoint folder (<storage>/<name>/epoch_NNNN)",
        )
    if (init_optimizer or init_full_state) and STATE_FILE not in names:
        kind = "a run dir" if SUMMARY_FILE in names else "a folder"
        raise ConfigError(
            "run.init_full_state" if init_full_state else "run.init_optimizer",
            True,
            f"needs a checkpoint folder (it holds {STATE_FILE}); {source} is {kind} without one.",
            "run.init_from=<storage>/<name>/epoch_NNNN",
        )
    return source


def source_path(source: str, cwd: str) -> str:
    """A URI as it is; a local path absolute (against the driver's folder: workers run elsewhere)."""
    return source if "://" in source else os.path.abspath(os.path.join(cwd, os.path.expanduser(source)))


def _listing(source: str) -> list[str] | None:
    if "://" not in source:
        return sorted(os.listdir(source)) if os.path.isdir(source) else None
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(source)
    infos = filesystem.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    return sorted(os.path.basename(info.path) for info in infos) or None


def read(source: str, init_optimizer: bool, config: bool = False) -> dict[str, Any]:
    """``model``: model.pt's state (one state_dict, or {name: state_dict}); ``optimizers``: the optimizers'
    full states when asked; ``config``: the source's resolved config when asked (None where it has none)."""
    import json

    import ray.train

    from hydra_raytrain.recipe.checkpoint import read_weights

    with ray.train.Checkpoint(path=source).as_directory() as folder:
        state = read_weights(folder, optimizers=init_optimizer)
        if config:
            path = os.path.join(folder, CONFIG_FILE)
            state["config"] = None
            if os.path.exists(path):
                with open(path) as file:
                    state["config"] = json.load(file)
        return state


def starts_built(peft_method: str, init_from: str | None, init_full_state: bool) -> bool:
    """Whether ``run.init_from``'s weights go into the model as it is built, before its adapters (``peft``): new
    adapters on the source's weights (a LoRA source's adapters merged into them first). Else the loop loads them
    into the built model (``recipe/resuming.py``'s ``_warm_start``), or continues the source's full state."""
    return peft_method != "none" and bool(init_from) and not init_full_state


def starting_model(spec: Mapping[str, Any], init_from: str | None) -> Any:
    """The model as a run starts it, without adapters, on the CPU: its builder's, with ``init_from``'s weights where
    given (every key of the model's the source holds). A source that trained LoRA adapters (its config's ``peft``)
    has them merged into its base: the model it fine-tuned. What a LoRA run's adapters are added to, and a task's
    reference (``Task.on_setup``: DPO's)."""
    from hydra.utils import instantiate

    model = instantiate(dict(spec), _convert_="all")
    if not init_from:
        return model
    state = read(init_from, False, config=True)
    saved, peft = state["model"], (state["config"] or {}).get("peft") or {}
    if peft.get("method", "none") != "none":  # the source's adapters, on the base, merged
        from hydra_raytrain.config.finetuning import PeftConfig
        from hydra_raytrain.config.resolved import typed
        from hydra_raytrain.recipe.finetune import add_adapters

        model = add_adapters(model, typed(PeftConfig, peft))
    expected = model.state_dict()
    if not any(key in saved for key in expected):
        check_fit({"model": model}, {"model": saved}, init_from, strict=False)
    model.load_state_dict(fitting(expected, saved), strict=False)
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def mismatches(expected: Mapping[str, Any], saved: Mapping[str, Any], strict: bool) -> list[str]:
    """What keeps ``saved`` (a state_dict) from loading into a model whose state_dict is ``expected``: shapes that
    differ (always), keys missing or unexpected (``strict``)."""
    problems = [
        f"{key} (saved {list(saved[key].shape)}, model {list(value.shape)})"
        for key, value in expected.items()
        if key in saved and hasattr(value, "shape") and tuple(saved[key].shape) != tuple(value.shape)
    ]
    if problems:
        problems = ["shapes differ: " + ", ".join(problems)]
    if strict:
        missing = [key for key in expected if key not in saved]
        unexpected = [key for key in saved if key not in expected]
        problems += [f"missing: {', '.join(missing)}"] if missing else []
        problems += [f"unexpected: {', '.join(unexpected)}"] if unexpected else []
    return problems


def fitting(expected: Mapping[str, Any], saved: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``saved`` that the model has (``run.init_from_strict=false`` skips the others)."""
    return {key: value for key, value in saved.items() if key in expected}


def hyperparameters(optimizer: Any) -> list[dict[str, Any]]:
    """Each param group's settings (lr, betas, weight decay, a schedule's initial_lr), without its parameters:
    a warm start keeps the configured ones, and takes only the optimizer's state."""
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def check_fit(models: Mapping[str, Any], saved: Mapping[str, Any], source: str, strict: bool) -> None:
    """A ConfigError naming the keys when ``saved`` ({name: state_dict}) does not fit ``models`` (unwrapped)."""
    if set(saved) != set(models):
        raise ConfigError(KEY, source, f"holds the models {sorted(saved)}, this run has {sorted(models)}.")
    for name, model in models.items():
        expected = model.state_dict()
        problems = mismatches(expected, saved[name], strict)
        if not any(key in saved[name] for key in expected):
            problems = [f"no key in common (saved: {', '.join(list(saved[name])[:5])}, ...)"]
        if problems:
            where = "" if list(models) == ["model"] else f" {name}"
            raise ConfigError(
                KEY,
                source,
                f"its weights do not fit the model{where}: {'; '.join(problems)}"[:2000],
                "a run of the same model"
                + ("" if not strict else "; or run.init_from_strict=false to skip missing and unexpected keys"),
            )


LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")  # a param group's learning rates a schedule keeps in step


def carry_over(optimizer: Any, schedules: list[Any], configured: list[dict[str, Any]]) -> None:
    """After another run's full state was loaded (``run.init_full_state``): this run's settings in the live
    optimizer. Each setting takes its configured value, except the learning rates, which a schedule moves: a
    group's lr, initial_lr, max_lr and min_lr and each schedule's ``base_lrs`` are scaled by configured / loaded
    initial lr, so the schedule goes on where it was, at the new level."""
    for index, (group, settings) in enumerate(zip(optimizer.param_groups, configured, strict=True)):
        loaded = group.get("initial_lr", group["lr"])
        wanted = settings.get("initial_lr", settings["lr"])
        ratio = float(wanted) / float(loaded) if float(loaded) else 1.0
        for key, value in settings.items():
            if key not in LR_KEYS:
                group[key] = value
        for key in LR_KEYS:
            if isinstance(group.get(key), (int, float)) and not isinstance(group.get(key), bool):
                group[key] = group[key] * ratio
        for schedule in _schedules(schedules):
            base_lrs = getattr(schedule, "base_lrs", None)
            if base_lrs is not None and index < len(base_lrs):
                base_lrs[index] = base_lrs[index] * ratio


def _schedules(schedules: list[Any]) -> list[Any]:
    """Every schedule, those a SequentialLR or ChainedScheduler holds included."""
    found = []
    for schedule in schedules:
        found.append(schedule)
        found += _schedules(list(getattr(schedule, "_schedulers", [])))
    return found
