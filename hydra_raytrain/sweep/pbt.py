"""Population Based Training over a sweep's trials (``hydra.sweeper.scheduler=pbt``)::

    python -m hydra_raytrain -m hydra/sweeper=ray_tune hydra.sweeper.scheduler=pbt \\
        'optimizer.lr=tag(log,interval(1e-4,1e-1))' hydra.sweeper.num_samples=4

The swept keys are the mutations, in the sweep grammar: a list or ``choice()`` moves to a neighbouring value,
an ``interval()`` is multiplied by 0.8 or 1.2 (kept inside it), and either is drawn anew with
``resample_probability``. Only optimizer settings can change in a running trial.

Every epoch with a checkpoint, a trial reports to Tune with a small *pointer* checkpoint (``pbt.json``) naming
its Ray Train checkpoint of that epoch; the full state stays in the trial's Ray storage. When PBT has a weak
trial exploit a strong one, Tune restarts the weak trial with the strong one's pointer and the perturbed
settings: the trial continues the strong one's checkpoint (weights, optimizer, schedule, epoch, step) as a new
Ray Train run of its own, ``<name>-g<generation>`` (``run.init_full_state``), with the new settings in the live
optimizer. Each exploit is a line of the trial's ``pbt.jsonl``; a re-run of the sweep continues every trial at
its latest generation.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import PopulationBasedTraining, TrialScheduler
from ray.tune.schedulers.pb2 import PB2

from hydra_raytrain.config import ConfigError
from hydra_raytrain.sweep.lineage import append_lineage, bare, describe, read_lineage
from hydra_raytrain.sweep.space import Parameter

if TYPE_CHECKING:
    from hydra_raytrain.config.sweeper import SweepSettings
    from hydra_raytrain.sweep.job import Job

POINTER_FILE = "pbt.json"
MUTABLE = "optimizer."  # what a running trial can change: its optimizers' settings


# ---------------------------------------------------------------- the driver: checks, mutations, the scheduler


def check(space: dict[str, Parameter], probes: list[Job], settings: SweepSettings) -> None:
    """Everything PBT (and PB2) needs from the trials, refused by name before any starts."""
    name = settings.scheduler
    if not space:
        raise ConfigError(
            "hydra.sweeper.scheduler",
            name,
            "has nothing to perturb: no swept key.",
            "optimizer settings swept as a list or interval(), e.g. 'optimizer.lr=tag(log,interval(1e-4,1e-1))'",
        )
    for key, parameter in space.items():
        _check_key(key, parameter, name)
    for job in probes:
        cfg = job.cfg
        if cfg.dataset.get("folds"):
            raise ConfigError(
                "hydra.sweeper.scheduler", name, "would mix a configuration's folds.", "scheduler=fifo with folds"
            )
        if cfg.run.resume == "never":
            raise ConfigError(
                "run.resume",
                "never",
                "would discard a trial's state each time PBT restarts it, and checkpoints others continue.",
                "run.resume=auto under PBT",
            )
        if cfg.checkpoint.num_to_keep is not None:
            raise ConfigError(
                "checkpoint.num_to_keep",
                cfg.checkpoint.num_to_keep,
                "would delete checkpoints another PBT trial may still continue.",
                "checkpoint.num_to_keep=null under PBT (hydra.sweeper.keep_checkpoints prunes at the end)",
            )
        every = cfg.checkpoint.every_n_epochs
        if settings.perturbation_interval % every:
            raise ConfigError(
                "hydra.sweeper.perturbation_interval",
                settings.perturbation_interval,
                f"PBT continues the checkpoint of a perturbation epoch; checkpoints come every {every} epochs.",
                f"a multiple of checkpoint.every_n_epochs={every}",
            )
        if settings.perturbation_interval >= cfg.trainer.max_epochs:
            raise ConfigError(
                "hydra.sweeper.perturbation_interval",
                settings.perturbation_interval,
                f"the trials train {cfg.trainer.max_epochs} epochs: PBT would never perturb one.",
                f"1 to {cfg.trainer.max_epochs - 1}",
            )


def trials_at_once(cpus: float, trial_cpus: float) -> int:
    """How many trials of ``trial_cpus`` CPUs a cluster of ``cpus`` CPUs runs together (one at least)."""
    return max(1, int(cpus // max(1, trial_cpus)))


def check_population(population: int, cpus: float, trial_cpus: float, settings: SweepSettings) -> str | None:
    """PBT's trials exploit one another only while they are alive together: a population the cluster (or
    ``max_concurrent_trials``) runs in turns ends with few or no exploits. Refused by name before any trial starts;
    with ``hydra.sweeper.allow_partial_population=true``, the warning to print instead."""
    fits = trials_at_once(cpus, trial_cpus)
    together = min(fits, settings.max_concurrent_trials or fits)
    if population <= together:
        return None
    limit = (
        f"hydra.sweeper.max_concurrent_trials={together} runs {together} at a time"
        if together < fits
        else f"the cluster's {cpus:g} CPUs hold {fits} trial{'s' if fits != 1 else ''} of {trial_cpus:g} CPUs at a time"
    )
    why = (
        f"its {population} trials exploit one another only while alive together, and {limit}: the later trials "
        "would start as the earlier ones end, and few or no exploits would happen."
    )
    valid = (
        f"at most {together} trial{'s' if together != 1 else ''} (hydra.sweeper.num_samples, or fewer swept values), "
        "fewer workers or CPUs per trial (scaling.num_workers, scaling.resources_per_worker), a bigger cluster "
        "(ray.address), or hydra.sweeper.allow_partial_population=true to run it anyway"
    )
    if not settings.allow_partial_population:
        raise ConfigError("hydra.sweeper.scheduler", settings.scheduler, why, valid)
    return f"Warning: hydra.sweeper.scheduler={settings.scheduler} (allow_partial_population=true): {why}"


def _check_key(key: str, parameter: Parameter, name: str) -> None:
    """A swept key PBT can change in a running trial: an optimizer setting (a range, under PB2)."""
    if not bare(key).startswith(MUTABLE) or bare(key).rsplit(".", 1)[-1].startswith("_"):
        raise ConfigError(
            "hydra.sweeper.scheduler",
            name,
            f"would change {bare(key)} in a running trial; only optimizer settings (not its _target_) can "
            "change there.",
            "sweep optimizer.* keys (lr, weight_decay, momentum...) under PBT, or scheduler=fifo / asha",
        )
    if name == "pb2" and parameter.choices is not None:
        raise ConfigError(
            "hydra.sweeper.scheduler",
            "pb2",
            f"explores ranges: {bare(key)} is swept as a list of values.",
            f"{bare(key)}=interval(low,high) under pb2, or scheduler=pbt for lists",
        )


def mutations(space: dict[str, Parameter]) -> dict[str, Any]:
    """Tune's ``hyperparam_mutations``: a list of the choices' value strings, or a (log-)uniform range."""
    from ray import tune

    mutated: dict[str, Any] = {}
    for key, parameter in space.items():
        if parameter.choices is not None:  # PBT moves to a neighbour: numbers in their order, others as written
            mutated[key] = ordered(parameter.choices)
        else:
            low, high = parameter.bounds
            mutated[key] = tune.loguniform(low, high) if parameter.log else tune.uniform(low, high)
    return mutated


def ordered(choices: tuple[str, ...]) -> list[str]:
    """Choices as PBT's neighbours: ascending when every one is a number, else in the order written."""
    try:
        return sorted(choices, key=float)
    except ValueError:
        return list(choices)


