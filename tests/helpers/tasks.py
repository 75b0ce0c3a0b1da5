"""Tasks that misbehave or report on purpose, imported inside Ray workers (the repo root is on their path)."""

import hashlib
import json
import os
import signal
import time

import ray.train
import torch

from hydra_raytrain.tasks.base import StepOutput
from hydra_raytrain.tasks.causal_lm import CausalLM
from hydra_raytrain.tasks.classification import Classification
from hydra_raytrain.tasks.dpo import DPO
from hydra_raytrain.tasks.gan import GAN


class _CrashOnce:
    """SIGKILLs its own worker process at micro-batch ``at_step`` on ``rank``, once: the marker file records
    that it happened, so the restarted worker group trains on. It first waits ``linger`` seconds: a checkpoint
    counts once Ray Train's controller has collected its report (it polls the workers every 0.25 s here), and a
    worker that dies before that loses it; or, with ``after`` (a checkpoint's name), until Ray has counted that
    one (and maybe later ones), 60 s at most: a wait that never ends would hang the test instead of failing it.
    With ``record`` (a folder), every rank appends each batch it trains (its process id and an md5 of each
    sample) to ``<record>/rank<R>.jsonl``."""

    def __init__(
        self,
        marker: str,
        at_step: int,
        rank: int = 1,
        record: str | None = None,
        linger: float = 0,
        after: str | None = None,
        **task_options,
    ):
        super().__init__(**task_options)
        self.marker, self.at_step, self.rank, self.calls, self.record = marker, at_step, rank, 0, record
        self.linger, self.after = linger, after

    def train_batch(self, step, batch):
        self.calls += 1
        rank = ray.train.get_context().get_world_rank()
        if self.calls == self.at_step and rank == self.rank and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(self.linger)
            deadline = time.monotonic() + 60  # never counted: killed anyway, and the test fails on what it resumed
            while (
                self.after
                and time.monotonic() < deadline
                and not any(
                    reported.checkpoint.path.rstrip("/").endswith(self.after)
                    for reported in ray.train.get_all_reported_checkpoints(timeout_s=0.05)
                )
            ):
                pass
            os.kill(os.getpid(), signal.SIGKILL)
        if self.record:
            samples = [hashlib.md5(sample.cpu().numpy().tobytes()).hexdigest() for sample in batch[0]]
            with open(os.path.join(self.record, f"rank{rank}.jsonl"), "a") as file:
                file.write(json.dumps({"pid": os.getpid(), "samples": samples}) + "\n")
        return super().train_batch(step, batch)


class CrashOnce(_CrashOnce, Classification):
    pass


class CrashOnceGAN(_CrashOnce, GAN):
    pass


