"""Completions of prompts by a causal language model's run: what ``predict`` writes for a file of prompts (a
``prompt`` column, or a ``messages`` column of conversations rendered by the run's chat template with its
generation prompt) and ``serve`` answers for ``{"inputs": ["prompt", ...]}``. Greedy by default, or sampled
(``models/sampling.py``: each row from its seed and text alone); ``max_new_tokens`` new tokens at most."""

from __future__ import annotations

import os
from typing import Any

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.models.sampling import GREEDY, Sampling

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
