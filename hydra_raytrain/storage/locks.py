"""One holder at a time of a folder: a run dir (the live driver of its run) or a folder ``predict`` is writing.

The hold is an exclusive ``flock`` on a file in the folder, which the kernel releases when the holding process ends,
however it ends (a SIGKILL, a crash; on NFS, a lost node's lease running out): a killed holder's folder is taken
over by the next command, with no stale lock to clean up. The file says who holds it (host, pid, since when, the
command), so a refusal names the holder. The file stays when the hold ends (removing it would let two processes
hold two files of one name); it is empty of meaning then. No torch or Ray at import.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

LOCK_FILE = ".lock"


class Held(Exception):
    """The folder is held by another live process: ``holder`` says which."""

    def __init__(self, folder: str, what: str, holder: dict[str, Any], advice: str) -> None:
        self.folder, self.holder = folder, holder
        super().__init__(f"{folder} is in use: {what} by {describe(holder)}. {advice}")


def describe(holder: dict[str, Any]) -> str:
    """``pid 123 on host-a since 2026-11-28 23:10:04 (python -m hydra_raytrain ...)``, or what is known of it."""
    if not holder:
        return "another process (it has not said which yet)"
    since = holder.get("since")
    when = datetime.datetime.fromtimestamp(since).strftime("%Y-%m-%d %H:%M:%S") if since else "?"
    command = f" ({holder['command']})" if holder.get("command") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')} since {when}{command}"


@contextlib.contextmanager
def holding(folder: str, what: str, advice: str, wait: bool = False) -> Iterator[None]:
    """Hold ``folder`` for the block: at once, or ``Held`` when another live process holds it (``what``: what that
    holder does, ``advice``: what to do about it); with ``wait``, wait for it, saying so once."""
    fd = _take(folder, what, advice, wait)
    try:
        mine = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(), "command": _command()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # the hold ends with the descriptor


def _take(folder: str, what: str, advice: str, wait: bool) -> int:
    """The descriptor of ``folder``'s lock file, locked; a file unlinked meanwhile (its folder removed or renamed
    by the holder it waited for) is no hold: the folder's new one is taken instead."""
    said = False
    while True:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            if not wait:
                os.close(fd)
                raise Held(folder, what, holder, advice) from None
            if not said:
                print(f"Waiting for {folder}: {what} by {describe(holder)}", file=sys.stderr, flush=True)
                said = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def held(folder: str) -> bool:
    """Whether a live process holds ``folder`` now (its lock file taken)."""
    try:
        fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _read(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 4096, 0)
        holder = json.loads(data) if data.strip() else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


def _command() -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    shown = "python -m hydra_raytrain" if script == "__main__.py" else script
    from hydra_raytrain.config.redact import redact_text

    return redact_text(" ".join([shown, *sys.argv[1:]]))[:300]
