"""The logger protocol and the one place loggers are built, started, fed and finished; the trackers' driver side.

A tracker is a helper: one that cannot start or log warns once and is dropped; training goes on, and the run's
own files (metrics.jsonl, summary.json, TensorBoard's) are still written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlparse

from hydra.utils import instantiate

from hydra_raytrain.config.errors import one_line
from hydra_raytrain.messages.outcome import RunStatus
from hydra_raytrain.storage.rundir import MODEL_FILE

log = logging.getLogger(__name__)


class Logger(Protocol):
    def start(self, config: dict[str, Any], run_dir: str, run_id: str | None) -> str:
        """Begin (or, given the ``run_id`` a checkpoint stored, continue) the tracker's run; return its id."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def finish(self, status: RunStatus) -> None:
        """Always called, on failure too (``status`` "failed"), so a multirun logs every job."""


def build_loggers(nodes: Mapping[str, Any]) -> dict[str, Logger]:
    """``logger`` config (name -> ``_target_`` node) -> started-later logger objects, by name."""
    return {name: instantiate(node) for name, node in (nodes or {}).items()}


def start_all(
    loggers: MutableMapping[str, Logger], config: dict[str, Any], run_dir: str, run_ids: Mapping[str, str]
) -> dict[str, str]:
    """Start each logger; one that fails is dropped from ``loggers`` with a warning."""
    started = {}
    for name, logger in list(loggers.items()):
        try:
            started[name] = logger.start(config, run_dir, run_ids.get(name))
        except Exception as error:
            _drop(loggers, name, "could not start", error)
    return started


def log_all(loggers: MutableMapping[str, Logger], metrics: Mapping[str, float], step: int) -> None:
    for name, logger in list(loggers.items()):
        try:
            logger.log_metrics(metrics, step)
        except Exception as error:
            _drop(loggers, name, "failed to log", error)


def finish_all(loggers: Mapping[str, Logger], status: RunStatus) -> list[str]:
    """Finish every logger even if one fails; returns the errors so the caller can report them."""
    errors = []
    for name, logger in loggers.items():
        try:
            logger.finish(status)
        except Exception as error:  # a tracker's failure must not hide the run's own outcome
            errors.append(f"{name}: {error}")
    return errors


def replay(
    nodes: Mapping[str, Any],
    config: dict[str, Any],
    run_dir: str,
    history: list[dict[str, Any]],
    files: Sequence[str] = (),
) -> list[str]:
    """Log a finished run's epochs (``metrics.jsonl``) on the driver: to loggers that did not log it when it trained
    (a logger added to a finished run's command), or what a tracker lacks once the run completes. ``files`` go to
    the loggers that keep files (a ``log_files`` method: MLflow's artifacts). Returns the names that logged it all."""
    loggers = build_loggers(nodes)
    start_all(loggers, config, run_dir, {})
    for metrics in history:
        log_all(loggers, metrics, step=metrics["epoch"])
    for name, logger in list(loggers.items()):
        if files and hasattr(logger, "log_files"):
            try:
                logger.log_files(list(files))
            except Exception as failure:  # the run completed: its tracker run did too, without the files
                _drop(loggers, name, "failed to log the run's files", failure, status="completed")
    for error in finish_all(loggers, "completed"):
        log.warning(f"a logger failed to finish: {error}")
    return sorted(loggers)


def _drop(
    loggers: MutableMapping[str, Logger], name: str, what: str, error: Exception, status: RunStatus = "failed"
) -> None:
    reason = " ".join(str(error).split())[:500]
    log.warning(
        f"logger.{name} {what} ({type(error).__name__}: {reason}); training goes on without it "
        f"(metrics.jsonl and summary.json are still written)."
    )
    try:
        loggers[name].finish(status)
    except Exception:
        pass
    del loggers[name]


def flat_settings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config's leaves by dotted name (``optimizer.lr``), as trackers list a run's settings; an empty
    mapping is a leaf."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flat_settings(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def server_problem(url: str, timeout_s: float = 3.0) -> str | None:
    """Why a TCP connection to a tracking server at ``url`` (or to the proxy that ``HTTPS_PROXY`` / ``HTTP_PROXY``
    name for it, unless ``NO_PROXY`` exempts it) fails, in a few seconds at most; None when it connects."""
    import urllib.request

    parsed = urlparse(url)
    proxy = urllib.request.getproxies().get(parsed.scheme)
    if proxy and not urllib.request.proxy_bypass(parsed.hostname or ""):
        parsed = urlparse(proxy if "://" in proxy else f"http://{proxy}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "", port), timeout=timeout_s).close()
    except OSError as error:
        return error.strerror or type(error).__name__
    return None


# A tracker's driver side, beside its worker side (``Logger``): what the driver (``driver/run.py``) and a sweep
# (``sweep/tuner.py``) ask of every tracker of a config's ``logger`` section. They loop over the trackers and name
# none; a tracker's class names its driver side (``driver_side = ...``), and one that names none needs nothing here.


class DriverSide:
    """What the driver asks of a tracker, by default nothing. Each method takes the tracker's config node and
    returns a new one where it changes it: a run's ``Resolved`` is never mutated."""

    test_with_completion = False  # the test split's figures go in with ``complete`` (else they are replayed)

    def prepare(self, node: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]] | None:
        """Before the workers start: the node as the workers will use it, and the variables to forward to them (on a
        joined cluster they do not inherit the driver's environment). None drops the tracker from this run, after
        one warning: the same command run again later logs the finished run to it."""
        return node, {}

    def for_trial(self, node: dict[str, Any], sweep_dir: str) -> dict[str, Any]:
        """The node of one trial of the sweep in ``sweep_dir``: how the tracker groups a sweep's runs."""
        return node

    def in_sweep(self, node: dict[str, Any]) -> bool:
        """Whether the node is a trial's of a sweep whose record is open already (``for_trial``)."""
        return False

    def open_sweep(self, node: dict[str, Any], sweep_dir: str) -> tuple[dict[str, Any], Any] | None:
        """Before a sweep's trials start: the sweep's own record opened (a handle for ``close_sweep``) and the node
        its trials use; None when the tracker cannot be reached (warned)."""
        return node, None

    def close_sweep(self, node: dict[str, Any], handle: Any, figures: Mapping[str, float], failed: bool) -> None:
        """The sweep's record ended, with its figures (the best trial's)."""

    def restart(self, node: dict[str, Any], run_name: str, run_dir: str) -> None:
        """``run.resume=never``: the run dir's earlier record set aside, so the new run starts its own."""

    def complete(self, node: dict[str, Any], ending: Ending) -> None:
        """Once a run completed and its files are written: what the tracker lacks of it."""


