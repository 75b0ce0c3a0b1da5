"""Logs a failed run can be debugged from after the terminal is gone, and less of Ray's noise on the terminal.

<run dir>/driver.log          everything the driver's terminal showed (our lines, Ray's forwarded worker output)
<run dir>/logs/<who>.out|err  each worker's and the controller's stdout / stderr: links to Ray's files while the
                              run lasts, copies once it ends (``<who>`` = ``rank<R>-pid<P>`` or
                              ``controller-pid<P>``; a restarted worker gets a new pair)
"""

from __future__ import annotations

import contextlib
import glob
import io
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from typing import TextIO

from hydra_raytrain.config.errors import redacted
from hydra_raytrain.runtime.internals import (
    RAY_TRAIN_PLACEMENT_GROUP_CLEANER_LOGGER,
    RAY_TRAIN_USER_ERROR_LOGGER,
    ray_logs_dir,
    ray_train_context_logger,
)

LOGS_DIR = "logs"
DRIVER_LOG = "driver.log"


class _Tee(io.TextIOBase):
    def __init__(self, stream: TextIO, copy: TextIO):
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        given = len(text)
        text = redacted(text)  # a URI's credentials, whoever prints them (a tracker's "view run at" line)
        self.stream.write(text)
        with contextlib.suppress(ValueError):  # the copy closed under a late writer (a Ray log thread)
            self.copy.write(text)
        return given

    def flush(self) -> None:
        self.stream.flush()
        with contextlib.suppress(ValueError):
            self.copy.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


@contextlib.contextmanager
def tee_output(path: str) -> Iterator[None]:
    """Copy the driver's stdout and stderr into ``path`` (appended: a resumed run adds to the same file)."""
    with open(path, "a", buffering=1) as copy:
        stdout, stderr = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(stdout, copy), _Tee(stderr, copy)
        # Logging handlers hold the stream they were configured with (Hydra's console handler): they write
        # through the copy too while it lasts.
        handlers = [
            (h, h.stream)
            for h in logging.getLogger().handlers
            if type(h) is logging.StreamHandler and h.stream in (stdout, stderr)
        ]
        for handler, stream in handlers:
            handler.setStream(sys.stdout if stream is stdout else sys.stderr)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = stdout, stderr
            for handler, stream in handlers:
                handler.setStream(stream)


def link_process_logs(run_dir: str, who: str) -> None:
    """Link this Ray process's stdout / stderr files (Ray's ``worker-<id>-<job>-<pid>.out|err``) into
    ``<run dir>/logs``. Best effort: outside Ray, or on a node without the run dir, there is nothing to link."""
    try:
        import ray

        logs = ray_logs_dir()
        worker_id = ray.get_runtime_context().get_worker_id()
        folder = os.path.join(run_dir, LOGS_DIR)
        os.makedirs(folder, exist_ok=True)
        for source in glob.glob(os.path.join(logs, f"worker-{worker_id}-*-{os.getpid()}.*")):
            target = os.path.join(folder, f"{who}-pid{os.getpid()}{os.path.splitext(source)[1]}")
            if not os.path.lexists(target):
                os.symlink(source, target)
    except Exception as error:  # never fail a run over a log link
        logging.getLogger(__name__).debug(f"no log link for {who}: {error}")


def keep_process_logs(run_dir: str) -> None:
    """At the end of a run: each link whose file this machine can read becomes a copy, so the logs outlive
    Ray's session folder. Links to other nodes' files stay links."""
    folder = os.path.join(run_dir, LOGS_DIR)
    for link in glob.glob(os.path.join(folder, "*")):
        if os.path.islink(link) and os.path.isfile(link):
            source = os.path.realpath(link)
            os.remove(link)
            shutil.copyfile(source, link)


def quiet_ray_train(level: str) -> None:
    """Ray Train's INFO lines ("Reporting training result ...", "Moving model to device ...") at ``level``.
    Ray 2.60 names one of its loggers by file path (``logging.getLogger(__file__)`` in
    ray/train/v2/_internal/execution/context.py), so RunConfig's LoggingConfig, which filters ``ray.train.*``,
    misses it."""
    logging.getLogger("ray.train").setLevel(level)
    context_logger = ray_train_context_logger()
    if context_logger is not None:
        context_logger.setLevel(level)
    user_errors = logging.getLogger(RAY_TRAIN_USER_ERROR_LOGGER)
    user_errors.removeFilter(_no_worker_traceback)
    if logging.getLevelName(level) > logging.INFO:
        user_errors.addFilter(_no_worker_traceback)


# Ray 2.60's worker logs "Error in training function:" and the traceback, which reaches the driver's terminal once
# per rank. The driver prints the first rank's cause in one line instead, and summary.json keeps every rank's
# traceback (Ray's error snippets). ray.logging_level=INFO brings them back.


def _no_worker_traceback(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Error in training function")


def quiet_placement_group_cleaner() -> None:
    """``worker_process_setup_hook`` of a local cluster started without its dashboard (so without Ray's state API):
    Ray Train's placement-group cleaner would warn "Failed to query Ray Train Controller actor state" every few
    seconds of every run. It has nothing to clean there (the cluster ends with the command), so errors only."""
    logging.getLogger(RAY_TRAIN_PLACEMENT_GROUP_CLEANER_LOGGER).setLevel(logging.ERROR)
