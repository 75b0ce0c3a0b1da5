"""Classification tasks that misbehave on purpose, imported inside Ray workers (the repo root is on their path)."""

import os
import signal
import time

import ray.train

from hydra_raytrain.tasks.classification import Classification


class CrashOnce(Classification):
    """SIGKILLs its own worker process at optimizer step ``at_step`` on ``rank``, once: the marker file
    records that it happened, so the restarted worker group trains on."""

    def __init__(self, marker: str, at_step: int, rank: int = 1, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.marker, self.at_step, self.rank, self.calls = marker, at_step, rank, 0

    def train_batch(self, step, batch):
        self.calls += 1
        if self.calls == self.at_step and ray.train.get_context().get_world_rank() == self.rank and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().train_batch(step, batch)


class Slow(Classification):
    """Sleeps after every batch, so that a test can act in the middle of a run."""

    def __init__(self, seconds_per_batch: float, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.seconds_per_batch = seconds_per_batch

    def train_batch(self, step, batch):
        time.sleep(self.seconds_per_batch)
        return super().train_batch(step, batch)
