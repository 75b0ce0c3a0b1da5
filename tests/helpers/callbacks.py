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


class HookLog:
    """Rank 0 appends each hook it is called at to ``path``, one line each: the order the loop calls them in."""

    def __init__(self, path: str):
        self.path = path

    def _write(self, run, text):
        if run.rank == 0:
            with open(self.path, "a") as file:
                file.write(text + "\n")

    def on_run_start(self, run):
        self._write(run, f"run_start {run.epoch}")

    def on_epoch_start(self, run):
        self._write(run, f"epoch_start {run.epoch}")

    def on_after_optimizer_step(self, run, sums):
        self._write(run, f"step {run.global_step}")

    def on_validation_end(self, run, metrics):
        self._write(run, f"validation_end {metrics['epoch']}")

    def on_checkpoint(self, run, name):
        self._write(run, f"checkpoint {name}")

    def on_epoch_end(self, run, metrics):
        self._write(run, f"epoch_end {metrics['epoch']}")

    def on_run_end(self, run, status):
        self._write(run, f"run_end {status}")


class WeightsMoved:
    """Reports, after each epoch's validation, how far the models' parameters have moved since the run started
    (``moved``: the largest absolute change) and the optimizer steps it saw (``steps_seen``): that training steps
    happened and changed the weights, not just that a run completed."""

    def __init__(self):
        self.start, self.steps = None, 0

    def on_run_start(self, run):
        self.start = {
            (model, name): p.detach().clone() for model, m in run.models.items() for name, p in m.named_parameters()
        }

    def on_after_optimizer_step(self, run, sums):
        self.steps += 1

    def on_validation_end(self, run, metrics):
        now = {(model, name): p.detach() for model, m in run.models.items() for name, p in m.named_parameters()}
        moved = max((now[key].float() - start.float()).abs().max().item() for key, start in self.start.items())
        return {"moved": moved, "steps_seen": self.steps}
