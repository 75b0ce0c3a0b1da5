"""Which worker failures are retried, and the record of each one (``failures.jsonl`` in the run dir, and the
summary's ``failures``).

Ray Train retries any worker failure up to ``failure.max_failures`` times, each at a full start-up's cost. An
error that will repeat (the user's code or config: a shape mismatch, a missing key, CUDA out of memory) is
not retried: the run ends at the first one and says why. A worker process that died (killed, out of host
memory, its node lost) is always retried: its surviving peers' errors are consequences.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray.train import UserCallback

from hydra_raytrain.config.errors import one_line, redacted
from hydra_raytrain.runtime.internals import RAY_TRAIN_CONTROLLER_LOGGER
from hydra_raytrain.storage.rundir import read_jsonl

if TYPE_CHECKING:  # FailureLog runs in Ray Train's controller: Hydra's import (~0.3 s) stays out of its start
    from hydra_raytrain.config import schema

FAILURES_FILE = "failures.jsonl"
STOP_TRAINING = "StopTraining:"  # hydra_raytrain.callbacks' stop: never retried, whatever failure.retry_on says
STORAGE_UNAVAILABLE = "StorageUnavailable:"  # storage/retry.py's window ran out: retrying would wait it again


class NotRetried(RuntimeError):
    """Raised on Ray Train's controller to end the run without the retries ``failure.max_failures`` allows."""


@dataclass(frozen=True)
class Verdict:
    retried: bool
    why: str


def describe(error: BaseException) -> str:
    """What the patterns are searched in: ``"<ExceptionType>: <message on one line>"``."""
    return f"{type(error).__name__}: {one_line(error)}"


def process_died(error: BaseException) -> bool:
    """Ray's own errors stand for a worker process that is gone (health check failed, actor died)."""
    return type(error).__module__.startswith("ray.")


def classify(
    errors: Mapping[int, str],
    died: bool,
    not_retried: Sequence[str],
    retry_on: Sequence[str],
    failures: int,
    max_failures: int,
) -> Verdict:
    """The verdict on the run's ``failures``-th failure: ``errors`` are the failed workers' descriptions."""
    if not died:
        stopped = next((rank for rank, text in sorted(errors.items()) if text.startswith(STOP_TRAINING)), None)
        if stopped is not None:
            return Verdict(False, f"a callback of worker {stopped} stopped the run")
        away = next((rank for rank, text in sorted(errors.items()) if STORAGE_UNAVAILABLE in text), None)
        if away is not None:
            return Verdict(False, f"worker {away} retried storage for storage.retry_window_s")
        for rank, text in sorted(errors.items()):
            pattern = next((p for p in not_retried if re.search(p, text)), None)
            if pattern is not None and not any(re.search(p, text) for p in retry_on):
                return Verdict(False, f"worker {rank}'s error would repeat (matches failure.not_retried {pattern!r})")
    if max_failures != -1 and failures > max_failures:
        return Verdict(False, f"failure.max_failures={max_failures} reached")
    return Verdict(True, "a worker process died" if died else "no failure.not_retried pattern matches")


class FailureLog(UserCallback):
    """On Ray Train's controller (the driver's node): records each failure in ``<run dir>/failures.jsonl`` and
    ends the run at one that would repeat. An exception raised here fails Ray's control loop, which does not
    retry it (a ControllerError); Ray's own limit (``max_failures``) is left to Ray."""

    def __init__(self, run_dir: str, failure: schema.FailureConfig):
        self.path, self.failure, self.failures = os.path.join(run_dir, FAILURES_FILE), failure, 0

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        self.failures += 1
        errors = {rank: describe(error) for rank, error in sorted(worker_exceptions.items())}
        died = any(process_died(error) for error in worker_exceptions.values())
        failure = self.failure
        verdict = classify(errors, died, failure.not_retried, failure.retry_on, self.failures, failure.max_failures)
        with open(self.path, "a") as file:
            record = {"failure": self.failures, "errors": errors, **vars(verdict)}
            file.write(redacted(json.dumps(record)) + "\n")  # a URI's credentials in an error: ***
        rank, first = next(iter(errors.items()))
        if verdict.retried:  # otherwise the driver's last line says it
            print(f"Worker failure {self.failures}: worker {rank}: {first[:300]}; retrying: {verdict.why}", flush=True)
        within_limit = failure.max_failures == -1 or self.failures <= failure.max_failures
        if not verdict.retried and within_limit:
            logging.getLogger(RAY_TRAIN_CONTROLLER_LOGGER).addFilter(_without_not_retried)
            raise NotRetried(f"worker {rank}: {first} (not retried: {verdict.why})")


def _without_not_retried(record: logging.LogRecord) -> bool:
    """The controller's log of our NotRetried, with its traceback, dropped: the driver's last line says it."""
    return not (record.exc_info and isinstance(record.exc_info[1], NotRetried))


def read(run_dir: str) -> list[dict[str, Any]]:
    return read_jsonl(os.path.join(run_dir, FAILURES_FILE))


def forget(run_dir: str) -> None:
    """A new command on the run: its summary tells that command's failures."""
    path = os.path.join(run_dir, FAILURES_FILE)
    if os.path.exists(path):
        os.remove(path)
