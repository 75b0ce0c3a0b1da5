"""A user's own callbacks, as a run imports them by their ``_target_`` (the session cluster's workers have ROOT
on their path)."""

import json

from ray.train import UserCallback


class StepCounter:
    """Counts the optimizer steps it saw, a state kept in checkpoints: after a resume it must go on counting
    from the checkpoint's figure, so that each epoch's ``counted_steps`` equals the run's ``step``."""

    def __init__(self):
        self.steps = 0

    def on_after_optimizer_step(self, run, sums):
        self.steps += 1

    def on_validation_end(self, run, metrics):
        return {"counted_steps": self.steps}

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


class ReportsSeen(UserCallback):
    """A Ray Train callback (the driver's): appends each report's epoch (null for a mid-epoch checkpoint's) and
    each failure's ranks to ``path``, one JSON line each."""

    def __init__(self, path: str):
        self.path = path

    def after_report(self, run_context, metrics, checkpoint):
        self._write({"epoch": metrics[0].get("epoch"), "checkpoint": checkpoint is not None})

    def after_exception(self, run_context, worker_exceptions):
        self._write({"failed": sorted(worker_exceptions)})

    def _write(self, entry):
        with open(self.path, "a") as file:
            file.write(json.dumps(entry) + "\n")
