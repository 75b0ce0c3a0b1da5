"""The logger protocol and the one place loggers are built."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Protocol

from hydra.utils import instantiate


class Logger(Protocol):
    def start(self, config: Dict[str, Any], run_dir: str, run_id: Optional[str]) -> str:
        """Begin (or, given the ``run_id`` a checkpoint stored, continue) the tracker's run; return its id."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def finish(self, status: str) -> None:
        """Always called, on failure too (``status`` "failed"), so a multirun logs every job."""


def build_loggers(nodes: Mapping[str, Any]) -> Dict[str, Logger]:
    """``logger`` config (name -> ``_target_`` node) -> started-later logger objects, by name."""
    return {name: instantiate(node) for name, node in (nodes or {}).items()}


def start_all(loggers: Mapping[str, Logger], config: Dict[str, Any], run_dir: str, run_ids: Mapping[str, str]) -> Dict[str, str]:
    return {name: logger.start(config, run_dir, run_ids.get(name)) for name, logger in loggers.items()}


def finish_all(loggers: Mapping[str, Logger], status: str) -> List[str]:
    """Finish every logger even if one fails; returns the errors so the caller can report them."""
    errors = []
    for name, logger in loggers.items():
        try:
            logger.finish(status)
        except Exception as error:  # a tracker's failure must not hide the run's own outcome
            errors.append(f"{name}: {error}")
    return errors
