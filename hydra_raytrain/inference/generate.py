"""Completions of prompts by a causal language model's run: what ``predict`` writes for a file of prompts (a
``prompt`` column, or a ``messages`` column of conversations rendered by the run's chat template with its
generation prompt) and ``serve`` answers for ``{"inputs": ["prompt", ...]}``. Greedy by default, or sampled
(``models/sampling.py``: each row from its seed and text alone); ``max_new_tokens`` new tokens at most. For
serve's OpenAI API (``inference/openai_api.py``), the requests of a batch generate together, each with its own
settings, and each step's new text goes to its client as it comes (``stream_rows``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.inference.openai_api import Ask, Piece, asked, check_length, read_request, render_with
from hydra_raytrain.models.sampling import GREEDY, RowSampler, Sampling, cut_at_stop

PROMPT_COLUMN, MESSAGES_COLUMN = "prompt", "messages"


class Completer:
    """The run's model and tokenizer in one actor or replica: prompts in, greedy completions out."""

    def __init__(
        self,
        run: str,
        device: str = "cpu",
        max_new_tokens: int = 32,
        batch_size: int = 8,
        threads: int | None = None,
        sampling: Sampling = GREEDY,
    ) -> None:
        import torch

        from hydra_raytrain.inference.evaluate import load_model
        from hydra_raytrain.inference.finished import FinishedRun
        from hydra_raytrain.models.text import run_tokenizer

        if threads is not None:
            torch.set_num_threads(threads)
        self.tokenizer = run_tokenizer(FinishedRun.read(run).config)
        self.model = load_model(run).to(torch.device(device)).eval()  # type: ignore[union-attr]
        self.max_new_tokens, self.batch_size, self.sampling = max_new_tokens, batch_size, sampling

    def complete(self, prompts: list[str], special: bool = True) -> list[str]:
        from hydra_raytrain.models.text import complete

        return complete(
            self.model, self.tokenizer, prompts, self.max_new_tokens, self.batch_size, self.sampling, special
        )

    def render(self, conversation: Any) -> str:
        """A conversation (a list of ``{role, content}``) as the run's chat template renders it, with its generation
        prompt: what follows is the assistant's turn."""
        if not isinstance(conversation, list) or not all(isinstance(m, dict) and "role" in m for m in conversation):
            raise ConfigError(
                "INPUT", str(conversation)[:80], "is no conversation.", 'a list of {"role": ..., "content": ...}'
            )
        return self.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)

    def ask(self, kind: str, body: bytes, model: str, cap: int) -> Ask:
        """An OpenAI request's body (``kind``: chat or text) read and tokenized, or ApiError: its prompt must leave
        ``max_tokens`` of the model's positions."""
        ask = asked(kind, read_request(body), model, cap, render_with(self.tokenizer))
        ask.prompt_ids = list(self.tokenizer(ask.prompt, add_special_tokens=ask.special)["input_ids"])
        check_length(ask, getattr(self.model.config, "max_position_embeddings", None))
        return ask

    def stream(self, asks: Sequence[Ask], emit: Callable[[list[Piece | None]], None]) -> None:
        stream_rows(self.model, self.tokenizer, asks, emit)

    def fits(self, asks: Sequence[Ask]) -> bool:
        """The requests generate together within the model's positions: the longest prompt, left-padded, and the
        most new tokens any of them asks (a row that has ended goes on taking positions until the batch ends)."""
        positions = getattr(self.model.config, "max_position_embeddings", None)
        longest, most = max(len(a.prompt_ids) for a in asks), max(a.max_tokens for a in asks)
        return not positions or longest + most <= positions


class PromptRows(Completer):
    """predict's actor: each row's ``column`` completed into ``prediction``, the other columns carried."""

    def __init__(self, run: str, column: str, **options: Any) -> None:
        super().__init__(run, **options)
        self.column = column

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        rows = batch.column(self.column).to_pylist()
        if self.column == MESSAGES_COLUMN:  # rendered with their special tokens: the tokenizer adds none
            completions = self.complete([self.render(conversation) for conversation in rows], special=False)
        else:
            completions = self.complete([str(prompt) for prompt in rows])
        return batch.append_column("prediction", pa.array(completions, pa.string()))


def prompt_column(data: Any, columns: list[str] | None) -> str:
    """The input's column of prompts: the one ``--features`` names, else ``prompt``, else ``messages`` (the
    conversations a chat model answers); checked on the schema."""
    names = list(data.schema().names)
    column = columns[0] if columns else PROMPT_COLUMN
    if not columns and PROMPT_COLUMN not in names and MESSAGES_COLUMN in names:
        column = MESSAGES_COLUMN
    if column not in names or (columns and len(columns) > 1):
        raise ConfigError(
            "--features" if columns else "INPUT", columns or column, "names no single column of prompts.",
            f"one column of prompts (--features NAME), of: {', '.join(names)}",
        )  # fmt: skip
    return column


