"""The sweep: every trial composed and checked on the driver, then run as concurrent Ray Tune trials.

Each trial's run dir is ``<sweep dir>/<run identity>``, so re-running the identical sweep finds every trial
again: completed and early-stopped trials are not re-run, interrupted ones resume from their checkpoints
(the run identity is also the Ray Train run name), failed ones are tried again.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, open_dict
from ray.tune import Callback
from ray.tune.schedulers import HyperBandForBOHB

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.monitor import monitored
from hydra_raytrain.config.schema import RayConfig
from hydra_raytrain.config.sweeper import EVOLVING, PAUSING, SweepSettings
from hydra_raytrain.data.tokenized_ray import for_sweep
from hydra_raytrain.loggers import base as trackers
from hydra_raytrain.preflight.rehearsal import Datasets, check_every_epoch
from hydra_raytrain.preflight.replaced import apply_overrides
from hydra_raytrain.preflight.validate import validate
from hydra_raytrain.recipe.lightning_setup import is_lightning
from hydra_raytrain.storage import rundir
from hydra_raytrain.sweep import pbt, results
from hydra_raytrain.sweep.job import Job
from hydra_raytrain.sweep.search import (
    HydraSearch,
    check_no_swept_secret,
    earlier_jobs,
    final_value,
    optuna_distributions,
    replayed,
    shared_secrets,
)
from hydra_raytrain.sweep.space import Parameter, parameter_space, start_order, trial_overrides
from hydra_raytrain.sweep.trial import run_trial, trains_in_trial

# Tune's console output off (with verbose=0 its new output still prints a "Configuration for experiment" box and
# a TensorBoard hint into Ray's temp folder): the sweep prints its own plan line and summary table.
TUNE_ENV = {"RAY_AIR_NEW_OUTPUT": "0"}


@dataclass
class Shared:
    """What a sweep's trials share as they are composed and checked: the datasets built (each once), and the notes
    said (once for the sweep, not once per trial)."""

    datasets: Datasets = field(default_factory=Datasets)
    said: set[str] = field(default_factory=set)


def compose_job(
    sweep_config: DictConfig,
    config_loader: Any,
    sweep_dir: str,
    overrides: list[str],
    index: int,
    params: dict[str, Any] | None = None,
    metric: str | None = None,
    shared: Shared | None = None,
) -> Job:
    """One trial's config, composed by Hydra as the basic launcher would, resolved and checked here (the sweep's
    ``metric`` too: one the trial reports): a config error stops the sweep before the trial starts, naming the
    trial."""
    composed = config_loader.load_sweep_config(sweep_config, list(overrides))
    with open_dict(composed):
        del composed["hydra"]
    said = shared.said if shared is not None else set()
    for note in apply_overrides(composed, list(overrides)):
        if note not in said:  # said once for the sweep, not once per trial
            said.add(note)
            print(note, file=sys.stderr, flush=True)
    try:
        named = {"hydra.sweeper.metric": metric} if metric else None
        resolved = validate(composed, os.getcwd(), named=named, datasets=shared.datasets if shared else None)
    except ConfigError as error:
        trial = f"trial {index}" if index >= 0 else "the search space"
        raise error.within(f"{trial}: {' '.join(overrides)}") from None
    name = resolved.run_name()
    # each trial its own tracker run, grouped by the sweep (W&B's group, MLflow's parent run in the sweep's store)
    resolved = dataclasses.replace(resolved, logger=trackers.for_trial(resolved.logger, sweep_dir))
    return Job(index, list(overrides), params or {}, resolved, name, os.path.join(sweep_dir, name))


def compose_jobs(compose: Callable[..., Job], arguments: Sequence[str], settings: SweepSettings) -> list[Job]:
    """The basic search: every trial of the grid (x num_samples draws), composed up front."""
    jobs = [
        compose(overrides, index)
        for index, overrides in enumerate(trial_overrides(arguments, settings.num_samples, settings.seed))
    ]
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise ConfigError(
            "sweep",
            " ".join(arguments),
            "two trials have the same config (and would share a run).",
            "sweep values that change the config",
        )
    return jobs


def probe_jobs(compose: Callable[..., Job], fixed: list[str], space: dict[str, Parameter]) -> list[Job]:
    """For a search algorithm, whose trials are not known up front: configs that check the space and size the
    cluster before anything starts: every combination of swept ``scaling.*`` choices, other categorical keys at
    their first choice, ranges at their middle."""

    def middle(p: Parameter) -> float:
        low, high = p.bounds
        return math.sqrt(low * high) if p.log else (low + high) / 2

    varying = [
        [p.override(key, c) for c in p.choices]
        for key, p in space.items()
        if p.choices is not None and key.startswith("scaling.")
    ]
    pinned = [
        p.override(key, p.choices[0] if p.choices is not None else middle(p))
        for key, p in space.items()
        if p.choices is None or not key.startswith("scaling.")
    ]
    return [compose(fixed + pinned + list(combination), -1) for combination in itertools.product(*varying)]


@dataclass
class Trials:
    """The sweep's trials: every one known (``jobs``), the finished ones of earlier runs of this sweep (``done``),
    those to run again first (``todo``: interrupted or failed), how many to start (``budget``), and the configs
    that size the cluster (``probes``: every trial of a grid; for a search algorithm, configs spanning its space)."""

    jobs: list[Job]
    done: list[Job]
    todo: list[Job]
    budget: int
    total: int  # trials the sweep has in all, earlier runs' included
    probes: list[Job]
    fixed: list[str] = field(default_factory=list)  # a search algorithm's fixed overrides and its space
    space: dict[str, Parameter] = field(default_factory=dict)
    arguments: list[str] = field(default_factory=list)  # the sweep's command-line overrides


def run_sweep(
    sweep_config: DictConfig, config_loader: Any, arguments: Sequence[str], settings: SweepSettings
) -> dict[str, Any]:
    """Plan the trials (composed and checked up front), size the cluster, run Tune's Tuner, write the results."""
    errors: dict[int, Any]
    interrupted: set[int]
    settings.check()
    sweep_dir = os.path.abspath(str(sweep_config.hydra.sweep.dir))
    shared = Shared()
    compose = functools.partial(
        compose_job, sweep_config, config_loader, sweep_dir, metric=settings.metric, shared=shared
    )
    previous = results.read_previous(sweep_dir)
    plan = plan_trials(compose, arguments, settings, sweep_dir, previous)
    trainer = plan.probes[0].cfg.trainer
    task = get_object(plan.probes[0].cfg.task["_target_"])
    metric, mode = monitored(task, (settings.metric, settings.mode), (trainer.monitor, trainer.monitor_mode))
    check_every_epoch(metric, [job.cfg.task for job in plan.probes])
    if settings.scheduler == "asha":
        _check_asha(settings.grace_period, plan.probes)
    if settings.scheduler == "hyperband":
        _check_hyperband(plan.probes)
    if settings.scheduler in EVOLVING:
        pbt.check(parameter_space(arguments)[1], plan.probes, settings)
    if settings.scheduler in PAUSING and any(is_lightning(job.cfg.task["_target_"]) for job in plan.probes):
        raise ConfigError(
            "hydra.sweeper.scheduler",
            settings.scheduler,
            "cannot continue a Lightning module's checkpoint in a trial it restarts.",
            "fifo or asha",
        )
    concurrent = size_cluster(plan, settings, sweep_dir, shared.datasets)
    jobs, errors, interrupted = plan.jobs, {}, set()  # nothing left to run: the earlier runs' trials
    tracked = plan.probes[0].cfg.logger  # the sweep's own tracker records (MLflow's parent run), its trials in them
    tracked, opened = trackers.open_sweeps(tracked, sweep_dir) if plan.budget else ({}, {})
    summary: dict[str, Any] = {}
    try:
        if plan.budget > 0:
            jobs, errors, interrupted = run_trials(plan, settings, compose, sweep_dir, (metric, mode), concurrent)
        summary = results.collect(jobs, errors, previous, metric, mode, sweep_dir, settings.scheduler, interrupted)
        results.write_all(summary, jobs, sweep_dir, settings.keep_checkpoints)
    finally:
        best = (summary.get("best") or {}).get("best")
        figures = {f"best_{metric}": best} if isinstance(best, (int, float)) else {}
        trackers.close_sweeps(tracked, opened, figures, failed=not summary)
    return summary


