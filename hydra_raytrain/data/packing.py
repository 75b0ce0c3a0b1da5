"""Packing (``dataset.packing=true``): tokenized rows packed into sequences of at most ``dataset.max_length`` tokens,
each document kept apart.

A row is never split: rows are placed best-fit decreasing (TRL's ``bfd``: the longest first, each into the open
pack it fills most tightly), once, the same on every worker; the sampler then shuffles packs as it shuffled rows, so
``trainer.batch_size`` counts packed sequences. Inside a pack:

- positions restart at each document (``position_ids``), so a document sees the positions it sees alone;
- no token attends across a boundary: the batch carries ``position_ids`` and no ``attention_mask``, from which
  transformers builds a block-causal mask for eager and sdpa attention (``masking_utils.find_packed_sequence_indices``;
  a 2D mask would switch that off). Flash-attention is refused: transformers reads packed rows from the positions
  only for a batch of one row;
- no label crosses a boundary: each document's first label is ``IGNORE`` (the previous document's last token does
  not predict it; alone, nothing did), so the loss counts exactly the tokens it counts unpacked.

A model whose attention does not honour this is refused before training (:func:`check_packing`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.token_rows import IGNORE, TokenizedRows, supervised_positions


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[np.ndarray]:
    """Each pack's rows (indices into ``lengths``, ascending; packs ordered by their first row): the longest row
    first, each into the open pack whose room it fills most tightly, a new pack when none has room. Deterministic."""
    if len(lengths) and int(np.max(lengths)) > capacity:
        raise ValueError(f"a row of {int(np.max(lengths))} tokens does not fit a pack of {capacity}")
    rooms, packs = Rooms(capacity), list[list[int]]()
    for row in np.argsort(-np.asarray(lengths), kind="stable").tolist():
        need = int(lengths[row])
        room = rooms.tightest(need)
        if room is None:
            pack, left = len(packs), capacity - need
            packs.append([])
        else:
            pack, left = rooms.take(room), room - need
        packs[pack].append(row)
        if left > 0:
            rooms.put(left, pack)
    return sorted((np.array(sorted(pack), dtype=np.int64) for pack in packs), key=lambda pack: int(pack[0]))


class Rooms:
    """The open packs by the room they have left, and a segment tree over the rooms that finds the tightest one that
    fits in O(log capacity): a leaf r holds r while some open pack has room r exactly; a node, its leaves' max."""

    def __init__(self, capacity: int):
        self.size = 1 << max(capacity, 1).bit_length()
        self.tree = [0] * (2 * self.size)
        self.packs: dict[int, list[int]] = {}

    def tightest(self, need: int) -> int | None:
        """The smallest room of an open pack that holds ``need`` tokens; None when no open pack does."""
        if self.tree[1] < need:
            return None
        node = 1
        while node < self.size:
            node = 2 * node if self.tree[2 * node] >= need else 2 * node + 1
        return node - self.size

    def take(self, room: int) -> int:
        """A pack with ``room`` left, no longer open at that room."""
        waiting = self.packs[room]
        pack = waiting.pop()
        if not waiting:
            del self.packs[room]
            self._mark(room, False)
        return pack

    def put(self, room: int, pack: int) -> None:
        if room not in self.packs:
            self.packs[room] = []
            self._mark(room, True)
        self.packs[room].append(pack)

    def _mark(self, room: int, present: bool) -> None:
        node = self.size + room
        self.tree[node] = room if present else 0
        while node > 1:
            node //= 2
            self.tree[node] = max(self.tree[2 * node], self.tree[2 * node + 1])


