"""A text classifier's run (``task=text_classification``) answering texts: what ``predict`` writes for a file of
texts (``prediction``: the class, ``probability``: its softmax probability, beside the input's columns) and
``serve`` answers for ``{"inputs": ["text", ...]}``: ``{"predictions": [{"label": ..., "probability": ...}]}``.
A reward model's run (``task=reward_model``: one output) answers a score per text instead (``prediction``: the
score; serve's ``{"score": ...}``), each text read as training read a pair's side: after the input's prompt column
where it has the run's (``dataset.columns.prompt``), else after an empty prompt, and ended by the end token.

Texts are encoded as training encoded them (``Tokenize``: the run's tokenizer, cut at ``dataset.max_length``, token
types where its tokenizer makes them), ``batch_size`` texts a model call."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.preference import COLUMNS as PAIR_COLUMNS
from hydra_raytrain.data.preference import PREFERENCE
from hydra_raytrain.data.text_labels import CLASSIFICATION, COLUMNS, PAIR
from hydra_raytrain.inference.export_text import is_text


def is_classifier(cfg: dict[str, Any]) -> bool:
    """Whether a run trained a text classifier (``dataset=text dataset.format=classification``) or a reward model
    (:func:`is_scorer`)."""
    return is_text(cfg) and (cfg.get("dataset") or {}).get("format") == CLASSIFICATION or is_scorer(cfg)


def is_scorer(cfg: dict[str, Any]) -> bool:
    """Whether a run trained a reward model (``task=reward_model`` on ``dataset.format=preference``)."""
    target = str((cfg.get("task") or {}).get("_target_", ""))
    return is_text(cfg) and (cfg.get("dataset") or {}).get("format") == PREFERENCE and target.endswith(".RewardModel")


class TextClassifier:
    """The run's classifier and tokenizer in one actor or replica: texts in, classes and probabilities out."""

    def __init__(self, run: str, device: str = "cpu", batch_size: int = 64, threads: int | None = None) -> None:
        import torch

        from hydra_raytrain.data.tokenized import Tokenize
        from hydra_raytrain.inference.evaluate import load_model
        from hydra_raytrain.inference.finished import FinishedRun
        from hydra_raytrain.models.text import run_tokenizer

        if threads is not None:
            torch.set_num_threads(threads)
        config = FinishedRun.read(run).config
        dataset, tokenizer = config["dataset"], run_tokenizer(config)
        self.torch, self.device, self.batch_size = torch, torch.device(device), batch_size
        self.model: Any = load_model(run)
        self.model.to(self.device).eval()  # type: ignore[union-attr]
        self.classes = list(dataset["classes"])
        self.pad_id, self.types = tokenizer.pad_token_id, "token_type_ids" in tokenizer.model_input_names
        self.scorer, self.max_length = is_scorer(config), int(dataset["max_length"])
        self.tokenize = Tokenize(tokenizer, CLASSIFICATION, {"text": "text", PAIR: PAIR}, self.max_length)

    def scores(self, texts: list[str], prompts: list[str] | None = None) -> np.ndarray:
        """A reward model's score of each text (after its prompt), ``(texts,)``."""
        from hydra_raytrain.data.token_rows import TokenizedRows

        sides = self.tokenize.completed(list(prompts) if prompts else [""] * len(texts), texts)
        cut = [np.asarray(ids[: self.max_length]) for ids, _ in sides]
        every = TokenizedRows.of([(ids, ids) for ids in cut], self.pad_id)
        outputs = []
        with self.torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                batch = every.collate([every[i] for i in range(start, min(start + self.batch_size, len(texts)))])
                inputs = {name: batch[name].to(self.device) for name in ("input_ids", "attention_mask")}
                outputs.append(self.model(**inputs).logits[:, 0].float().cpu())
        return self.torch.cat(outputs).numpy() if outputs else np.zeros(0, np.float32)

    def classify(self, texts: list[str], pairs: list[str] | None = None) -> tuple[list[Any], np.ndarray]:
        """Each text's class (of the run's classes) and every class's probability ``(texts, classes)``."""
        from hydra_raytrain.data.token_rows import ClassifiedRows, chunk_of

        seconds: list[str | None] = list(pairs) if pairs else [None] * len(texts)
        rows = [{"text": t, PAIR: p} for t, p in zip(texts, seconds, strict=True)]
        encoded, _, _ = self.tokenize.cut(rows)
        every = ClassifiedRows([chunk_of(encoded)], range(len(rows)), self.pad_id, np.zeros(len(rows)), self.types)
        outputs = []
        with self.torch.no_grad():
            for start in range(0, len(rows), self.batch_size):
                batch = every.collate([every[i] for i in range(start, min(start + self.batch_size, len(rows)))])
                inputs = {name: value.to(self.device) for name, value in batch.items() if name != "labels"}
                outputs.append(self.torch.softmax(self.model(**inputs).logits.float(), dim=-1).cpu())
        probabilities = self.torch.cat(outputs).numpy() if outputs else np.zeros((0, len(self.classes)), np.float32)
        return [self.classes[i] for i in probabilities.argmax(axis=1)], probabilities

    def answers(self, texts: list[str]) -> list[dict[str, Any]]:
        """serve's answer: each text's ``{"label", "probability"}`` (a reward model's: ``{"score"}``)."""
        if self.scorer:
            return [{"score": float(score)} for score in self.scores(texts)]
        labels, probabilities = self.classify(texts)
        return [
            {"label": label, "probability": float(row.max())} for label, row in zip(labels, probabilities, strict=True)
        ]


