"""Next-token prediction for a causal language model (``task=causal_lm``; ``model=causal_lm``, ``dataset=text``).

The loss is exact in supervised tokens. A step returns the *sum* of its tokens' losses and, as the step's
``normalizer``, how many tokens it supervised; the runner adds the normalizers of an accumulation window over
every worker and divides the gradients by that total before clipping and stepping (``recipe/step.py``). One
worker with batch 8, two with 4 each and one with 4 x 2 accumulation then take the same steps: a mean per worker
or per micro-batch would weigh a short row's tokens more than a long row's.

Reports ``loss`` (per supervised token), ``perplexity`` and ``tokens`` (supervised) as ``train_*`` / ``val_*``
(the loop adds ``tokens_per_second``). After each epoch, rank 0 completes ``prompts`` greedily into
``<run dir>/samples.jsonl`` (one line per prompt and epoch), which the trackers keep with the run's other files.
With ``eval_generation``, validation also completes each row's prompt and scores the completions
(``val_exact_match``, the user's ``generation_metrics``: ``tasks/generation.py``) every ``eval_generation_every``
epochs and at the last, and on every split scored after training (``test_*``, ``evaluate``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.token_rows import IGNORE, supervised_positions  # IGNORE: the prompt's labels, padding's
from hydra_raytrain.storage.rundir import SAMPLES_FILE

from .base import StepOutput, Sums, Task
from .generation import EXACT_MATCH, GenerationScores


class CausalLM(Task):
    monitor = "val_loss"
    mode = "min"
    modes = {f"{split}_{EXACT_MATCH}": "max" for split in ("val", "test")}

    def __init__(
        self,
        prompts: Sequence[str] = (),
        max_new_tokens: int = 32,
        tokenizer: str | None = None,
        supervised_logits_only: bool = True,
        eval_generation: bool = False,
        eval_generation_every: int = 1,
        eval_max_new_tokens: int | None = None,
        generation_metrics: Sequence[Any] = (EXACT_MATCH,),
    ):
        self.prompts, self.max_new_tokens, self.tokenizer = list(prompts), max_new_tokens, tokenizer
        self.supervised_logits_only = supervised_logits_only
        if not isinstance(eval_generation_every, int) or eval_generation_every < 1:
            raise ConfigError("task.eval_generation_every", eval_generation_every, "is a number of epochs.", "1, 2...")
        if eval_max_new_tokens is not None and (not isinstance(eval_max_new_tokens, int) or eval_max_new_tokens < 1):
            raise ConfigError("task.eval_max_new_tokens", eval_max_new_tokens, "is a number of tokens.", "null, 1...")
        self.every, self.generating = eval_generation_every, False
        self.scores = None
        if eval_generation:
            self.scores = GenerationScores(
                list(generation_metrics), self._tokenizer, eval_max_new_tokens or max_new_tokens
            )
        self.occasional = (frozenset(self.scores.names), self.every) if self.scores else Task.occasional
        self._loaded: Any = None

    def training_step(self, model, batch) -> StepOutput:
        labels = batch["labels"]
        tokens = (labels[:, 1:] != IGNORE).sum()  # position t predicts token t + 1
        positions = None
        if self.supervised_logits_only:  # the collate's, made on the host: nothing waits for the GPU
            positions = batch["supervised"] if "supervised" in batch else supervised_positions(labels)
        with supervised_head(model, labels.shape, positions):
            output = model(**inputs_of(batch))
        logits = output.logits
        if logits.dim() == 2 and positions is not None:  # the head ran on the supervised positions alone
            targets = labels.reshape(-1).index_select(0, positions + 1)
        else:
            logits, targets = logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16's logits: the loss in float32
        loss = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
        sums = {"loss": loss.detach(), "tokens": tokens, "count": labels.new_full((), len(labels))}
        return StepOutput(loss, sums, normalizer=tokens)

    def validation_step(self, model, batch) -> Sums:
        sums = self.training_step(model, batch).sums
        if self.scores is not None and self.generating:
            sums.update(self.scores.sums(model, batch))
        return sums

    def on_validation_start(self, epoch: int | None = None, max_epochs: int | None = None) -> bool:
        """Generation every ``eval_generation_every`` epochs and at the last (on a split scored after training:
        always); its steps differ in number between workers."""
        self.generating = self.scores is not None and (epoch is None or epoch % self.every == 0 or epoch == max_epochs)
        return self.generating

    def on_validation_end(self) -> dict[str, float]:
        return self.scores.gathered() if self.scores is not None and self.generating else {}

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        loss = sums["loss"] / max(sums["tokens"], 1)
        values = {"loss": loss, "perplexity": math.exp(min(loss, 80.0)), "tokens": sums["tokens"]}
        if sums.get("generated"):
            values[EXACT_MATCH] = sums[EXACT_MATCH] / sums["generated"]
        extra = set(sums) - {"loss", "tokens", "count", "generated", EXACT_MATCH}  # on_validation_end's figures
        return {**values, **{name: sums[name] for name in sorted(extra)}}

    def _tokenizer(self) -> Any:
        from hydra_raytrain.models.text import load_tokenizer

        if self._loaded is None:
            self._loaded = load_tokenizer(self.tokenizer, "task.tokenizer")
        return self._loaded

    def on_epoch_end(self, model, epoch: int, run_dir: str) -> None:
        if not self.prompts:
            return
        from hydra_raytrain.models.text import complete

        completions = complete(model, self._tokenizer(), self.prompts, self.max_new_tokens)
        with open(os.path.join(run_dir, SAMPLES_FILE), "a") as out:
            for prompt, completion in zip(self.prompts, completions, strict=True):
                out.write(json.dumps({"epoch": epoch, "prompt": prompt, "completion": completion}) + "\n")


def inputs_of(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The model's inputs: the ids and the padding mask; for packed rows (``data/packing.py``) the ids, the positions
    restarting at each document and no mask (transformers keeps the documents apart from the positions, and builds
    no cache: a cache turns that off)."""
    if "position_ids" in batch:
        return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False}
    return {"input_ids": batch["input_ids"], "attention_mask": batch.get("attention_mask")}