NOTHING_ON_THE_DRIVER = DriverSide()


@dataclass(frozen=True)
class Ending:
    """A completed run as the driver hands it to the trackers."""

    config: dict[str, Any]  # {"cfg": the resolved config, "run_name": ...}: what a Logger's start takes
    run_dir: str
    logs: list[dict[str, Any]]  # metrics.jsonl's epochs, then the test split's figures at the last epoch's step
    best: Any  # Ray's best checkpoint (None where Ray kept none)
    files: Callable[[str | None], list[str]]  # the run's files to keep, given the model file to keep (None: final)
    # The model with the weights of a checkpoint folder (None: the run's final ones) and a few validation inputs
    # (numpy): what a model format's signature and input example need. Raises where the task has no one model.
    model: Callable[[str | None], tuple[Any, Any]]

    @contextlib.contextmanager
    def kept_model(self, weights: str, tracker: str) -> Iterator[str | None]:
        """The model file a tracker keeps: with ``weights`` "best", the model.pt of the best checkpoint Ray kept
        (readable while the block lasts); None for the final model: with "last", where Ray kept none, where that
        checkpoint is sharded, or where it cannot be read (said)."""
        kept = None
        with contextlib.ExitStack() as stack:
            if weights == "best" and self.best is not None:
                try:
                    path = os.path.join(stack.enter_context(self.best.as_directory()), MODEL_FILE)
                    kept = path if os.path.exists(path) else None  # a sharded checkpoint: the final model
                except Exception as error:  # noqa: BLE001  (the final model is kept instead)
                    warn(f"{tracker}: the best checkpoint could not be read ({one_line(error)}): the final model")
            yield kept


def driver_side(node: Mapping[str, Any]) -> DriverSide:
    """The driver side of the tracker a ``logger`` node builds (its ``_target_``'s ``driver_side``)."""
    from hydra.utils import get_object

    return getattr(get_object(node["_target_"]), "driver_side", NOTHING_ON_THE_DRIVER)


def prepare_all(nodes: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Every tracker prepared before the workers start: the nodes kept (as prepared), and the variables to forward."""
    kept, env = {}, {}
    for name, node in nodes.items():
        prepared = driver_side(node).prepare(dict(node))
        if prepared is not None:
            kept[name], forwarded = prepared
            env.update(forwarded)
    return kept, env


def for_trial(nodes: Mapping[str, Any], sweep_dir: str) -> dict[str, Any]:
    return {name: driver_side(node).for_trial(dict(node), sweep_dir) for name, node in nodes.items()}


def open_sweeps(nodes: Mapping[str, Any], sweep_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each tracker's sweep record opened: the nodes its trials use (a tracker that cannot be reached dropped), and
    the handles to close."""
    kept, handles = {}, {}
    for name, node in nodes.items():
        opened = driver_side(node).open_sweep(dict(node), sweep_dir)
        if opened is not None:
            kept[name], handles[name] = opened
    return kept, handles


def close_sweeps(
    nodes: Mapping[str, Any], handles: Mapping[str, Any], figures: Mapping[str, float], failed: bool
) -> None:
    for name, handle in handles.items():
        if handle is not None:
            driver_side(nodes[name]).close_sweep(dict(nodes[name]), handle, figures, failed)


def restart_all(nodes: Mapping[str, Any], run_name: str, run_dir: str) -> None:
    for node in nodes.values():
        driver_side(node).restart(dict(node), run_name, run_dir)


def complete_all(nodes: Mapping[str, Any], ending: Ending) -> None:
    """What each tracker lacks of a completed run, once its files are written."""
    for node in nodes.values():
        driver_side(node).complete(dict(node), ending)


def replay_test(nodes: Mapping[str, Any], config: dict[str, Any], run_dir: str, test: dict[str, Any]) -> None:
    """The test split's figures (at the last epoch's step) to the trackers that do not take them with ``complete``."""
    replayed = {name: node for name, node in nodes.items() if not driver_side(node).test_with_completion}
    if replayed:
        replay(replayed, config, run_dir, [test])


def warn(message: str) -> None:
    """A tracker's warning on the driver's console: training goes on."""
    import sys

    print(f"WARNING: {message}", file=sys.stderr, flush=True)
