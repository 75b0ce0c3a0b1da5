"""The logger protocol and the one place loggers are built, started, fed and finished.

A tracker is a helper: one that cannot start or log warns once and is dropped; training goes on, and the run's
own files (metrics.jsonl, summary.json, TensorBoard's) are still written.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlparse

from hydra.utils import instantiate

from hydra_raytrain.outcome import RunStatus

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
