"""A reward model (``task=reward_model``; ``model=text_classifier``, ``dataset=text dataset.format=preference``): a
sequence classifier with one output scores each side of a pair, and learns to score the chosen side higher
(Bradley-Terry: ``-log sigmoid(r_chosen - r_rejected)``, as TRL's ``RewardTrainer``).

Each side is read as DPO reads it (its prompt, then its completion and the end-of-sequence token:
``data/preference.py``); the model's score is its head's output at the side's last token (transformers' sequence
classifiers read the last token that is not padding; an encoder its first). A step returns the sum over its pairs
and, as the normaliser, its pairs: the loss is exact in pairs across workers and micro-batches. Reports
(``train_*``, ``val_*``): ``loss``, ``rewards_chosen``, ``rewards_rejected`` (mean scores), ``reward_accuracy``,
``reward_margin``. A finished run's ``predict`` and ``serve`` answer a score per text; ``export --format hf`` is an
``AutoModelForSequenceClassification`` with one label.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hydra_raytrain.config.errors import ConfigError

from .base import StepOutput, Task
from .dpo import DPO, pair_sums


class RewardModel(Task):
    monitor = "val_loss"
    mode = "min"
    modes = DPO.modes

    def __init__(self, center_rewards_coefficient: float = 0.0):
        if not isinstance(center_rewards_coefficient, (int, float)) or center_rewards_coefficient < 0:
            raise ConfigError(
                "task.center_rewards_coefficient", center_rewards_coefficient, "weighs the squared mean reward: >= 0.",
                "0.0 (off), or 0.01 (TRL's suggestion)",
            )  # fmt: skip
        self.center = float(center_rewards_coefficient)

    def training_step(self, model, batch) -> StepOutput:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        if logits.dim() != 2 or logits.size(-1) != 1:
            raise ConfigError(
                "model", type(getattr(model, "module", model)).__name__, f"gives outputs of shape "
                f"{list(logits.shape)}; task=reward_model scores a text with one number.",
                "model=text_classifier (its head gets one output for dataset.format=preference)",
            )  # fmt: skip
        rewards = logits[:, 0].to(torch.promote_types(logits.dtype, torch.float32))
        pairs = len(rewards) // 2
        chosen, rejected = rewards[:pairs], rewards[pairs:]
        losses = -F.logsigmoid(chosen - rejected)
        if self.center:  # TRL's centring: the rewards' mean kept near zero
            losses = losses + self.center * (chosen + rejected) ** 2
        sums = pair_sums(losses, chosen.detach(), rejected.detach())
        return StepOutput(losses.sum(), sums, normalizer=sums["count"])