class PackedRows(Dataset):
    """:class:`TokenizedRows` packed into sequences of at most ``length`` tokens: ``{"input_ids", "labels",
    "position_ids"}`` per pack; :meth:`collate` pads a batch of packs to its longest."""

    def __init__(self, rows: TokenizedRows, length: int):
        self.rows, self.length, self.pad_id = rows, length, rows.pad_id
        self.packs = best_fit_decreasing(rows.lengths(), length)

    def __len__(self) -> int:
        return len(self.packs)

    @property
    def longest(self) -> int:
        """The most tokens a document holds (a pack holds at most ``length``)."""
        return self.rows.longest

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"pack {index} of {len(self)}")
        documents = [self.rows[int(row)] for row in self.packs[index]]
        labels = [document["labels"].clone() for document in documents]
        for part in labels:
            part[0] = IGNORE  # predicted by nothing: alone, it is the first token; packed, not by the neighbour's
        return {
            "input_ids": torch.cat([document["input_ids"] for document in documents]),
            "labels": torch.cat(labels),
            "position_ids": torch.cat([torch.arange(len(part)) for part in labels]),
        }

    def collate(self, packs: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Right-padded to the batch's longest pack: padding ids, ``IGNORE`` labels and position 0 (each padding token
        a sequence of its own: nothing real attends to it, and no position beyond a document's is asked of the
        model); no ``attention_mask`` (see the module's docstring); ``supervised`` as :meth:`TokenizedRows.collate`
        makes it."""
        longest = max(len(pack["input_ids"]) for pack in packs)
        batch = {
            "input_ids": torch.full((len(packs), longest), self.pad_id, dtype=torch.long),
            "labels": torch.full((len(packs), longest), IGNORE, dtype=torch.long),
            "position_ids": torch.zeros((len(packs), longest), dtype=torch.long),
        }
        for i, pack in enumerate(packs):
            n = len(pack["input_ids"])
            batch["input_ids"][i, :n] = pack["input_ids"]
            batch["labels"][i, :n] = pack["labels"]
            batch["position_ids"][i, :n] = pack["position_ids"]
        batch["supervised"] = supervised_positions(batch["labels"])
        return batch


def packed(part: Any, length: int | None) -> Any:
    """``part`` packed into sequences of ``length`` tokens (None: as it is)."""
    return part if length is None or part is None else PackedRows(part, length)


def check_text_models(dataset: Mapping[str, Any], splits: Any, models: Mapping[str, Any]) -> None:
    """What a text dataset asks of the models, checked before Ray starts (on the first rows) and by each worker
    (on all of them): rows within their positions (``check_positions``), documents kept apart when packed."""
    check_positions(dataset.get("max_length"), splits, models)
    check_packing(dataset, models)


def check_positions(max_length: Any, splits: Any, models: Mapping[str, Any]) -> None:
    """Text rows no longer than the models' positions (GPT-2's 1,024): refused by name, not an index error in the
    embeddings (a pack's documents restart their positions: its longest document counts). Checked before Ray
    starts on the first rows, and by each worker on all of them."""
    parts: list[Any] = [getattr(splits, name, None) for name in ("train", "val", "test")]
    longest = max((part.longest for part in parts if isinstance(part, (TokenizedRows, PackedRows))), default=0)
    for model in models.values():
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if isinstance(limit, int) and longest > limit:
            raise ConfigError(
                "dataset.max_length", max_length, f"rows of up to {longest} tokens; the model has {limit} positions.",
                f"dataset.max_length={limit} or less (longer rows are cut)",
            )  # fmt: skip


def check_packing(dataset: Mapping[str, Any], models: Mapping[str, Any]) -> None:
    """With ``dataset.packing``: a ConfigError unless each model keeps packed documents apart, tried on a document
    of 3 tokens packed after two different ones: its logits must not move (to 1e-6 of their scale; masked out, the
    first document adds exact zeros). A model that takes no ``position_ids``, or whose attention lets the first
    document in, is refused."""
    if not dataset.get("packing"):
        return
    for name, model in models.items():
        attention = str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "")
        if "flash" in attention:
            raise ConfigError(
                "dataset.packing", True, f"the model ({name}) attends with {attention}, whose kernel transformers "
                "keeps packed documents apart in only for a batch of one row.",
                "dataset.packing=false, or the model's attn_implementation sdpa or eager",
            )  # fmt: skip
        leak = _packed_difference(model)
        if leak is None or leak > 1e-6:
            found = (
                "takes no position_ids" if leak is None else f"lets packed documents attend to each other ({leak:.0e})"
            )
            raise ConfigError(
                "dataset.packing", True, f"the model ({name}: {type(model).__name__}) {found}.",
                "dataset.packing=false, or a model whose attention transformers builds from position ids "
                "(its modeling uses masking_utils.create_causal_mask: Llama, Qwen, Mistral, GPT-2, ...)",
            )  # fmt: skip


def _packed_difference(model: Any) -> float | None:
    """How far a 3-token document's logits move, relative to their scale, when the document packed before it
    changes; None when the model's forward refuses the packed inputs."""
    vocabulary = getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(vocabulary, int):
        return None
    device = next(model.parameters()).device
    positions = torch.tensor([[0, 1, 2, 0, 1, 2]], device=device)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            seen = [
                model(
                    input_ids=torch.tensor([ids], device=device) % vocabulary, position_ids=positions, use_cache=False
                )
                .logits[0, 3:]
                .float()
                for ids in ([1, 2, 3, 4, 5, 6], [9, 8, 7, 4, 5, 6])
            ]
    except (TypeError, ValueError):
        return None
    finally:
        model.train(training)
    return float(((seen[0] - seen[1]).abs().max() / seen[0].abs().max().clamp_min(1e-6)).item())
