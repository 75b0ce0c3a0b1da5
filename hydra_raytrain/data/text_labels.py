"""A text classification's labels (``dataset=text dataset.format=classification``): the classes are the label
column's values in the training rows, sorted (strings, or integers), kept with the run (``dataset.classes``) and
named by its model (``id2label``); each split's labels become class indices, and a label training never saw is
refused by name. No torch here: ``${text_classes:...}`` resolves on the driver before anything heavy loads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.text_files import read_rows

CLASSIFICATION = "classification"  # the dataset.format
SCORE = "score"  # the one class of a reward model's head (dataset.format=preference)
PAIR_TASKS = (".DPO", ".RewardModel")  # the tasks that learn from preference pairs
COLUMNS = {"text": "text", "label": "label"}  # what it reads; ``text_pair`` too, where a file has it
PAIR = "text_pair"


def label_column(columns: Mapping[str, Any] | None) -> str:
    """The label's column: ``dataset.columns.label``, else ``label``."""
    return str(dict(columns or {}).get("label", COLUMNS["label"]))


def text_classes(path: str, format: str = "text", columns: Mapping[str, Any] | None = None) -> list[Any] | None:
    """``dataset.classes``: the labels of ``path``'s rows (a classification's), sorted; preference pairs' one score
    (a reward model's head: ``[score]``); None for other formats."""
    if format == "preference":
        return [SCORE]
    if format != CLASSIFICATION:
        return None
    column = label_column(columns)
    return classes_of([row[column] for row in read_rows(path, [column], "dataset.path")], column)


def classes_of(values: Sequence[Any], column: str) -> list[Any]:
    """The distinct labels, sorted; a ConfigError for empty labels, labels that are not strings or integers (or a
    mix of both), and a single class."""
    key = "dataset.columns.label"
    empty = sum(value is None for value in values)
    if empty:
        raise ConfigError(key, column, f"{empty} rows of dataset.path have no label.", "a label in every row")
    kinds = {type(value) for value in values}
    if not (kinds <= {str} or kinds <= {int}):
        found = ", ".join(sorted(kind.__name__ for kind in kinds))
        raise ConfigError(
            key, column, f"holds {found} values: a label is a class, named by a string or an integer (not both).",
            "a column of strings (positive, negative) or of integers (0, 1, 2)",
        )  # fmt: skip
    classes = sorted(set(values))
    if len(classes) < 2:
        raise ConfigError(
            key, column, f"holds one label ({few(classes)}) in dataset.path's rows: a classifier needs two or more.",
            "a label column with at least two classes",
        )  # fmt: skip
    return classes


def class_indices(values: Sequence[Any], classes: Sequence[Any], key: str, path: str) -> np.ndarray:
    """Each label's index in ``classes``; a ConfigError naming ``key`` (the rows' file set, at ``path``) for a label
    that is none of them."""
    index = {label: i for i, label in enumerate(classes)}
    unknown = sorted({value for value in values if value not in index}, key=str)
    if unknown:
        raise ConfigError(
            key, path, f"holds labels the training rows never have: {few(unknown)} (the classes: {few(classes)}).",
            "rows whose labels are among the classes of dataset.path's rows",
        )  # fmt: skip
    return np.fromiter((index[value] for value in values), dtype=np.int64, count=len(values))


def check_trained_classes(train: np.ndarray, classes: Sequence[Any], val_fraction: float) -> None:
    """Every class among the training split's labels (``train``: their indices); a ConfigError naming the classes
    the split drew no row of (all their rows went to validation or test)."""
    missing = sorted(set(range(len(classes))) - set(np.unique(train).tolist()))
    if missing:
        names = few([classes[i] for i in missing])
        raise ConfigError(
            "dataset.val_fraction", val_fraction, f"the training split has no row labelled {names}: every such row of "
            "dataset.path went to validation or test, so the model could never learn it.",
            "more rows of that label, or a dataset.val_path (and dataset.test_path) of your own",
        )  # fmt: skip


def few(values: Sequence[Any], shown: int = 8) -> str:
    listed = ", ".join(repr(value) for value in values[:shown])
    return listed + (f", ... ({len(values)} in all)" if len(values) > shown else "")


def check_reference(task: Mapping[str, Any], model: Mapping[str, Any], peft: str, init_from: str | None) -> None:
    """DPO's reference is the run's starting weights, built again (a frozen copy, or the precomputed figures) unless
    LoRA's adapters are switched off: weights the builder draws anew each time (``model.path=null``) cannot be, and
    are refused by name, unless ``run.init_from`` gives them."""
    target = str(task.get("_target_", ""))
    rebuilt = peft == "none" or task.get("precompute_reference")
    if target.endswith(".DPO") and rebuilt and "_target_" in model and not model.get("path") and not init_from:
        raise ConfigError(
            "model.path", model.get("path"), "task=dpo compares the policy with its starting weights, built again; "
            "new weights (model.model_type) are drawn anew each time.",
            "model.path=DIR (save_pretrained's), run.init_from=RUN, or peft=lora (the reference: the adapters off)",
        )  # fmt: skip


def check_text_task(dataset: Mapping[str, Any], task: Mapping[str, Any]) -> None:
    """A text dataset's format fits its task: a classification's rows (``format=classification``) for
    ``task=text_classification``, and only for it; a ConfigError naming ``dataset.format`` (or ``task``, for
    ``task=text_classification`` on another dataset) otherwise."""
    format, target = dataset.get("format"), str(task.get("_target_", ""))
    if dataset.get("_target_") != "hydra_raytrain.data.text":
        if target.endswith(PAIR_TASKS):
            raise ConfigError(
                "task", target, f"learns from preference pairs; {dataset.get('_target_')} holds none.",
                "dataset=text dataset.format=preference",
            )  # fmt: skip
        if target.endswith(".TextClassification"):
            raise ConfigError(
                "task", "text_classification", f"reads texts and labels; {dataset.get('_target_')} holds none.",
                "dataset=text dataset.format=classification, or task=classification for images and tables",
            )  # fmt: skip
        return
    if target.endswith(".TextClassification") and format != CLASSIFICATION:
        raise ConfigError(
            "dataset.format", format, "task=text_classification learns one label per text.",
            "dataset.format=classification (columns text and label; dataset.columns renames them)",
        )  # fmt: skip
    pairs = format == "preference"
    if target.endswith(PAIR_TASKS) and not pairs:
        raise ConfigError(
            "dataset.format", format, f"{target} learns from pairs: a prompt, a chosen and a rejected completion.",
            "dataset.format=preference (columns prompt, chosen, rejected; dataset.columns renames them)",
        )  # fmt: skip
    if pairs and target.endswith((".CausalLM", ".TextClassification")):
        raise ConfigError(
            "dataset.format", format, f"task={'causal_lm' if target.endswith('.CausalLM') else 'text_classification'}"
            " learns from single texts; pairs train task=dpo.",
            "task=dpo, or dataset.format=text, prompt_completion or messages",
        )  # fmt: skip
    if target.endswith(".CausalLM") and format == CLASSIFICATION:
        raise ConfigError(
            "dataset.format", format, "task=causal_lm learns a text's tokens, not its label.",
            "task=text_classification model=text_classifier, or dataset.format=text, prompt_completion or messages",
        )  # fmt: skip
