"""A trained model scored on one whole split, in this process (the CPU, or the first GPU): what ``evaluate``
prints and what the driver reports as ``summary.json``'s ``test`` after training.

The metrics are the task's own, every sample once (``validation_totals``), named for the split: ``val_loss``,
``test_accuracy``, ... A Lightning run is validated by ``lightning.Trainer`` over the split's loader (its
``val_*`` names renamed for the test split)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.schema import DataLoaderConfig
from hydra_raytrain.recipe.lightning_setup import import_lightning, is_lightning, one_device_trainer
from hydra_raytrain.recipe.loaders import build_loader, move_to
from hydra_raytrain.recipe.metrics import validation_totals
from hydra_raytrain.recipe.warm_start import starting_model

SPLITS = ("val", "test")


def has_test_split(dataset: dict[str, Any]) -> bool:
    """Whether the config asks for a test split (``test_fraction``, ``test_path``, ``test_size``), without
    building the dataset."""
    return any(dataset.get(key) for key in ("test_fraction", "test_path", "test_size"))


def load_weights(
    path: str, spec: dict[str, Any], peft: dict[str, Any] | None = None
) -> torch.nn.Module | dict[str, torch.nn.Module]:
    """The model ``spec`` builds (with the run's adapters, ``peft``), with the weights of ``path`` (a run dir's
    model.pt, a checkpoint folder, a sharded FSDP checkpoint read whole, a Lightning checkpoint), in eval mode; a
    task of several: ``{name: model}``."""
    from hydra_raytrain.recipe.checkpoint import read_weights

    lightning_checkpoint = os.path.join(path, "checkpoint.ckpt")  # a task=lightning checkpoint folder
    if os.path.exists(lightning_checkpoint) and not os.path.exists(os.path.join(path, "model.pt")):
        state = lightning_state(lightning_checkpoint)
    else:
        state = read_weights(path)["model"]
    if "_target_" not in spec:
        return {name: _build(node, state[name], peft) for name, node in spec.items()}
    return _build(spec, state, peft)


def lightning_state(checkpoint: str) -> dict[str, Any]:
    """A Lightning checkpoint's weights: read with ``weights_only=True`` where it holds only tensors and plain
    values; one whose hyperparameters or loops hold objects needs pickle, which runs code from the file: read so
    only with a warning that says it (a run dir is trusted like a script: docs/outputs.md#trust)."""
    import pickle
    import warnings

    try:
        return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    except pickle.UnpicklingError as error:
        reason = " ".join(str(error).split("\n")[0].split())[:200]
        warnings.warn(
            f"{checkpoint} holds Python objects beside its weights ({reason}): read with pickle "
            "(weights_only=False), which runs code from the file; read only checkpoints you trust",
            stacklevel=2,
        )
        return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


def _build(spec: dict[str, Any], state: dict[str, Any], peft: dict[str, Any] | None) -> torch.nn.Module:
    from hydra_raytrain.config.finetuning import PeftConfig
    from hydra_raytrain.config.resolved import typed
    from hydra_raytrain.recipe.checkpoint import check_trained_only
    from hydra_raytrain.recipe.finetune import add_adapters

    settings = typed(PeftConfig, peft or {})
    model = add_adapters(instantiate(spec, _convert_="all"), settings)
    if settings.method != "none" and set(state) != set(model.state_dict()):  # the adapters alone: on the base
        check_trained_only(model, state, "the run")
        model.load_state_dict(state, strict=False)
        return model.eval()
    model.load_state_dict(state)
    return model.eval()


def score(path: str, cfg: dict[str, Any], split: str = "val", built: Any = None) -> dict[str, Any]:
    """The weights at ``path`` scored on the whole ``split`` of the run's dataset (``cfg``: its resolved config):
    the task's metrics, and the matrices its ``metrics`` name (``val_confusion_matrix``: lists of counts).
    ``built``: the run's text as it tokenized it (``data/tokenized_ray.py``), else the dataset is built here."""
    if split not in SPLITS:
        raise ConfigError("--split", split, "is no split to score.", " | ".join(SPLITS))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_weights(path, cfg["model"], cfg.get("peft"))
    model = {name: m.to(device) for name, m in model.items()} if isinstance(model, dict) else model.to(device)
    if is_lightning(cfg["task"]["_target_"]):
        return _validate_lightning(cfg, model, device, split)
    task = instantiate(cfg["task"])
    task.on_setup(lambda: starting_model(cfg["model"], (cfg.get("run") or {}).get("init_from")))
    task.on_validation_start()
    totals = validation_totals(task, model, split_loader(cfg, split, built), lambda b: move_to(b, device))
    matrices = task.metrics.matrices(totals) if getattr(task, "metrics", None) is not None else {}
    return {f"{split}_{name}": value for name, value in {**task.compute(totals), **matrices}.items()}


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers among scored ``metrics`` (what loggers and one-line reports take)."""
    return {name: value for name, value in metrics.items() if isinstance(value, (int, float))}


def shown(metrics: dict[str, Any]) -> str:
    """Scored ``metrics`` for the terminal: the numbers on one line, each matrix below it, a row per true class."""
    lines = ["  ".join(f"{name} {value:.4f}" for name, value in scalars(metrics).items())]
    for name, matrix in metrics.items():
        if isinstance(matrix, list):
            width = max(len(str(count)) for row in matrix for count in row)
            lines += [f"{name} (rows: true class, columns: predicted class):"]
            lines += ["  " + " ".join(f"{count:>{width}}" for count in row) for row in matrix]
    return "\n".join(lines)


def split_loader(cfg: dict[str, Any], split: str, built: Any = None) -> Any:
    """The whole split, read in this process: a built dataset's through a DataLoader, a streamed one's files
    (Ray Data streamed them in training) read here. A split the dataset does not have: one ConfigError."""
    from hydra_raytrain.data.streamed import Streamed

    built = built.splits() if built is not None else instantiate(cfg["dataset"], _convert_="all")
    trainer = cfg["trainer"]
    batch = trainer["val_batch_size_per_worker"] or trainer["batch_size_per_worker"] or trainer["batch_size"]
    if isinstance(built, Streamed):
        if split == "test" and "test" not in built.rows:
            raise _no_test_split(cfg)
        return built.read(split, batch)
    dataset = getattr(built, split)
    if dataset is None:
        raise _no_test_split(cfg)
    options = DataLoaderConfig(**trainer["dataloader"])
    return build_loader(dataset, batch, train=False, rank=0, world_size=1, seed=trainer["seed"], options=options)


def _no_test_split(cfg: dict[str, Any]) -> ConfigError:
    return ConfigError(
        "--split",
        "test",
        f"the run's dataset ({cfg['dataset'].get('_target_')}) has no test split.",
        "a run trained with dataset.test_fraction (or dataset.test_path, dataset.test_size); or --split val",
    )


def _validate_lightning(cfg: dict[str, Any], module: Any, device: torch.device, split: str) -> dict[str, float]:
    """``task=lightning``: ``lightning.Trainer.validate`` on one device, over the datamodule's validation loader
    or the dataset's whole split; the metrics are what the module logs (``val_*`` named for the split)."""
    from hydra_raytrain.recipe.lightning import quiet_lightning

    quiet_lightning("WARNING")
    trainer = one_device_trainer(import_lightning(), accelerator="gpu" if device.type == "cuda" else "cpu")
    if cfg.get("datamodule"):
        if split != "val":
            raise _no_test_split(cfg)
        [logged] = trainer.validate(module, datamodule=instantiate(cfg["datamodule"], _convert_="all"), verbose=False)
    else:
        [logged] = trainer.validate(module, dataloaders=split_loader(cfg, split), verbose=False)

    def named(name: str) -> str:  # the module's val_ metrics, named for the split
        return f"{split}_{name[4:]}" if split != "val" and name.startswith("val_") else name

    return {named(name): float(value) for name, value in logged.items()}


def with_example(folder: str, cfg: dict[str, Any], rows: int = 2) -> tuple[torch.nn.Module, np.ndarray]:
    """The model of a run or checkpoint ``folder`` (eval mode, on the CPU) and a few validation inputs as it takes
    them (float32): what a tracker's model format records as its signature and input example. A task of several
    models, or a model without one input tensor, is refused (``ValueError``)."""
    model = load_weights(folder, cfg["model"], cfg.get("peft"))
    if isinstance(model, dict):
        raise ValueError(f"the task trains several models ({', '.join(sorted(model))}), not one")
    batch = next(iter(split_loader(cfg, "val")))
    inputs = batch[0] if isinstance(batch, (list, tuple)) else batch
    if not isinstance(inputs, torch.Tensor):
        raise ValueError(f"the model's inputs are {type(inputs).__name__}, not one tensor")
    return model.cpu(), inputs[:rows].detach().cpu().float().numpy()
