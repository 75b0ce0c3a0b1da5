"""A causal LM's validation scored on what it says (``task.eval_generation=true``): each validation row's prompt
completed greedily, as ``predict`` completes it, and the completion compared with the row's own answer.

    python -m hydra_raytrain task=causal_lm ... task.eval_generation=true trainer.monitor=val_exact_match \\
        'task.generation_metrics=[exact_match,my_metrics.rouge_l]'

A row's prompt is what comes before its last supervised span (a ``prompt_completion`` row's prompt; a conversation's
turns before its last assistant reply, with the template's generation prompt, as training rendered them), its answer
that span decoded. ``exact_match`` is the share of rows whose completion is their answer (both stripped of the
whitespace around them): sums, exact across workers. Any other metric is a function the user names, called once
with every row's completion and answer (``fn(predictions, references)``, lists of strings, every worker's rows
gathered) and returning a number (reported under the function's name) or a dict of numbers (under its keys).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.token_rows import IGNORE

EXACT_MATCH = "exact_match"
KEY = "task.generation_metrics"
TAKEN = ("loss", "perplexity", "tokens", "count", "generated", EXACT_MATCH)  # names the task reports itself


class GenerationScores:
    """The metrics of a validation pass's completions: ``exact_match`` from sums, the user's from every row."""

    def __init__(self, metrics: Sequence[Any], tokenizer: Callable[[], Any], max_new_tokens: int):
        self.metrics = named_metrics(metrics)
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.kept: list[tuple[str, str]] = []  # this pass's (completion, answer) pairs on this worker

    def sums(self, model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch's rows completed: how many match their answer (``exact_match``) of how many (``generated``);
        their texts kept for the user's metrics."""
        from hydra_raytrain.models.text import generated

        if not callable(getattr(model, "generate", None)):
            raise ConfigError(
                "task.eval_generation", True, f"completes prompts with the model's generate(): "
                f"{type(model).__name__} has none.", "a transformers causal LM (model=causal_lm), or false",
            )  # fmt: skip
        tokenizer = self.tokenizer()
        prompts, answers = prompts_and_answers(batch)
        completions = tokenizer.batch_decode(
            generated(model, tokenizer.pad_token_id, prompts, self.max_new_tokens), skip_special_tokens=True
        )
        references = tokenizer.batch_decode(answers, skip_special_tokens=True)
        if self.metrics:
            self.kept.extend(zip(completions, references, strict=True))
        matched = sum(c.strip() == r.strip() for c, r in zip(completions, references, strict=True))
        labels = batch["labels"]
        return {EXACT_MATCH: labels.new_tensor(matched), "generated": labels.new_tensor(len(prompts))}

    def gathered(self) -> dict[str, float]:
        """The user's metrics on every worker's rows of the pass (a collective when distributed: every rank gets
        the same figures)."""
        kept, self.kept = self.kept, []
        if not self.metrics:
            return {}
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            everyone: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, kept)
            kept = [pair for rows in everyone for pair in rows]
        predictions, references = [c for c, _ in kept], [r for _, r in kept]
        values: dict[str, float] = {}
        for name, metric in self.metrics.items():
            values.update(called(name, metric, predictions, references))
        return values

    @property
    def names(self) -> list[str]:
        """The metrics' names as far as known before they run (a dict-returning metric names its own)."""
        return [EXACT_MATCH, *self.metrics]


def named_metrics(metrics: Sequence[Any]) -> dict[str, Callable[..., Any]]:
    """The user's metrics by name: ``exact_match`` (always computed) is left out; a dotted path is imported; a
    ``{_target_: ..., _partial_: true}`` node arrives as Hydra instantiated it (a callable)."""
    from hydra.utils import get_method

    if isinstance(metrics, str) or not isinstance(metrics, Sequence):
        raise ConfigError(KEY, metrics, "is a list of metrics.", f"e.g. [{EXACT_MATCH}, my_metrics.rouge_l]")
    named: dict[str, Callable[..., Any]] = {}
    for entry in metrics:
        if entry == EXACT_MATCH:
            continue
        metric = entry
        if isinstance(entry, str):
            try:
                metric = get_method(entry)
            except Exception as error:
                cause = error.__cause__ or error  # Hydra's "Error loading" wraps what went wrong
                raise ConfigError(
                    KEY, entry, f"imports no function ({type(cause).__name__}: {str(cause).splitlines()[0]}).",
                    f"{EXACT_MATCH}, a function's dotted path (module.fn), or {{_target_: module.fn, _partial_: true}}",
                ) from None  # fmt: skip
        if not callable(metric):
            raise ConfigError(
                KEY, entry, "is no metric.", f"{EXACT_MATCH}, module.fn, or {{_target_: module.fn, _partial_: true}}"
            )
        name = metric_name(metric)
        if name in TAKEN:
            raise ConfigError(KEY, entry, f"is named {name!r}, a metric the task reports itself.", "other names")
        if name in named:
            raise ConfigError(KEY, entry, f"names the metric {name!r} twice.")
        named[name] = metric
    return named


def metric_name(metric: Callable[..., Any]) -> str:
    """A function's name (a partial's function's), else its class's."""
    while isinstance(metric, functools.partial):
        metric = metric.func
    return getattr(metric, "__name__", None) or type(metric).__name__


def called(name: str, metric: Callable[..., Any], predictions: list[str], references: list[str]) -> dict[str, float]:
    """``metric(predictions, references)`` as figures: a number under ``name``, a dict's numbers under its keys."""
    try:
        value = metric(predictions, references)
        figures = {str(k): float(v) for k, v in value.items()} if isinstance(value, dict) else {name: float(value)}
    except Exception as error:
        raise ConfigError(
            KEY, name, f"failed on {len(predictions)} completions ({type(error).__name__}: {error}).",
            "a function of (predictions, references), lists of strings, returning a number or a dict of numbers",
        ) from None  # fmt: skip
    taken = sorted(set(figures) & set(TAKEN))
    if taken:
        raise ConfigError(KEY, name, f"reports {', '.join(taken)}, a name the task reports itself.", "other names")
    return figures


def prompts_and_answers(batch: dict[str, torch.Tensor]) -> tuple[list[list[int]], list[list[int]]]:
    """Each row's prompt (its ids before its last supervised span) and answer (that span's ids), from a right-padded
    batch of token rows (``data/token_rows.py``)."""
    if "position_ids" in batch:
        raise ConfigError(
            "task.eval_generation", True, "completes each validation row's prompt: packed rows "
            "(dataset.packing=true) hold several documents in one row.", "dataset.packing=false",
        )  # fmt: skip
    prompts, answers = [], []
    mask = batch.get("attention_mask")
    for row, (ids, labels) in enumerate(zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True)):
        length = int(mask[row].sum()) if mask is not None else len(ids)
        supervised = [t for t in range(length) if labels[t] != IGNORE]
        end = supervised[-1] + 1 if supervised else 0
        start = end
        while start > 0 and labels[start - 1] != IGNORE:
            start -= 1
        if start == 0:
            raise ConfigError(
                "task.eval_generation", True, "completes each validation row's prompt: a row has none (rows of "
                "dataset.format=text learn every token; a prompt_completion row's prompt may be empty).",
                "dataset.format=prompt_completion or messages, every row with a prompt",
            )  # fmt: skip
        prompts.append(ids[:start])
        answers.append(labels[start:end])
    return prompts, answers
