"""``train(cfg)``: what ``python -m hydra_raytrain`` does, callable from tests and notebooks.

validate (driver) -> connect to Ray -> TorchTrainer.fit (workers run hydra_raytrain.recipe) -> run dir files
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from ray.train import TrainingFailedError
from ray.train.torch import TorchTrainer
from rich.console import Console

from hydra_raytrain.callbacks.base import driver_callbacks
from hydra_raytrain.config.errors import ConfigError, one_line
from hydra_raytrain.config.monitor import monitored
from hydra_raytrain.config.redact import redact_text, redact_tree, redact_yaml, save_redacted
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.data.streamed import Streamed
from hydra_raytrain.data.tokenized_ray import tokenized_for_run
from hydra_raytrain.driver import builders, cluster, failures, report
from hydra_raytrain.driver.epoch_log import EpochLog, is_epoch_report
from hydra_raytrain.driver.plan import Plan, preflight
from hydra_raytrain.driver.provenance import provenance
from hydra_raytrain.driver.storage import check_storage, checkpoint_uri
from hydra_raytrain.driver.storage import delete as delete_storage
from hydra_raytrain.driver.storage import outages as storage_outages
from hydra_raytrain.inference.scoring import has_test_split, scalars, score, shown, with_example
from hydra_raytrain.loggers import base as trackers
from hydra_raytrain.loggers.base import replay
from hydra_raytrain.messages.notice import PREEMPTED_EXIT_CODE, posted_on_sigterm
from hydra_raytrain.messages.outcome import RunStatus, WorkerResult
from hydra_raytrain.preflight.rehearsal import Datasets
from hydra_raytrain.recipe.checkpoint import local_reports
from hydra_raytrain.recipe.lightning_setup import is_lightning
from hydra_raytrain.recipe.loop import train_loop_per_worker
from hydra_raytrain.runtime.host import import_path, mark
from hydra_raytrain.storage import locks, rundir
from hydra_raytrain.storage.logfiles import DRIVER_LOG, keep_process_logs, quiet_ray_train, tee_output
from hydra_raytrain.storage.retry import StorageUnavailable

# Read by Ray Train's controller and workers (RAY_TRAIN_* variables propagate from the driver).
RAY_TRAIN_ENV = {
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # otherwise every worker print shows twice on the driver
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",  # fit() returns within ~1 s of the last report instead of ~4 s
}


class TrainingFailed(RuntimeError):
    """The run started and failed; summary.json in the run dir holds the full error."""


def hydra_run_dir() -> str | None:
    return HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None


def train(
    cfg: DictConfig,
    run_dir: str | None = None,
    extra_callbacks: Sequence[Any] = (),
    show_summary: bool = True,
    rehearse: bool = True,
    datasets: Datasets | None = None,
    tokenized: Any = None,
) -> dict[str, Any]:
    """Train the configured model; return the summary (also written to ``<run_dir>/summary.json``).

    ``run_dir`` defaults to Hydra's run dir when called under ``@hydra.main``. ``extra_callbacks`` go to Ray
    Train's RunConfig (a sweep trial passes Tune's TuneReportCallback; in local mode, which runs no callback, their
    ``after_report`` hears each report of this process); a sweep shows one table for all trials
    instead of each run's (``show_summary=False``) and rehearsed each trial's config already (``rehearse=False``).
    ``datasets``: the datasets the caller's earlier runs built (a multirun's jobs share them); ``tokenized``: the
    run's text tokenized by the caller (a sweep's, once for its trials: ``data/tokenized_ray.py``).
    Raises ``ConfigError`` before anything starts or is written when the config cannot work, ``locks.Held`` when a
    live run holds the run dir (``run.if_running=wait``: waits for it), ``TrainingFailed`` when the run fails. A
    run stopped by a preemption notice (SIGTERM) returns a summary whose status is ``preempted``: the same call
    resumes it.
    """
    started = time.time()
    mark("composed")  # the interpreter, the imports and Hydra's composition before this
    run_dir = os.path.abspath(run_dir or hydra_run_dir() or "")
    if not run_dir or run_dir == os.getcwd():
        raise ValueError("train(cfg) needs run_dir= when it is not called from the hydra_raytrain CLI.")
    redact_hydra_files(run_dir)  # what Hydra wrote before this ran: the command line's secrets, as typed
    wait = OmegaConf.select(cfg, "run.if_running", default="refuse") == "wait"  # checked with the rest below
    new = not os.path.exists(run_dir)
    try:
        with locks.holding(run_dir, "a run of this config trains there", RUN_HELD, wait=wait):
            plan = _checked(cfg, run_dir, rehearse, datasets)
            mark("checked")
            with _multirun_parent(plan.resolved, run_dir) as resolved:
                planned = dataclasses.replace(plan, resolved=resolved)
                return _train(planned, cfg, run_dir, started, extra_callbacks, show_summary, tokenized)
    except ConfigError:
        if new and os.path.isdir(run_dir) and set(os.listdir(run_dir)) <= {locks.LOCK_FILE}:
            shutil.rmtree(run_dir, ignore_errors=True)  # a refused config leaves nothing: its hold made the folder
        raise


RUN_HELD = (
    "Wait for it to end (then the same command resumes or reports it), stop it (Ctrl-C), set run.if_running=wait to "
    "start once it ends, or give this one another run dir (hydra.run.dir=...)."
)


def _train(
    plan: Plan,
    cfg: DictConfig,
    run_dir: str,
    started: float,
    extra_callbacks: Sequence[Any],
    show_summary: bool,
    tokenized: Any = None,
) -> dict[str, Any]:
    resolved, name, stream = plan.resolved, plan.name, plan.stream  # name: the run dir's ${run_name:} too
    unresolved = OmegaConf.to_container(cfg, resolve=False)  # what redaction keeps unresolved (config/redact.py)
    storage = resolved.storage.path or os.path.join(run_dir, "ray_storage")
    finished = rundir.finished_summary(run_dir) if resolved.run.resume == "auto" else None
    if finished is not None:
        print(rundir.already_complete(finished), flush=True)
        return _log_finished_run(resolved, run_dir, name, finished, unresolved)

    for note in plan.notes:
        print(note, flush=True)
    resolved, nodes = _size_and_connect(resolved, plan.request)
    mark("ray")
    # A storage that does not answer before the run: waited for a minute at most (a mistyped endpoint looks alike).
    check_storage(storage, nodes, resolved.storage.shared_filesystem, min(resolved.storage.retry_window_s, 60))
    if resolved.run.resume == "never":
        _discard_previous_state(run_dir, storage, name, resolved.storage.retry_window_s)
        trackers.restart_all(resolved.logger, name, run_dir)
    _write_config(run_dir, cfg, saved_config(resolved, unresolved))
    quiet_ray_train(resolved.ray.logging_level)
    with tee_output(os.path.join(run_dir, DRIVER_LOG)):
        built = tokenized if tokenized is not None or not nodes else tokenized_for_run(resolved.dataset)
        return _fit(
            resolved,
            run_dir,
            storage,
            name,
            local_mode=nodes == 0,
            started=started,
            stream=stream,
            built=built,
            extra_callbacks=extra_callbacks,
            show_summary=show_summary,
            unresolved=unresolved,
        )


def _checked(cfg: DictConfig, run_dir: str, rehearse: bool, datasets: Datasets | None = None) -> Plan:
    """The run's plan (every check before Ray starts: ``preflight``), and the progress bar's default: on for a
    terminal (bars in a log file or CI output are noise)."""
    plan = preflight(cfg, cwd=os.getcwd(), rehearse=rehearse, datasets=datasets)
    if plan.replaced:  # Hydra saved the config before the replaced _target_'s arguments were dropped
        _save_composed(run_dir, cfg)
    resolved = plan.resolved
    if resolved.trainer.progress_bar is None:
        trainer = dataclasses.replace(resolved.trainer, progress_bar=sys.stderr.isatty())
        plan = dataclasses.replace(plan, resolved=dataclasses.replace(resolved, trainer=trainer))
    return plan


def _size_and_connect(resolved: Resolved, request: cluster.ResourceRequest) -> tuple[Resolved, int]:
    """The workers' share of a local cluster, then the cluster started or joined; the config as sized and the
    number of live nodes (0: Ray Train's local mode, no cluster at all). ``request``: the plan's."""
    data_cpus = request.data_cpus  # CPUs kept free for Ray Data's tasks
    if not resolved.ray.address and (not ray.is_initialized() or cluster.started_here()):
        # A local cluster of this command (this run's, or an earlier job's of a sequential multirun): each worker
        # gets its share of the cores (less the CPUs Ray Data's tasks keep, where the cluster's CPUs are set).
        cpus = cluster.local_cpus(resolved.ray, data_cpus)
        resolved = dataclasses.replace(resolved, scaling=cluster.machine_share(resolved.scaling, cpus))
        request = cluster.resource_request(resolved.scaling, data_cpus)
    if not request.num_workers:
        return resolved, 0
    cluster.connect(resolved.ray, request)
    return resolved, len([node for node in ray.nodes() if node["Alive"]])


def _fit(
    resolved: Resolved,
    run_dir: str,
    storage: str,
    name: str,
    local_mode: bool,
    started: float,
    extra_callbacks: Sequence[Any] = (),
    show_summary: bool = True,
    stream: Streamed | None = None,
    unresolved: Any = None,
    built: Any = None,
) -> dict[str, Any]:
    """TorchTrainer.fit, then the run dir's model.pt and summary.json (also on failure). ``stream``: a dataset
    Ray Data streams to the workers (``TorchTrainer(datasets=...)``); ``unresolved``: the composed config before
    resolution (what is saved of it: ``saved_config``); ``built``: text Ray Data tokenized for the workers."""
    origin = provenance(str(resolved.model.get("_target_") or ""))
    tracked, tracker_env = trackers.prepare_all(resolved.logger)  # a tracker that cannot be reached: dropped
    resolved = dataclasses.replace(resolved, logger=tracked)
    summarize = Summary(resolved, run_dir, os.path.join(storage, name), started, show_summary, origin, name, unresolved)
    epoch_log = EpochLog(run_dir, resolved.trainer.max_epochs)
    failures.forget(run_dir)
    # The user's before FailureLog, which raises at a failure that is not retried: they see that one too.
    callbacks = [epoch_log, *driver_callbacks(resolved.callbacks), failures.FailureLog(run_dir, resolved.failure)]
    callbacks += extra_callbacks
    saved = saved_config(resolved, unresolved)
    trainer_for = _trainer_factory(
        resolved, run_dir, storage, name, stream, callbacks, origin, tracker_env, saved, built
    )
    try:
        if local_mode:  # nothing persists a checkpoint: no notice to act on; the reports come from this process
            with local_reports(_as_callbacks_would(epoch_log, extra_callbacks)):
                result = trainer_for(None).fit()
        else:
            with posted_on_sigterm(f"hydra_raytrain.notice.{name}") as notice:
                result = trainer_for(notice).fit()
    except TrainingFailedError as error:
        summarize("failed", error=str(error))
        raise TrainingFailed(
            f"Training failed: {redact_text(_first_cause(error))}\nRun dir: {run_dir} (summary.json has the full error)"
        ) from None
    outcome: WorkerResult = result.return_value
    return _conclude(outcome, summarize, run_dir, result, built)


def _as_callbacks_would(epoch_log: EpochLog, extra_callbacks: Sequence[Any]) -> Callable[[dict[str, Any]], None]:
    """A local-mode run's listener to its reports (it runs no Ray Train callback): each epoch into metrics.jsonl as
    it ends, and every report to the caller's callbacks (a sweep trial's report to Tune), as on workers."""

    def heard(metrics: dict[str, Any]) -> None:
        if is_epoch_report(metrics):
            epoch_log.write(metrics)
        for callback in extra_callbacks:
            callback.after_report(None, [metrics], None)

    return heard


def _trainer_factory(
    resolved: Resolved,
    run_dir: str,
    storage: str,
    name: str,
    stream: Streamed | None,
    callbacks: list[Any],
    origin: dict[str, Any] | None = None,
    tracker_env: dict[str, str] | None = None,
    saved: dict[str, Any] | None = None,
    built: Any = None,
) -> Callable[[str | None], TorchTrainer]:
    """The run's ``TorchTrainer`` for a preemption notice's name (None: no notice): the workers' loop (ours, or
    Lightning's), its config, Ray Data's datasets, and Ray's config objects (``builders.py``); ``tracker_env``: the
    trackers' variables for the workers (``prepare_all``)."""
    for variable, value in RAY_TRAIN_ENV.items():
        os.environ.setdefault(variable, value)
    worker_env = builders.worker_env(resolved, {**RAY_TRAIN_ENV, **(tracker_env or {})}, import_path())
    loop_config: dict[str, Any] = {"cfg": resolved.to_dict(), "run_dir": run_dir, "run_name": name}
    loop_config["provenance"] = origin  # the loggers record it
    loop_config["saved_cfg"] = saved  # what checkpoints and trackers keep of the config: redacted
    if built is not None:  # in the object store once, read in place by every worker of the node
        loop_config["built"] = built
    data: dict[str, Any] = {}
    if stream is not None:
        from ray.data import DataContext  # each dataset keeps a copy of the driver's; Ray Train hands it on

        context = DataContext.get_current()
        context.enable_progress_bars = bool(resolved.trainer.progress_bar)
        context.print_on_execution_start = False  # two INFO lines per split and epoch
        loop_config["rows"] = stream.rows
        data = {"datasets": stream.ray_datasets(), "dataset_config": builders.ValidationOnce()}
    loop = train_loop_per_worker
    if is_lightning(resolved.task["_target_"]):
        from hydra_raytrain.recipe.lightning import train_loop_lightning as loop  # imports Lightning

    def trainer_for(notice: str | None) -> TorchTrainer:
        return TorchTrainer(
            loop,
            train_loop_config={**loop_config, "notice": notice},
            **data,
            scaling_config=builders.scaling_config(resolved.scaling),
            torch_config=builders.torch_config(resolved.scaling),
            run_config=builders.run_config(resolved, storage, name, callbacks=callbacks, worker_env=worker_env),
        )

    return trainer_for


