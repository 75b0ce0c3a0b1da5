"""One CLI run of hydra_raytrain in a scratch folder, for the benchmarks: its epoch metrics and resolved config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def epoch_metrics(args: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``python -m hydra_raytrain *args`` in a fresh process (this environment, the repo on PYTHONPATH): the rows
    of its metrics.jsonl and its config.json. Exits with the run's stderr when it fails."""
    with tempfile.TemporaryDirectory() as folder:
        args = [*args, "hydra.run.dir=run"]
        env = {**os.environ, "PYTHONPATH": ROOT}
        done = subprocess.run(
            [sys.executable, "-m", "hydra_raytrain", *args], cwd=folder, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
        with open(os.path.join(folder, "run", "metrics.jsonl")) as file:
            epochs = [json.loads(line) for line in file]
        with open(os.path.join(folder, "run", "config.json")) as file:
            config = json.load(file)
    return epochs, config
