"""The sweep: every trial composed and checked on the driver, then run as concurrent Ray Tune trials.

Each trial's run dir is ``<sweep dir>/<run identity>``, so re-running the identical sweep finds every trial
again: completed and early-stopped trials are not re-run, interrupted ones resume from their checkpoints
(the run identity is also the Ray Train run name), failed ones are tried again.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, open_dict

from hydra_raytrain.config import ConfigError, run_name, validate
from hydra_raytrain.sweep import results
from hydra_raytrain.sweep.space import trial_overrides
from hydra_raytrain.sweep.trial import run_trial

SCHEDULERS = ("fifo", "asha")


@dataclass
class SweepSettings:
    """``hydra.sweeper.*`` of ``hydra/sweeper=ray_tune``."""

    metric: Optional[str] = None  # None: the task's monitor (val_accuracy for classification, val_loss for regression)
    mode: Optional[str] = None  # "max" / "min"; None: the task's
    num_samples: int = 1  # repeats of the grid, with new draws of interval() parameters each time
    seed: int = 0  # of those draws: the same command gives the same trials
    max_concurrent_trials: Optional[int] = None  # None: as many as the cluster holds
    scheduler: str = "fifo"  # fifo, or asha (stops weak trials at epoch boundaries)
    grace_period: int = 1  # ASHA: epochs every trial gets before it can be stopped
    reduction_factor: float = 2.0  # ASHA: keep 1/reduction_factor of the trials at each rung
    keep_checkpoints: Optional[int] = None  # keep only the best K trials' checkpoints (None: all)

    def check(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ConfigError("hydra.sweeper.scheduler", self.scheduler, "unknown scheduler.", ", ".join(SCHEDULERS))
        if self.mode not in (None, "max", "min"):
            raise ConfigError("hydra.sweeper.mode", self.mode, "unknown mode.", "max, min")
        for key in ("num_samples", "grace_period", "max_concurrent_trials", "keep_checkpoints"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"hydra.sweeper.{key}", value, "must be >= 1.")


def compose_jobs(sweep_config: DictConfig, config_loader: Any, arguments: Sequence[str], settings: SweepSettings, sweep_dir: str) -> List[Dict[str, Any]]:
    """Every trial's config, composed by Hydra as the basic launcher would, resolved and checked here: a config
    error in any trial stops the sweep before anything starts, naming the trial."""
    jobs = []
    for index, overrides in enumerate(trial_overrides(arguments, settings.num_samples, settings.seed)):
        composed = config_loader.load_sweep_config(sweep_config, list(overrides))
        with open_dict(composed):
            del composed["hydra"]
        try:
            resolved = validate(composed, cwd=os.getcwd())
        except ConfigError as error:
            raise ConfigError(error.key, error.value, f"{error.reason} (trial {index}: {' '.join(overrides)})", error.valid) from None
        name = run_name(resolved)
        wandb = resolved["logger"].get("wandb")
        if wandb is not None and not wandb.get("group"):  # each trial its own W&B run, grouped by sweep
            wandb["group"] = os.path.basename(sweep_dir)
        jobs.append({"index": index, "overrides": list(overrides), "cfg": resolved, "name": name, "run_dir": os.path.join(sweep_dir, name)})
    names = [job["name"] for job in jobs]
    if len(set(names)) != len(names):
        raise ConfigError("sweep", " ".join(arguments), "two trials have the same config (and would share a run).", "sweep values that change the config")
    return jobs


def run_sweep(sweep_config: DictConfig, config_loader: Any, arguments: Sequence[str], settings: SweepSettings) -> Dict[str, Any]:
    import ray
    from ray import tune

    from hydra_raytrain.driver import cluster
    from hydra_raytrain.driver.run import RAY_TRAIN_ENV

    settings.check()
    sweep_dir = os.path.abspath(str(sweep_config.hydra.sweep.dir))
    jobs = compose_jobs(sweep_config, config_loader, arguments, settings, sweep_dir)
    task_cls = _task_class(jobs[0]["cfg"])
    metric = settings.metric or jobs[0]["cfg"]["trainer"]["monitor"] or task_cls.monitor
    mode = settings.mode or jobs[0]["cfg"]["trainer"]["monitor_mode"] or task_cls.mode
    previous = results.read_previous(sweep_dir)
    todo = [job for job in jobs if previous.get(job["name"], {}).get("status") not in ("completed", "stopped")]

    requests = [cluster.resource_request(job["cfg"]["scaling"]) for job in jobs]
    largest = max(requests, key=lambda r: r.total.get("CPU", 0) + r.total.get("GPU", 0))
    if largest.num_workers == 0:
        raise ConfigError("scaling.num_workers", 0, "local mode runs in the driver's process: it cannot be a concurrent trial.", "scaling.num_workers >= 1")
    ray_cfg = jobs[0]["cfg"]["ray"]
    new_local_cluster = not ray.is_initialized() and not ray_cfg["address"]
    cluster.connect(ray_cfg, _cluster_request(requests, largest, ray_cfg) if new_local_cluster else largest)
    cluster.check_fits(largest, ray.cluster_resources(), "the Ray cluster")
    for variable, value in RAY_TRAIN_ENV.items():
        os.environ.setdefault(variable, value)
    cpus = ray.cluster_resources().get("CPU", 1)
    fits = max(1, int(cpus // max(1, largest.total.get("CPU", 1))))
    concurrent = min(fits, settings.max_concurrent_trials or fits, max(1, len(todo)))
    _print_plan(jobs, todo, concurrent, cpus, sweep_dir)

    if todo:
        scheduler = None
        if settings.scheduler == "asha":
            from ray.tune.schedulers import ASHAScheduler

            max_epochs = max(job["cfg"]["trainer"]["max_epochs"] for job in todo)
            # max_t one past the last epoch: a trial that reaches it ends by itself (and writes its summary)
            # instead of being stopped by ASHA's max_t rule just before.
            scheduler = ASHAScheduler(time_attr="training_iteration", max_t=max_epochs + 1, grace_period=settings.grace_period,
                                      reduction_factor=settings.reduction_factor)
        # The trial function only waits on its Ray Train run, whose workers hold the CPUs: it reserves next to nothing.
        trainable = tune.with_resources(tune.with_parameters(run_trial, jobs=jobs), {"CPU": 0, "memory": 1})
        tuner = tune.Tuner(
            trainable,
            param_space={"index": tune.grid_search([job["index"] for job in todo])},
            tune_config=tune.TuneConfig(metric=metric, mode=mode, scheduler=scheduler, max_concurrent_trials=concurrent),
            run_config=tune.RunConfig(name="tune", storage_path=os.path.join(sweep_dir, "tune"), verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=0)),
        )
        grid = tuner.fit()
        errors = {result.config["index"]: result.error for result in grid if result.error is not None}
    else:
        errors = {}
    summary = results.collect(jobs, errors, previous, metric, mode, sweep_dir, scheduler=settings.scheduler)
    results.write_all(summary, jobs, sweep_dir, settings.keep_checkpoints)
    return summary


def _cluster_request(requests, largest, ray_cfg):
    """A new local cluster is sized for every trial at once (each trial's workers are separate processes),
    within ray.max_cpu_oversubscription CPUs per core; never below the largest trial."""
    from hydra_raytrain.driver.cluster import ResourceRequest

    per_worker_cpu = max(1.0, largest.per_worker.get("CPU", 1.0))
    wanted = sum(r.total.get("CPU", 0.0) for r in requests)
    cap = (os.cpu_count() or 1) * ray_cfg["max_cpu_oversubscription"]
    workers = int(max(largest.total.get("CPU", 0.0), min(wanted, cap)) // per_worker_cpu)
    return ResourceRequest(max(workers, largest.num_workers), largest.per_worker)


def _task_class(cfg: Dict[str, Any]):
    from hydra.utils import get_object

    return get_object(cfg["task"]["_target_"])


def _print_plan(jobs, todo, concurrent, cpus, sweep_dir) -> None:
    skipped = len(jobs) - len(todo)
    note = f"; {skipped} already done in an earlier run of this sweep" if skipped else ""
    print(f"Sweep: {len(jobs)} trials{note}; up to {concurrent} at a time on {math.floor(cpus)} CPUs. Sweep dir: {sweep_dir}", flush=True)
