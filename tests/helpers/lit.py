"""Lightning modules and a datamodule for the task=lightning tests, imported inside Ray workers (the repo root is on
their path)."""

import os
import signal
import time

import lightning.pytorch as pl
import ray.train
from torch.utils.data import DataLoader

from hydra_raytrain.data.bundled import digits
from hydra_raytrain.tasks.lit_classifier import LitClassifier


class CrashOnceLit(LitClassifier):
    """SIGKILLs its worker on ``rank`` at the start of epoch ``at_epoch`` (1-based), once (``marker`` records it),
    after Ray has counted the checkpoint ``after`` (60 s at most)."""

    def __init__(self, marker: str, at_epoch: int, after: str, rank: int = 1, **options):
        super().__init__(**options)
        self.marker, self.at_epoch, self.after, self.rank = marker, at_epoch, after, rank

    def on_train_epoch_start(self) -> None:
        if self.current_epoch + 1 != self.at_epoch or self.global_rank != self.rank or os.path.exists(self.marker):
            return
        open(self.marker, "w").close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            reported.checkpoint.path.rstrip("/").endswith(self.after)
            for reported in ray.train.get_all_reported_checkpoints(timeout_s=0.05)
        ):
            pass
        os.kill(os.getpid(), signal.SIGKILL)


class NoValidationMetric(LitClassifier):
    """Logs its training metrics only."""

    def validation_step(self, batch, batch_idx):
        return None


class DigitsDataModule(pl.LightningDataModule):
    """The bundled digits as a LightningDataModule (Lightning shards its loaders over the workers)."""

    def __init__(self, batch_size: int = 32):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        self.splits = digits()

    def train_dataloader(self):
        return DataLoader(self.splits.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.splits.val, batch_size=self.batch_size)


class SlowLit(LitClassifier):
    """Sleeps in every training step, so that a test can act in the middle of a run."""

    def __init__(self, seconds_per_batch: float, **options):
        super().__init__(**options)
        self.seconds_per_batch = seconds_per_batch

    def training_step(self, batch, batch_idx):
        time.sleep(self.seconds_per_batch)
        return super().training_step(batch, batch_idx)