@contextlib.contextmanager
def supervised_head(model: nn.Module, shape: torch.Size, positions: torch.Tensor | None) -> Iterator[None]:
    """The output head (``get_output_embeddings()``, the vocabulary projection) runs on ``positions`` only (of a
    batch of ``shape``, ``supervised_positions``), its logits ``(positions, vocabulary)``: a prompt's positions and
    the padding cost no vocabulary-sized matmul, softmax or memory. Elsewhere (no positions, a compiled model, a
    model without the method, a head under activation checkpointing, a head called otherwise) the model computes
    every position's logits as it always does."""
    head = _output_head(model) if positions is not None else None
    if head is None:
        yield
        return

    def keep(module: nn.Module, args: tuple) -> tuple | None:
        hidden = args[0] if args else None
        if hidden is None or hidden.dim() != 3 or hidden.shape[:2] != shape:
            return None  # not the whole sequence: leave it (a model that slices its hidden states itself)
        return (hidden.reshape(-1, hidden.size(-1)).index_select(0, positions), *args[1:])

    handle = head.register_forward_pre_hook(keep)
    try:
        yield
    finally:
        handle.remove()


def _output_head(model: nn.Module) -> nn.Module | None:
    from torch.distributed._composable import checkpoint

    inner = getattr(model, "module", model)  # DDP's wrapper
    if any(getattr(m, "_compiled_call_impl", None) is not None for m in (model, inner)):
        return None  # torch.compile: a hook added per step would recompile the graph each time
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Module):
        return None
    for module in inner.modules():  # activation checkpointing recomputes it in backward, after the hook is gone
        if checkpoint.state(module) is not None and any(part is head for part in module.modules()):
            return None
    return head
