"""Preference pairs (``dataset.format=preference``): a prompt and two completions, the one chosen and the one
rejected, what DPO and reward models learn from (``tasks/dpo.py``).

A row holds, in TRL's layouts:
- ``prompt``, ``chosen``, ``rejected`` strings: each side tokenized as ``prompt_completion`` tokenizes a row (the
  prompt's labels masked, the completion and the end-of-sequence token supervised);
- ``chosen`` and ``rejected`` conversations (the ``messages`` layout), the turns they share the prompt and their
  last assistant turns what is compared; or ``prompt`` a conversation and ``chosen`` / ``rejected`` the replies.
  Each side rendered by the chat template, its last assistant turn supervised (``dataset.train_on=last_assistant``).

The two sides of row i are rows 2i and 2i+1 of the tokenized chunks (``data/token_rows.py``); the flags a row
gets (cut, learned) are its pair's: a pair is learned when both sides supervise a token and differ.
:class:`PreferenceRows` hands out pairs and batches B pairs as 2B rows, the chosen ones first.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.token_rows import Chunk, TokenizedRows

PREFERENCE = "preference"  # the dataset.format
COLUMNS = {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"}
SIDES = ("chosen", "rejected")


def conversations(rows: list[dict[str, Any]], columns: dict[str, str]) -> list[tuple[list[Any], list[Any]]] | None:
    """Each row's two whole conversations (the prompt's turns, then the side's), when the rows hold conversations;
    None when they hold strings. A ConfigError naming the column for a row of the other kind, sides whose turns
    before their last differ, or a last turn that is not the assistant's."""
    chosen = columns["chosen"]
    if not rows or isinstance(rows[0][chosen], str):
        _check_strings(rows, columns)
        return None
    whole = []
    for index, row in enumerate(rows):
        prompt = row.get(columns["prompt"]) or []
        if not isinstance(prompt, list):
            raise _kind(columns["prompt"], index, "a conversation (a list of {role, content}) or absent")
        pair = []
        for side in SIDES:
            turns = row[columns[side]]
            if not isinstance(turns, list) or not turns or turns[-1].get("role") != "assistant":
                raise _kind(columns[side], index, "a conversation ending with an assistant turn")
            pair.append(list(prompt) + turns)
        if pair[0][:-1] != pair[1][:-1]:
            raise ConfigError(
                f"dataset.columns.{chosen}", chosen, f"row {index}'s chosen and rejected conversations differ "
                "before their last turn: the turns they share are the prompt, the last assistant turns are compared.",
                "conversations that differ in their last assistant turn only (or a prompt column and one reply each)",
            )  # fmt: skip
        whole.append((pair[0], pair[1]))
    return whole


def _check_strings(rows: list[dict[str, Any]], columns: dict[str, str]) -> None:
    for index, row in enumerate(rows):
        for side in SIDES:
            if not isinstance(row[columns[side]], str):
                raise _kind(columns[side], index, "a string as the rows before it")
        if not isinstance(row.get(columns["prompt"]), str):
            raise _kind(columns["prompt"], index, "a string: rows of strings need their prompt")


def _kind(column: str, index: int, wanted: str) -> ConfigError:
    return ConfigError(
        f"dataset.columns.{column}", column, f"row {index} holds another kind of value; each row holds {wanted}.",
        "prompt, chosen and rejected strings; or chosen and rejected conversations (messages' layout)",
    )  # fmt: skip


def pair_flags(cut: np.ndarray, learned: np.ndarray, sides: Sequence[tuple[Any, Any]]) -> tuple[np.ndarray, ...]:
    """Each pair's flags from its two sides' (interleaved): cut (either side), learned (both sides supervise a
    token and differ), tied (the two sides the same tokens)."""
    tied = np.array([np.array_equal(sides[i][0], sides[i + 1][0]) for i in range(0, len(sides), 2)], dtype=bool)
    return cut[0::2] | cut[1::2], learned[0::2] & learned[1::2] & ~tied, tied


def report_ties(key: str, tied: np.ndarray, sampled: bool) -> None:
    """A ConfigError when every pair of ``key`` ties (nothing to prefer); unless ``sampled``, the ties said."""
    if len(tied) and tied.all():
        rows = f"the first {len(tied)} rows" if sampled else f"all {len(tied)} rows"
        raise ConfigError(
            "dataset.format", PREFERENCE, f"chosen equals rejected in {rows} of {key}: nothing to prefer.",
            "rows whose chosen and rejected completions differ (dataset.columns names the columns)",
        )  # fmt: skip
    if tied.any() and not sampled:
        warnings.warn(f"{tied.sum():,} rows of {key} have chosen = rejected: dropped", stacklevel=3)


class PreferenceRows(TokenizedRows):
    """Preference pairs: ``rows`` are pair numbers, pair p's chosen side row 2p of the chunks, its rejected side row
    2p + 1. An item is ``{"chosen": row, "rejected": row}`` (each ``{"input_ids", "labels"}``); :meth:`collate` pads
    B pairs as 2B rows, the B chosen ones first. ``reference``, once a task set it (``{pair number: (chosen,
    rejected)}``: a reference model's log-probabilities, computed once), goes with each batch as
    ``reference_logps`` (2B values, in the rows' order)."""

    def __init__(self, chunks: Sequence[Chunk], rows: Sequence[int] | np.ndarray, pad_id: int):
        super().__init__(chunks, rows, pad_id)
        self.reference: dict[int, tuple[float, float]] | None = None

    def lengths(self) -> np.ndarray:
        """Each pair's longer side, in pair order."""
        if not self.chunks:
            return np.zeros(0, dtype=np.int64)
        sides = np.concatenate([np.diff(offsets) for _, _, offsets in self.chunks])
        return np.maximum(sides[2 * self.rows], sides[2 * self.rows + 1])

    def __getitem__(self, index: int) -> dict[str, dict[str, torch.Tensor]]:  # type: ignore[override]
        if not -len(self) <= index < len(self):
            raise IndexError(f"pair {index} of {len(self)}")
        pair = int(self.rows[index])
        item = {"chosen": self.row(2 * pair), "rejected": self.row(2 * pair + 1)}
        if self.reference is not None:
            item["reference"] = {"logps": torch.tensor(self.reference[pair], dtype=torch.float64)}
        return item

    def collate(self, pairs: Sequence[dict[str, dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:  # type: ignore[override]
        batch = super().collate([pair["chosen"] for pair in pairs] + [pair["rejected"] for pair in pairs])
        if self.reference is not None:
            logps = torch.stack([pair["reference"]["logps"] for pair in pairs])  # (B, 2)
            batch["reference_logps"] = torch.cat([logps[:, 0], logps[:, 1]])
        return batch
