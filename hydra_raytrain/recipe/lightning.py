"""What every Ray Train worker runs for ``task=lightning``: the user's ``LightningModule``, unchanged, in a
``lightning.Trainer`` set up by Ray's own recipe (``RayDDPStrategy``, ``RayLightningEnvironment``,
``prepare_trainer``), with our settings mapped onto Lightning's arguments.

The output contract is the one of ``recipe/loop.py``: at each epoch's end :class:`RunReport` reports the module's
logged metrics (``trainer.callback_metrics``) with the runner's own (``epoch``, ``step``, ``lr``, ...) to Ray
Train, whose controller writes ``metrics.jsonl``; every ``checkpoint.every_n_epochs`` epochs and at the end the
report carries a Lightning checkpoint (``checkpoint.ckpt``, written by rank 0) to Ray storage. A restarted worker
group, or a re-run of the same command, continues with ``trainer.fit(ckpt_path=...)`` from Ray's latest one: the
weights, the optimizers, the LR schedulers, the epoch and step counters and this callback's history come back
(Lightning does not save RNG states: dropout masks and random transforms of the epochs after it differ).
"""

from __future__ import annotations

import io
import logging
import math
import os
import tempfile
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import ray.train
import torch
from hydra.utils import instantiate

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.monitor import monitored
from hydra_raytrain.config.redact import redact_tree
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.loggers.base import build_loggers, finish_all, log_all, start_all
from hydra_raytrain.messages.notice import NoticeReader
from hydra_raytrain.messages.outcome import RunStatus, WorkerResult
from hydra_raytrain.recipe import checkpoint
from hydra_raytrain.recipe.cadence import Cadence
from hydra_raytrain.recipe.lightning_setup import MODULE_LOADERS, check_module
from hydra_raytrain.recipe.loaders import (
    build_loader,
    loader_processes,
    loader_seed,
    per_worker_batch_size,
    worker_cpus,
)
from hydra_raytrain.recipe.seed import rank_seed, seed_everything
from hydra_raytrain.storage.logfiles import link_process_logs, quiet_ray_train
from hydra_raytrain.storage.rundir import CONFIG_FILE, write_json
from hydra_raytrain.tasks.lightning import Lightning

CHECKPOINT_FILE = "checkpoint.ckpt"  # Ray's RayTrainReportCallback name for the Lightning checkpoint

logger = logging.getLogger(__name__)


def train_loop_lightning(config: dict[str, Any]) -> WorkerResult | None:
    """``recipe.loop.train_loop_per_worker``'s contract: rank 0 returns the status, the epoch history, the
    optimizer steps and the module's final ``state_dict`` as ``torch.save`` bytes (``model.pt``)."""
    cfg = Resolved.from_dict(config["cfg"])
    quiet_ray_train(cfg.ray.logging_level)
    quiet_lightning(cfg.ray.logging_level)
    rank = ray.train.get_context().get_world_rank()
    link_process_logs(config["run_dir"], f"rank{rank}")
    torch.set_num_threads(cfg.trainer.num_threads or worker_cpus())
    seed_everything(cfg.trainer.seed)  # the same initial weights on every rank
    module = instantiate(cfg.model, _convert_="all")  # plain lists and dicts, as the driver's rehearsal built it
    check_module("model", cfg.model["_target_"], module, pl)
    datamodule = instantiate(cfg.datamodule, _convert_="all") if cfg.datamodule else None
    own = datamodule is not None or cfg.dataset["_target_"] == MODULE_LOADERS  # Lightning shards those loaders
    loaders = {} if own else dataset_loaders(cfg, rank, config.get("built"))
    seed_everything(rank_seed(cfg.trainer.seed, rank))  # dropout masks and random transforms differ by rank
    report = RunReport(cfg, config["run_dir"], config["run_name"], config.get("notice"), loaders.get("train"))
    report.provenance = config.get("provenance")
    if config.get("saved_cfg") is not None:
        report.saved = config["saved_cfg"]
    trainer = build_trainer(cfg, report)
    status: RunStatus = "failed"
    try:
        with LatestCheckpoint() as latest:
            report.resumed_from = latest.name
            try:  # the checkpoint is this run's own: objects a module saved in its hyperparameters load too
                fit = dict(datamodule=datamodule, ckpt_path=latest.path, weights_only=False, **loaders_for_fit(loaders))
                trainer.fit(module, **fit)
                status = "completed"
            except Preempted:
                status = "preempted"
    finally:
        report.finish(status)
    if rank != 0:
        return None
    weights = None
    if status == "completed":
        buffer = io.BytesIO()
        torch.save(module.state_dict(), buffer)
        weights = buffer.getvalue()
    notice = report.notice_reader.notice if report.notice_reader else None
    return WorkerResult(status, report.history, trainer.global_step, weights, notice)


