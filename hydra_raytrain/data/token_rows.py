"""Tokenized rows held as flat arrays: what ``dataset=text`` builds (``data/tokenized.py``) and packing packs
(``data/packing.py``); ``IGNORE`` marks a label the loss skips."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

IGNORE = -100  # a label the loss skips (torch's cross_entropy ignore_index)

Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]  # every row's ids, every row's labels, where each row starts


class TokenizedRows(Dataset):
    """Tokenized rows: ``{"input_ids", "labels"}`` per row; :meth:`collate` pads a batch to its longest row.

    Held as chunks of flat arrays (:data:`Chunk`) and the numbers of the rows kept across them: the blocks Ray Data
    tokenized (``data/tokenized_ray.py``) reach every worker through Ray's object store and are read in place."""

    def __init__(self, chunks: Sequence[Chunk], rows: Sequence[int] | np.ndarray, pad_id: int):
        self.chunks = list(chunks)
        self.starts = np.cumsum([0] + [len(offsets) - 1 for _, _, offsets in self.chunks], dtype=np.int64)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.pad_id = pad_id

    @classmethod
    def of(cls, pairs: Sequence[tuple[np.ndarray, np.ndarray]], pad_id: int) -> TokenizedRows:
        """Every row of ``pairs`` (ids, labels), in one chunk."""
        return cls([chunk_of(pairs)], range(len(pairs)), pad_id)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def longest(self) -> int:
        """The most tokens a row holds."""
        return int(self.lengths().max(initial=0))

    def lengths(self) -> np.ndarray:
        """Each row's tokens, in row order."""
        if not self.chunks:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.diff(offsets) for _, _, offsets in self.chunks])[self.rows]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        return self.row(int(self.rows[index]))

    def row(self, row: int) -> dict[str, torch.Tensor]:
        """Row ``row`` of the chunks (numbered across them, whether kept or not)."""
        chunk = int(np.searchsorted(self.starts, row, side="right")) - 1
        ids, labels, offsets = self.chunks[chunk]
        start, end = offsets[row - self.starts[chunk]], offsets[row - self.starts[chunk] + 1]
        return {
            "input_ids": torch.from_numpy(ids[start:end].astype(np.int64)),  # a copy: the arrays may be read-only
            "labels": torch.from_numpy(labels[start:end].astype(np.int64)),
        }

    def collate(self, rows: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Right-padded to the batch's longest row: padding ids, ``IGNORE`` labels, a zero attention mask; and
        ``supervised``, the flat positions whose next token is supervised (made here, on the host, so that the
        task's selection of them waits for no GPU: ``tasks/causal_lm.py``)."""
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
        batch["supervised"] = supervised_positions(batch["labels"])
        return batch


class ClassifiedRows(TokenizedRows):
    """Tokenized texts and their classes (``dataset.format=classification``): ``{"input_ids", "token_type_ids",
    "labels"}`` per row, ``labels`` the class's index (``targets``, by row number). The chunks' label arrays hold
    the token types (a text pair's second text: 1). :meth:`collate` pads to the batch's longest row and sends
    ``token_type_ids`` only for a tokenizer that makes them (``types``: BERT's; GPT-2's and Llama's do not)."""

    def __init__(
        self, chunks: Sequence[Chunk], rows: Sequence[int] | np.ndarray, pad_id: int, targets: np.ndarray, types: bool
    ):
        super().__init__(chunks, rows, pad_id)
        self.targets, self.types = np.asarray(targets, dtype=np.int64), types

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = super().__getitem__(index)
        target = torch.tensor(int(self.targets[self.rows[index]]))
        return {"input_ids": row["input_ids"], "token_type_ids": row["labels"], "labels": target}

    def collate(self, rows: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        longest = max(len(row["input_ids"]) for row in rows)
        ids = torch.full((len(rows), longest), self.pad_id, dtype=torch.long)
        mask, types = torch.zeros_like(ids), torch.zeros_like(ids)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            ids[i, :n], mask[i, :n], types[i, :n] = row["input_ids"], 1, row["token_type_ids"]
        batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([row["labels"] for row in rows])}
        return {**batch, "token_type_ids": types} if self.types else batch


def supervised_positions(labels: torch.Tensor) -> torch.Tensor:
    """The flat positions (row * length + t, in a ``(rows, length)`` batch) whose next token is supervised."""
    rows, columns = (labels[:, 1:] != IGNORE).nonzero(as_tuple=True)
    return rows * labels.size(1) + columns


def chunk_of(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> Chunk:
    """Rows' (ids, labels) as one :data:`Chunk`."""
    offsets = np.concatenate([[0], np.cumsum([len(ids) for ids, _ in pairs], dtype=np.int64)]).astype(np.int64)
    ids = np.concatenate([ids for ids, _ in pairs]).astype(np.int32) if pairs else np.zeros(0, np.int32)
    labels = np.concatenate([labels for _, labels in pairs]).astype(np.int32) if pairs else ids.copy()
    return ids, labels, offsets
