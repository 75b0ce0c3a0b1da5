"""Next-token prediction for a causal language model (``task=causal_lm``; ``model=causal_lm``, ``dataset=text``).

The loss is exact in supervised tokens. A step returns the *sum* of its tokens' losses and, as the step's
``normalizer``, how many tokens it supervised; the runner adds the normalizers of an accumulation window over
every worker and divides the gradients by that total before clipping and stepping (``recipe/step.py``). One
worker with batch 8, two with 4 each and one with 4 x 2 accumulation then take the same steps: a mean per worker
or per micro-batch would weigh a short row's tokens more than a long row's.

Reports ``loss`` (per supervised token), ``perplexity`` and ``tokens`` (supervised) as ``train_*`` / ``val_*``
(the loop adds ``tokens_per_second``). After each epoch, rank 0 completes ``prompts`` greedily into
``<run dir>/samples.jsonl`` (one line per prompt and epoch), which the trackers keep with the run's other files.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from hydra_raytrain.rundir import SAMPLES_FILE

from .base import StepOutput, Task

IGNORE = -100  # labels the loss skips: the prompt, padding (hydra_raytrain/data/tokenized.py)


class CausalLM(Task):
    monitor = "val_loss"
    mode = "min"

    def __init__(self, prompts: Sequence[str] = (), max_new_tokens: int = 32, tokenizer: str | None = None):
        self.prompts, self.max_new_tokens, self.tokenizer = list(prompts), max_new_tokens, tokenizer

    def training_step(self, model, batch) -> StepOutput:
        output = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
        logits, targets = output.logits[:, :-1], batch["labels"][:, 1:]  # position t predicts token t + 1
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16's logits: the loss in float32
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE, reduction="sum"
        )
        tokens = (targets != IGNORE).sum()
        sums = {"loss": loss.detach(), "tokens": tokens, "count": targets.new_full((), len(targets))}
        return StepOutput(loss, sums, normalizer=tokens)

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        loss = sums["loss"] / max(sums["tokens"], 1)
        return {"loss": loss, "perplexity": math.exp(min(loss, 80.0)), "tokens": sums["tokens"]}

    def on_epoch_end(self, model, epoch: int, run_dir: str) -> None:
        if not self.prompts:
            return
        from hydra_raytrain.models.text import complete, load_tokenizer

        tokenizer = load_tokenizer(self.tokenizer, "task.tokenizer")
        completions = complete(model, tokenizer, self.prompts, self.max_new_tokens)
        with open(os.path.join(run_dir, SAMPLES_FILE), "a") as out:
            for prompt, completion in zip(self.prompts, completions, strict=True):
                out.write(json.dumps({"epoch": epoch, "prompt": prompt, "completion": completion}) + "\n")