def completions(data: Any, run: str, column: str, options: dict[str, Any], pool: dict[str, Any]) -> Any:
    """``data`` with each row's prompt completed (``prediction``) by a pool of model actors (``pool``: Ray Data's
    ``map_batches`` resources)."""
    return data.map_batches(
        PromptRows,
        fn_constructor_kwargs={"run": os.path.abspath(run), "column": column, **options},
        batch_format="pyarrow",
        **pool,
    )


class RowText:
    """One request's answer as its tokens come: the text that can be sent so far (an unfinished character, or the
    start of a stop text, held back), and its end: an end token or a stop text ("stop"), or ``max_tokens``
    ("length"). Every token generated counts in ``completion_tokens``, the one that ended it too."""

    def __init__(self, tokenizer: Any, ask: Ask, ends: set[int]) -> None:
        self.tokenizer, self.ask, self.ends = tokenizer, ask, ends
        self.ids: list[int] = []
        self.sent, self.count, self.done = "", 0, False

    def step(self, token: int) -> Piece | None:
        if self.done:
            return None
        if self.ask.cancelled.is_set():  # its client left
            self.done = True
            return None
        self.count += 1
        if token in self.ends:
            return self.end("stop", self.decoded())
        self.ids.append(token)
        if self.count < self.ask.max_tokens and not (self.ask.stream or self.ask.sampling.stop):
            return None  # an answer sent whole, with no stop text to look for: decoded once, at its end
        text = self.decoded()
        cut = cut_at_stop(text, self.ask.sampling.stop)
        if cut != text:
            return self.end("stop", cut)
        if self.count >= self.ask.max_tokens:
            return self.end("length", text)
        return self.piece(held_back(text, self.ask.sampling.stop))

    def decoded(self) -> str:
        return str(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def piece(self, text: str, finish: str | None = None) -> Piece:
        # Text already sent stays sent: should decoding more tokens change it (a tokenizer that cleans up spaces),
        # what follows its length is sent
        new = text[len(self.sent) :]
        self.sent += new
        if finish is None:
            return Piece(new)
        return Piece(new, finish, len(self.ask.prompt_ids), self.count)

    def end(self, finish: str, text: str) -> Piece:
        self.done = True
        return self.piece(text, finish)


def held_back(text: str, stop: Sequence[str]) -> str:
    """``text`` without what may still change: a last character not yet whole (the replacement character a partial
    UTF-8 sequence decodes to) and an ending that begins a stop text."""
    text = text.rstrip("\ufffd")
    longest = max((k for s in stop for k in range(1, min(len(s), len(text) + 1)) if text.endswith(s[:k])), default=0)
    return text[: len(text) - longest]


def stream_rows(model: Any, tokenizer: Any, asks: Sequence[Ask], emit: Callable[[list[Piece | None]], None]) -> None:
    """Generate every request of ``asks`` in one batch: prompts padded on the left, the KV cache on, each row drawn
    as its request says (``RowSampler``). After each step ``emit`` gets one entry per request: its new piece, or
    ``None`` (ended before, or cancelled). A row ends on its own: an end token, a stop text, its ``max_tokens``, or
    its client gone; the batch ends when every row has."""
    import torch
    from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    from hydra_raytrain.models.text import left_padded

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ends = {tokenizer.eos_token_id, *listed(model.generation_config.eos_token_id)} - {None}
    rows = [RowText(tokenizer, ask, ends) for ask in asks]
    ids, mask = left_padded([ask.prompt_ids for ask in asks], pad)

    class Watch(StoppingCriteria):  # called after each step with every row's tokens: the new one last
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            emit([row.step(token) for row, token in zip(rows, input_ids[:, -1].tolist(), strict=True)])
            time.sleep(0)  # the interpreter's lock let go between steps: the replica's event loop takes requests
            return torch.tensor([row.done for row in rows], device=input_ids.device)

    options: dict[str, Any] = {"do_sample": False, "stopping_criteria": StoppingCriteriaList([Watch()])}
    if any(not ask.sampling.greedy for ask in asks):
        sampler = RowSampler([ask.prompt for ask in asks], [ask.sampling for ask in asks])
        options["logits_processor"] = LogitsProcessorList([sampler])
    device = next(model.parameters()).device
    with torch.no_grad():
        model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), pad_token_id=pad,
            max_new_tokens=max(ask.max_tokens for ask in asks), **options,
        )  # fmt: skip


def listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]
