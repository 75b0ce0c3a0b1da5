"""The resolvers the config files use, registered when ``hydra_raytrain.conf`` is imported (Hydra imports it
for ``pkg://hydra_raytrain.conf``): ``${run_name:}`` (the run dir's identity), ``${sweep_name:...}``, and the
values a dataset infers from its files (``${class_count:...}``, ``${parquet_shape:...}``, ...).

They sit above what they read: the command line's replaced targets (``replaced.py``), the path arguments of every
``_target_`` (``targets.py``), the data modules. A resolver runs only when a config is resolved.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from hydra_raytrain.config.identity import run_name, sweep_name
from hydra_raytrain.data import folders, sizing, tables, text_labels
from hydra_raytrain.preflight.replaced import apply_overrides
from hydra_raytrain.preflight.targets import absolute_target_paths


def run_identity(cfg: DictConfig, cwd: str) -> str:
    """The run name of a composed config as the driver will run it: ``_target_`` replacements of the command line
    applied (``replaced.py``; the overrides come from ``hydra.overrides.task`` when the config has them) and path
    arguments made absolute against ``cwd``, as ``validate`` does. So a relative ``dataset.root`` names the same run
    in the run dir and in Ray storage, and the same relative path from another folder is another run."""
    overrides = OmegaConf.select(cfg, "hydra.overrides.task", default=None)
    sections = [str(key) for key in cfg if key != "hydra"]
    if overrides:
        cfg = copy.deepcopy(cfg)  # the caller's config stays as composed
        apply_overrides(cfg, list(overrides))
    resolved = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in sections}
    for section in ("model", "dataset", "task", "optimizer", "scheduler"):
        absolute_target_paths(resolved.get(section), cwd)
    run = cast(dict[str, Any], resolved.get("run") or {})
    if run.get("init_from"):
        from hydra_raytrain.recipe.warm_start import source_path  # torch: only for a warm start

        run["init_from"] = source_path(run["init_from"], cwd)
    return run_name(resolved)


def run_name_resolver(*, _root_: DictConfig) -> str:
    """``${run_name:}`` in ``hydra.run.dir``. A config that does not resolve gets a placeholder name: the
    driver's validation then reports what is wrong (and removes the run dir)."""
    try:
        return run_identity(_root_, os.getcwd())
    except Exception:
        return "unresolved-config"


def register_resolvers() -> None:
    resolvers: dict[str, Callable[..., Any]] = {
        "run_name": run_name_resolver,
        "sweep_name": sweep_name,
        "class_count": folders.class_count,
        "image_shape": folders.image_shape,
        "parquet_shape": sizing.parquet_shape,
        "parquet_outputs": sizing.parquet_outputs,
        "stream_classes": sizing.stream_classes,
        "stream_image_shape": sizing.stream_image_shape,
        "table_columns": tables.table_columns,
        "table_shape": tables.table_shape,
        "table_outputs": tables.table_outputs,
        "table_classes": tables.table_classes,
        "text_classes": text_labels.text_classes,
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            # ${sweep_name:...} is cached: Hydra copies a sweep's resolver cache into each job it composes
            # (ConfigLoader.load_sweep_config), so every job of a plain -m sees its sweep's dir, not one named by
            # its own overrides. The cache's key is the argument's text, the same in the sweep and its jobs.
            OmegaConf.register_new_resolver(name, resolver, use_cache=name == "sweep_name")