class Slow(Classification):
    """Sleeps after every batch, so that a test can act in the middle of a run."""

    def __init__(self, seconds_per_batch: float, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.seconds_per_batch = seconds_per_batch

    def train_batch(self, step, batch):
        time.sleep(self.seconds_per_batch)
        return super().train_batch(step, batch)


class HeldUntil(Classification):
    """Each batch waits until the file ``path`` exists (120 s at most), so that a test acts in the middle of a run
    for as long as it needs, however slow the machine."""

    def __init__(self, path: str, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.path = path

    def train_batch(self, step, batch):
        deadline = time.monotonic() + 120
        while not os.path.exists(self.path) and time.monotonic() < deadline:
            time.sleep(0.1)
        return super().train_batch(step, batch)


class SlowProbe(Slow):
    """Slow, and on its first batch rank 0 adds the worker's environment variable ``variable`` to ``path`` (one
    JSON line per run): what the trials of a sweep received."""

    def __init__(self, seconds_per_batch: float, path: str, variable: str, label_smoothing: float = 0.0):
        super().__init__(seconds_per_batch, label_smoothing)
        self.path, self.variable, self.done = path, variable, False

    def train_batch(self, step, batch):
        if not self.done and ray.train.get_context().get_world_rank() == 0:
            with open(self.path, "a") as file:
                file.write(json.dumps({"env": os.environ.get(self.variable)}) + "\n")
            self.done = True
        return super().train_batch(step, batch)


class Probe(Classification):
    """On its first batch, rank 0 writes what the runner gave it to ``path``: its process id, the worker's
    environment variable ``variable``, the model's wrapper and DDP options, the input's memory format."""

    def __init__(self, path: str, variable: str, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.path, self.variable, self.done = path, variable, False

    def train_batch(self, step, batch):
        if not self.done and ray.train.get_context().get_world_rank() == 0:
            model = step.model
            with open(self.path, "w") as file:
                json.dump(
                    {
                        "pid": os.getpid(),
                        "env": os.environ.get(self.variable),
                        "wrapper": type(model).__name__,
                        "find_unused_parameters": getattr(model, "find_unused_parameters", None),
                        "bucket_bytes_cap": getattr(model, "bucket_bytes_cap", None),
                        "channels_last": batch[0].is_contiguous(memory_format=__import__("torch").channels_last),
                        "compiled": getattr(step.unwrapped["model"], "_compiled_call_impl", None) is not None,
                    },
                    file,
                )
        self.done = True
        return super().train_batch(step, batch)


class CudaOnly(Classification):
    """A step that runs on CUDA only (a custom kernel), as some users' models do."""

    def validation_step(self, model, batch):
        if not batch[0].is_cuda:
            raise RuntimeError("this kernel runs on CUDA only")
        return super().validation_step(model, batch)


class ShapeMismatch(Classification):
    """A bug that repeats on every attempt: a matrix product of mismatched shapes in the training step."""

    def train_batch(self, step, batch):
        __import__("torch").zeros(2, 3) @ __import__("torch").zeros(2, 3)


class FailsInTraining(Classification):
    """Raises in its first training step: a failure only a running worker can meet (the driver rehearses the
    validation step, not training)."""

    def __init__(self, message: str = "the loss diverged at the first step", label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.message = message

    def train_batch(self, step, batch):
        raise RuntimeError(self.message)


class Counted(Classification):
    """Classification that also reports what its sums saw: ``samples`` (the count) and ``label_sum`` (the labels
    added up), so a test proves which samples an epoch counted, over every worker."""

    def training_step(self, model, batch):
        output = super().training_step(model, batch)
        output.sums["label_sum"] = batch[1].sum()
        # Each label weighted by its place in the batch: the same rows in another order give another sum
        output.sums["label_order"] = (batch[1] * torch.arange(1, len(batch[1]) + 1, device=batch[1].device)).sum()
        return output

    def compute(self, sums):
        counted = {"samples": sums["count"], "label_sum": sums["label_sum"], "label_order": sums["label_order"]}
        return {**super().compute(sums), **counted}


class MeanPerBatchLM(CausalLM):
    """The causal LM loss as most hand-written loops take it: each micro-batch's mean over its own tokens (no
    normalizer), which DDP then averages over the workers: a short row's tokens weigh more than a long row's."""

    def training_step(self, model, batch):
        output = super().training_step(model, batch)
        return StepOutput(output.loss / output.normalizer.clamp(min=1), output.sums)


class CrashOnceLM(_CrashOnce, CausalLM):
    pass


class CrashOnceDPO(_CrashOnce, DPO):
    pass


class SlowLM(CausalLM):
    """A causal LM's task that sleeps after every batch, so that a test can act in the middle of a run."""

    def __init__(self, seconds_per_batch: float, **kwargs):
        super().__init__(**kwargs)
        self.seconds_per_batch = seconds_per_batch

    def train_batch(self, step, batch):
        time.sleep(self.seconds_per_batch)
        return super().train_batch(step, batch)


def completion_census(predictions: list[str], references: list[str]) -> dict[str, float]:
    """A generation metric (``task.generation_metrics``): how many rows were completed, how many distinct answers
    they had, and the completions' characters (a checksum of what was said)."""
    return {"rows": len(references), "distinct_answers": len(set(references)), "said": sum(map(len, predictions))}
