"""A driver (``python -m hydra_raytrain``) started in the background, for tests that signal it mid-run."""

import os
import subprocess
import sys
import time

from tests.conftest import ROOT


def start_driver(args, cwd, output):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    return subprocess.Popen(
        [sys.executable, "-m", "hydra_raytrain", *args], cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT
    )


def wait_for(condition, driver, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and driver.poll() is None:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not reached in {timeout} s (driver exit code {driver.poll()})")
