"""Sampled completions that depend on the seed and the prompt alone: not on the batch a prompt shares, its place
in it, or the actor or replica that completes it (``predict --temperature 0.7 --top-p 0.9 --seed 1``).

``transformers``' own sampling draws every row of a batch from one random stream: a prompt's completion then changes
with its neighbours. Here each row draws from a generator of its own, seeded by the seed and the prompt's text,
inside a logits processor that keeps only the token drawn; ``generate`` then takes it greedily. Greedy decoding
(``temperature`` 0, the default) draws nothing."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hydra_raytrain.config.errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn: ``temperature`` 0 is greedy; else softmax(logits / temperature) over the smallest
    set of tokens whose probabilities add up to ``top_p`` (nucleus sampling), drawn with ``seed``. A completion ends
    before the first of ``stop`` it holds (the stop text left out, as OpenAI's API does)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ConfigError("--temperature", self.temperature, "must be 0 (greedy) or more.")
        if not 0 < self.top_p <= 1:
            raise ConfigError("--top-p", self.top_p, "must be in (0, 1].")
        if any(not text for text in self.stop):
            raise ConfigError("--stop", list(self.stop), "holds an empty text.", "texts that end a completion")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


def row_seed(seed: int, prompt: str) -> int:
    """A prompt's own seed: the same for the same seed and text wherever it is completed."""
    digest = hashlib.sha256(f"{seed}\0{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class RowSampler:
    """A ``generate`` logits processor: each row's next token drawn from its own generator (temperature, then the
    nucleus of ``top_p``); the scores returned keep that token alone, which greedy decoding then takes. ``sampling``:
    one for every row, or one per row (a served batch's requests each ask their own; a greedy row keeps its scores)."""

    def __init__(self, prompts: Sequence[str], sampling: Sampling | Sequence[Sampling]) -> None:
        import torch

        self.rows = [sampling] * len(prompts) if isinstance(sampling, Sampling) else list(sampling)
        self.generators = [
            torch.Generator().manual_seed(row_seed(s.seed, p)) for p, s in zip(prompts, self.rows, strict=True)
        ]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        kept = scores.clone()
        for row, (sampling, generator) in enumerate(zip(self.rows, self.generators, strict=True)):
            if sampling.greedy:
                continue
            logits = scores[row : row + 1].float().cpu()
            logits = (logits - logits.max()) / sampling.temperature  # a tiny temperature: no overflow to inf
            probabilities = nucleus(logits, sampling.top_p)
            drawn = int(torch.multinomial(probabilities[0], 1, generator=generator))
            kept[row] = float("-inf")
            kept[row, drawn] = 0.0
        return kept


def nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Each row's probabilities over its nucleus: the most probable tokens whose probabilities reach ``top_p``
    (at least one), the others 0, renormalised."""
    import torch

    probabilities = torch.softmax(logits, dim=-1)
    if top_p >= 1:
        return probabilities
    ordered, order = probabilities.sort(dim=-1, descending=True)
    outside = ordered.cumsum(dim=-1) - ordered >= top_p  # the mass before a token already reaches top_p
    ordered = ordered.masked_fill(outside, 0.0)
    kept = torch.zeros_like(probabilities).scatter_(-1, order, ordered)
    return kept / kept.sum(dim=-1, keepdim=True)


def generation_options(prompts: Sequence[str], sampling: Sampling, tokenizer: Any) -> dict[str, Any]:
    """``generate``'s arguments for ``sampling``: greedy, with the row sampler when it draws, and transformers' stop
    strings (which need the tokenizer)."""
    from transformers import LogitsProcessorList

    options: dict[str, Any] = {"do_sample": False}
    if not sampling.greedy:
        options["logits_processor"] = LogitsProcessorList([RowSampler(prompts, sampling)])
    if sampling.stop:
        options.update(stop_strings=list(sampling.stop), tokenizer=tokenizer)
    return options


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the first stop text it holds (left out)."""
    ends = [text.find(s) for s in stop if s in text]
    return text[: min(ends)] if ends else text
