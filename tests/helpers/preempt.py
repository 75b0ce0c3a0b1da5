"""Preempting a run that trains in this process: SIGTERM to it, from a thread, once a file appears."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path


def sigterm_once_written(path: Path, timeout: float = 120) -> None:
    """From a thread: SIGTERM to this process once ``path`` exists (a run dir's ``metrics.jsonl``: its first epoch
    ended), while the driver's handler is installed (never pytest's own end)."""

    def wait_and_signal() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not path.exists():
            time.sleep(0.05)
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait_and_signal, daemon=True).start()