def quiet_lightning(level: str) -> None:
    """Lightning's start-up lines (devices, tips, "fit stopped") at ``ray.logging_level`` (WARNING by default), as
    Ray's; and a deprecation warning Lightning raises inside its own code on this torch."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(level)
    warnings.filterwarnings("ignore", message=r".*LeafSpec.*is deprecated")


def build_trainer(cfg: Resolved, report: RunReport) -> pl.Trainer:
    """A ``lightning.Trainer`` with Ray's DDP strategy and environment, our settings as its arguments, and
    ``trainer.lightning_kwargs`` on top (for the rest of Lightning's arguments)."""
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    callbacks: list[pl.Callback] = [report]
    stopping = cfg.trainer.early_stopping
    if stopping.patience is not None:
        monitor, mode = monitored(Lightning, (stopping.monitor, stopping.mode), trainer_monitor(cfg))
        callbacks.append(
            # Decided when validation ends, before RunReport's epoch end: the stopping epoch is checkpointed as final.
            pl.callbacks.EarlyStopping(
                monitor,
                patience=stopping.patience,
                mode=mode,
                min_delta=stopping.min_delta,
                check_on_train_epoch_end=False,
            )
        )
    arguments = {**trainer_arguments(cfg), **(cfg.trainer.lightning_kwargs or {})}
    arguments["callbacks"] = callbacks + list(arguments.get("callbacks") or [])
    with warnings.catch_warnings():  # our loaders are sharded already: Lightning's hints about them do not apply
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer = pl.Trainer(
            strategy=RayDDPStrategy(**(cfg.trainer.parallel_strategy_kwargs or {})),
            plugins=[RayLightningEnvironment()],
            **arguments,
        )
    return prepare_trainer(trainer)


def trainer_arguments(cfg: Resolved) -> dict[str, Any]:
    """Our settings as ``lightning.Trainer`` arguments (a pure function: unit-tested)."""
    trainer = cfg.trainer
    return {
        "accelerator": "gpu" if cfg.scaling.use_gpu else "cpu",
        "devices": "auto",
        "max_epochs": trainer.max_epochs,
        "precision": trainer.precision,  # 32, 64, bf16-mixed, 16-mixed: Lightning's own names
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "gradient_clip_val": trainer.gradient_clip_val,
        "limit_train_batches": trainer.limit_train_batches,  # batches per worker and epoch, as ours
        "limit_val_batches": trainer.limit_val_batches,
        "deterministic": trainer.deterministic or None,
        # The dataset group's loaders are sharded already; a datamodule's or the module's own get Lightning's
        # DistributedSampler.
        "use_distributed_sampler": bool(cfg.datamodule) or cfg.dataset["_target_"] == MODULE_LOADERS,
        "enable_checkpointing": False,  # RunReport checkpoints to Ray storage
        "logger": False,  # our loggers (W&B, TensorBoard) log each epoch's report
        "enable_progress_bar": bool(trainer.progress_bar),
        "enable_model_summary": False,
        "default_root_dir": tempfile.gettempdir(),
    }


def trainer_monitor(cfg: Resolved) -> tuple[str | None, str | None]:
    return cfg.trainer.monitor, cfg.trainer.monitor_mode


def dataset_loaders(cfg: Resolved, rank: int, built: Any = None) -> dict[str, Any]:
    """The dataset group's splits behind our DataLoaders, each rank its shard (``recipe/sampler.py``): training
    reshuffled every epoch (Lightning calls the sampler's ``set_epoch``). Validation is padded like Lightning's own
    sampler (the DDP-wrapped module's forward may broadcast buffers: every rank runs as many batches), so with W
    workers up to W - 1 samples are counted twice when the split does not divide evenly."""
    trainer = cfg.trainer
    world_size = ray.train.get_context().get_world_size()
    batch = per_worker_batch_size(trainer.batch_size, trainer.batch_size_per_worker, world_size)
    cpus = worker_cpus()
    splits = built.splits() if built is not None else instantiate(cfg.dataset, _convert_="all")  # text: tokenized
    on_gpu = cfg.scaling.use_gpu
    options = trainer.dataloader
    processes = loader_processes(options.num_workers, cpus, False, on_gpu)
    pinned = on_gpu if options.pin_memory is None else options.pin_memory
    loading = dict(
        options=options, num_workers=processes, pin_memory=pinned, rank=rank, world_size=world_size, seed=trainer.seed
    )
    train = build_loader(splits.train, batch, train=True, **loading)
    val = build_loader(splits.val, trainer.val_batch_size_per_worker or batch, train=False, pad=True, **loading)
    return {"train": train, "val": val}


def loaders_for_fit(loaders: dict[str, Any]) -> dict[str, Any]:
    return {"train_dataloaders": loaders["train"], "val_dataloaders": loaders["val"]} if loaders else {}


class Preempted(Exception):
    """Raised on every rank at the same optimizer step when the driver posted a preemption notice."""


class LatestCheckpoint:
    """The latest checkpoint Ray holds for this run (after a worker failure, or a re-run of the same command),
    downloaded to a local folder: ``path`` for ``trainer.fit(ckpt_path=...)`` and ``name`` (its folder's, for the
    resume line), both None when there is none."""

    def __enter__(self) -> LatestCheckpoint:
        latest = ray.train.get_checkpoint()
        self.path: str | None = None
        self.name: str | None = None
        self.folder: tempfile.TemporaryDirectory | None = None
        if latest is not None:
            self.folder = tempfile.TemporaryDirectory()
            self.name = os.path.basename(latest.path.rstrip("/"))
            self.path = os.path.join(latest.to_directory(self.folder.name), CHECKPOINT_FILE)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.folder is not None:
            self.folder.cleanup()


class RunReport(pl.Callback):
    """Reports each epoch to Ray Train as ``recipe/loop.py`` does (the driver's metrics.jsonl, Tune's results), logs
    it to our loggers on rank 0, checkpoints to Ray storage, and watches the driver's preemption notice."""

    def __init__(self, cfg: Resolved, run_dir: str, run_name: str, notice: str | None, train_loader: Any):
        context = ray.train.get_context()
        self.cfg, self.run_dir, self.run_name, self.train_loader = cfg, run_dir, run_name, train_loader
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        self.monitor, _ = monitored(Lightning, trainer_monitor(cfg))
        self.history: list[dict[str, Any]] = []
        self.tracker_ids: dict[str, str] = {}
        self.loggers = build_loggers(cfg.logger) if self.rank == 0 else {}
        self.notice_reader = NoticeReader(notice) if notice and self.rank == 0 else None
        self.cadence = Cadence(None, None, self.notice_reader, self.rank, self.world_size, notice is not None)
        self.uploads = checkpoint.Uploads(
            cfg.checkpoint.checkpoint_upload_mode,
            checkpoint.staging_folder(run_name, run_dir, self.rank),
            local_mode=cfg.scaling.num_workers == 0,
        )
        self.resumed_from: str | None = None  # the checkpoint fit() resumes from
        self.provenance: dict[str, Any] | None = None  # where the run came from (the driver's), for the loggers
        self.saved = redact_tree(cfg.to_dict())  # the config as saved and logged (the driver's, redacted)
        self.started, self.samples = 0.0, 0

    # Kept in every Lightning checkpoint (under "callbacks"): a resumed run continues the history and tracker runs.
    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "tracker_ids": self.tracker_ids}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history, self.tracker_ids = list(state["history"]), dict(state["tracker_ids"])

    def on_fit_start(self, trainer: Any, module: Any) -> None:  # after Lightning restored this callback's state
        config = {"cfg": self.saved, "run_name": self.run_name, "provenance": self.provenance}
        self.tracker_ids = start_all(self.loggers, config, self.run_dir, self.tracker_ids)

    def on_train_start(self, trainer: Any, module: Any) -> None:  # after Lightning restored its loops' counters
        if self.rank == 0 and self.resumed_from:
            print(
                f"Resuming from checkpoint {self.resumed_from}: the start of epoch {trainer.current_epoch + 1}, "
                f"optimizer step {trainer.global_step}",
                flush=True,
            )

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        if self.train_loader is not None and self.train_loader.generator is not None:  # loader processes' seeds
            self.train_loader.generator.manual_seed(
                loader_seed(self.cfg.trainer.seed, self.rank, trainer.current_epoch)
            )
        self.started, self.samples = time.perf_counter(), 0

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.samples += _count(batch)
        if self.cadence.after_step(trainer.global_step).stop:  # every rank at the same step
            raise Preempted  # the epoch so far is neither reported nor checkpointed (mid-epoch resume is not exact)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        logged = {name: float(value) for name, value in trainer.callback_metrics.items() if _scalar(value)}
        seconds = time.perf_counter() - self.started
        epoch = trainer.current_epoch + 1
        metrics = {
            "epoch": epoch,
            **logged,
            "lr": trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else math.nan,
            "step": trainer.global_step,
            "world_size": self.world_size,
            "samples_per_second": self.samples * self.world_size / seconds,  # every rank runs as many batches
            "epoch_seconds": seconds,
        }
        if self.monitor not in metrics:  # the module's own metrics, or the runner's (trainer.monitor=epoch)
            raise ConfigError(
                "trainer.monitor",
                self.monitor,
                f"{self.cfg.model['_target_']} logs no such metric (self.log(name, value) in its validation_step).",
                ", ".join(sorted(logged)) or "nothing was logged",
            )
        log_all(self.loggers, metrics, step=epoch)
        self.history.append(metrics)
        final = epoch == trainer.max_epochs or trainer.should_stop
        if not (final or epoch % self.cfg.checkpoint.every_n_epochs == 0):
            self.uploads.report(metrics)
            return

        def write(folder: str) -> None:  # every rank calls it (a barrier); rank 0 writes the files
            trainer.save_checkpoint(os.path.join(folder, CHECKPOINT_FILE), weights_only=False)
            if self.rank == 0:  # where evaluate reads a checkpoint folder's config from
                write_json(os.path.join(folder, CONFIG_FILE), self.saved)

        self.uploads.report(metrics, write, f"epoch_{epoch:04d}")

    def finish(self, status: RunStatus) -> None:
        if status != "failed":  # a failed rank's peers may be gone: nothing in flight is waited for
            self.cadence.close()
            self.uploads.close()
        else:
            self.uploads.discard()
        for error in finish_all(self.loggers, status):
            logger.warning(f"a logger failed to finish: {error}")


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1)


def _count(batch: Any) -> int:
    first = (
        batch[0]
        if isinstance(batch, (list, tuple))
        else next(iter(batch.values()))
        if isinstance(batch, dict)
        else batch
    )
    return len(first)