@dataclass
class Summary:
    """Writes the run's ``summary.json`` (and ``curves.png``, the process logs) when the fit ends, and shows the
    summary table; returns the summary."""

    resolved: Resolved
    run_dir: str
    checkpoints: str  # the run's folder in Ray storage: <storage>/<run name>
    started: float
    show: bool
    provenance: dict[str, Any] | None = None  # where the run came from (driver/provenance.py)
    name: str = ""  # the run's name, as it started (sizing the workers does not make it another run)
    unresolved: Any = None  # the composed config before resolution (``saved_config``)

    def __call__(self, status: RunStatus, error: str | None = None, **extra: Any) -> dict[str, Any]:
        trainer = self.resolved.trainer
        monitor, mode = monitored(get_object(self.resolved.task["_target_"]), (trainer.monitor, trainer.monitor_mode))
        history = rundir.read_history(self.run_dir)
        elapsed = time.time() - self.started
        summary = rundir.make_summary(status, history, monitor, mode, self.run_dir, self.checkpoints, elapsed, error)
        summary["stopped_early"] = status == "completed" and len(history) < trainer.max_epochs
        summary["loggers"] = sorted(self.resolved.logger)  # what logged the run: a logger added later replays it
        summary["launched_from"] = os.getcwd()  # where the config's own modules imported from (evaluate's hint)
        summary["failures"] = failures.read(self.run_dir)  # what failed in this command, what was retried and why
        summary["provenance"] = self.provenance
        summary["storage_outages"] = storage_outages(self.checkpoints)  # survived (each said as it ended)
        summary.update(extra)
        rundir.write_json(os.path.join(self.run_dir, rundir.SUMMARY_FILE), summary)
        if history:
            report.plot_curves(history, os.path.join(self.run_dir, report.CURVES_FILE))
        keep_process_logs(self.run_dir)
        if self.show:
            Console().print(report.summary_table(summary))
            print(report.storage_line(summary), flush=True)
        return summary


