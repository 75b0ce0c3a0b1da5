"""A classification task that notes when its first optimizer step finished (for benchmarks/throughput.py)."""

import json
import time

from hydra_raytrain.tasks.classification import Classification


class TimedClassification(Classification):
    def __init__(self, record_to: str, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.record_to, self.recorded = record_to, False

    def train_batch(self, step, batch):
        sums = super().train_batch(step, batch)
        if not self.recorded:
            with open(self.record_to, "w") as file:
                json.dump({"first_step": time.time()}, file)
            self.recorded = True
        return sums
