"""Text for a causal language model (``dataset=text``): JSON lines or Parquet rows, tokenized into input ids and
labels, the labels of what is not learned masked (``IGNORE``, which the loss skips).

``format``:
- ``text``: every token is supervised (continued pre-training on documents);
- ``prompt_completion``: the prompt is read, the completion (and the end-of-sequence token) learned;
- ``messages``: a conversation (a list of ``{role, content}``) rendered by the tokenizer's chat template, its
  assistant turns learned.

Rows longer than ``max_length`` tokens are cut (counted and said); a row left with no supervised token is
dropped (counted and said); batches are padded to their longest row (``TokenizedRows.collate``). The splits
follow the other datasets' rules (``val_path`` or ``val_fraction``, ``test_path`` or ``test_fraction``, folds).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.files import absolute_location, filesystem_of, listing
from hydra_raytrain.data.splits import Splits, check_fractions, split_indices

FORMATS = ("text", "prompt_completion", "messages")
IGNORE = -100  # a label the loss skips (torch's cross_entropy ignore_index)
SUFFIXES = (".jsonl", ".json", ".parquet")
LAYOUT = "a .jsonl or .parquet file, or a folder (or s3:// prefix) of them, one row per example"


class TokenizedRows(Dataset):
    """Tokenized rows: ``{"input_ids", "labels"}`` per row; :meth:`collate` pads a batch to its longest row.

    Held as three flat arrays (every row's ids, labels, and where each row starts), so that the splits the driver
    tokenized reach every worker through Ray's object store in one piece, read in place (``recipe/loop.py``)."""

    def __init__(self, rows: Sequence[tuple[np.ndarray, np.ndarray]], pad_id: int):
        lengths = [len(ids) for ids, _ in rows]
        self.offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
        self.ids = np.concatenate([ids for ids, _ in rows]).astype(np.int32) if rows else np.zeros(0, np.int32)
        self.labels = np.concatenate([labels for _, labels in rows]).astype(np.int32) if rows else self.ids.copy()
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def longest(self) -> int:
        """The most tokens a row holds."""
        return int(np.diff(self.offsets).max(initial=0))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        start, end = self.offsets[index % len(self)], self.offsets[index % len(self) + 1]
        return {
            "input_ids": torch.from_numpy(self.ids[start:end].astype(np.int64)),  # a copy: the arrays may be read-only
            "labels": torch.from_numpy(self.labels[start:end].astype(np.int64)),
        }

    def collate(self, rows: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Right-padded to the batch's longest row: padding ids, ``IGNORE`` labels, a zero attention mask."""
        longest = max(len(row["input_ids"]) for row in rows)
        batch = {
            "input_ids": torch.full((len(rows), longest), self.pad_id, dtype=torch.long),
            "attention_mask": torch.zeros((len(rows), longest), dtype=torch.long),
            "labels": torch.full((len(rows), longest), IGNORE, dtype=torch.long),
        }
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            batch["input_ids"][i, :n] = row["input_ids"]
            batch["attention_mask"][i, :n] = 1
            batch["labels"][i, :n] = row["labels"]
        return batch


def text(
    path: str,
    tokenizer: str,
    format: str = "text",
    max_length: int = 1024,
    columns: dict[str, str] | None = None,
    val_path: str | None = None,
    val_fraction: float = 0.1,
    split_seed: int = 0,
    test_path: str | None = None,
    test_fraction: float = 0.0,
    folds: int | None = None,
    fold: int = 0,
) -> Splits:
    """The splits of the rows at ``path`` (and ``val_path`` / ``test_path``), tokenized by ``tokenizer``'s
    tokenizer. ``columns`` renames the columns a format reads (``{prompt: question, completion: answer}``)."""
    from hydra_raytrain.models.text import load_tokenizer

    if format not in FORMATS:
        raise ConfigError("dataset.format", format, "unknown format.", ", ".join(FORMATS))
    if max_length < 2:
        raise ConfigError("dataset.max_length", max_length, "a row needs at least 2 tokens to learn one.")
    loaded = load_tokenizer(tokenizer, "dataset.tokenizer")
    if format == "messages" and not loaded.chat_template:
        raise ConfigError(
            "dataset.format", format, f"the tokenizer at {tokenizer} has no chat template.",
            "a tokenizer with a chat template (its tokenizer_config.json's), or dataset.format=prompt_completion",
        )  # fmt: skip
    names = {**default_columns(format), **(columns or {})}
    tokenize = Tokenize(loaded, format, names, max_length)
    rows = tokenize.rows(read_rows(path, list(names.values()), "dataset.path"), "dataset.path")
    held = {
        split: tokenize.rows(read_rows(where, list(names.values()), f"dataset.{split}_path"), f"dataset.{split}_path")
        for split, where in (("val", val_path), ("test", test_path))
        if where is not None
    }
    pad = loaded.pad_token_id
    train, val, test = _split(len(rows), held, val_fraction, test_fraction, split_seed, folds, fold)
    return Splits(
        TokenizedRows([rows[i] for i in train], pad),
        TokenizedRows(held["val"] if "val" in held else [rows[i] for i in val], pad),
        TokenizedRows(held["test"] if "test" in held else [rows[i] for i in test], pad)
        if test or "test" in held
        else None,
    )


def _split(
    n: int, held: dict[str, Any], val_fraction: float, test_fraction: float, seed: int, folds: int | None, fold: int
) -> tuple[list[int], list[int], list[int]]:
    """The rows of each split (indices): validation and test from their own files when held, else a seeded
    fraction of the rows (as every dataset splits, ``data/splits.py``)."""
    if "val" not in held:
        return split_indices(n, val_fraction, seed, 0.0 if "test" in held else test_fraction, folds, fold)
    if folds is not None:
        raise ConfigError(
            "dataset.folds", folds, "dataset.val_path holds the validation rows: cross-validation cuts its folds "
            "from dataset.path's rows.", "dataset.val_path=null (the folds from dataset.path), or dataset.folds=null",
        )  # fmt: skip
    check_fractions(val_fraction, test_fraction)
    if "test" in held or not test_fraction:
        return list(range(n)), [], []
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_test = min(n - 1, max(1, round(n * test_fraction)))
    return order[n_test:], [], order[:n_test]


def default_columns(format: str) -> dict[str, str]:
    return {"text": {"text": "text"}, "prompt_completion": {"prompt": "prompt", "completion": "completion"}}.get(
        format, {"messages": "messages"}
    )


def read_rows(path: str, columns: list[str], key: str) -> list[dict[str, Any]]:
    """The rows of every JSON-lines / Parquet file at ``path`` (a file, a folder, an ``s3://`` prefix), in file
    order, holding ``columns``; a ConfigError naming ``key`` for a missing column or no such file."""
    import pyarrow.json
    import pyarrow.parquet as pq

    files = [file for file in listing(absolute_location(path), key, LAYOUT) if file.lower().endswith(SUFFIXES)]
    if not files:
        raise ConfigError(key, path, "holds no .jsonl or .parquet file.", LAYOUT)
    rows: list[dict[str, Any]] = []
    for file in files:
        fs, location = filesystem_of(file)
        with fs.open_input_file(location) as stream:
            table = pq.read_table(stream) if file.endswith(".parquet") else pyarrow.json.read_json(stream)
        missing = [column for column in columns if column not in table.column_names]
        if missing:
            raise ConfigError(
                key, path, f"{file} has no column {', '.join(missing)} (its columns: {', '.join(table.column_names)}).",
                "the format's columns, or dataset.columns mapping them to yours, e.g. {prompt: question}",
            )  # fmt: skip
        rows.extend(table.select(columns).to_pylist())
    return rows


class Tokenize:
    """Rows of one format to ``(input_ids, labels)`` arrays, cut at ``max_length``."""

    def __init__(self, tokenizer: Any, format: str, columns: dict[str, str], max_length: int):
        self.tokenizer, self.format, self.columns, self.max_length = tokenizer, format, columns, max_length

    def rows(self, rows: list[dict[str, Any]], key: str) -> list[tuple[np.ndarray, np.ndarray]]:
        pairs = {"text": self._text, "prompt_completion": self._prompt_completion, "messages": self._messages}[
            self.format
        ](rows)
        cut = sum(len(ids) > self.max_length for ids, _ in pairs)
        kept = [
            (np.asarray(ids[: self.max_length], dtype=np.int64), np.asarray(labels[: self.max_length], dtype=np.int64))
            for ids, labels in pairs
        ]
        learned = [row for row in kept if (row[1][1:] != IGNORE).any()]  # the first token is never predicted
        if not learned:
            raise ConfigError(
                "dataset.format", self.format, f"no row of {key} supervises a token (of {len(rows)} rows).",
                "a format whose rows have something to learn: completions that are not empty, assistant turns",
            )  # fmt: skip
        if cut:
            warnings.warn(
                f"dataset.max_length={self.max_length} cut {cut:,} of {len(rows):,} rows of {key}", stacklevel=2
            )
        if len(learned) < len(kept):
            warnings.warn(f"{len(kept) - len(learned):,} rows of {key} supervise no token: dropped", stacklevel=2)
        return learned

    def _ids(self, texts: list[str], special: bool) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=special)["input_ids"]

    def _text(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        eos = [self.tokenizer.eos_token_id]
        ids = [row + eos for row in self._ids([row[self.columns["text"]] for row in rows], True)]
        return [(row, row) for row in ids]

    def _prompt_completion(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        prompts = self._ids([row[self.columns["prompt"]] for row in rows], True)
        eos = [self.tokenizer.eos_token_id]
        completions = [row + eos for row in self._ids([row[self.columns["completion"]] for row in rows], False)]
        return [(p + c, [IGNORE] * len(p) + c) for p, c in zip(prompts, completions, strict=True)]

    def _messages(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        return [self._conversation(row[self.columns["messages"]]) for row in rows]

    def _conversation(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
        """The whole conversation's ids; supervised: each assistant turn, what the template adds after the
        conversation up to it with the generation prompt."""

        def render(turns: list[dict[str, Any]], prompt: bool) -> list[int]:  # fmt: skip
            rendered = self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=prompt)
            return self._ids([rendered], False)[0]

        ids = render(messages, False)
        labels = [IGNORE] * len(ids)
        for index, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before, through = render(messages[:index], True), render(messages[: index + 1], False)
            if ids[: len(before)] != before or ids[: len(through)] != through:
                raise ConfigError(
                    "dataset.format", "messages", "the tokenizer's chat template renders a conversation's earlier "
                    "turns otherwise once later turns follow (or its tokens merge across turns): the assistant "
                    "turns cannot be found in the whole conversation's tokens.",
                    "a template that renders each turn alike whatever follows, or prompt_completion rows",
                )  # fmt: skip
            labels[len(before) : len(through)] = ids[len(before) : len(through)]
        return ids, labels