def plan_trials(
    compose: Callable[..., Job],
    arguments: Sequence[str],
    settings: SweepSettings,
    sweep_dir: str,
    previous: dict[str, dict[str, Any]],
) -> Trials:
    """The basic search's grid, composed up front; a search algorithm's earlier trials and probes of its space."""
    if settings.search_alg == "basic":
        jobs = compose_jobs(compose, arguments, settings)
        done, todo = _finished(jobs, lambda job: previous.get(job.name, {}).get("status"))
        return Trials(jobs, done, todo, len(todo), len(jobs), probes=jobs, arguments=list(arguments))
    fixed, space = parameter_space(arguments)
    if any(results.key_of(key) == results.FOLD_KEY for key in space):
        raise ConfigError(
            "hydra.sweeper.search_alg",
            settings.search_alg,
            "would draw dataset.fold with the other keys: each configuration would get one fold of its own.",
            "search_alg=basic to cross-validate (every fold of every configuration)",
        )
    if not space:
        raise ConfigError(
            "hydra.sweeper.search_alg",
            settings.search_alg,
            "has nothing to search: no swept key.",
            "a comma list, choice(), range() or interval() on the command line or in hydra.sweeper.params",
        )
    check_no_swept_secret(space)
    jobs = [compose(replayed(job, fixed, space), job.index, job.params) for job in earlier_jobs(sweep_dir)]
    done, todo = _finished(jobs, lambda job: _status(job, previous))  # todo: interrupted or failed, suggested first
    budget = settings.num_samples - len(done)
    return Trials(jobs, done, todo, budget, settings.num_samples, probe_jobs(compose, fixed, space), fixed, space)


