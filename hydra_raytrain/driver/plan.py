"""A run's plan: everything a run checks before Ray starts, reported together (the config:
``hydra_raytrain.preflight``; the resources: a local cluster this machine can start for the request, or a
``ray.address`` that answers), and what those checks decided, made once and handed on as one typed ``Plan``.
``train`` and ``hydra-raytrain check`` both take it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray
from hydra.utils import get_object
from omegaconf import DictConfig

from hydra_raytrain.config.errors import Problems
from hydra_raytrain.config.plain import as_dict
from hydra_raytrain.config.resolved import Resolved, typed
from hydra_raytrain.config.schema import RayConfig, ScalingConfig, cluster_address
from hydra_raytrain.data import roads, table_files, tables
from hydra_raytrain.data.streamed import Streamed
from hydra_raytrain.driver import cluster
from hydra_raytrain.preflight.rehearsal import Datasets
from hydra_raytrain.preflight.replaced import apply_command_line_targets
from hydra_raytrain.preflight.validate import validate


@dataclass(frozen=True)
class Plan:
    """What the checks decided for one run: its resolved config, its name, the road its data takes, what its
    workers ask Ray for, and the notes to say once."""

    resolved: Resolved
    name: str  # the run's name: its run dir's ${run_name:} and its folder in Ray storage
    stream: Streamed | None  # Ray Data streams the data (as built here), else None: each worker builds its splits
    request: cluster.ResourceRequest  # the workers' request, and the CPUs kept for Ray Data's tasks
    replaced: tuple[str, ...] = ()  # the notes on the command line's replaced _target_s (said as they were applied)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the run says as it starts: how a table is read (its road and size, read from the file only then: a
        check says nothing of it)."""
        if get_object(self.resolved.dataset["_target_"]) is not tables.table:
            return ()
        return (table_files.reading_line(self.resolved.dataset),)


def preflight(
    cfg: DictConfig,
    cwd: str,
    rehearse: bool = True,
    datasets: Datasets | None = None,
    named: Mapping[str, str] | None = None,
) -> Plan:
    """The run's plan, or a ``ConfigError`` naming every problem found. The command line's replaced ``_target_``s
    applied first. ``rehearse=False``: a config that was rehearsed already (a sweep trial's, on the sweep's driver).
    A Ray already initialised in this process (a notebook, a sweep trial) is checked against when the run
    connects, not this machine. ``datasets``: the caller's built datasets (a sweep's trials share them)."""
    replaced = apply_command_line_targets(cfg)
    datasets = datasets or Datasets()
    problems = Problems()
    resolved = stream = None
    with problems.collect():
        resolved = validate(cfg, cwd, rehearse=rehearse, named=named, datasets=datasets)
        stream = streamed(resolved.dataset, datasets)
    request = None
    if not problems.failed("scaling", "ray"):
        # Checked even when another section failed: the two sections, typed, from the composed config.
        with problems.collect():
            request = _check_resources(cfg, resolved, stream.cpus if stream is not None else 0)
    problems.raise_any()
    assert resolved is not None and request is not None
    return Plan(resolved, resolved.run_name(), stream, request, tuple(replaced))


def streamed(node: dict[str, Any], datasets: Datasets | None = None) -> Streamed | None:
    """The dataset as the driver built it when Ray Data streams it (``data/streamed.py``), else None."""
    if not roads.streams(node):
        return None
    built = (datasets or Datasets()).build(node)
    return built if isinstance(built, Streamed) else None


def streamed_cpus(node: dict[str, Any], datasets: Datasets | None = None) -> int:
    """The CPUs a run keeps free of its workers for Ray Data's tasks: 0 unless Ray Data streams its dataset."""
    stream = streamed(node, datasets)
    return stream.cpus if stream is not None else 0


def _check_resources(cfg: DictConfig, resolved: Resolved | None, data_cpus: int) -> cluster.ResourceRequest | None:
    """The workers' request; before Ray starts, whether this machine (or ``ray.address``) can serve it."""
    try:
        scaling, ray_cfg = (
            (resolved.scaling, resolved.ray)
            if resolved
            else (
                typed(ScalingConfig, as_dict(cfg.scaling)),
                typed(RayConfig, {**as_dict(cfg.ray), "address": cluster_address(cfg.ray.address, os.environ)}),
            )
        )
    except Exception:  # an interpolation of these sections that does not resolve is reported by validate
        return None
    request = cluster.resource_request(scaling, data_cpus)
    if not ray.is_initialized() and request.num_workers:  # 0: Ray Train's local mode, no cluster
        cluster.check_request(ray_cfg, request)
    return request
