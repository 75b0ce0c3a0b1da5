"""A causal language model's or text classifier's run exported as Hugging Face folders (``export --format hf |
peft``).

    python -m hydra_raytrain.export outputs/runs/<name> --format hf     # -> <run>/export/hf/ (LoRA merged)
    python -m hydra_raytrain.export outputs/runs/<name> --format peft   # -> <run>/export/adapter/ (LoRA runs)

``hf``: the model (its LoRA adapters merged into its weights) with its tokenizer and a generation config (greedy,
the tokenizer's end and padding tokens), which ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load offline. ``peft``: the adapters alone, which
``PeftModel.from_pretrained(base, folder)`` loads onto the base model (``model.path``; a classifier's adapters
hold its head). A classifier's ``hf`` folder is what ``AutoModelForSequenceClassification`` and
``pipeline("text-classification")`` load, its classes named (``id2label``). Either is loaded back and its logits on
a batch of token ids compared with the run's model; above ``--tolerance`` the export is refused. The folder is
written under a temporary name and moved into place once checked.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.inference.finished import FinishedRun

FOLDERS = {"hf": "hf", "peft": "adapter"}
TEXT_DATASET = "hydra_raytrain.data.text"


def is_text(cfg: dict[str, Any]) -> bool:
    """Whether a run trained a causal language model on text (``dataset=text``)."""
    return (cfg.get("dataset") or {}).get("_target_") == TEXT_DATASET


def export_text(run: str, finished: FinishedRun, format: str, output: str | None, tolerance: float) -> dict[str, Any]:
    """Write the run's model as ``format``'s folder, loaded back and compared; returns its description."""
    from hydra_raytrain.models.text import run_tokenizer

    cfg = finished.config
    adapters = (cfg.get("peft") or {}).get("method", "none") != "none"
    if format == "peft" and not adapters:
        raise ConfigError("--format", format, "this run trained no adapters (peft=none).", "--format hf")
    model = finished.load_model()
    tokenizer = run_tokenizer(cfg)  # with the chat template the run trained with
    path = os.path.abspath(output or os.path.join(run, "export", FOLDERS[format]))
    partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.partial")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ids = torch.randint(len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            expected = model(input_ids=ids).logits
        loaded = _write_hf(model, tokenizer, partial) if format == "hf" else _write_adapter(model, cfg, partial)
        with torch.no_grad():
            difference = float((loaded(input_ids=ids).logits - expected).abs().max())
        if not difference <= tolerance:
            raise ValueError(
                f"the exported model's logits differ by up to {difference:.3g} (--tolerance {tolerance:g})"
            )
        _move_into_place(partial, path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return {"format": format, "file": os.path.basename(path), "max_abs_diff": difference, "run": os.path.abspath(run)}


def _write_hf(model: Any, tokenizer: Any, folder: str) -> Any:
    """The model (adapters merged) and its tokenizer in ``folder``, loaded back by transformers' Auto class for it:
    a causal LM with a greedy generation config; a classifier with its config's ``id2label`` (the run's classes)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, GenerationConfig

    from hydra_raytrain.models.text import dtype_argument

    merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    classifier = type(merged).__name__.endswith("ForSequenceClassification")
    if not classifier:
        merged.generation_config = GenerationConfig(
            do_sample=False,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    merged.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    auto = AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
    return auto.from_pretrained(folder, **{dtype_argument(): merged.dtype}).eval()


def _write_adapter(model: Any, cfg: dict[str, Any], folder: str) -> Any:
    from hydra.utils import instantiate
    from peft import PeftModel

    model.save_pretrained(folder)
    base = instantiate(cfg["model"], _convert_="all").to(model.dtype)
    return PeftModel.from_pretrained(base, folder).eval()


def _move_into_place(partial: str, path: str) -> None:
    """The checked folder at ``path``; a previous export there is removed only once the new one is in place."""
    previous = f"{path}.{os.getpid()}.previous"
    if os.path.exists(path):
        os.replace(path, previous)
    os.replace(partial, path)
    shutil.rmtree(previous, ignore_errors=True)
