"""A search algorithm's suggestions as Hydra jobs (``hydra.sweeper.search_alg=optuna`` or ``bohb``).

Tune asks ``HydraSearch.suggest`` for each new trial on the driver; it asks the wrapped searcher (Optuna's
TPE, BOHB) for values, turns them into overrides, composes and checks that trial's config with Hydra as the basic
launcher would, and writes it to ``<run dir>/job.json``, which the trial reads. So every trial is still a
composed, validated config with a run identity, and an earlier run of the sweep is found again on disk:

- trials that completed (or that ASHA stopped) are told to the searcher as evaluated points, not re-run;
- trials that were interrupted or failed are suggested again first, with their own values: they resume
  from their checkpoints (run identity = Ray Train run name);
- ``num_samples`` counts the trials of the whole sweep, earlier runs included.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ray.tune.search import Searcher

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.redact import secret_name
from hydra_raytrain.storage import rundir
from hydra_raytrain.sweep.job import Job
from hydra_raytrain.sweep.space import Parameter

JOB_FILE = "job.json"


def optuna_distributions(space: dict[str, Parameter]) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    return {
        key: CategoricalDistribution(list(p.choices))
        if p.choices is not None
        else FloatDistribution(*p.bounds, log=p.log)
        for key, p in space.items()
    }


def earlier_jobs(sweep_dir: str) -> list[Job]:
    """The jobs an earlier run of this sweep suggested (each ``<run dir>/job.json``), by index."""
    names = os.listdir(sweep_dir) if os.path.isdir(sweep_dir) else []
    found = [
        read_job(os.path.join(sweep_dir, name))
        for name in names
        if os.path.exists(os.path.join(sweep_dir, name, JOB_FILE))
    ]
    return sorted(found, key=lambda job: job.index)


def write_job(job: Job, hidden: Mapping[tuple[Any, ...], Any]) -> None:
    """``<run dir>/job.json``, its secrets ``***`` (``Job.saved``): the trial puts back ``hidden``, the sweep's
    secret values, which every trial shares (they come from the command line, the config files or the environment,
    not from a swept value: one that would is refused)."""
    if job.hidden() != hidden:
        swept = sorted(".".join(map(str, path)) for path in set(job.hidden()) ^ set(hidden))
        raise ConfigError(
            "hydra.sweeper.params",
            ", ".join(swept) or "a secret",
            "a swept value is or holds a secret (a secret-looking key, URI credentials): the sweep's records "
            "would have to write it.",
            "secrets from the command line's fixed overrides, the config or the environment (${oc.env:NAME})",
        )
    os.makedirs(job.run_dir, exist_ok=True)
    rundir.write_json(os.path.join(job.run_dir, JOB_FILE), job.saved())


def final_value(run_dir: str, metric: str) -> float | None:
    """A trial's last reported ``metric`` (what Tune's searchers are told), None before its first epoch."""
    history = rundir.read_history(run_dir)
    value = history[-1].get(metric) if history else None
    return value if isinstance(value, (int, float)) else None


def check_no_swept_secret(space: dict[str, Parameter]) -> None:
    """A search algorithm's trial starts from job.json, written without the sweep's secrets, which the trials get in
    memory, one value for them all: a swept secret-looking key is refused."""
    secret = [key for key in space if secret_name(key)]
    if secret:
        raise ConfigError(
            secret[0],
            "a swept value",
            "is a secret-looking key swept by a search algorithm, whose records would have to write its values.",
            "one value for the whole sweep (a fixed override, or ${oc.env:NAME}); sweep the keys around it",
        )


def shared_secrets(probes: list[Job]) -> dict[tuple[Any, ...], Any]:
    """The secret values the sweep's trials share (a probe's: ``Job.hidden``): job.json is written without them and
    each trial gets them in memory."""
    return probes[0].hidden() if probes else {}


def replayed(job: Job, fixed: list[str], space: dict[str, Parameter]) -> list[str]:
    """An earlier trial's overrides: this command's fixed ones (the identical command: its secrets, which job.json
    does not hold) and the values the search drew for it, as they were first written."""
    if not set(job.params) <= set(space):  # another command's sweep dir: its trials' overrides as saved
        return job.overrides
    return fixed + [space[key].override(key, value) for key, value in job.params.items()]


def read_job(run_dir: str, hidden: Mapping[tuple[Any, ...], Any] | None = None) -> Job:
    """A trial's ``job.json``; ``hidden``: the secret values it was written without (``write_job``), put back."""
    with open(os.path.join(run_dir, JOB_FILE)) as file:
        return Job.from_dict(json.load(file), hidden)


