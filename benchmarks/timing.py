"""A classification task that notes when its first optimizer step finished (for benchmarks/throughput.py)."""

import time

import ray.train

from hydra_raytrain.storage.rundir import write_json
from hydra_raytrain.tasks.classification import Classification


def rank_0() -> bool:
    """Only rank 0 writes the benchmark's files (two workers writing one file at once leave it unreadable)."""
    return ray.train.get_context().get_world_rank() == 0


class TimedClassification(Classification):
    def __init__(self, record_to: str, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.record_to, self.recorded = record_to, False

    def train_batch(self, step, batch):
        sums = super().train_batch(step, batch)
        if not self.recorded and rank_0():
            write_json(self.record_to, {"first_step": time.time()})
            self.recorded = True
        return sums


class PeakMemory(Classification):
    """Samples its worker's memory every 16 batches, on rank 0, and keeps the largest figures in ``record_to``
    (for benchmarks/streaming.py): the private memory (USS) the process holds, and its resident memory, which also
    counts the pages of Ray's shared object store it has read blocks from."""

    def __init__(self, record_to: str, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.record_to, self.batches, self.peak = record_to, 0, {"uss": 0, "rss": 0}

    def train_batch(self, step, batch):
        if self.batches % 16 == 0 and rank_0():
            import psutil

            memory = psutil.Process().memory_full_info()
            self.peak = {name: max(self.peak[name], getattr(memory, name)) for name in self.peak}
            write_json(self.record_to, self.peak)
        self.batches += 1
        return super().train_batch(step, batch)