def size_cluster(plan: Trials, settings: SweepSettings, sweep_dir: str, datasets: Datasets | None = None) -> int:
    """Start or join the cluster for the largest trial; how many trials run at once (printed with the plan)."""
    import ray

    from hydra_raytrain.driver import cluster
    from hydra_raytrain.driver.plan import streamed_cpus
    from hydra_raytrain.driver.run import RAY_TRAIN_ENV

    # A dataset Ray Data streams keeps a CPU per trial free of the trial's workers (its tasks stall without one).
    requests = [
        cluster.resource_request(job.cfg.scaling, streamed_cpus(job.cfg.dataset, datasets)) for job in plan.probes
    ]
    largest = max(requests, key=lambda r: r.total.get("CPU", 0) + r.total.get("GPU", 0))
    local = trains_in_trial(plan.probes, settings.scheduler)
    # A stopped trial in local mode ends with its process: no worker group's placement group to free.
    stopped_groups = not all(job.cfg.scaling.num_workers == 0 for job in plan.probes)
    ray_cfg, stops = plan.probes[0].cfg.ray, settings.scheduler in ("asha", *PAUSING) and stopped_groups
    trial_cpus = largest.total.get("CPU", 0) + (1 if local else 0) or 1
    if stops:  # what the config alone tells, before a cluster starts
        _check_asha_can_free_stopped_trials(ray_cfg, settings.scheduler, asked=False)
    evolving = settings.scheduler in EVOLVING
    if evolving and not settings.allow_partial_population and not (ray.is_initialized() or ray_cfg.address):
        # the local cluster it would start: a population that cluster cannot hold is refused before it starts
        pbt.check_population(plan.total, cluster.check_request(ray_cfg, largest) or 1, trial_cpus, settings)
    # A new local cluster gets one CPU per core (or the largest trial's CPUs, oversubscribed as for one run):
    # CPU trials beyond the cores only slow each other down, so concurrency stops at the cores.
    cluster.connect(ray_cfg, largest)
    cluster.check_fits(largest, ray.cluster_resources(), "the Ray cluster")
    if stops:
        _check_asha_can_free_stopped_trials(ray_cfg, settings.scheduler, asked=True)
    for variable, value in {**RAY_TRAIN_ENV, **TUNE_ENV}.items():
        os.environ.setdefault(variable, value)
    cpus = ray.cluster_resources().get("CPU", 1)
    warning = pbt.check_population(plan.total, cpus, trial_cpus, settings) if evolving else None
    if warning:
        print(warning, file=sys.stderr, flush=True)
    fits = pbt.trials_at_once(cpus, trial_cpus)
    concurrent = min(fits, settings.max_concurrent_trials or fits, max(1, plan.budget))
    _print_plan(plan.total, plan.budget, concurrent, cpus, sweep_dir)
    return concurrent


