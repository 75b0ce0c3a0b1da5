"""The worker recipe: what every Ray Train worker runs (``train_loop_per_worker``).

Fixed phases, torchtune-style: ``setup`` (data, model, optimizer, then the latest checkpoint if Ray restarted
us) -> ``train`` (one report per epoch, a full-state checkpoint every ``checkpoint.every_n_epochs`` and at
the end). The config arrives resolved from the driver (a plain dict, absolute paths):
``${hydra:...}`` and the driver's working directory mean nothing in a worker.
"""

from __future__ import annotations

import inspect
import io
import itertools
import logging
import tempfile
import time
from typing import Any, Dict, Optional

import ray.train
import ray.train.torch
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel

from hydra_raytrain.loggers.base import build_loggers, finish_all, start_all
from hydra_raytrain.recipe import checkpoint
from hydra_raytrain.recipe.loaders import build_loader, loader_seed, move_to, per_worker_batch_size
from hydra_raytrain.recipe.metrics import SumMeter, validation_totals
from hydra_raytrain.recipe.step import TrainStep

logger = logging.getLogger(__name__)


def train_loop_per_worker(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Rank 0 returns the epoch history and the final weights as ``torch.save`` bytes (``Result.return_value``;
    Ray refuses tensors there). Ray's local mode persists no checkpoint, so this is how the driver gets
    ``model.pt`` in every mode."""
    recipe = Recipe(OmegaConf.create(config["cfg"]), run_dir=config["run_dir"], run_name=config["run_name"])
    status = "failed"
    try:
        recipe.setup()
        weights = recipe.train()
        status = "completed"
    finally:
        recipe.cleanup(status)
    return {"history": recipe.history, "weights": weights} if recipe.rank == 0 else None


class Recipe:
    def __init__(self, cfg: DictConfig, run_dir: str, run_name: str):
        self.cfg, self.run_dir, self.run_name = cfg, run_dir, run_name
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
        self.start_epoch, self.global_step, self.history, self.tracker_ids = 0, 0, [], {}
        self.loggers = build_loggers(OmegaConf.to_container(self.cfg.logger)) if self.rank == 0 else {}
        self._resume()
        # After resuming: a tracker continues the run whose id the checkpoint stored.
        config = {"cfg": OmegaConf.to_container(self.cfg), "run_name": self.run_name}
        self.tracker_ids = start_all(self.loggers, config, self.run_dir, self.tracker_ids)

    def cleanup(self, status: str) -> None:
        for error in finish_all(getattr(self, "loggers", {}), status):
            logger.warning(f"a logger failed to finish: {error}")

    def _resume(self) -> None:
        """Continue from Ray's latest checkpoint (after a worker failure, or a re-run of the same run);
        a checkpoint that does not load is skipped for the one before it."""
        latest = ray.train.get_checkpoint()
        if latest is None:
            return
        older = [reported.checkpoint for reported in reversed(ray.train.get_all_reported_checkpoints())]
        candidates = [latest] + [c for c in older if c.path != latest.path]
        state = checkpoint.read_newest_loadable(candidates, self.rank, warn=lambda message: logger.warning(message))
        if state is None:
            raise RuntimeError(f"None of the run's {len(candidates)} checkpoints loads; see the warnings above.")
        self.unwrapped.load_state_dict(state["model"])
        self.step.optimizer.load_state_dict(state["train"]["optimizer"])
        if self.step.lr_scheduler is not None:
            self.step.lr_scheduler.load_state_dict(state["train"]["lr_scheduler"])
        self.start_epoch = state["train"]["epoch"]
        self.global_step = state["train"]["global_step"]
        self.history = list(state["train"]["history"])
        self.tracker_ids = dict(state["train"].get("tracker_ids") or {})
        if state["rng"] is not None:
            checkpoint.set_rng_state(state["rng"])

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

    def train(self) -> Optional[bytes]:
        max_epochs, weights = self.cfg.trainer.max_epochs, None
        for epoch in range(self.start_epoch, max_epochs):
            # A new permutation each epoch, agreed by every rank; without this every epoch repeats epoch 0's order.
            self.train_loader.sampler.set_epoch(epoch)
            # Loader workers' seeds derive from this generator: reseeding per epoch makes a resumed epoch
            # draw exactly what the uninterrupted one drew.
            self.train_loader.generator.manual_seed(loader_seed(self.cfg.trainer.seed, self.rank, epoch))
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
            for tracker in self.loggers.values():
                tracker.log_metrics(metrics, step=epoch + 1)
            self.history.append(metrics)
            weights = self._report(metrics, epoch + 1, final=epoch + 1 == max_epochs)
        return weights

    def _train_epoch(self) -> Dict[str, float]:
        self.model.train()
        meter = SumMeter()
        for batch in itertools.islice(self.train_loader, self.train_batches):
            meter.add(self.task.train_batch(self.step, self._to_device(batch)))
            self.global_step += 1
        return meter.totals()

    def _validate(self) -> Dict[str, float]:
        # The unwrapped model: ranks hold different numbers of validation batches, and DDP's forward could
        # start a collective (buffer broadcast) that the other ranks never join.
        batches = itertools.islice(self.val_loader, self.val_batches)
        return validation_totals(self.task, self.unwrapped, batches, self._to_device)

    def _to_device(self, batch: Any) -> Any:
        return move_to(batch, self.device)

    def _report(self, metrics: Dict[str, float], epochs_done: int, final: bool) -> Optional[bytes]:
        """Every rank reports (a barrier). Every ``checkpoint.every_n_epochs`` epochs and at the end, each rank
        adds its share of a full-state checkpoint; at the end rank 0 also returns the weights' bytes."""
        if not (final or epochs_done % self.cfg.checkpoint.every_n_epochs == 0):
            ray.train.report(metrics)
            return None
        weights = None
        with tempfile.TemporaryDirectory() as folder:
            if self.rank == 0:
                buffer = io.BytesIO()
                torch.save(self.unwrapped.state_dict(), buffer)
                weights = buffer.getvalue()
                checkpoint.write(folder, self.rank, self.unwrapped.state_dict(), self._train_state(epochs_done), OmegaConf.to_container(self.cfg))
            else:
                checkpoint.write(folder, self.rank)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder), checkpoint_dir_name=f"epoch_{epochs_done:04d}")
        return weights if final else None

    def _train_state(self, epochs_done: int) -> Dict[str, Any]:
        monitor = self.cfg.trainer.monitor or self.task.monitor
        scores = [m[monitor] for m in self.history if monitor in m]
        pick = max if (self.cfg.trainer.monitor_mode or self.task.mode) == "max" else min
        return {
            "optimizer": self.step.optimizer.state_dict(),
            "lr_scheduler": self.step.lr_scheduler.state_dict() if self.step.lr_scheduler is not None else None,
            "epoch": epochs_done,  # the sampler's next epoch is this one (0-based)
            "global_step": self.global_step,
            "best": {"monitor": monitor, "value": pick(scores) if scores else None},
            "history": self.history,
            "tracker_ids": self.tracker_ids,  # so a resumed run continues the same tracker runs
        }
