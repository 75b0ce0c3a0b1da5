"""One Tune trial: a whole hydra_raytrain run on the trial's composed config, in its own run dir.

Ray Train V2 inside Tune: the trial builds the TorchTrainer, whose RunConfig carries Tune's
``TuneReportCallback`` so every epoch reaches Tune (and ASHA can stop the trial between epochs). A trial in Ray
Train's local mode (``scaling.num_workers=0``) trains in its own process and reports each epoch to Tune itself.
A trial whose run already completed (an earlier sweep, re-run) reports its final metrics and returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hydra_raytrain.sweep.job import Job

TRIAL_FILE = "trial.json"


def trains_in_trial(jobs: Sequence[Job], scheduler: str) -> bool:
    """Whether a trial of the sweep trains in its own process (``scaling.num_workers=0``: Ray Train's local mode,
    no worker group to start), which then holds a CPU; otherwise it only waits on its workers. Refused under a
    ``scheduler`` that continues trials from their checkpoints, of which local mode stores none."""
    from hydra_raytrain.config import ConfigError
    from hydra_raytrain.config.sweeper import PAUSING

    local = any(job.cfg.scaling.num_workers == 0 for job in jobs)
    if local and scheduler in PAUSING:
        raise ConfigError(
            "scaling.num_workers",
            0,
            f"{scheduler} continues a trial from its checkpoint (it pauses or clones trials), and Ray Train's local "
            "mode stores none.",
            "scaling.num_workers >= 1 for this scheduler, or hydra.sweeper.scheduler=asha or fifo for trials in "
            "local mode",
        )
    return local


def run_trial(
    config: dict[str, Any],
    jobs: list[Job],
    sweep_dir: str,
    cwd: str,
    pythonpath: str,
    argv: list[str] | None = None,
    compose: Callable[..., Job] | None = None,
    hidden: dict[tuple[Any, ...], Any] | None = None,
    tokenized: dict[str, Any] | None = None,  # the sweep's text, tokenized once for its trials, by dataset
) -> None:
    from ray import tune

    from hydra_raytrain.config.redact import redact_text
    from hydra_raytrain.data.tokenized_ray import key_of
    from hydra_raytrain.driver.run import train
    from hydra_raytrain.storage import rundir
    from hydra_raytrain.sweep.search import read_job

    # The basic search hands every job over up front; a search algorithm's jobs are written by the driver as
    # they are suggested (the trial runs on the driver's node), without the sweep's secrets (``hidden``: put back).
    job = jobs[config["index"]] if jobs else read_job(os.path.join(sweep_dir, config["name"]), hidden)
    _as_on_the_driver(cwd, pythonpath, argv)
    run_dir = job.run_dir
    os.makedirs(run_dir, exist_ok=True)
    finished = rundir.finished_summary(run_dir)
    if finished is not None:
        tune.report({**finished["final"], "already_complete": True})
        return
    with open(os.path.join(run_dir, TRIAL_FILE), "w") as file:
        overrides = [redact_text(override) for override in job.overrides]  # a typed secret as ***
        json.dump({"index": config["index"], "overrides": overrides, "started": time.time()}, file)
    _write_hydra_files(run_dir, job)
    text = (tokenized or {}).get(key_of(job.cfg.dataset))  # None: not text, or a dataset the sweep did not know
    if compose is not None:  # PBT: the trial's current generation, each epoch reported with a checkpoint to clone
        from hydra_raytrain.sweep.pbt import run_segment

        def segment(cfg: Any, callback: Any) -> dict[str, Any]:
            return train(cfg, run_dir, [callback], show_summary=False, rehearse=False, tokenized=text)

        run_segment(config, job, segment, compose)
        return
    _train_reporting_to_tune(job, run_dir, text)


def _train_reporting_to_tune(job: Job, run_dir: str, text: Any) -> None:
    """The trial's run, each epoch reported to Tune. On workers Ray Train's controller reports them (Tune's
    ``TuneReportCallback``, through Tune's queue between the two actors); in Ray Train's local mode this thread
    trains, and reports them itself."""
    from omegaconf import OmegaConf
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from hydra_raytrain.driver.epoch_log import EpochReportsOnly
    from hydra_raytrain.driver.run import train
    from hydra_raytrain.storage import rundir

    epochs_before = len(rundir.read_history(run_dir))
    local = job.cfg.scaling.num_workers == 0
    to_tune = TuneReports() if local else TuneReportCallback()
    with _train_apis_in_this_trial() if local else contextlib.nullcontext():
        summary = train(
            OmegaConf.create(job.cfg.to_dict()),
            run_dir=run_dir,
            extra_callbacks=[EpochReportsOnly(to_tune)],
            show_summary=False,
            rehearse=False,
            tokenized=text,
        )
    if not local and len(rundir.read_history(run_dir)) == epochs_before and summary.get("final"):
        # Nothing was left to train (interrupted after its last epoch's checkpoint, before its summary): no epoch
        # reached Tune, whose result for the trial would be empty (a searcher learns nothing of it). It gets the
        # final figures, as PBT's trials do. (Local mode resumes from no checkpoint: it trains every epoch again.)
        tune.report(dict(summary["final"]))


class TuneReports:
    """Ray Train's callback interface (``after_report``) for a trial in local mode: each report to Tune from the
    trial's own thread, which trains (``tune.report``), so that its scheduler can stop the trial between epochs."""

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        from ray import tune

        tune.report(dict(metrics[0]))


@contextlib.contextmanager
def _train_apis_in_this_trial() -> Iterator[None]:
    """Ray Train V2's worker APIs (``ray.train.get_context``, ``report``, ``get_checkpoint``) refuse to run in a
    Tune trial's process (ray-project/ray#49454: a function given to Tune calls Tune's), which is where a trial in
    Ray Train's local mode trains them. Their check tells a Tune trial by its session's ``world_rank``, None there:
    set while the run trains. ``tune.report`` reads the same session and does not look at it."""
    from ray.train._internal.session import get_session

    tune_session = get_session()
    tune_session.world_rank = 0
    try:
        yield
    finally:
        tune_session.world_rank = None


def _as_on_the_driver(cwd: str, pythonpath: str, argv: list[str] | None = None) -> None:
    """The trial runs train() as the CLI does on the driver: from the driver's folder (Tune moves a trial into
    its own folder), with the driver's import path, which train() then hands to the workers, and its command line
    (the run's provenance)."""
    os.chdir(cwd)
    if argv:
        sys.argv = list(argv)
    os.environ["PYTHONPATH"] = pythonpath
    for entry in reversed(pythonpath.split(os.pathsep)):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def _write_hydra_files(run_dir: str, job: Job) -> None:
    """The job's overrides, where Hydra keeps them (train() adds the composed config.yaml)."""
    import yaml

    folder = os.path.join(run_dir, ".hydra")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "overrides.yaml"), "w") as file:
        yaml.safe_dump(job.overrides, file)