def run_trials(
    plan: Trials,
    settings: SweepSettings,
    compose: Callable[..., Job],
    sweep_dir: str,
    objective: tuple[str, str],
    concurrent: int,
) -> tuple[list[Job], dict[int, Any], set[int]]:
    """Tune's Tuner over the trials still to run; every trial of the sweep, the errors of those that failed, and
    the trials it started that Tune did not end (the sweep was interrupted)."""
    from ray import tune

    (metric, mode), local = objective, trains_in_trial(plan.probes, settings.scheduler)
    space = parameter_space(plan.arguments)[1] if settings.scheduler in EVOLVING else {}  # PBT's mutations
    scheduler = _scheduler(plan, settings, space)
    searcher = _search(plan, settings, compose, objective, concurrent)
    # Under ASHA the grid starts in a seeded random order (space.start_order says why).
    order = start_order([job.index for job in plan.todo], shuffle=scheduler is not None, seed=settings.seed)
    if searcher:
        param_space: dict[str, Any] = {}
    elif space:  # PBT mutates each trial's current values of the swept keys
        param_space = pbt.param_space(order, pbt.current_values(plan.todo, space))
    else:
        param_space = {"index": tune.grid_search(order)}
    # HyperBand must see every trial of a bracket, and Tune creates no more trials than max_concurrent_trials:
    # under it all are created, and each takes 1/concurrent of the driver's node to run.
    bracketed = settings.scheduler == "hyperband"
    share = math.floor(10_000 / concurrent) / 10_000 if bracketed else 0.001
    # The grid's jobs go to the trials in memory; a search's are written as suggested, without the secrets
    handed, hidden = (plan.jobs, {}) if searcher is None else ([], dict(searcher.held.value.hidden))
    tuner = tune.Tuner(
        _trainable(handed, sweep_dir, compose, settings.scheduler in PAUSING, share, hidden, for_sweep(plan), local),
        param_space=param_space,
        # reuse_actors: a trial slot keeps its process (torch and Ray Train imported) for the next trial. Not
        # with ASHA: a trial it stops must take its process down, which ends that trial's Ray Train run with it.
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=mode,
            scheduler=scheduler,
            search_alg=searcher,
            num_samples=plan.budget if searcher else 1,
            max_concurrent_trials=None if bracketed else concurrent,
            reuse_actors=scheduler is None,
            trial_dirname_creator=_trial_dirname,
        ),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=os.path.join(sweep_dir, "tune"),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
            callbacks=[ended := EndedTrials()],
        ),
    )
    with warnings.catch_warnings():  # PBT's hint to reuse actors: a trial it pauses must end its Ray Train run
        warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
        grid = tuner.fit()
    errors = {result.config["index"]: result.error for result in grid if result.error is not None}
    jobs = plan.jobs if searcher is None else sorted(plan.done + searcher.jobs, key=lambda job: job.index)
    started = plan.todo if searcher is None else searcher.jobs
    return jobs, errors, {job.index for job in started if job.index not in ended.indices}