def within_bounds(bounds: dict[str, tuple[float, float]], config: dict[str, Any]) -> dict[str, Any]:
    """PBT's custom explore step: a range's value multiplied past its interval is kept at the interval's end."""
    for key, (low, high) in bounds.items():
        config[key] = min(max(float(config[key]), low), high)
    return config


class SweepRules:
    """Tune's PBT (or PB2), except that an exploit copies the strong trial's swept values, not its ``index`` (the
    index is the trial itself: its run dir, its job), that a trial's last epoch perturbs nothing (continuing it
    would leave nothing to train), that only epochs with a checkpoint perturb, and that a strong trial can be
    cloned from its latest checkpoint."""

    _time_attr: str

    def __init__(self, last_epoch: int, checkpoint_every: int, **settings: Any):
        super().__init__(**settings)
        self.last_epoch, self.checkpoint_every = last_epoch, checkpoint_every

    def on_trial_result(self, tune_controller, trial, result: dict[str, Any]) -> str:
        epoch = result.get(self._time_attr, 0)
        # Only where there is a checkpoint to continue: a trial resumed off the interval's rhythm (a re-run)
        # would otherwise come to its perturbation epochs without one, and every exploit would be skipped.
        if epoch >= self.last_epoch or epoch % self.checkpoint_every:
            return TrialScheduler.CONTINUE
        return super().on_trial_result(tune_controller, trial, result)  # type: ignore[misc]

    def _checkpoint_or_exploit(self, trial, tune_controller, upper_quantile, lower_quantile) -> None:
        # Tune's PBT clones a strong trial only from the checkpoint it kept when that trial last perturbed among
        # others; a strong trial that has always reported first (alone, no quantiles yet) has none, and every
        # exploit of it would be skipped. Its latest reported checkpoint (a pointer of an epoch) serves instead.
        # (Not one of its last epoch: continuing it would leave nothing to train.)
        for other in upper_quantile:
            state = self._trial_state[other]  # type: ignore[attr-defined]
            latest = (other.last_result or {}).get(self._time_attr, 0)
            if other is not trial and state.last_checkpoint is None and other.checkpoint is not None:
                state.last_checkpoint = other.checkpoint if latest < self.last_epoch else None
        super()._checkpoint_or_exploit(trial, tune_controller, upper_quantile, lower_quantile)  # type: ignore[misc]

    def _get_new_config(self, trial, trial_to_clone):
        config, operations = super()._get_new_config(trial, trial_to_clone)  # type: ignore[misc]
        return {**config, "index": trial.config["index"]}, operations


