"""What a checkpoint holds, and how it is written and read back.

One Ray checkpoint folder per save, merged by Ray from every rank's files:

    model.pt            rank 0: the full model state_dict (also the run dir's model.pt format); a task with
                        several models (config.model names them) stores {name: state_dict}
    sharded/            FSDP instead of model.pt: a torch.distributed.checkpoint of the models and optimizers,
                        {"model": {name: state_dict}, "optimizers": {name: state}}; every rank writes its own
                        shards (__<R>_0.distcp), rank 0 the .metadata. Nothing is gathered on one rank, and it
                        loads into any number of ranks (DCP reshards)
    config.json         rank 0: the resolved config, so a checkpoint alone rebuilds its model (load_model)
    train_state.pt      rank 0: optimizers (unless sharded), LR schedules, fp16 scaler, epoch, global step, best
                        metric, history
    rng_rank<R>.pt      every rank: its torch / numpy / python RNG states (they differ per rank)

Everything else is plain tensors and containers, so every file loads with ``torch.load(weights_only=True)``.

:class:`Uploads` hands each rank's folder to ``ray.train.report``, which stores it (``checkpoint_upload_mode``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import numpy as np
import ray.train
import torch
from torch import nn

from hydra_raytrain.recipe.parallel import unwrap
from hydra_raytrain.storage import retry
from hydra_raytrain.storage.rundir import CONFIG_FILE, MODEL_FILE

# torch.distributed.checkpoint is imported where it is used: importing it takes 0.6 s (sympy, for its planner), of
# every driver's and worker's start-up before the first step, which needs none of it.

STATE_FILE = "train_state.pt"
SHARDED_DIR = "sharded"

logger = logging.getLogger(__name__)


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def rng_state() -> dict[str, Any]:
    kind, keys, position, has_gauss, cached = cast(tuple, np.random.get_state(legacy=True))
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": position,
            "has_gauss": has_gauss,
            "cached": cached,
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state(
        (numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["cached"])
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather(
    models: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer], trained_only: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full (unsharded, unwrapped) model and optimizer states on rank 0's CPU, whatever wraps the models
    (DDP, FSDP, nothing). A collective under FSDP: every rank calls it; ranks other than 0 get empty dicts.
    ``trained_only`` (adapters: ``peft``): the frozen parameters left out, which the model's builder gives again."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_states = {name: get_model_state_dict(model, options=options) for name, model in models.items()}
    if trained_only:
        model_states = {
            name: {key: value for key, value in state.items() if key not in frozen_names(models[name])}
            for name, state in model_states.items()
        }
    optimizer_states = {
        name: get_optimizer_state_dict(models[name], optimizer, options=options)
        for name, optimizer in optimizers.items()
    }
    return model_states, optimizer_states


def trained_only(peft_method: str, model: dict[str, Any], init_from: str | None, init_full_state: bool) -> bool:
    """Whether a run's weights leave its frozen parameters out: adapters (``peft``) trained on weights its model's
    builder loads from files (``model.path``: the same weights every time, where new ones drawn at random would
    not be), and not on those of a warm start (``run.init_from``; a continued run, ``init_full_state``, a PBT
    exploit, continues the same base)."""
    return peft_method != "none" and bool(model.get("path")) and (not init_from or init_full_state)


def frozen_names(model: nn.Module) -> set[str]:
    """The state_dict keys of a model's parameters that do not train (a tied one's every name: GPT-2's lm_head)."""
    from hydra_raytrain.recipe.finetune import WRAPPER_NAMES  # what wrappers add to names and state_dicts drop

    named = unwrap(model).named_parameters(remove_duplicate=False)
    return {
        ".".join(part for part in name.split(".") if part not in WRAPPER_NAMES)
        for name, parameter in named
        if not parameter.requires_grad
    }


