"""The worker recipe: what every Ray Train worker runs (``train_loop_per_worker``).

Fixed phases, torchtune-style: ``setup`` (data, models, optimizers, then the latest checkpoint if Ray restarted
us) -> ``train`` (one report per epoch, a full-state checkpoint every ``checkpoint.every_n_epochs`` and at
the end, or when early stopping ends the run; mid-epoch ones every ``checkpoint.every_n_steps`` optimizer steps,
``checkpoint.every_n_minutes``, and on a preemption notice, after which the run stops). The config arrives
resolved from the driver (a plain dict, absolute paths): ``${hydra:...}`` and the driver's working directory mean
nothing in a worker.

An epoch: its order set (``_start_epoch``), its batches (``_train_epoch``: the step is ``step.py``'s), validation,
its metrics, what follows them (``_end_epoch``), its report and checkpoint (``saving.py``). Where a run starts from
(a checkpoint, another run) is ``resuming.py``'s.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from functools import partial
from typing import Any, cast

import ray.train
import ray.train.torch
import torch
from hydra.utils import instantiate

from hydra_raytrain.callbacks.base import Callbacks, RunState
from hydra_raytrain.config.monitor import monitored
from hydra_raytrain.config.redact import redact_tree
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.loggers.base import build_loggers, finish_all, log_all, start_all
from hydra_raytrain.messages.notice import NoticeReader
from hydra_raytrain.messages.outcome import RunStatus, WorkerResult
from hydra_raytrain.recipe import checkpoint, ema, parallel, warm_start
from hydra_raytrain.recipe.augment import Augment
from hydra_raytrain.recipe.building import Place, build_loaders, build_models, build_profiler, build_step
from hydra_raytrain.recipe.cadence import Cadence
from hydra_raytrain.recipe.loaders import (
    copies_ahead,
    loader_seed,
    move_to,
    prefetched,
)
from hydra_raytrain.recipe.metrics import SumMeter, rates, reported, should_stop, validation_totals
from hydra_raytrain.recipe.resuming import Resuming
from hydra_raytrain.recipe.sampler import ShardedSampler
from hydra_raytrain.recipe.saving import Saving
from hydra_raytrain.recipe.seed import rank_seed, seed_everything, use_deterministic_algorithms
from hydra_raytrain.recipe.step import PARAM_DTYPES, sync_debug
from hydra_raytrain.recipe.streaming import StreamLoader
from hydra_raytrain.runtime.host import mark
from hydra_raytrain.storage.logfiles import link_process_logs, quiet_ray_train
from hydra_raytrain.tasks.base import Task

logger = logging.getLogger(__name__)


def train_loop_per_worker(config: dict[str, Any]) -> WorkerResult | None:
    """Rank 0 returns the status (completed, or preempted after a notice), the epoch history, the optimizer steps
    and the final weights as ``torch.save`` bytes (``Result.return_value``; Ray refuses tensors there). Ray's local
    mode persists no checkpoint, so this is how the driver gets ``model.pt`` in every mode."""
    rank = ray.train.get_context().get_world_rank()
    if rank == 0:
        mark("worker")  # Ray Train's controller and worker group started, this module imported
    cfg = Resolved.from_dict(config["cfg"])
    quiet_ray_train(cfg.ray.logging_level)
    link_process_logs(config["run_dir"], f"rank{rank}")
    recipe = Recipe(
        cfg,
        run_dir=config["run_dir"],
        run_name=config["run_name"],
        notice=config.get("notice"),
        rows=config.get("rows"),
        provenance=config.get("provenance"),
        saved=config.get("saved_cfg"),
        built=config.get("built"),
    )
    status: RunStatus = "failed"
    try:
        recipe.setup()
        if recipe.rank == 0:
            mark("setup")  # data, model, optimizer, DDP
        weights = recipe.train()
        status = recipe.status
    finally:
        recipe.cleanup(status)
    if recipe.rank != 0:
        return None
    notice = recipe.notice_reader.notice if recipe.notice_reader is not None else None
    return WorkerResult(status, recipe.history, recipe.global_step, weights, notice)


class Recipe(Resuming, Saving):
    """A worker's run in fixed phases: ``setup``, ``train`` (its epochs), ``cleanup``. Where it starts from is
    ``resuming.py``'s, what it saves ``saving.py``'s; the state they share is named in ``state.py``."""

    def __init__(
        self,
        cfg: Resolved,
        run_dir: str,
        run_name: str,
        notice: str | None = None,
        rows: dict[str, int] | None = None,
        provenance: dict[str, Any] | None = None,
        saved: dict[str, Any] | None = None,
        built: Any = None,
    ):
        """``rows``: the rows of each split of a dataset that Ray Data streams (None: the workers build it);
        ``provenance``: where the run came from (the driver's), for the loggers; ``saved``: the config as the run
        saves and logs it (redacted: the driver's ``saved_config``), for checkpoints and the loggers; ``built``:
        the text Ray Data tokenized for the run (``data/tokenized_ray.py``), read in place."""
        self.cfg, self.run_dir, self.run_name, self.notice, self.rows = cfg, run_dir, run_name, notice, rows
        self.built = built
        self.provenance = provenance
        self.saved = saved if saved is not None else redact_tree(cfg.to_dict())
        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        self.device = ray.train.torch.get_device()
        self.several_models = "_target_" not in cfg.model  # config.model names several models (a GAN)
        # trainer.precision=64: weights, inputs and whatever a task creates (noise, targets) in float64. The
        # default dtype is restored in cleanup: in local mode this is the driver's own process.
        self.float_dtype = PARAM_DTYPES.get(cfg.trainer.precision)
        self.default_dtype = torch.get_default_dtype()
        self.memory_format = torch.channels_last if cfg.trainer.channels_last else None  # read once: not per step
        self.sync_debug_mode = cfg.trainer.sync_debug_mode
        # peft: checkpoints and model.pt hold the adapters (and what else trains), not the frozen weights that the
        # model's builder gives again; unless those came from a warm start (run.init_from).
        run = cfg.run
        self.trained_only = checkpoint.trained_only(cfg.peft.method, cfg.model, run.init_from, run.init_full_state)
        augment = cfg.trainer.augment
        self.augment = Augment(augment.random_crop_padding, augment.horizontal_flip, cfg.trainer.seed)

    def setup(self) -> None:
        trainer = self.cfg.trainer
        if trainer.deterministic:
            use_deterministic_algorithms()
        # The same seed on every rank for the initial weights (DDP also broadcasts rank 0's at wrap time)...
        seed_everything(trainer.seed)
        self.task = instantiate(self.cfg.task)
        place = Place(self.rank, self.world_size, self.device, self.float_dtype)
        loaders = build_loaders(self.cfg, place, self.rows, self.built)
        self.train_loader, self.val_loader, self.batch_size = loaders.train, loaders.val, loaders.batch_size
        self.train_batches, self.val_batches = loaders.train_batches, loaders.val_batches
        models = build_models(self.cfg, place, loaders.splits)
        starting = partial(warm_start.starting_model, self.cfg.model, self.cfg.run.init_from)
        self.task.on_setup(starting, loaders.splits, self.device, self.float_dtype or torch.float32)  # before loaders
        if self.float_dtype is not None:  # after the models: float64 weights start from float32's initial values
            torch.set_default_dtype(self.float_dtype)
        self.step = build_step(self.cfg, models, self.train_batches, self.device)
        self.sharded = bool(self.step.gradient_sync)  # some model is sharded by FSDP
        decay = trainer.ema.decay  # the weights' moving averages: validated and saved (recipe/ema.py)
        self.averages = ema.averaged(self.step.unwrapped, decay) if decay is not None else {}
        self.val_steps = self._lockstep_val_batches() if self.sharded else self.val_batches
        # ...then a stream per rank: dropout masks, noise and augmentations differ between ranks.
        seed_everything(rank_seed(trainer.seed, self.rank))
        self.start_epoch, self.global_step = 0, 0  # global_step: optimizer steps
        self.status: RunStatus = "completed"
        self.position: dict[str, Any] | None = None  # where in start_epoch a mid-epoch checkpoint left off
        self.history: list[dict[str, Any]] = []
        self.tracker_ids: dict[str, str] = {}
        self.loggers = build_loggers(self.cfg.logger) if self.rank == 0 else {}
        self.callbacks = Callbacks.build(self.cfg.callbacks)  # every rank's; their state resumes with the run
        self.run_state = RunState(self.rank, self.world_size, self.run_dir, self.step.unwrapped, self.step.optimizers)
        self._from_another_run()
        rng = self._resume()
        # After resuming: a tracker continues the run whose id the checkpoint stored.
        config = {"cfg": self.saved, "run_name": self.run_name, "provenance": self.provenance}
        self.tracker_ids = start_all(self.loggers, config, self.run_dir, self.tracker_ids)
        self.profiler = build_profiler(self.cfg, place, self.run_dir)
        every = self.cfg.checkpoint
        self.notice_reader = NoticeReader(self.notice) if self.notice and self.rank == 0 else None
        self.uploads = checkpoint.Uploads(
            self.cfg.checkpoint.checkpoint_upload_mode,
            checkpoint.staging_folder(self.run_name, self.run_dir, self.rank),
            local_mode=self.cfg.scaling.num_workers == 0,
        )
        self.cadence = Cadence(
            every.every_n_steps,
            every.every_n_minutes,
            self.notice_reader,
            self.rank,
            self.world_size,
            self.notice is not None,
        )
        if rng is not None:  # last: nothing above draws from the streams the checkpoint left
            checkpoint.set_rng_state(rng)
        self.run_state.epoch = self.start_epoch + 1
        self._hook("on_run_start")
        self.started = True  # on_run_end is called for a run whose on_run_start was

    def cleanup(self, status: RunStatus) -> None:
        torch.set_default_dtype(self.default_dtype)
        if status == "failed" and getattr(self, "uploads", None) is not None:
            self.uploads.discard()
        if getattr(self, "started", False):
            try:
                self._hook("on_run_end", status)
            except Exception as failure:  # noqa: BLE001  (the run's own outcome stands)
                logger.warning(f"a callback's on_run_end failed: {failure}")
        for error in finish_all(getattr(self, "loggers", {}), status):
            logger.warning(f"a logger failed to finish: {error}")

    def train(self) -> bytes | None:
        """The epochs left; the final weights' bytes on rank 0, None when a preemption notice stopped the run."""
        max_epochs, weights, reported_final = self.cfg.trainer.max_epochs, None, False
        for epoch in range(self.start_epoch, max_epochs):
            if self._stop_early():  # a resumed run that had already stopped
                break
            position = self._start_epoch(epoch)
            started = time.perf_counter()
            meter = SumMeter.resumed(position["sums"], self.rank, self.device)
            train = self._train_epoch(epoch, position["batches"], meter)
            if train is None:  # preempted: checkpointed, every rank stops here
                self.status = "preempted"
                break
            speed = rates(train, position["sums"], time.perf_counter() - started)
            val = self._validate(epoch + 1)
            metrics = self._epoch_metrics(epoch + 1, train, val, speed, started)
            self._end_epoch(epoch + 1, metrics)
            final = epoch + 1 == max_epochs or self._stop_early()
            weights = self._report(metrics, epoch + 1, final=final)
            self._hook("on_epoch_end", metrics)
            if final:
                reported_final = True
                break
        self.cadence.close()
        self.uploads.close()
        if self.profiler is not None:
            self.profiler.stop()
        if not reported_final and self.status == "completed":  # resumed from the last one: nothing left to train
            weights = self._weights()  # on every rank (a collective under FSDP)
        return weights

    def _start_epoch(self, epoch: int) -> dict[str, Any]:
        """The epoch's data order set on every rank, and where in it to start: its first batch, or where a mid-epoch
        checkpoint left off (``samples`` of its order consumed, ``batches`` of this run's, the partial ``sums``)."""
        position, self.position = self.position or {"samples": 0, "batches": 0, "sums": {}}, None
        # A new permutation each epoch, agreed by every rank; without this every epoch repeats epoch 0's order.
        # A resumed epoch starts after what its ranks consumed before the checkpoint.
        if isinstance(self.train_loader, StreamLoader):  # a new pass over the data: it cannot seek
            self.train_loader.set_epoch(epoch)
        else:
            cast(ShardedSampler, self.train_loader.sampler).set_epoch(epoch, start=position["samples"])
            # Loader workers' seeds derive from this generator: reseeding per epoch makes a resumed epoch
            # draw exactly what the uninterrupted one drew.
            self.train_loader.generator.manual_seed(loader_seed(self.cfg.trainer.seed, self.rank, epoch))
        self.run_state.epoch = epoch + 1
        self._hook("on_epoch_start")
        return position

    def _epoch_metrics(
        self, epochs_done: int, train: dict[str, float], val: dict[str, float], speed: dict[str, float], started: float
    ) -> dict[str, Any]:
        """The epoch's report: the task's metrics of both splits, the learning rate, the speed, memory, timings."""
        return {
            "epoch": epochs_done,
            **{f"train_{k}": v for k, v in self.task.compute(train).items()},
            **{f"val_{k}": v for k, v in self.task.compute(val).items()},
            "lr": next(iter(self.step.optimizers.values())).param_groups[0]["lr"],
            "step": self.global_step,
            "world_size": self.world_size,
            **speed,
            "epoch_seconds": time.perf_counter() - started,
            **parallel.memory(self.step.models.values(), self.step.optimizers.values()),  # rank 0's share
            **self.step.timer.pop(),
        }

    def _end_epoch(self, epochs_done: int, metrics: dict[str, Any]) -> None:
        """What follows an epoch's validation: the callbacks' metrics added, the schedules stepped, the trackers
        fed, the history grown, the task's ``on_epoch_end``."""
        if self.callbacks:
            metrics.update(self.callbacks.validation_end(self.run_state, metrics))
        self.step.end_epoch()
        log_all(self.loggers, metrics, step=epochs_done)
        self.history.append(metrics)
        self._task_epoch_end(epochs_done)

    def _stop_early(self) -> bool:
        """Early stopping, decided from the epoch history (all-reduced metrics, so every rank agrees)."""
        settings = self.cfg.trainer.early_stopping
        if settings.patience is None:
            return False
        trainer = self.cfg.trainer
        monitor, mode = monitored(self.task, (settings.monitor, settings.mode), (trainer.monitor, trainer.monitor_mode))
        return should_stop(reported(self.history, monitor), mode, settings.patience, settings.min_delta)

    def _train_epoch(self, epoch: int, done: int, meter: SumMeter) -> dict[str, float] | None:
        """The epoch's batches from ``done`` on (0 unless resumed mid-epoch), their sums added to ``meter``; the
        epoch's totals, or None when a preemption notice stopped it (after a mid-epoch checkpoint)."""
        for model in self.step.models.values():
            model.train()
        window = self.cfg.trainer.accumulate_grad_batches
        batches = prefetched(
            itertools.islice(self.train_loader, self.train_batches - done),
            self._to_device,
            self.device,
            ahead=copies_ahead(self.train_loader, self.device),
        )
        bar, stopped = self._progress_bar(epoch, done), False
        for index in range(done, self.train_batches):
            with sync_debug(self.sync_debug_mode, self.device):  # nothing here waits for the GPU
                with self.step.timer("data"):
                    batch = next(batches)
                    if self.augment.enabled:
                        batch = self.augment(batch, epoch, self._positions(index, batch))
                # Gradients accumulate over `window` micro-batches; DDP all-reduces on the window's last one only.
                self.step.sync = (index + 1) % window == 0 or index + 1 == self.train_batches
                with self.step.no_sync():
                    sums = self.task.train_batch(self.step, batch)
                meter.add(sums)
                self.step.end_iteration()
            if self.profiler is not None:
                self.profiler.step()
            if bar is not None:
                bar.update(1)
            if not self.step.sync:
                continue
            self.global_step += 1  # an accumulation window ended: every optimizer stepped
            ema.update(self.averages, self.step.unwrapped)
            self._hook("on_after_optimizer_step", sums)
            decision = self.cadence.after_step(self.global_step)
            last = index + 1 == self.train_batches
            if decision.checkpoint and not (last and self._epoch_checkpoint_due(epoch + 1) and not decision.stop):
                self._save_mid_epoch(epoch, index + 1, meter)
            if decision.stop:
                stopped = True
                break
        if bar is not None:
            bar.close()
        return None if stopped else meter.totals()

    def _progress_bar(self, epoch: int, done: int) -> Any:
        """Rank 0's bar over the epoch's batches, drawn by the driver (ray.experimental.tqdm_ray: worker bars
        render cleanly there instead of interleaving)."""
        if self.rank != 0 or not self.cfg.trainer.progress_bar:
            return None
        from ray.experimental.tqdm_ray import tqdm

        bar = tqdm(total=self.train_batches, desc=f"epoch {epoch + 1}/{self.cfg.trainer.max_epochs}", unit="batch")
        if done:
            bar.update(done)
        return bar

    def _validate(self, epochs_done: int) -> dict[str, float]:
        # The unwrapped models: ranks hold different numbers of validation batches, and DDP's forward could
        # start a collective (buffer broadcast) that the other ranks never join. FSDP's forward all-gathers each
        # unit's parameters: there every rank runs as many forwards (``val_steps``), the extra ones uncounted; or,
        # for a pass whose forwards differ in number (a generation's), every unit is gathered first.
        uneven_forwards = self.task.on_validation_start(epochs_done, self.cfg.trainer.max_epochs)
        batches = itertools.islice(self.val_loader, self.val_batches)
        extra = 0 if uneven_forwards else self.val_steps - self.val_batches
        uneven = isinstance(self.val_loader, StreamLoader)  # a rank's shard may hold no batch at all
        with contextlib.ExitStack() as stack:
            if self.sharded and uneven_forwards:
                stack.enter_context(parallel.gathered(self.step.models.values(), self.cfg.fsdp.reshard_after_forward))
            stack.enter_context(self.step.precision.autocast())
            return validation_totals(
                self.task, self._eval_models(), batches, self._to_device, extra, uneven, self.device
            )

    def _lockstep_val_batches(self) -> int:
        """The most validation batches any rank holds (a collective): under FSDP every rank runs that many."""
        if not parallel.every_rank(self.val_batches > 0):  # every rank raises, none waits for the others
            raise ValueError(
                f"a rank holds no batch of the validation split (over {self.world_size} workers): FSDP needs "
                "every rank in every forward. Use fewer workers or a larger validation split."
            )
        most = torch.tensor(self.val_batches, device=self.device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
        return int(most.item())

    def _task_epoch_end(self, epochs_done: int) -> None:
        """The task's hook, on rank 0, with the unwrapped models (under FSDP, every unit's parameters gathered on
        every rank first: rank 0's forwards then need no collective)."""
        if type(self.task).on_epoch_end is Task.on_epoch_end:  # the default does nothing
            return
        with contextlib.ExitStack() as stack:
            if self.sharded:  # FSDP's units gathered; its low-precision weights need autocast, as in training
                stack.enter_context(parallel.gathered(self.step.models.values(), self.cfg.fsdp.reshard_after_forward))
                stack.enter_context(self.step.precision.autocast())
            if self.rank == 0:
                self.task.on_epoch_end(self._eval_models(), epochs_done, self.run_dir)

    def _eval_models(self) -> Any:
        """The unwrapped models, or their moving averages (``trainer.ema.decay``)."""
        models = {name: a.module for name, a in self.averages.items()} if self.averages else self.step.unwrapped
        return dict(models) if self.several_models else models["model"]

    def _to_device(self, batch: Any) -> Any:
        return move_to(batch, self.device, self.memory_format, self.float_dtype)

    def _positions(self, index: int, batch: Any) -> torch.Tensor:
        """The positions in the epoch's order of this rank's batch ``index``: sample j is at ``rank + world_size *
        (index * batch_size + j)`` (ShardedSampler's layout), however many workers there are."""
        count = len(batch[0] if isinstance(batch, (list, tuple)) else batch)
        first = index * self.batch_size
        return self.rank + self.world_size * torch.arange(first, first + count, device=self.device)