class SweepPBT(SweepRules, PopulationBasedTraining):
    pass


class SweepPB2(SweepRules, PB2):
    pass


def scheduler(settings: SweepSettings, space: dict[str, Parameter], max_epochs: int, every: int = 1) -> SweepRules:
    """Tune's PBT (PB2) on epochs (``epoch`` in each report), asynchronous; ``every``: checkpoint.every_n_epochs."""
    bounds = {key: p.bounds for key, p in space.items() if p.choices is None}
    if settings.scheduler == "pb2":  # the bandit picks values inside each interval's bounds
        return SweepPB2(
            last_epoch=max_epochs,
            checkpoint_every=every,
            time_attr="epoch",
            perturbation_interval=settings.perturbation_interval,
            hyperparam_bounds={key: list(b) for key, b in bounds.items()},
            quantile_fraction=settings.quantile_fraction,
        )
    return SweepPBT(
        last_epoch=max_epochs,
        checkpoint_every=every,
        time_attr="epoch",
        perturbation_interval=settings.perturbation_interval,
        hyperparam_mutations=mutations(space),
        quantile_fraction=settings.quantile_fraction,
        resample_probability=settings.resample_probability,
        custom_explore_fn=functools.partial(within_bounds, bounds),
    )


def current_values(jobs: list[Job], space: dict[str, Parameter]) -> dict[int, dict[str, Any]]:
    """Each trial's values of the swept keys now: its latest exploit's (an earlier run of the sweep), else its
    overrides' (a choice as its value string, a range's value as a float)."""
    values = {}
    for job in jobs:
        given = dict(override.split("=", 1) for override in job.overrides)
        own = {key: given[key] if p.choices is not None else float(given[key]) for key, p in space.items()}
        lineage = read_lineage(job.run_dir)
        values[job.index] = {**own, **lineage[-1]["after"]} if lineage else own
    return values


def param_space(order: list[int], values: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Tune's config of each trial: its index and its current values of the swept keys (which PBT mutates)."""
    from ray import tune

    keys = next(iter(values.values())).keys() if values else []
    space: dict[str, Any] = {"index": tune.grid_search(order)}
    for key in keys:
        space[key] = tune.sample_from(functools.partial(_value_of, values, key))
    return space


def _value_of(values: dict[int, dict[str, Any]], key: str, config: Any) -> Any:
    return values[config["index"]][key]


# ---------------------------------------------------------------- the trial


def run_segment(config: dict[str, Any], job: Job, train: Callable[..., Any], compose: Callable[..., Job]) -> None:
    """One stretch of a PBT trial, in Tune's trial process: the current generation of the trial (after an exploit,
    a new one continuing the donor's checkpoint), trained in a thread while this one hands each epoch to Tune
    with its pointer checkpoint."""
    from ray import tune
    from ray.util.queue import Queue

    from hydra_raytrain.driver.epoch_log import QueueReports

    swept = {key: value for key, value in config.items() if key != "index"}
    lineage = read_lineage(job.run_dir)
    pointer = _read_pointer(tune.get_checkpoint())
    own = pointer is not None and (pointer["index"], pointer["generation"]) == (job.index, _generation(lineage))
    again = pointer is not None and bool(lineage) and pointer["checkpoint"] == lineage[-1]["checkpoint"]
    if pointer is not None and not own and not again:  # restarted before its first report: the same exploit
        lineage.append(_exploit(job, pointer, lineage, swept, compose))
    cfg, run_name = _generation_config(job, lineage, compose)
    reports: Any = Queue(actor_options={"num_cpus": 0})
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["summary"] = train(cfg, QueueReports(reports))
        except BaseException as error:  # handed to the trial's thread, which raises it for Tune
            outcome["error"] = error
        finally:
            reports.put(None)

    thread = threading.Thread(target=work, name="pbt-trial", daemon=True)
    thread.start()
    reported = False
    while (item := reports.get()) is not None:
        metrics, checkpoint_path = item
        reported = True
        if checkpoint_path is None:
            tune.report(metrics)
            continue
        here = {"index": job.index, "generation": _generation(lineage), "run": run_name}
        here.update(checkpoint=checkpoint_path, epoch=metrics["epoch"], step=metrics.get("step"), values=swept)
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, POINTER_FILE), "w") as file:
                json.dump(here, file)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    if not reported:  # it had trained its last epoch already (killed before its summary): Tune gets the final one
        tune.report(dict(outcome["summary"]["final"]))