def _conclude(
    outcome: WorkerResult, summarize: Summary, run_dir: str, result: Any = None, built: Any = None
) -> dict[str, Any]:
    """A preempted run's summary and how to resume it; a completed one's ``model.pt``, its test split's score
    (where the dataset has one: text the run tokenized, ``built``, is not tokenized again) and summary."""
    if outcome.status == "preempted":
        summary = summarize("preempted", preempted_by=outcome.notice)
        print(
            f"Preempted ({outcome.notice}) after optimizer step {outcome.steps}: checkpointed; the same "
            f"command resumes the run (exit code {PREEMPTED_EXIT_CODE}).\nRun dir: {run_dir}",
            flush=True,
        )
        return summary
    assert outcome.weights is not None, outcome.status
    with open(os.path.join(run_dir, rundir.MODEL_FILE), "wb") as file:
        file.write(outcome.weights)
    resolved = summarize.resolved
    best = _best_checkpoint(resolved, result)
    test = _test_best(resolved, run_dir, best, built) if has_test_split(resolved.dataset) else None
    logs, tested = _tracked_logs(run_dir, test if test and "error" not in test else None)
    config = {"cfg": saved_config(resolved, summarize.unresolved), "run_name": summarize.name}
    if tested is not None:
        trackers.replay_test(resolved.logger, config, run_dir, tested)
    summary = summarize("completed", test=test) if test else summarize("completed")
    ending = trackers.Ending(
        config,
        run_dir,
        logs,
        best[0] if best else None,
        files=lambda model: _run_files(run_dir, model),
        model=lambda folder: with_example(folder or run_dir, resolved.to_dict()),
    )
    trackers.complete_all(resolved.logger, ending)
    print(f"Run dir: {run_dir}", flush=True)
    return summary