class InMemory:
    """A value kept in this process only: a pickle of what holds it (Tune writes its searcher into the sweep's
    files) holds a key, never the value; a copy in this process reads the same value."""

    _values: ClassVar[dict[int, Any]] = {}
    _keys = itertools.count()

    def __init__(self, value: Any):
        self.key = next(InMemory._keys)
        InMemory._values[self.key] = value

    @property
    def value(self) -> Any:
        return InMemory._values[self.key]


@dataclass
class _Held:
    """What HydraSearch holds in memory only (``InMemory``)."""

    fixed: list[str]
    compose: Callable[..., Job]
    hidden: Mapping[tuple[Any, ...], Any]
    replay: list[Job]
    known: dict[str, Job]
    jobs: list[Job] = field(default_factory=list)
    running: dict[str, Job] = field(default_factory=dict)  # Tune trial id -> its job


class HydraSearch(Searcher):
    """Wraps a Tune searcher: its suggestions become composed Hydra jobs; earlier trials are replayed first.

    ``compose(overrides, index, params)`` returns a ``Job`` (sweep/job.py). ``known`` are the sweep's earlier
    jobs; ``budget`` is how many trials this run may start. A suggestion whose config is a trial the sweep already
    has (a categorical space, or a sampler that repeats itself) is not run twice: the searcher is told that trial's
    result and asked again.
    """

    ATTEMPTS = 20

    def __init__(
        self,
        searcher: Searcher,
        space: dict[str, Parameter],
        fixed: list[str],
        compose: Callable[..., Job],
        known: list[Job],
        replay: list[Job],
        budget: int,
        hidden: Mapping[tuple[Any, ...], Any],
    ):
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher, self.space, self.budget = searcher, space, budget
        self.next_index = max((job.index for job in known), default=-1) + 1
        # What holds the sweep's secrets (the fixed overrides, the jobs' configs, Hydra's composition) stays in this
        # process: Tune pickles its searcher into the sweep's files (tuner.pkl), which get its key only.
        self.held = InMemory(
            _Held(
                fixed=fixed,
                compose=compose,
                hidden=hidden,  # the sweep's secret values: job.json is written without them
                replay=list(replay),
                known={job.name: job for job in known},
            )
        )
        self.asked: dict[str, str] = {}  # Tune trial id -> the id the wrapped searcher knows the trial by

    @property
    def jobs(self) -> list[Job]:
        """Every job this run handed to Tune."""
        return self.held.value.jobs

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # or Searcher.FINISHED
        held = self.held.value
        if len(held.jobs) >= self.budget:
            return Searcher.FINISHED
        job = held.replay.pop(0) if held.replay else self._new_job(trial_id)
        if not isinstance(job, Job):
            return job  # None (ask later) or FINISHED
        write_job(job, held.hidden)
        held.jobs.append(job)
        held.known[job.name] = job
        held.running[trial_id] = job
        return {"index": job.index, "name": job.name}

    def _new_job(self, trial_id: str) -> Job | str | None:
        for attempt in range(self.ATTEMPTS):
            ask_id = trial_id if attempt == 0 else f"{trial_id}-{attempt}"
            params = self.searcher.suggest(ask_id)
            if params is None or params == Searcher.FINISHED:
                return params
            held = self.held.value
            job = held.compose(
                held.fixed + [self.space[key].override(key, value) for key, value in params.items()],
                self.next_index,
                params,
            )
            twin = held.known.get(job.name)
            if twin is None:
                self.next_index += 1
                self.asked[trial_id] = ask_id
                return job
            value = final_value(twin.run_dir, self.metric)
            self.searcher.on_trial_complete(
                ask_id, None if value is None else {self.metric: value}, error=value is None
            )
        return None

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id in self.asked:
            self.searcher.on_trial_result(self.asked[trial_id], result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        job = self.held.value.running.pop(trial_id, None)
        if trial_id in self.asked:
            self.searcher.on_trial_complete(self.asked.pop(trial_id), result, error)
        elif job is not None and result and isinstance(result.get(self.metric), (int, float)):  # a replayed trial
            with contextlib.suppress(NotImplementedError):  # BOHB takes no point it did not suggest
                self.searcher.add_evaluated_point(job.params, result[self.metric])

    def on_pause(self, trial_id: str) -> None:
        """HyperBand for BOHB pauses a trial: BOHB counts it out of its running trials."""
        if trial_id in self.asked:
            self.searcher.on_pause(self.asked[trial_id])

    def on_unpause(self, trial_id: str) -> None:
        if trial_id in self.asked:
            self.searcher.on_unpause(self.asked[trial_id])

    def get_state(self) -> dict[str, Any]:
        """Nothing of ours for Tune's experiment state: a re-run finds the sweep's trials in their run dirs."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """See ``get_state``."""
