"""A preemption notice to the workers: SIGTERM to the driver, or Ray draining a node of the run.

SIGTERM to the driver (what a scheduler or a spot instance's notice sends) posts a notice on a small named Ray
actor, created then (a run that gets none starts no process for it); a thread of rank 0 looks the name up, and
rank 0 reads the notice between optimizer steps without waiting on it, and the workers checkpoint at the next step
and stop (recipe/cadence.py decides it the same on every rank). The run's status is then ``preempted`` and the
CLI exits with :data:`PREEMPTED_EXIT_CODE`; the identical command resumes the run. A second SIGTERM stops the
driver at once (as does SIGINT, Ray Train's own abort). The board lives on the driver's node.

A node drain (a spot reclaim seen by Ray's autoscaler, ``ray drain-node``) reaches every worker through Ray
Train's PreemptionWatcher; rank 0 reads it in the same look, and the run stops the same way, before the node goes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

import ray

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, run the command again


class NoticeBoard:
    """The actor (``num_cpus=0``) that holds the notice: created by the notice itself, under the run's board name."""

    def __init__(self, notice: str) -> None:
        self.notice = notice

    def read(self) -> str:
        return self.notice


@contextlib.contextmanager
def posted_on_sigterm(prefix: str) -> Iterator[str | None]:
    """While training: SIGTERM posts a notice on a board (its name, ``prefix`` and a unique suffix, is yielded
    for the workers), a second SIGTERM goes to the handler there was before (Ray's exits the driver). Yields
    None where no signal handler can be installed (not the main thread: a sweep trial); there is then no board.

    The board is an actor made by the first SIGTERM: a run costs no process (Ray's minimum is about a CPU-second
    to start one, and a share of a core while it lives) for a notice most runs never get."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = f"{prefix}.{uuid.uuid4().hex[:8]}"
    on_this_node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    boards: list[Any] = []
    received = threading.Event()
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        if received.is_set():
            if callable(previous):
                previous(signum, frame)
                return
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        received.set()
        # Ray registers a named actor at once: rank 0 finds the name while the board's process starts.
        board = ray.remote(num_cpus=0)(NoticeBoard).options(name=name, scheduling_strategy=on_this_node)
        boards.append(board.remote("SIGTERM"))
        print(
            "SIGTERM: checkpointing at the next optimizer step, then stopping; the same command resumes the run. "
            "Send SIGTERM again to stop at once.",
            file=sys.stderr,
            flush=True,
        )

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield name
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        for board in boards:
            with contextlib.suppress(Exception):  # Ray may be gone already: the run's own error matters, not this
                ray.kill(board)


class NoticeReader:
    """Rank 0's view of the board and of node drains. A thread looks the board's name up every ``interval``
    seconds and reads its notice once it exists, so a training step never waits on it. True from the first notice
    on; ``notice`` then says which ("SIGTERM", or the drain)."""

    def __init__(self, name: str, interval: float = 0.5):
        self.name, self.interval = name, interval
        self.notice: str | None = None
        self.posted: str | None = None  # the board's notice, set by the thread
        self.drains = preemption_context()
        # The thread holds the reader weakly: it ends with the reader (or at its first notice, or when Ray is gone).
        threading.Thread(target=_watch_board, args=(weakref.ref(self),), name="notice-board", daemon=True).start()

    def __call__(self) -> bool:
        if self.notice is not None:
            return True
        if self.drains is not None:
            self.notice = drain_notice(self.drains.preemption_info)
        self.notice = self.notice or self.posted
        return self.notice is not None


def _watch_board(ref: weakref.ref[NoticeReader]) -> None:
    while (reader := ref()) is not None and reader.notice is None:
        name, interval = reader.name, reader.interval
        del reader  # not kept alive by the wait
        try:
            board = ray.get_actor(name)
        except ValueError:  # no notice yet
            time.sleep(interval)
            continue
        except Exception:  # Ray is gone (the run ended): Ray Train ends the workers
            return
        try:
            notice = ray.get(board.read.remote())
        except ray.exceptions.RayActorError:  # the driver is gone: Ray Train ends the run
            return
        if (reader := ref()) is not None:
            reader.posted = notice
        return


def preemption_context() -> Any:
    """This worker's Ray Train preemption context, where Ray Train's PreemptionWatcher puts what it sees of a node
    of the run being drained; None (with a warning) where Ray's internals differ: drains are then left to Ray
    Train's restart from the latest checkpoint.

    Read from the worker's own train context: the public ``ray.train.get_preemption_info()`` is a barrier that
    every rank must join, where this is a look by rank 0 between steps, broadcast like the SIGTERM notice."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        context = get_train_context().preemption_context
        context.preemption_info  # noqa: B018  (the field read at every step)
        return context
    except (ImportError, AttributeError, RuntimeError) as error:
        logging.getLogger(__name__).warning(f"node drains are not watched ({type(error).__name__}: {error})")
        return None


def drain_notice(info: Any) -> str | None:
    """The notice for a ``ray.train.PreemptionInfo`` (None: no drain)."""
    if info is None:
        return None
    notice = f"Ray drains node {', '.join(info.preempted_node_ids)}"
    if info.deadline_ms:
        notice += f", deadline {time.strftime('%H:%M:%S', time.localtime(info.deadline_ms / 1000))}"
    return notice