def check_trained_only(model: nn.Module, state: dict[str, Any], where: str) -> None:
    """A state that :func:`gather` saved ``trained_only`` holds every key of ``model`` but its frozen parameters."""
    expected = set(unwrap(model).state_dict()) - frozen_names(model)
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - set(unwrap(model).state_dict()))
    if missing or unexpected:
        raise ValueError(
            f"the weights at {where} do not fit the model and its adapters: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )


def load(
    models: dict[str, nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    model_states: dict[str, Any],
    optimizer_states: dict[str, Any],
    strict: bool = True,
    trained_only: bool = False,
) -> None:
    """The inverse of :func:`gather`; every rank passes the full states it read from the checkpoint (a model's
    state may leave keys out with ``strict=False``: a warm start; ``trained_only``: its frozen parameters, checked)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    if trained_only:
        for name, model in models.items():
            check_trained_only(model, model_states[name], "the checkpoint")
    options = StateDictOptions(full_state_dict=True, strict=strict and not trained_only)
    for name, model in models.items():
        set_model_state_dict(model, model_states[name], options=options)
    for name, optimizer in optimizers.items():
        set_optimizer_state_dict(models[name], optimizer, optimizer_states[name], options=options)


def _sharded_states(models: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer]) -> dict[str, Any]:
    """This rank's shards of every model and optimizer state (DTensors under FSDP), as DCP saves and loads them."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {
        "model": {name: get_model_state_dict(model) for name, model in models.items()},
        "optimizers": {
            name: get_optimizer_state_dict(models[name], optimizer) for name, optimizer in optimizers.items()
        },
    }


def write_sharded(folder: str, models: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """Every rank's shards into ``<folder>/sharded`` (a collective: every rank calls it, each with its own folder;
    Ray merges the folders into one checkpoint)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_sharded_states(models, optimizers), checkpoint_id=os.path.join(folder, SHARDED_DIR))


def load_sharded(path: str, models: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """The inverse of :func:`write_sharded`, into models sharded over any number of ranks (a collective; an error
    reading any rank's part is raised on every rank)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    states = _sharded_states(models, optimizers)
    dcp.load(states, checkpoint_id=path)
    for name, model in models.items():
        set_model_state_dict(model, states["model"][name])
    for name, optimizer in optimizers.items():
        set_optimizer_state_dict(models[name], optimizer, states["optimizers"][name])


def check_sharded(path: str) -> None:
    """Raise unless every file a sharded checkpoint's metadata names is there, whole. The same verdict on every rank
    without a collective (each reads the same files), before the collective load."""
    from torch.distributed.checkpoint import FileSystemReader

    ends: dict[str, int] = {}
    for info in FileSystemReader(path).read_metadata().storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        size = os.path.getsize(os.path.join(path, name)) if os.path.exists(os.path.join(path, name)) else None
        if size is None or size < end:
            raise EOFError(f"{SHARDED_DIR}/{name} is {'missing' if size is None else f'{size} bytes'}, {end} expected")


def read_weights(folder: str, optimizers: bool = False) -> dict[str, Any]:
    """A checkpoint folder's (or run dir's) full weights in model.pt's layout, whichever way it was written
    (``model``), and with ``optimizers`` the optimizers' full states (``optimizers``; None in a run dir). No model
    is needed: a sharded checkpoint is read whole into this process (a collective inside a worker group)."""
    if os.path.exists(os.path.join(folder, MODEL_FILE)):
        model = torch.load(os.path.join(folder, MODEL_FILE), weights_only=True, map_location="cpu")
        state = None
        if optimizers and os.path.exists(os.path.join(folder, STATE_FILE)):
            train = torch.load(os.path.join(folder, STATE_FILE), weights_only=True, map_location="cpu")
            state = train["optimizers"]
            if train.get("ema"):  # model.pt holds trainer.ema's averages: the optimizers' moments go with the raw
                model = train["ema"]["raw"]
        return {"model": model, "optimizers": state}
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    keys = {"model", "optimizers"} if optimizers else {"model"}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        loaded = _load_state_dict_from_keys(keys, checkpoint_id=os.path.join(folder, SHARDED_DIR))
    return {
        "model": pack_models(loaded["model"], several=list(loaded["model"]) != ["model"]),
        "optimizers": loaded.get("optimizers"),
    }


def has_weights(names: Iterable[str]) -> bool:
    """Whether a folder's file names include weights (model.pt, or a sharded checkpoint)."""
    return MODEL_FILE in names or SHARDED_DIR in names


def pack_models(model_states: dict[str, Any], several: bool) -> dict[str, Any]:
    """model.pt's layout: the state_dict itself for one model, {name: state_dict} for several."""
    return model_states if several else model_states["model"]


def unpack_models(saved: dict[str, Any], several: bool) -> dict[str, Any]:
    return saved if several else {"model": saved}


def write(
    folder: str,
    rank: int,
    model_state: dict[str, Any] | None = None,
    train_state: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> None:
    """This rank's share of a checkpoint: its RNG states; rank 0 also passes the train state and config, and the
    model's full state unless the checkpoint is sharded (see :func:`write_sharded`)."""
    torch.save(rng_state(), os.path.join(folder, rng_file(rank)))
    if model_state is not None:
        torch.save(model_state, os.path.join(folder, MODEL_FILE))
    if train_state is not None:
        torch.save(train_state, os.path.join(folder, STATE_FILE))
        with open(os.path.join(folder, CONFIG_FILE), "w") as file:
            json.dump(config, file)


def read(folder: str, rank: int) -> dict[str, Any]:
    """Load a whole checkpoint folder, every rank's RNG file included, so that every rank judges the same
    folder complete or broken (they must agree on which checkpoint to resume from). A sharded checkpoint is only
    checked complete here (``model`` None, ``sharded`` its path): :func:`load_sharded` loads it."""
    names = sorted(name for name in os.listdir(folder) if name.startswith("rng_rank"))
    rngs = {name: torch.load(os.path.join(folder, name), weights_only=True) for name in names}
    train = torch.load(os.path.join(folder, STATE_FILE), weights_only=True)
    sharded = os.path.join(folder, SHARDED_DIR)
    full = os.path.exists(os.path.join(folder, MODEL_FILE)) or not os.path.isdir(sharded)
    model = torch.load(os.path.join(folder, MODEL_FILE), weights_only=True) if full else None
    if not full:
        check_sharded(sharded)
    return {
        "model": model,
        "sharded": None if full else sharded,
        "train": train,
        "rng": rngs.get(rng_file(rank)),  # None when the world size grew (elastic): the caller reseeds
    }


def read_newest_loadable(
    checkpoints: list[Any],
    rank: int,
    warn,
    models: dict[str, nn.Module] | None = None,
    optimizers: dict[str, torch.optim.Optimizer] | None = None,
) -> dict[str, Any] | None:
    """The newest of ``checkpoints`` (Ray Checkpoint objects, newest first) that loads on every rank, with its
    folder's ``name``; warns about each one skipped (a truncated file, a missing part, a failed download on one
    node: the ranks agree before going on). A sharded one loads into ``models`` and ``optimizers`` here (a
    collective; ``model`` is then None)."""
    from hydra_raytrain.recipe.parallel import every_rank

    for checkpoint in checkpoints:
        try:
            with checkpoint.as_directory() as folder:
                try:
                    state, error = read(folder, rank), None
                except Exception as caught:  # torch raises RuntimeError / EOFError / UnpicklingError on truncation
                    state, error = None, caught
                if not every_rank(error is None):
                    raise error or RuntimeError("another rank could not read it")
                assert state is not None
                if state["sharded"] is not None:
                    load_sharded(state["sharded"], models or {}, optimizers or {})  # its errors reach every rank
                return {**state, "name": os.path.basename(checkpoint.path.rstrip("/"))}
        except retry.StorageUnavailable:
            raise  # not this checkpoint's fault: the previous one is as far away
        except Exception as error:
            warn(
                f"checkpoint {checkpoint.path} cannot be loaded ({type(error).__name__}: {error}); "
                "trying the previous one"
            )
    return None


WAIT_WARNING_S = 1.0  # a checkpoint waiting this long for the previous upload: said once

# Ray's local mode (scaling.num_workers=0) keeps the last report and runs no Ray Train callback: the driver, whose
# process trains there, listens to every report instead (driver/run.py), so that each epoch reaches metrics.jsonl
# and a sweep's Tune as it ends, as a worker's does through the callbacks.
_local_listeners: list[Callable[[dict[str, Any]], None]] = []


@contextlib.contextmanager
def local_reports(listener: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """While inside: ``listener`` is given the metrics of every report a local-mode run of this process makes."""
    _local_listeners.append(listener)
    try:
        yield
    finally:
        _local_listeners.remove(listener)


class Uploads:
    """Every report of a run goes through here, in one ``checkpoint_upload_mode`` (Ray keeps reports in order).

    SYNC: ``ray.train.report`` returns once this rank's share is stored; the folder is then deleted here. ASYNC: Ray
    stores it in a background thread and deletes the folder afterwards, while training goes on; a worker's return
    waits for it. Ray counts a checkpoint only once every rank's share is stored, so it is complete or absent in
    its list in both modes. One upload at a time: a checkpoint due while this rank's previous one is still uploading
    first waits for it (storage slower than the checkpoints would otherwise pile full-state copies up on the local
    disk). The folders live in ``staging`` (one per run and rank, emptied when the worker starts: what a killed
    worker's upload left). Ray's local mode stores nothing (and deletes nothing): SYNC there."""

    def __init__(self, mode: str, staging: str, local_mode: bool = False):
        self.mode = ray.train.CheckpointUploadMode["SYNC" if local_mode else mode]
        self.local_mode = local_mode
        self.staging = staging
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        self.uploading: str | None = None  # ASYNC: the folder of the upload in flight, until Ray deletes it
        self.warned = False

    def report(self, metrics: dict[str, Any], write: Callable[[str], None] | None = None, name: str | None = None):
        """Report ``metrics``; with ``write``, a checkpoint named ``name`` whose folder ``write`` fills."""
        self._store(metrics, write, name)
        if self.local_mode:
            for listener in list(_local_listeners):
                listener(metrics)

    def _store(self, metrics: dict[str, Any], write: Callable[[str], None] | None, name: str | None) -> None:
        if write is None:
            ray.train.report(metrics, checkpoint_upload_mode=self.mode)
            return
        if self.mode is ray.train.CheckpointUploadMode.SYNC:
            with tempfile.TemporaryDirectory(dir=self.staging) as folder:
                write(folder)
                self._report(metrics, folder, name)
            return
        self._wait_for_previous(name)
        folder = tempfile.mkdtemp(dir=self.staging)
        try:
            write(folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self.uploading = folder
        self._report(metrics, folder, name)

    def _report(self, metrics: dict[str, Any], folder: str, name: str | None) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_dir_name=name,
            checkpoint_upload_mode=self.mode,
            checkpoint_upload_fn=retry.upload,  # Ray's own upload, its files retried through an outage
        )

    def discard(self) -> None:
        """This rank failed: its staging folder removed, nothing in flight waited for (its peers may be gone)."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def close(self) -> None:
        """This rank's run ended (completed or preempted): its last upload stored (the worker's return waits for it
        anyway), then its staging folder removed; left there, every run would leave one per rank in the temp dir."""
        self._wait_for_upload()
        shutil.rmtree(self.staging, ignore_errors=True)

    def _wait_for_previous(self, name: str | None) -> None:
        waited = self._wait_for_upload()
        # A shorter wait is Ray Train's own pace (a worker's next report waits for the controller to collect the
        # previous one, every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S): nothing for the user to change.
        if waited >= WAIT_WARNING_S and not self.warned:
            self.warned = True
            logger.warning(
                f"checkpoint {name} waited {waited:.1f} s for the previous one to be stored: storage takes longer "
                "than checkpoint.every_n_steps / every_n_minutes leave between checkpoints"
            )

    def _wait_for_upload(self) -> float:
        """Seconds this rank waited for its upload in flight to be stored (0: none in flight)."""
        if self.uploading is None or not os.path.exists(self.uploading):
            return 0.0  # stored and deleted by Ray: the usual case, checked without a call
        started = time.perf_counter()
        # Returns once Ray has processed every report of this rank so far: the upload is stored (or its error raised).
        ray.train.get_all_reported_checkpoints(consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED)
        shutil.rmtree(self.uploading, ignore_errors=True)  # Ray failed to delete it (it logged why): not ours to keep
        return time.perf_counter() - started


def staging_folder(run_name: str, run_dir: str, rank: int) -> str:
    """Where a rank writes its checkpoint folders before Ray stores them: on the worker's local disk, one per run
    and rank, so that a restarted worker finds (and removes) what its killed predecessor left. Named by the run
    dir as well as the run name: two runs of one config (one name) in two run dirs at once on a node each keep
    their own (a worker's start empties its folder, under the other run's upload otherwise). Inside the user's own
    folder of the temp dir (``private_temp``): no one else can put or read anything there."""
    where = hashlib.sha1(run_dir.encode()).hexdigest()[:8]
    return os.path.join(private_temp(), f"{run_name}-{where}-rank{rank}")


def private_temp() -> str:
    """``<temp dir>/hydra_raytrain-<uid>``, this user's only (mode 700): made here, or this user's own folder
    there (closed to others if it was open); another user's or a link there is refused (a shared temp dir's names
    are guessable)."""
    folder = os.path.join(tempfile.gettempdir(), f"hydra_raytrain-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and info.st_mode & 0o077:
        os.chmod(folder, 0o700)  # this user's own folder, made by hand or an older version: closed
        info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"{folder} is not this user's private folder (a link, another user's, or open to others): remove it, "
            "or set TMPDIR to a folder of your own"
        )
    return folder
