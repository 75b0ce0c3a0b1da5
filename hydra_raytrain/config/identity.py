"""A run's identity: a name derived from the composed config, used for Ray's ``RunConfig.name`` and the
default run dir (``outputs/runs/<name>``). The same config always gives the same name, so re-running a
command finds its run again (and resumes it); a change that can alter the result gives a new name."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

# Keys that cannot change what is learned: how Ray is reached, where results go, what is logged, when and
# which checkpoints are kept, whether to resume, which failures are retried (a retry resumes exactly), how FSDP
# groups and places the shards (each element's reduction is the same).
NON_RESULT_KEYS = ("hydra", "logger", "ray", "storage", "run", "checkpoint", "failure", "fsdp")
# Trainer settings that only change what is shown or measured, the memory it takes (activation checkpointing
# recomputes the same activations), or how fast (threads; the device-resident path slices the same batches): a run
# that ran out of memory or time resumes with them changed. But ``data_on_device=true`` holds a dataset's
# per-sample transforms as they were drawn once: it names another run.
NON_RESULT_TRAINER_KEYS = (
    "progress_bar",
    "profile",
    "profiler_steps",
    "sync_debug_mode",
    "num_threads",
    "data_on_device",
    "activation_checkpointing",
    "activation_checkpointing_modules",
)


def run_name(cfg: Mapping[str, Any]) -> str:
    if cfg["storage"]["name"]:
        return cfg["storage"]["name"]
    identity = {key: value for key, value in cfg.items() if key not in NON_RESULT_KEYS}
    identity["trainer"] = {k: v for k, v in identity["trainer"].items() if k not in NON_RESULT_TRAINER_KEYS}
    # Settings added since runs were first named count only when set: an earlier run keeps its name.
    for section, key in (("trainer", "lightning_kwargs"), (None, "datamodule")):
        node = identity[section] if section else identity
        if not node.get(key):
            node.pop(key, None)
    if cfg["trainer"].get("data_on_device") is True:
        identity["trainer"]["data_on_device"] = True
    if (cfg.get("run") or {}).get("init_from"):  # a warm start: another starting point, another run
        identity["init_from"] = {k: v for k, v in cfg["run"].items() if k.startswith("init_")}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:10]
    model = (
        _label(cfg["model"]) if "_target_" in cfg["model"] else _label(cfg["task"])
    )  # several models: the task (gan)

    dataset = str(cfg["dataset"].get("name") or cfg["dataset"]["_target_"].rsplit(".", 1)[-1]).lower()
    return f"{model}-{dataset}-{digest}"


def _label(node: Mapping[str, Any]) -> str:
    return str(node.get("arch") or node["_target_"].rsplit(".", 1)[-1]).lower()


def run_identity(cfg: DictConfig, cwd: str) -> str:
    """The run name of a composed config as the driver will run it: ``_target_`` replacements of the command line
    applied (``replaced.py``; the overrides come from ``hydra.overrides.task`` when the config has them) and path
    arguments made absolute against ``cwd``, as ``validate`` does. So a relative ``dataset.root`` names the same run
    in the run dir and in Ray storage, and the same relative path from another folder is another run."""
    from hydra_raytrain.config.replaced import drop_replaced_arguments
    from hydra_raytrain.config.validate import absolute_target_paths

    overrides = OmegaConf.select(cfg, "hydra.overrides.task", default=None)
    sections = [str(key) for key in cfg if key != "hydra"]
    if overrides:
        cfg = copy.deepcopy(cfg)  # the caller's config stays as composed
        drop_replaced_arguments(cfg, list(overrides))
    resolved = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in sections}
    for section in ("model", "dataset", "task", "optimizer", "scheduler"):
        absolute_target_paths(resolved.get(section), cwd)
    run = cast(dict[str, Any], resolved.get("run") or {})
    if run.get("init_from"):
        from hydra_raytrain.recipe.warm_start import source_path

        run["init_from"] = source_path(run["init_from"], cwd)
    return run_name(resolved)


def run_name_resolver(*, _root_: DictConfig) -> str:
    """``${run_name:}`` in ``hydra.run.dir``. A config that does not resolve gets a placeholder name: the
    driver's validation then reports what is wrong (and removes the run dir)."""
    try:
        return run_identity(_root_, os.getcwd())
    except Exception:
        return "unresolved-config"


def sweep_name(*argument_lists: Any) -> str:
    """``${sweep_name:${hydra.overrides.task},${hydra.overrides.hydra}}`` in ``hydra.sweep.dir``: the same sweep
    command (its arguments in any order) finds the same sweep dir again, which is how a sweep resumes."""
    listed = sorted(str(argument) for arguments in argument_lists for argument in (arguments or []))
    return "sweep-" + hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:10]


def _streamed(name: str) -> Callable[..., Any]:
    """A resolver of ``data/streamed.py``, imported when first used: that module imports this package."""

    def resolve(*arguments: Any) -> Any:
        from hydra_raytrain.data import streamed

        return getattr(streamed, name)(*arguments)

    return resolve


def register_resolver() -> None:
    from hydra_raytrain.data import folders

    resolvers: dict[str, Callable[..., Any]] = {
        "run_name": run_name_resolver,
        "sweep_name": sweep_name,
        "class_count": folders.class_count,
        "image_shape": folders.image_shape,
        "parquet_shape": _streamed("parquet_shape"),
        "parquet_outputs": _streamed("parquet_outputs"),
        "stream_classes": _streamed("stream_classes"),
        "stream_image_shape": _streamed("stream_image_shape"),
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
