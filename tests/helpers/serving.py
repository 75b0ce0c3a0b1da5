"""A real ``python -m hydra_raytrain.serve`` process for a test, and real HTTP requests to it on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.client
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def ask(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    """One real HTTP request to 127.0.0.1: its status and body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


@dataclass
class Server:
    process: subprocess.Popen
    errors: Path  # its stderr
    printed: list[str] = field(default_factory=list)  # its stdout, read as it comes
    health: str = ""  # the first /health answer


@contextlib.contextmanager
def serving(command: list[str], cwd: Path, port: int, ready_s: float = 120) -> Iterator[Server]:
    """The command started, waited for until it says ``Serving`` and /health answers 200; SIGTERM at the end."""
    errors = cwd / "serve-stderr.txt"
    with errors.open("w") as stderr:
        process = subprocess.Popen(command, cwd=str(cwd), stdout=subprocess.PIPE, stderr=stderr, text=True)
    server = Server(process, errors)
    reader = threading.Thread(target=lambda: server.printed.extend(iter(process.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline, status = time.time() + ready_s, 0
        while not (status == 200 and any(line.startswith("Serving ") for line in server.printed)):
            assert process.poll() is None, errors.read_text()[-3000:]
            assert time.time() < deadline, f"serve was not ready in {ready_s:.0f} s: {server.printed}"
            time.sleep(0.5)
            with contextlib.suppress(OSError):
                status, server.health = ask(port, "GET", "/health")
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        reader.join(timeout=10)
