"""``locks.holding``: one holder of a folder at a time. A second is refused naming the first (host, pid, command), or
waits for it; a holder killed with SIGKILL leaves nothing that blocks the next."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hydra_raytrain.storage.locks import LOCK_FILE, Held, holding

HOLD = """
import sys, time
from hydra_raytrain.storage.locks import holding
with holding(sys.argv[1], "a test holds it", "wait"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold(folder, seconds):
    """Another process holding ``folder`` for ``seconds``, once it says so."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "held\n"
    return process


def test_a_held_folder_is_refused_naming_its_holder_and_a_killed_holder_leaves_it_free(tmp_path):
    holder = hold(tmp_path, 60)
    with pytest.raises(Held) as caught:
        with holding(str(tmp_path), "a run trains there", "Wait for it."):
            pass
    said = json.loads((tmp_path / LOCK_FILE).read_text())
    assert (said["pid"], said["host"]) == (holder.pid, socket.gethostname()) and "-c" in said["command"]
    message = str(caught.value)
    assert message.startswith(f"{tmp_path} is in use: a run trains there by pid {holder.pid} on {socket.gethostname()}")
    assert message.endswith(". Wait for it.") and caught.value.holder == said
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with holding(str(tmp_path), "a run trains there", "Wait for it."):  # taken over at once: no stale lock
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    with holding(str(tmp_path), "a run trains there", "Wait for it."):  # released when the block ended
        pass


def test_a_waiting_holder_starts_when_the_first_ends(tmp_path, capsys):
    holder = hold(tmp_path, 1.5)
    started = time.time()
    with holding(str(tmp_path), "a run trains there", "Wait for it.", wait=True):
        assert time.time() - started >= 1.0  # held once the first's 1.5 s hold had ended
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert holder.wait(timeout=30) == 0
    assert f"Waiting for {tmp_path}: a run trains there by pid {holder.pid}" in capsys.readouterr().err
