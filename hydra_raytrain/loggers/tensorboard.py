"""TensorBoard event files in ``<run dir>/tensorboard`` from rank 0 (tensorboardX, which Ray ships)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from hydra_raytrain.outcome import RunStatus


class TensorBoardLogger:
    def __init__(self, subdir: str = "tensorboard"):
        self.subdir = subdir
        self.writer: Any = None  # tensorboardX.SummaryWriter once started

    def start(self, config: dict[str, Any], run_dir: str, run_id: str | None) -> str:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(os.path.join(run_dir, self.subdir))
        if config.get("provenance"):  # where the run came from: the command, git commit, versions, host
            self.writer.add_text("provenance", f"```\n{json.dumps(config['provenance'], indent=2)}\n```")
        return run_id or config["run_name"]

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        assert self.writer is not None, "start() first"
        for name, value in metrics.items():
            if name != "epoch":
                self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def finish(self, status: RunStatus) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