def _exploit(
    job: Job, pointer: dict[str, Any], lineage: list[dict[str, Any]], swept: dict[str, Any], compose: Callable
) -> dict:
    """Tune restarted this trial with another's pointer and perturbed values: the record of it, in ``pbt.jsonl``
    before anything trains (a kill after it resumes this generation), and the donor's history as the trial's.
    The new generation's config is composed and checked first: a config that cannot work records nothing."""
    record = {
        "generation": _generation(lineage) + 1,
        "donor": pointer["index"],
        "checkpoint": pointer["checkpoint"],
        "epoch": pointer["epoch"],
        "step": pointer["step"],
        "before": lineage[-1]["after"] if lineage else _own_values(job, swept),
        "donor_values": pointer["values"],  # what the explore step perturbed
        "after": swept,
        "time": time.time(),
    }
    _generation_config(job, lineage + [record], compose)
    history = _donor_history(pointer["checkpoint"])
    append_lineage(job.run_dir, record)
    _write_history(job.run_dir, history)
    print(f"PBT: trial {job.index} {describe(record)}", flush=True)
    return record


def _generation_config(job: Job, lineage: list[dict[str, Any]], compose: Callable[..., Job]) -> tuple[Any, str]:
    """The trial's config at its latest generation, and that generation's Ray Train run name: the job's own at
    generation 0; after an exploit, the job composed again by Hydra with its explored values (so that what
    interpolates them, such as OneCycleLR's ``max_lr: ${optimizer.lr}``, follows), continuing the donor's
    checkpoint as ``<name>-g<generation>``."""
    from omegaconf import OmegaConf

    generation = _generation(lineage)
    if not generation:
        return OmegaConf.create(job.cfg.to_dict()), job.name
    latest, name = lineage[-1], f"{job.name}-g{generation}"
    values = latest["after"]
    overrides = [o for o in job.overrides if o.split("=", 1)[0] not in values]
    overrides += [f"{key}={value if isinstance(value, str) else repr(value)}" for key, value in values.items()]
    cfg = OmegaConf.create(compose(overrides, job.index).cfg.to_dict())
    OmegaConf.update(cfg, "storage.name", name)
    OmegaConf.update(cfg, "run.init_from", latest["checkpoint"])
    OmegaConf.update(cfg, "run.init_full_state", True)
    return cfg, name


def _donor_history(checkpoint: str) -> list[dict[str, Any]]:
    """The epochs that trained the weights of a checkpoint folder (its train state's history)."""
    import ray.train
    import torch

    from hydra_raytrain.recipe.checkpoint import STATE_FILE

    with ray.train.Checkpoint(path=checkpoint).as_directory() as folder:  # mmap: not the optimizer moments
        return torch.load(os.path.join(folder, STATE_FILE), weights_only=True, map_location="cpu", mmap=True)["history"]


def _write_history(run_dir: str, history: list[dict[str, Any]]) -> None:
    """The trial's ``metrics.jsonl`` after an exploit: the history of the weights it continues (the donor's
    epochs); its own epochs since the last exploit are in its Tune results."""
    from hydra_raytrain.storage.rundir import METRICS_FILE, write_jsonl

    write_jsonl(os.path.join(run_dir, METRICS_FILE), history)


def _generation(lineage: list[dict[str, Any]]) -> int:
    return lineage[-1]["generation"] if lineage else 0


def _own_values(job: Job, swept: dict[str, Any]) -> dict[str, Any]:
    """The trial's values before its first exploit, typed as Tune's config has them."""
    given = dict(override.split("=", 1) for override in job.overrides)
    return {key: float(given[key]) if isinstance(value, float) else given[key] for key, value in swept.items()}


def _read_pointer(checkpoint: Any) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        path = os.path.join(folder, POINTER_FILE)
        if not os.path.exists(path):
            return None
        with open(path) as file:
            return json.load(file)
