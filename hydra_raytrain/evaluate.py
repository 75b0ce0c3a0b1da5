"""Use a trained run: rebuild its model, or score it on its validation split.

    python -m hydra_raytrain.evaluate outputs/runs/<name>                          # a run dir
    python -m hydra_raytrain.evaluate outputs/runs/<name>/ray_storage/<name>/epoch_0004   # one checkpoint

Prints the metrics (the names metrics.jsonl uses: val_loss, val_accuracy, ...) and writes them to
``evaluation.json`` in that folder. Evaluation runs in this process on the CPU (or the first GPU) over the
whole validation split, so it equals what training reported when ``trainer.limit_val_batches`` was unset.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from hydra_raytrain.config.errors import ConfigError, Problems
from hydra_raytrain.config.plain import as_dict
from hydra_raytrain.config.schema import DataLoaderConfig
from hydra_raytrain.preflight.resolvers import register_resolvers
from hydra_raytrain.preflight.targets import check_targets
from hydra_raytrain.recipe.lightning_setup import import_lightning, is_lightning, one_device_trainer
from hydra_raytrain.recipe.loaders import build_loader, move_to
from hydra_raytrain.recipe.metrics import validation_totals
from hydra_raytrain.rundir import CONFIG_FILE, MODEL_FILE, SUMMARY_FILE, write_json

EVALUATION_FILE = "evaluation.json"


def load_config(path: str) -> dict[str, Any]:
    """The resolved config of a run dir (``.hydra/config.yaml``) or of a checkpoint folder (``config.json``)."""
    if os.path.exists(os.path.join(path, CONFIG_FILE)):
        with open(os.path.join(path, CONFIG_FILE)) as file:
            return json.load(file)
    hydra_config = os.path.join(path, ".hydra", "config.yaml")
    if os.path.exists(hydra_config):
        register_resolvers()  # a dataset's ${class_count:...} and the like, outside Hydra
        return as_dict(OmegaConf.load(hydra_config))
    raise FileNotFoundError(f"{path} is neither a run dir (no .hydra/config.yaml) nor a checkpoint (no {CONFIG_FILE}).")


def check_config(cfg: dict[str, Any], path: str, command: str = "evaluate") -> None:
    """The run's model, dataset and task import here and take their arguments, or one ``ConfigError`` that says
    how to make a module of the user's own importable (evaluating from another folder than the training's)."""
    problems = Problems()
    for section in ("model", "dataset", "task", "datamodule"):
        check_targets(section, cfg.get(section) or {}, os.getcwd(), problems)
    launched_from = _launched_from(path)
    hint = (
        (
            f"run this from {launched_from}, where the run was trained, or put that folder on the path: "
            f"PYTHONPATH={launched_from} python -m hydra_raytrain.{command} {path}"
        )
        if launched_from
        else "the module on the path (run this from the folder the run was trained in, or set PYTHONPATH to it)"
    )
    problems.errors = [
        ConfigError(e.key, e.value, f"{e.problem} (in {os.getcwd()})", hint) if "cannot be imported" in e.problem else e
        for e in problems.errors
    ]
    problems.raise_any()


def check_finished(run: str) -> None:
    """A run dir is read (exported, predicted with) once its run completed and wrote model.pt; a checkpoint folder
    as it is."""
    summary = os.path.join(run, SUMMARY_FILE)
    if not os.path.exists(summary):
        return  # a checkpoint folder (config.json and its weights): load_model reads it
    with open(summary) as file:
        status = json.load(file).get("status")
    if status != "completed" or not os.path.exists(os.path.join(run, MODEL_FILE)):
        raise ConfigError(
            "RUN_DIR",
            run,
            f"is not a finished run (summary.json: status {status!r}, no model.pt).",
            "a completed run dir (the same training command resumes this one), or one checkpoint folder inside "
            "its Ray storage (<run>/ray_storage/<name>/<checkpoint>)",
        )


def _launched_from(path: str) -> str | None:
    """The folder the run was started from (summary.json's ``launched_from``), for a run dir or a checkpoint in it."""
    folder = os.path.abspath(path)
    for _ in range(4):  # <run dir>/ray_storage/<name>/<checkpoint>
        summary = os.path.join(folder, SUMMARY_FILE)
        if os.path.exists(summary):
            with open(summary) as file:
                return json.load(file).get("launched_from")
        folder = os.path.dirname(folder)
    return None


def load_model(path: str) -> torch.nn.Module | dict[str, torch.nn.Module]:
    """The model of a run dir or checkpoint, built from its saved config, with its weights, in eval mode.
    A task with several models (a GAN) gives ``{name: model}``."""
    cfg = load_config(path)
    check_config(cfg, path)
    return _load_model(path, cfg["model"])


def _load_model(path: str, spec: dict[str, Any]) -> torch.nn.Module | dict[str, torch.nn.Module]:
    from hydra_raytrain.recipe.checkpoint import read_weights  # model.pt, or a sharded (FSDP) checkpoint

    lightning_checkpoint = os.path.join(path, "checkpoint.ckpt")  # a task=lightning checkpoint folder
    if os.path.exists(lightning_checkpoint) and not os.path.exists(os.path.join(path, "model.pt")):
        state = torch.load(lightning_checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    else:
        state = read_weights(path)["model"]
    if "_target_" not in spec:
        return {name: _build(node, state[name]) for name, node in spec.items()}
    return _build(spec, state)


def _build(spec: dict[str, Any], state: dict[str, Any]) -> torch.nn.Module:
    model = instantiate(spec, _convert_="all")
    model.load_state_dict(state)
    return model.eval()


def evaluate(path: str) -> dict[str, float]:
    cfg = load_config(path)
    check_config(cfg, path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = _load_model(path, cfg["model"])
    model = {name: m.to(device) for name, m in model.items()} if isinstance(model, dict) else model.to(device)
    if is_lightning(cfg["task"]["_target_"]):
        metrics = _validate_lightning(cfg, model, device)
    else:
        task = instantiate(cfg["task"])
        totals = validation_totals(task, model, _val_loader(cfg), lambda b: move_to(b, device))
        metrics = {f"val_{name}": value for name, value in task.compute(totals).items()}
    write_json(os.path.join(path, EVALUATION_FILE), metrics)
    return metrics


def _val_loader(cfg: dict[str, Any]) -> Any:
    """The whole validation split, read in this process: a built dataset's through a DataLoader, a streamed one's
    files (Ray Data streamed them in training) read here."""
    from hydra_raytrain.data.streamed import Streamed

    splits = instantiate(cfg["dataset"], _convert_="all")
    trainer = cfg["trainer"]
    batch = trainer["val_batch_size_per_worker"] or trainer["batch_size_per_worker"] or trainer["batch_size"]
    if isinstance(splits, Streamed):
        return splits.read("val", batch)
    options = DataLoaderConfig(**trainer["dataloader"])
    return build_loader(splits.val, batch, train=False, rank=0, world_size=1, seed=trainer["seed"], options=options)


def _validate_lightning(cfg: dict[str, Any], module: Any, device: torch.device) -> dict[str, float]:
    """``task=lightning``: ``lightning.Trainer.validate`` on one device, over the datamodule's validation loader
    or the dataset's whole validation split; the metrics are what the module logs."""
    from hydra_raytrain.recipe.lightning import quiet_lightning

    quiet_lightning("WARNING")
    trainer = one_device_trainer(import_lightning(), accelerator="gpu" if device.type == "cuda" else "cpu")
    if cfg.get("datamodule"):
        [logged] = trainer.validate(module, datamodule=instantiate(cfg["datamodule"], _convert_="all"), verbose=False)
    else:
        [logged] = trainer.validate(module, dataloaders=_val_loader(cfg), verbose=False)
    return {name: float(value) for name, value in logged.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m hydra_raytrain.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a run dir, or one checkpoint folder inside its Ray storage")
    path = parser.parse_args().path
    if not os.path.isdir(path):
        parser.error(f"{path}: no such folder")
    try:
        metrics = evaluate(path)
    except ConfigError as error:
        print(str(error).replace("Invalid config", "Cannot evaluate this run here", 1), file=sys.stderr)
        sys.exit(2)
    print("  ".join(f"{name} {value:.4f}" for name, value in metrics.items()))
    print(f"Written: {os.path.join(path, EVALUATION_FILE)}")


if __name__ == "__main__":
    main()