class LabelledRows(TextClassifier):
    """predict's actor: each row's text (and second text) classified into ``prediction`` and ``probability``, the
    other columns carried."""

    def __init__(self, run: str, column: str, pair: str | None, **options: Any) -> None:
        super().__init__(run, **options)
        self.column, self.pair = column, pair

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        texts = [str(text) for text in batch.column(self.column).to_pylist()]
        pairs = [str(text) for text in batch.column(self.pair).to_pylist()] if self.pair else None
        if self.scorer:  # the second column: the texts' prompts
            return batch.append_column("prediction", pa.array(self.scores(texts, pairs), type=pa.float32()))
        labels, probabilities = self.classify(texts, pairs)
        chosen = probabilities.max(axis=1, initial=0.0).astype(np.float32)
        return batch.append_column("prediction", pa.array(labels)).append_column("probability", pa.array(chosen))


def text_columns(data: Any, cfg: dict[str, Any], columns: list[str] | None) -> tuple[str, str | None]:
    """The input's column of texts (``--features`` names it, else the run's: ``dataset.columns.text``) and of second
    texts (the run's ``text_pair`` column, where the input has it; a reward model's: its prompt column); checked on
    the schema."""
    names = list(data.schema().names)
    mapping = {**COLUMNS, PAIR: PAIR, **((cfg["dataset"].get("columns")) or {})}
    if is_scorer(cfg):  # a pair's prompt: read before each text
        mapping[PAIR] = {**PAIR_COLUMNS, **((cfg["dataset"].get("columns")) or {})}["prompt"]
    column = columns[0] if columns else mapping["text"]
    if column not in names or (columns and len(columns) > 1):
        raise ConfigError(
            "--features" if columns else "INPUT", columns or column, "names no single column of texts.",
            f"one column of texts (--features NAME), of: {', '.join(names)}",
        )  # fmt: skip
    return column, mapping[PAIR] if mapping[PAIR] in names else None


def labelled(data: Any, run: str, cfg: dict[str, Any], columns: list[str] | None, options: dict, pool: dict) -> Any:
    """``data`` with each row classified (``prediction``, ``probability``) by a pool of model actors (``pool``: Ray
    Data's ``map_batches`` resources); and the columns read."""
    column, pair = text_columns(data, cfg, columns)
    rows = data.map_batches(
        LabelledRows,
        fn_constructor_kwargs={"run": os.path.abspath(run), "column": column, "pair": pair, **options},
        batch_format="pyarrow",
        **pool,
    )
    return rows, [column] + ([pair] if pair else [])