def _best_checkpoint(resolved: Resolved, result: Any) -> tuple[Any, dict[str, Any]] | None:
    """The best checkpoint Ray kept and its metrics (by ``trainer.monitor``; on ties the earliest epoch, as
    summary.json's best); None where Ray kept none with it, as in local mode."""
    trainer = resolved.trainer
    monitor, mode = monitored(get_object(resolved.task["_target_"]), (trainer.monitor, trainer.monitor_mode))
    kept = [(c, m) for c, m in (getattr(result, "best_checkpoints", None) or []) if m.get(monitor) is not None]
    sign = 1 if mode == "max" else -1
    return max(kept, key=lambda pair: (sign * pair[1][monitor], -pair[1].get("epoch", 0))) if kept else None


def _test_best(
    resolved: Resolved, run_dir: str, best: tuple[Any, dict[str, Any]] | None, built: Any = None
) -> dict[str, Any]:
    """The best checkpoint (the final model where Ray kept none: ``_best_checkpoint``) scored on the dataset's test
    split, here on the driver: every test sample once. A failure warns and is recorded; the trained run stands."""
    trainer = resolved.trainer
    monitor, _ = monitored(get_object(resolved.task["_target_"]), (trainer.monitor, trainer.monitor_mode))
    cfg = resolved.to_dict()
    try:
        if best is None:
            metrics = score(run_dir, cfg, "test", built)
            where, epoch = os.path.join(run_dir, rundir.MODEL_FILE), None
        else:
            with best[0].as_directory() as folder:
                metrics = score(folder, cfg, "test", built)
            where, epoch = checkpoint_uri(best[0]), best[1].get("epoch")
    except Exception as error:  # noqa: BLE001  (training completed: its model and summary are written regardless)
        print(f"WARNING: the test split was not scored: {one_line(error)}", file=sys.stderr, flush=True)
        return {"error": one_line(error)}
    chosen = f"the checkpoint of epoch {epoch}, best {monitor}" if best is not None else "the final model"
    print(f"Test ({chosen}): {shown(metrics)}", flush=True)
    return {**metrics, "checkpoint": where, "epoch": epoch, "monitor": monitor}


