"""The worker recipe: what every Ray Train worker runs (``train_loop_per_worker``).

Fixed phases, torchtune-style: ``setup`` (data, model, optimizer) -> ``train`` (one report per epoch) -> the
final weights in a checkpoint. The config arrives resolved from the driver (a plain dict, absolute paths):
``${hydra:...}`` and the driver's working directory mean nothing in a worker.
"""

from __future__ import annotations

import inspect
import io
import os
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import ray.train
import ray.train.torch
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel

from hydra_raytrain.driver.outputs import MODEL_FILE
from hydra_raytrain.recipe.loaders import build_loader, per_worker_batch_size
from hydra_raytrain.recipe.metrics import SumMeter
from hydra_raytrain.recipe.step import TrainStep


def train_loop_per_worker(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Rank 0 returns the epoch history and the final weights as ``torch.save`` bytes (``Result.return_value``;
    Ray refuses tensors there). Ray's local mode persists no checkpoint, so this is how the driver gets
    ``model.pt`` in every mode."""
    recipe = Recipe(OmegaConf.create(config["cfg"]))
    recipe.setup()
    history, weights = recipe.train()
    return {"history": history, "weights": weights} if recipe.rank == 0 else None


class Recipe:
    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        self.device = ray.train.torch.get_device()

    def setup(self) -> None:
        # The same seed on every rank: identical initial weights (DDP also broadcasts rank 0's at wrap time).
        torch.manual_seed(self.cfg.trainer.seed)
        self.task = instantiate(self.cfg.task)
        self._setup_data()
        self._setup_model()
        self._setup_optimizer()

    def _setup_data(self) -> None:
        trainer = self.cfg.trainer
        splits = instantiate(self.cfg.dataset, _convert_="all")
        batch = per_worker_batch_size(trainer.batch_size, trainer.batch_size_per_worker, self.world_size)
        shard = dict(rank=self.rank, world_size=self.world_size, seed=trainer.seed, options=trainer.dataloader)
        self.train_loader = build_loader(splits.train, batch, train=True, **shard)
        self.val_loader = build_loader(splits.val, trainer.val_batch_size_per_worker or batch, train=False, **shard)
        self.train_batches = min(len(self.train_loader), trainer.limit_train_batches or len(self.train_loader))
        self.val_batches = min(len(self.val_loader), trainer.limit_val_batches or len(self.val_loader))

    def _setup_model(self) -> None:
        # prepare_model moves to the worker's device and wraps in DDP when there is more than one worker.
        self.model = ray.train.torch.prepare_model(instantiate(self.cfg.model, _convert_="all"))
        self.unwrapped = self.model.module if isinstance(self.model, DistributedDataParallel) else self.model

    def _setup_optimizer(self) -> None:
        optimizer = instantiate(self.cfg.optimizer)(self.model.parameters())
        lr_scheduler = None
        if self.cfg.scheduler.lr_scheduler is not None:
            build = instantiate(self.cfg.scheduler.lr_scheduler)
            runtime = {"steps_per_epoch": self.train_batches}
            accepted = inspect.signature(build).parameters
            lr_scheduler = build(optimizer, **{k: v for k, v in runtime.items() if k in accepted})
        per_batch = self.cfg.scheduler.interval == "step"
        self.step = TrainStep(self.model, optimizer, lr_scheduler, step_scheduler_per_batch=per_batch)

    def train(self) -> Tuple[List[Dict[str, float]], Optional[bytes]]:
        max_epochs, history = self.cfg.trainer.max_epochs, []
        for epoch in range(max_epochs):
            # A new permutation each epoch, agreed by every rank; without this every epoch repeats epoch 0's order.
            self.train_loader.sampler.set_epoch(epoch)
            started = time.perf_counter()
            train = self._train_epoch()
            train_seconds = time.perf_counter() - started
            val = self._validate()
            metrics = {
                "epoch": epoch + 1,
                **{f"train_{k}": v for k, v in self.task.compute(train).items()},
                **{f"val_{k}": v for k, v in self.task.compute(val).items()},
                "lr": self.step.optimizer.param_groups[0]["lr"],
                "world_size": self.world_size,
                "samples_per_second": train["count"] / train_seconds,
                "epoch_seconds": time.perf_counter() - started,
            }
            if self.step.lr_scheduler is not None and not self.step.step_scheduler_per_batch:
                self.step.lr_scheduler.step()
            history.append(metrics)
            weights = self._report(metrics, final=epoch + 1 == max_epochs)
        return history, weights

    def _train_epoch(self) -> Dict[str, float]:
        self.model.train()
        meter = SumMeter()
        for _, batch in zip(range(self.train_batches), self.train_loader):
            meter.add(self.task.train_batch(self.step, self._to_device(batch)))
        return meter.totals()

    @torch.no_grad()
    def _validate(self) -> Dict[str, float]:
        # The unwrapped model: ranks hold different numbers of validation batches, and DDP's forward could
        # start a collective (buffer broadcast) that the other ranks never join.
        self.unwrapped.eval()
        meter = SumMeter()
        for _, batch in zip(range(self.val_batches), self.val_loader):
            meter.add(self.task.validation_step(self.unwrapped, self._to_device(batch)))
        return meter.totals()

    def _to_device(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._to_device(item) for item in batch)
        if isinstance(batch, dict):
            return {key: self._to_device(value) for key, value in batch.items()}
        return batch

    def _report(self, metrics: Dict[str, float], final: bool) -> Optional[bytes]:
        """Every rank reports (a barrier); at the end rank 0 attaches the final weights as Ray's checkpoint
        and returns the same bytes for the driver's ``model.pt``."""
        if not (final and self.rank == 0):
            ray.train.report(metrics)
            return None
        buffer = io.BytesIO()
        torch.save(self.unwrapped.state_dict(), buffer)
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, MODEL_FILE), "wb") as file:
                file.write(buffer.getvalue())
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
        return buffer.getvalue()