class EndedTrials(Callback):
    """The trials Tune ended: completed, stopped by the scheduler, or failed. Not those the sweep's end (Ctrl-C)
    left running or paused: Tune stops them without this call, and a re-run continues them."""

    def __init__(self) -> None:
        self.indices: set[int] = set()

    def on_trial_complete(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self.indices.add(trial.config["index"])

    def on_trial_error(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self.indices.add(trial.config["index"])


def _scheduler(plan: Trials, settings: SweepSettings, space: dict[str, Parameter]) -> Any:
    """Tune's scheduler of ``hydra.sweeper.scheduler`` (None: fifo)."""
    if settings.scheduler == "asha":
        return asha_scheduler(settings, max(job.cfg.trainer.max_epochs for job in (plan.todo or plan.probes)))
    if settings.scheduler == "hyperband":
        return hyperband_scheduler(settings, max(job.cfg.trainer.max_epochs for job in (plan.todo or plan.probes)))
    if space:
        first = plan.todo[0].cfg
        return pbt.scheduler(settings, space, first.trainer.max_epochs, first.checkpoint.every_n_epochs)
    return None


def _trainable(
    jobs: list[Job],
    sweep_dir: str,
    compose: Callable[..., Job],
    pausing: bool = False,
    share: float = 0.001,
    hidden: dict[tuple[Any, ...], Any] | None = None,
    tokenized: dict[str, Any] | None = None,
    local: bool = False,
) -> Any:
    """The trial function only waits on its Ray Train run, whose workers hold the CPUs: it reserves next to
    nothing, on the driver's node (where the run dirs are; Ray Train puts each run's controller beside it): a
    ``share`` of the node's own resource. A trial in Ray Train's local mode (``local``) trains in that process,
    which reserves the CPU it trains on. Trials Tune pauses (``pausing``) report checkpoints to restart from,
    and get Hydra's composition (``compose``), to compose a trial again with PBT's explored values."""
    import ray
    from ray import tune

    from hydra_raytrain.runtime.host import import_path

    node = f"node:{ray.util.get_node_ip_address()}"
    trial = tune.with_parameters(
        run_trial,
        jobs=jobs,
        sweep_dir=sweep_dir,
        cwd=os.getcwd(),
        pythonpath=import_path(),
        argv=list(sys.argv),
        compose=compose if pausing else None,
        hidden=hidden or {},  # in Ray's object store, never on disk: job.json is written without it
        tokenized=tokenized or {},
    )
    return tune.with_resources(trial, {"CPU": 1 if local else 0, "memory": 1, node: share})


def asha_scheduler(settings: SweepSettings, max_epochs: int):
    """Tune's ASHA on epochs (one report per epoch is one training_iteration)."""
    from ray.tune.schedulers import ASHAScheduler

    # max_t one past the last epoch: a trial that reaches it ends by itself (and writes its summary) instead of
    # being stopped by ASHA's max_t rule just before.
    return ASHAScheduler(
        time_attr="training_iteration",
        max_t=max_epochs + 1,
        grace_period=settings.grace_period,
        reduction_factor=settings.reduction_factor,
    )


def hyperband_scheduler(settings: SweepSettings, max_epochs: int):
    """Tune's HyperBand on epochs: brackets of trials that pause at each milestone until the bracket's other
    trials reach it, then the best 1/reduction_factor continue (restarted from their checkpoint of that epoch).
    The last rung's trials are not stopped at max_t: they end by themselves (and write their summaries). Under
    BOHB, Tune's variant of it that tells BOHB's search which trials pause."""
    from ray.tune.schedulers import HyperBandScheduler

    kind = FullBudgetBOHB if settings.search_alg == "bohb" else HyperBandScheduler
    return kind(time_attr="epoch", max_t=max_epochs, reduction_factor=settings.reduction_factor, stop_last_trials=False)


class FullBudgetBOHB(HyperBandForBOHB):
    """Tune's HyperBand for BOHB, whose last rung's trials run to their end by themselves (``stop_last_trials``
    off): Tune's then hands BOHB no result at the full budget. A result at ``max_t`` carries that budget, so
    BOHB's model learns from the longest runs too."""

    def on_trial_result(self, tune_controller, trial, result: dict[str, Any]) -> str:
        action = super().on_trial_result(tune_controller, trial, result)
        if result.get(self._time_attr, 0) >= self._max_t_attr:
            result["hyperband_info"]["budget"] = self._max_t_attr
        return action


def _check_hyperband(probes: list[Job]) -> None:
    """HyperBand pauses a trial at each milestone and later continues it from its checkpoint of that epoch: it
    needs one every epoch, kept and resumed. Nor does it cross-validate (a configuration's folds would stop at
    different epochs)."""
    for job in probes:
        cfg = job.cfg
        if cfg.dataset.get("folds"):
            raise ConfigError(
                "hydra.sweeper.scheduler",
                "hyperband",
                "would stop a configuration's folds at different epochs: a fold mean needs every fold trained alike.",
                "hydra.sweeper.scheduler=fifo with dataset.folds",
            )
        if cfg.checkpoint.every_n_epochs != 1:
            raise ConfigError(
                "checkpoint.every_n_epochs",
                cfg.checkpoint.every_n_epochs,
                "HyperBand pauses trials at its milestones and continues them from a checkpoint of that epoch.",
                "checkpoint.every_n_epochs=1 under hyperband",
            )
        if cfg.run.resume == "never":
            raise ConfigError(
                "run.resume",
                "never",
                "would train a trial HyperBand paused from its first epoch again when it continues.",
                "run.resume=auto under hyperband",
            )


def _check_asha(grace_period: int, probes: list[Job]) -> None:
    """ASHA's first rung is at ``grace_period`` epochs: one past the trials' epochs would stop nothing. Nor does it
    cross-validate: it would stop a configuration's folds at different epochs, and their mean would mix them."""
    if any(job.cfg.dataset.get("folds") for job in probes):
        raise ConfigError(
            "hydra.sweeper.scheduler",
            "asha",
            "would stop a configuration's folds at different epochs: a fold mean needs every fold trained alike.",
            "hydra.sweeper.scheduler=fifo with dataset.folds",
        )
    max_epochs = max(job.cfg.trainer.max_epochs for job in probes)
    if grace_period > max_epochs:
        raise ConfigError(
            "hydra.sweeper.grace_period",
            grace_period,
            f"ASHA lets every trial train this many epochs before it can stop one; the trials train {max_epochs}.",
            f"1 to {max_epochs} (trainer.max_epochs)",
        )


def _check_asha_can_free_stopped_trials(ray_cfg: RayConfig, scheduler: str = "asha", asked: bool = True) -> None:
    """ASHA stops a trial (PBT restarts one) by ending its process; Ray Train then frees that run's placement
    group (its workers' CPUs) through Ray's state API. Where the cluster's processes cannot reach it (no dashboard),
    every stopped trial would keep its CPUs and the sweep would wait forever: refused before any trial starts.
    A local cluster started without its dashboard is refused from the config, before it starts; otherwise, once
    connected (``asked``), the cluster's state API is probed."""
    from hydra_raytrain.driver import cluster

    problem: str | None = None
    if not ray_cfg.address and ray_cfg.include_dashboard is False:
        problem = "ray.include_dashboard=false"  # (another cluster's dashboard on this machine may answer a probe)
    elif asked:
        problem = cluster.state_api_problem()
    if problem is not None:
        where = f"the cluster at ray.address={ray_cfg.address}" if ray_cfg.address else "the local cluster"
        raise ConfigError(
            "hydra.sweeper.scheduler",
            scheduler,
            f"a trial {scheduler.upper()} stops frees its workers' CPUs through Ray's state API, which {where} "
            "does not serve "
            f"({problem}): "
            "stopped trials would keep their CPUs and the sweep would wait forever.",
            "ray.include_dashboard=null (Ray's default: the dashboard serves the state API), a cluster started with "
            "its dashboard, or hydra.sweeper.scheduler=fifo",
        )


def _finished(jobs: list[Job], status: Callable[[Job], str | None]) -> tuple[list[Job], list[Job]]:
    """The jobs an earlier run of the sweep finished (completed, or stopped by the scheduler), and the others."""
    done: list[Job] = []
    others: list[Job] = []
    for job in jobs:
        (done if status(job) in ("completed", "stopped") else others).append(job)
    return done, others


def _status(job: Job, previous: dict[str, dict[str, Any]]) -> str:
    """An earlier trial's status: the earlier sweep summary's word (ASHA's "stopped" is only there), else its run's."""
    if job.name in previous:
        return previous[job.name]["status"]
    summary = rundir.finished_summary(job.run_dir)
    return summary["status"] if summary else "interrupted"


def _search(
    plan: Trials, settings: SweepSettings, compose: Callable[..., Job], objective: tuple[str, str], concurrent: int
) -> HydraSearch | None:
    """The search algorithm's suggestions as Hydra jobs (None: the basic search's grid)."""
    if settings.search_alg == "basic":
        return None
    seed = settings.seed + len(plan.jobs)  # past the trials earlier runs drew: a re-run does not draw them again
    if settings.search_alg == "bohb":
        inner = _bohb_search(plan.space, *objective, seed, concurrent)
    else:
        inner = _optuna_search(plan.space, *objective, seed, plan.done)
    return HydraSearch(
        inner,
        plan.space,
        plan.fixed,
        compose,
        known=plan.jobs,
        replay=plan.todo,
        budget=plan.budget,
        hidden=shared_secrets(plan.probes),
    )


def _optuna_search(space: dict[str, Parameter], metric: str, mode: str, seed: int, done: list[Job]):
    """Optuna's TPE over the space; the sweep's finished trials (earlier runs) told to it as evaluated points."""
    from ray.tune.search.optuna import OptunaSearch

    told = [(job.params, final_value(job.run_dir, metric)) for job in done]
    told = [(params, value) for params, value in told if value is not None]
    return OptunaSearch(
        space=optuna_distributions(space),
        metric=metric,
        mode=mode,
        seed=seed,
        points_to_evaluate=[params for params, _ in told] or None,
        evaluated_rewards=[value for _, value in told] or None,
    )


def _bohb_search(space: dict[str, Parameter], metric: str, mode: str, seed: int, concurrent: int):
    """BOHB's search (HpBandSter's kernel density model, fed each bracket's results) over the space as a
    ConfigSpace; it starts at most ``concurrent`` trials that are not paused. Earlier runs' trials are not told
    to it: it has no way to take a point it did not suggest."""
    import ConfigSpace as cs
    from ray.tune.search.bohb import TuneBOHB

    config_space = cs.ConfigurationSpace(seed=seed)
    for key, p in space.items():
        if p.choices is not None:
            config_space.add(cs.CategoricalHyperparameter(key, list(p.choices)))
        else:
            config_space.add(cs.UniformFloatHyperparameter(key, lower=p.bounds[0], upper=p.bounds[1], log=p.log))
    return TuneBOHB(config_space, metric=metric, mode=mode, seed=seed, max_concurrent=concurrent)


def _trial_dirname(trial) -> str:
    return f"trial_{trial.config.get('index', 'x')}_{trial.trial_id}"


def _print_plan(total: int, budget: int, concurrent: int, cpus: float, sweep_dir: str) -> None:
    skipped = total - budget
    note = f"; {skipped} already done in an earlier run of this sweep" if skipped else ""
    print(
        f"Sweep: {total} trials{note}; up to {concurrent} at a time on {math.floor(cpus)} CPUs. Sweep dir: {sweep_dir}",
        flush=True,
    )