def _log_finished_run(
    resolved: Resolved, run_dir: str, name: str, summary: dict[str, Any], unresolved: Any = None
) -> dict[str, Any]:
    """Loggers are not part of a run's identity: a logger added to a finished run's command gets the run's
    epochs from metrics.jsonl (on the driver, no training), and summary.json remembers it."""
    if "loggers" not in summary:  # written before summaries said which loggers logged the run: replay nothing
        return summary
    missing = {key: node for key, node in resolved.logger.items() if key not in summary["loggers"]}
    if not missing:
        return summary
    missing, _ = trackers.prepare_all(missing)
    resolved = dataclasses.replace(resolved, logger={**resolved.logger, **missing})  # what they log, as prepared
    logs, tested = _tracked_logs(run_dir, summary.get("test"))
    config = {"cfg": saved_config(resolved, unresolved), "run_name": name}
    logged = replay(missing, config, run_dir, logs, _run_files(run_dir))
    if logged:
        summary["loggers"] = sorted({*summary["loggers"], *logged})
        rundir.write_json(os.path.join(run_dir, rundir.SUMMARY_FILE), summary)
        epochs = len(logs) - (tested is not None)
        print(f"Logged the finished run's {epochs} epochs (metrics.jsonl) to: {', '.join(logged)}", flush=True)
    return summary


