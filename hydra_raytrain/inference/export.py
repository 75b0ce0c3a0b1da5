"""Export a trained run's model for another runtime, checked against the model itself.

    python -m hydra_raytrain.export outputs/runs/<name> --format onnx            # -> <run>/export/model.onnx
    python -m hydra_raytrain.export outputs/runs/<name> --format torch_export    # -> <run>/export/model.pt2
    python -m hydra_raytrain.export outputs/runs/<name> --format safetensors --output weights.safetensors
    python -m hydra_raytrain.export outputs/runs/<name> --format hf              # a causal LM: inference/export_text.py

The model is rebuilt from the run's config with its final weights (``load_model``; a GAN exports its generator),
traced with an example batch built from the dataset's ``input_shape`` (the generator's: ``[task.latent_dim]``),
with the batch axis dynamic. After writing, the file is loaded back (ONNX Runtime, ``torch.export.load``, or the
weights into a fresh model) and run on a batch of another size: the largest absolute difference from the eager
model is printed, and above ``--tolerance`` (1e-4) the export is refused and its files removed. The file is
written under a temporary name and moved into place once checked: a previous export survives a failed one. Beside
the file, ``<file>.json`` says what a consumer needs: the input's shape and name, the outputs, the class names, and the
dataset node whose builder prepared the training inputs (the same preprocessing is theirs to apply).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import torch

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.inference.export_text import FOLDERS, export_text, is_text
from hydra_raytrain.inference.finished import FinishedRun
from hydra_raytrain.shell.program import Command
from hydra_raytrain.storage.rundir import write_json

FORMATS = {
    "onnx": "model.onnx",
    "torch_export": "model.pt2",
    "safetensors": "model.safetensors",
    **FOLDERS,  # a causal language model's Hugging Face folders (inference/export_text.py)
}
EXPORT_DIR = "export"
INPUT_NAME = "input"


class ExportRefused(Exception):
    """The exported file does not compute what the model computes (or could not be written)."""


class Exported(torch.nn.Module):
    """The model as exported: one tensor in, one tensor out (a Hugging Face output's ``logits``)."""

    model: torch.nn.Module

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self.model(x)
        return getattr(output, "logits", output)


def export(run: str, format: str = "onnx", output: str | None = None, tolerance: float = 1e-4) -> dict[str, Any]:
    """Write the run's model in ``format``, check it, and write its ``.json``; returns that description."""
    if format not in FORMATS:
        raise ConfigError("--format", format, "is no export format.", " | ".join(FORMATS))
    finished = FinishedRun.read(run).checked("export")
    cfg = finished.config
    if format in FOLDERS or is_text(cfg):
        return _export_folder(run, finished, format, output, tolerance)
    model, sample_shape, role = _exported_model(finished)
    path = os.path.abspath(output or os.path.join(run, EXPORT_DIR, FORMATS[format]))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    example, other = (torch.randn(n, *sample_shape, generator=torch.Generator().manual_seed(n)) for n in (2, 3))
    # Written under a temporary name beside it, moved into place once checked: a failed or interrupted export
    # leaves the previous good one (and its .json) as they were.
    partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.partial")
    written = [partial]
    try:
        with torch.no_grad():
            expected = model(other)
        loaded = WRITERS[format](model, example, partial, written)
        with torch.no_grad():
            difference = float((loaded(other) - expected).abs().max())
        if not difference <= tolerance:
            raise ExportRefused(
                f"the exported {format} model differs from the model by up to {difference:.3g} on a batch of 3 "
                f"(--tolerance {tolerance:g}): not written."
            )
        os.replace(partial, path)
    except BaseException as error:
        for file in written:
            if os.path.exists(file):
                os.remove(file)
        if not isinstance(error, Exception) or isinstance(error, (ConfigError, ExportRefused)):
            raise  # Ctrl-C and exits as they are; our own messages as they are
        reason = " ".join(str(error).split())[:500]
        raise ExportRefused(f"the {format} export of the {role} failed: {type(error).__name__}: {reason}") from error
    description = {
        "format": format,
        "file": os.path.basename(path),
        "model": role,
        "input": {"name": INPUT_NAME, "shape": ["batch", *sample_shape], "dtype": "float32"},
        "output": _output_description(cfg, role),
        "classes": (cfg.get("dataset") or {}).get("classes"),
        "preprocessing": {"dataset": cfg.get("dataset"), "note": "inputs as this dataset builder yields them"},
        "max_abs_diff": difference,
        "run": os.path.abspath(run),
        "torch": torch.__version__,
    }
    write_json(path + ".json", description)
    return description


def _export_folder(run: str, finished: FinishedRun, format: str, output: str | None, tolerance: float) -> dict:
    """A causal language model's run as a Hugging Face folder (``hf``, ``peft``), and its ``.json`` beside it."""
    if not (format in FOLDERS and is_text(finished.config)):
        formats = "hf | peft" if is_text(finished.config) else " | ".join(set(FORMATS) - set(FOLDERS))
        raise ConfigError("--format", format, "does not fit this run's model.", formats)
    try:
        description = export_text(run, finished, format, output, tolerance)
    except (ConfigError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:
        reason = " ".join(str(error).split())[:500]
        raise ExportRefused(f"the {format} export failed: {type(error).__name__}: {reason}") from error
    folder = os.path.abspath(output or os.path.join(run, EXPORT_DIR, FOLDERS[format]))
    write_json(folder + ".json", description)
    return description


def _exported_model(run: FinishedRun) -> tuple[torch.nn.Module, list[int], str]:
    """The module to export, the shape of one of its samples, and what it is (the model, or a GAN's generator)."""
    loaded = run.load_model()
    if isinstance(loaded, dict):
        if "generator" not in loaded:
            raise ConfigError("model", sorted(loaded), "has several models and no generator to export.")
        return Exported(loaded["generator"]).eval(), [int(run.config["task"]["latent_dim"])], "generator"
    return Exported(loaded).eval(), [int(n) for n in run.dataset["input_shape"]], "model"


def _output_description(cfg: dict[str, Any], role: str) -> dict[str, Any]:
    if role == "generator":
        return {"name": "output", "shape": ["batch", *cfg["dataset"]["input_shape"]], "meaning": "generated samples"}
    outputs = int(cfg["dataset"].get("num_outputs") or 1)
    meaning = "logits: softmax for probabilities, argmax for the class" if outputs > 1 else "the predicted value"
    return {"name": "output", "shape": ["batch", outputs], "meaning": meaning}


def _onnx(model: torch.nn.Module, example: torch.Tensor, path: str, written: list[str]) -> Callable:
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError(
            "--format", "onnx", "needs onnx, onnxscript and onnxruntime.", "pip install 'hydra_raytrain[export]'"
        ) from None
    batch = torch.export.Dim("batch")
    written.append(path + ".data")  # what an export with external data would add
    torch.onnx.export(
        model,
        (example,),
        path,
        dynamo=True,
        input_names=[INPUT_NAME],
        output_names=["output"],
        dynamic_shapes={"x": {0: batch}},
        external_data=False,
        verbose=False,
    )
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(session.run(None, {INPUT_NAME: x.numpy()})[0])


def _torch_export(model: torch.nn.Module, example: torch.Tensor, path: str, written: list[str]) -> Callable:
    program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    torch.export.save(program, path)
    return torch.export.load(path).module()


def _safetensors(model: torch.nn.Module, example: torch.Tensor, path: str, written: list[str]) -> Callable:
    try:
        import safetensors.torch
    except ImportError:
        needs = "pip install 'hydra_raytrain[export]'"
        raise ConfigError("--format", "safetensors", "needs safetensors.", needs) from None
    import copy

    inner = model.model if isinstance(model, Exported) else model
    safetensors.torch.save_model(inner, path)
    fresh = copy.deepcopy(inner)
    for parameter in fresh.parameters():
        torch.nn.init.zeros_(parameter)  # the weights come from the file, not from this copy
    safetensors.torch.load_model(fresh, path)
    return Exported(fresh).eval()


WRITERS: dict[str, Callable[[torch.nn.Module, torch.Tensor, str, list[str]], Callable]] = {
    "onnx": _onnx,
    "torch_export": _torch_export,
    "safetensors": _safetensors,
}


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a finished run dir, or one checkpoint folder inside its Ray storage")
    parser.add_argument("--format", choices=list(FORMATS), default="onnx")
    parser.add_argument("--output", help="the file to write (default: <run>/export/model.<format's suffix>)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="the largest difference from the model allowed")


def _export(options: argparse.Namespace) -> None:
    description = export(options.run, options.format, options.output, options.tolerance)
    folder = os.path.dirname(os.path.abspath(options.output or os.path.join(options.run, EXPORT_DIR, "x")))
    path = os.path.join(folder, description["file"])
    print(f"{description['format']}: {path} (max abs diff from the model {description['max_abs_diff']:.2e})")
    print(f"Written: {path}.json")


COMMAND = Command(
    "export", __doc__, _options, _export, "Cannot export this run", "Export refused", failures=(ExportRefused,)
)
main = COMMAND.run


if __name__ == "__main__":
    main()