def _tracked_logs(run_dir: str, test: dict[str, Any] | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """What a tracker logs of a run: metrics.jsonl's epochs, then the test split's figures (``test_*``) at the last
    epoch's step; and that last row alone (None without test figures)."""
    history = rundir.read_history(run_dir)
    figures = {key: value for key, value in scalars(test or {}).items() if key.startswith("test_")}
    tested = {**figures, "epoch": len(history)} if figures else None
    return ([*history, tested] if tested else history), tested


def _run_files(run_dir: str, model: str | None = None) -> list[str]:
    """What a tracker keeps of a completed run: ``model.pt`` (``model``, else the run dir's), ``curves.png``,
    ``config.json``, ``summary.json``, a task's ``samples.jsonl`` and the run's chat template where it has them."""
    names = (
        report.CURVES_FILE,
        rundir.CONFIG_FILE,
        rundir.SUMMARY_FILE,
        rundir.SAMPLES_FILE,
        rundir.CHAT_TEMPLATE_FILE,
    )
    paths = [model or os.path.join(run_dir, rundir.MODEL_FILE), *(os.path.join(run_dir, n) for n in names)]
    return [path for path in paths if os.path.exists(path)]


@contextlib.contextmanager
def _multirun_parent(resolved: Resolved, run_dir: str) -> Iterator[Resolved]:
    """A job of Hydra's basic sweeper (``-m``, jobs one after another, each in ``<sweep dir>/<run name>``): each
    tracker's sweep record (MLflow's parent run) opened while the job lasts, the job's run in it; a tracker that
    cannot be reached is dropped from the job. ``hydra/sweeper=ray_tune`` opens its own: its trials' nodes say so.
    The sweep dir is the run dir's parent: ``${sweep_name:...}`` is cached, and Hydra hands the sweep's cache to
    each job it composes."""
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    opening = {n: node for n, node in resolved.logger.items() if not trackers.driver_side(node).in_sweep(node)}
    if not multirun or not opening:
        yield resolved
        return
    opened, handles = trackers.open_sweeps(opening, os.path.dirname(run_dir))
    logger = {n: opened.get(n, node) for n, node in resolved.logger.items() if n in opened or n not in opening}
    try:
        yield dataclasses.replace(resolved, logger=logger)
    finally:
        trackers.close_sweeps(opened, handles, {}, failed=False)


def _discard_previous_state(run_dir: str, storage: str, name: str, retry_window_s: float) -> None:
    """``run.resume=never``: this run's earlier files and Ray state go, so nothing resumes from them."""
    removed = [
        f
        for f in (rundir.METRICS_FILE, rundir.SUMMARY_FILE, rundir.MODEL_FILE, failures.FAILURES_FILE)
        if os.path.exists(os.path.join(run_dir, f))
    ]
    for file in removed:
        os.remove(os.path.join(run_dir, file))
    if delete_storage(f"{storage}/{name}", retry_window_s):
        removed.append(f"{storage}/{name}")
    if removed:
        print(f"run.resume=never: discarded the previous state of this run ({', '.join(removed)})", flush=True)


def _write_config(run_dir: str, cfg: DictConfig, saved: dict[str, Any]) -> None:
    """The composed config in ``.hydra/config.yaml`` (the CLI's run dir has Hydra's already), and the resolved one
    in ``config.json``, as in every checkpoint: absolute paths and inferred values, so ``evaluate`` works from any
    folder; ``saved``: the resolved config as saved (``saved_config``)."""
    if not os.path.exists(os.path.join(run_dir, ".hydra", "config.yaml")):
        _save_composed(run_dir, cfg)
    rundir.write_json(os.path.join(run_dir, rundir.CONFIG_FILE), saved)
    template = (saved.get("dataset") or {}).get("chat_template")
    if template:  # the template the run reads (its config holds the text): a file to read beside the config
        with open(os.path.join(run_dir, rundir.CHAT_TEMPLATE_FILE), "w", encoding="utf-8") as file:
            file.write(template)


def redact_hydra_files(run_dir: str) -> None:
    """Hydra's ``.hydra/`` files (the composed config, its own, the overrides) and, in a multirun, the sweep dir's
    ``multirun.yaml`` with their secrets ``***``."""
    paths = [os.path.join(run_dir, ".hydra", file) for file in ("config.yaml", "hydra.yaml", "overrides.yaml")]
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        paths.append(os.path.join(HydraConfig.get().sweep.dir, "multirun.yaml"))
    for path in paths:
        if os.path.exists(path):
            redact_yaml(path, overrides=path.endswith("overrides.yaml"))


def saved_config(resolved: Resolved, unresolved: Any = None) -> dict[str, Any]:
    """The resolved config as the run saves and logs it: secrets written ``***``, values from the environment as
    their interpolations (config/redact.py). The run itself uses ``resolved``."""
    return redact_tree(resolved.to_dict(), unresolved)


def _save_composed(run_dir: str, cfg: DictConfig) -> None:
    config_path = os.path.join(run_dir, ".hydra", "config.yaml")
    os.makedirs(os.path.dirname(config_path), exist_ok=True)
    save_redacted(config_path, OmegaConf.to_container(cfg, resolve=False))  # its secrets ***, as Hydra's files


def _first_cause(error: TrainingFailedError) -> str:
    """The lowest rank's error in one line (Hydra's instantiate wraps builder errors; its key line is noise)."""
    not_retried = getattr(error, "controller_failure", None)
    if isinstance(not_retried, failures.NotRetried):
        return str(not_retried)
    if isinstance(not_retried, StorageUnavailable):  # the controller's own write ran out of the window
        return f"Ray Train's controller: StorageUnavailable: {not_retried}"
    worker_failures = getattr(error, "worker_failures", None)
    if not worker_failures:
        return str(error).strip().splitlines()[-1]
    rank, cause = sorted(worker_failures.items())[0]
    return f"worker {rank}: {type(cause).__name__}: {one_line(cause)}"
