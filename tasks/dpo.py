"""Direct preference optimisation (``task=dpo``; ``model=causal_lm``, ``dataset=text dataset.format=preference``):
the policy learns to prefer each pair's chosen completion over its rejected one, against a reference, the run's
starting weights (Rafailov et al., 2023; TRL's ``DPOTrainer``).

A side's log-probability is the sum over its supervised tokens (the completion, ``data/preference.py``); its
implicit reward ``beta * (log pi - log ref)``. Losses (``loss``): ``sigmoid``, DPO's ``-log sigmoid(beta * margin)``
(with ``label_smoothing`` e, cDPO's ``(1 - e) * that + e * -log sigmoid(-beta * margin)``); ``ipo``,
``(margin - 1 / (2 beta))^2`` on log-probabilities averaged per token, as TRL computes it. A step returns the sum
over its pairs and, as the normaliser, its pairs: the runner divides each optimizer step's gradients by the pairs of
the whole accumulation window on every worker (``recipe/step.py``), so the loss is exact in pairs.

The reference: with LoRA (``peft=lora``), the same model with its adapters switched off (peft's
``disable_adapter``): no second copy. Without, a frozen copy built as the run starts (the model's builder, then
``run.init_from``'s weights: ``Task.on_setup``), in eval mode. With ``precompute_reference``, the reference's
log-probabilities of every training and validation pair are computed once as the run starts (each worker a share)
and go with the pairs' batches: no reference is held, and no step runs it. Dropout is off in the policy
(``disable_dropout``): the first step's loss is then ln 2 exactly, the policy being the reference.

Reports (``train_*``, ``val_*``, exact across workers): ``loss``, ``rewards_chosen``, ``rewards_rejected``,
``reward_accuracy`` (the share of pairs whose chosen reward is higher), ``reward_margin``, and ``logps_chosen`` /
``logps_rejected`` (the policy's summed log-probabilities: a chosen side that falls is DPO's known drift).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.preference import PreferenceRows
from hydra_raytrain.data.token_rows import supervised_positions

from .base import StepOutput, Sums, Task
from .causal_lm import inputs_of, supervised_head

LOSSES = ("sigmoid", "ipo")


class DPO(Task):
    monitor = "val_loss"
    mode = "min"
    modes = {
        f"{split}_{name}": "max"
        for split in ("val", "test")
        for name in ("reward_accuracy", "reward_margin", "rewards_chosen", "logps_chosen")
    }  # the directions of the metrics that rise as the pairs are learned

    def __init__(
        self,
        beta: float = 0.1,
        loss: str = "sigmoid",
        label_smoothing: float = 0.0,
        disable_dropout: bool = True,
        supervised_logits_only: bool = True,
        precompute_reference: bool = False,
    ):
        if not isinstance(beta, (int, float)) or beta <= 0:
            raise ConfigError("task.beta", beta, "weighs the rewards: a number above 0.", "0.1 (TRL's default)")
        if loss not in LOSSES:
            raise ConfigError("task.loss", loss, "unknown preference loss.", ", ".join(LOSSES))
        if not 0 <= label_smoothing < 0.5 or (loss == "ipo" and label_smoothing):
            raise ConfigError(
                "task.label_smoothing", label_smoothing, "is the share of pairs taken as flipped (cDPO), in [0, 0.5), "
                "and for loss=sigmoid only.", "0.0, or 0.1 with task.loss=sigmoid",
            )  # fmt: skip
        self.beta, self.loss, self.label_smoothing = float(beta), loss, float(label_smoothing)
        self.disable_dropout, self.supervised_logits_only = disable_dropout, supervised_logits_only
        self.precompute_reference = precompute_reference
        self.starting: Callable[[], nn.Module] | None = None
        self.reference: nn.Module | None = None
        self.dropout_off = False

    def on_setup(
        self,
        starting: Callable[[], Any],
        splits: Any = None,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Keeps ``starting``; with ``precompute_reference``, the starting model's log-probabilities of every pair
        of the training and validation splits, computed here once (each rank a share, then gathered), go with the
        pairs' batches (``reference_logps``) and no reference is held while training. A split scored after
        training (``test_*``, ``evaluate``) computes its reference as it scores."""
        self.starting = starting
        parts = [part for name in ("train", "val") if isinstance(part := getattr(splits, name, None), PreferenceRows)]
        if not self.precompute_reference or not parts:
            return
        model = starting().to(device=device, dtype=dtype).eval()
        for part in parts:
            part.reference = reference_table(model, part, device, self.supervised_logits_only)
        del model

    def training_step(self, model, batch) -> StepOutput:
        policy = model.module if isinstance(model, DistributedDataParallel) else model
        if self.disable_dropout and not self.dropout_off:
            for module in policy.modules():
                if isinstance(module, nn.Dropout):
                    module.p = 0.0
            self.dropout_off = True
        if "reference_logps" in batch:  # precomputed (precompute_reference)
            reference = batch["reference_logps"]
        else:
            with torch.no_grad():
                reference = self._reference_logps(policy, batch)
        logps, tokens = sequence_logps(model, batch, self.supervised_logits_only)
        reference = reference.to(logps.dtype)
        if self.loss == "ipo":  # IPO compares log-probabilities per token (TRL's)
            logps, reference = logps / tokens, reference / tokens
        pairs = len(logps) // 2
        chosen, rejected = logps[:pairs], logps[pairs:]
        losses = preference_loss(
            chosen, rejected, reference[:pairs], reference[pairs:], self.beta, self.loss, self.label_smoothing
        )
        rewards_chosen = self.beta * (chosen - reference[:pairs]).detach()
        rewards_rejected = self.beta * (rejected - reference[pairs:]).detach()
        sums = pair_sums(losses, rewards_chosen, rewards_rejected)
        sums.update(logps_chosen=chosen.detach().sum(), logps_rejected=rejected.detach().sum())
        return StepOutput(losses.sum(), sums, normalizer=sums["count"])

    def _reference_logps(self, policy: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The reference's log-probabilities of the batch's sides: the policy with its adapters off, or the frozen
        copy (built at the first step, on the policy's device and in its dtype)."""
        from peft import PeftModel

        if isinstance(policy, PeftModel):
            with policy.disable_adapter():
                return sequence_logps(policy, batch, self.supervised_logits_only)[0]
        if self.reference is None:
            if self.starting is None:
                raise RuntimeError("task=dpo without LoRA needs its starting model: the runner calls Task.on_setup")
            weight = next(policy.parameters())
            self.reference = self.starting().to(device=weight.device, dtype=weight.dtype).eval().requires_grad_(False)
        return sequence_logps(self.reference, batch, self.supervised_logits_only)[0]


def pair_sums(losses: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor) -> Sums:
    """The sums of a step's pairs: their losses, their chosen and rejected rewards, how many pairs reward the chosen
    side more (``reward_accuracy``), the margins, and ``count``, the pairs."""
    return {
        "loss": losses.detach().sum(),
        "rewards_chosen": chosen.sum(),
        "rewards_rejected": rejected.sum(),
        "reward_accuracy": (chosen > rejected).sum().to(losses.dtype),
        "reward_margin": (chosen - rejected).sum(),
        "count": torch.tensor(len(losses), device=losses.device),
    }


def reference_table(
    model: nn.Module, pairs: PreferenceRows, device: torch.device | None, supervised_only: bool, batch_size: int = 16
) -> dict[int, tuple[float, float]]:
    """``model``'s log-probabilities of each pair's sides, by pair number: each rank scores every world-size-th
    pair, then every rank gathers all of them (a collective when a process group runs)."""
    import torch.distributed as dist

    grouped = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    mine = list(range(rank, len(pairs), world))
    table: dict[int, tuple[float, float]] = {}
    with torch.no_grad():
        for start in range(0, len(mine), batch_size):
            indices = mine[start : start + batch_size]
            batch = pairs.collate([pairs[i] for i in indices])
            batch = {name: value.to(device) for name, value in batch.items()}
            logps = sequence_logps(model, batch, supervised_only)[0].double().cpu()
            for offset, index in enumerate(indices):
                table[int(pairs.rows[index])] = (float(logps[offset]), float(logps[len(indices) + offset]))
    if grouped:
        shares: list[Any] = [None] * world
        dist.all_gather_object(shares, table)
        table = {pair: values for share in shares for pair, values in share.items()}
    return table


def preference_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    beta: float,
    loss: str,
    label_smoothing: float,
) -> torch.Tensor:
    """Each pair's loss from the policy's and the reference's log-probabilities of its two sides."""
    margin = (chosen - reference_chosen) - (rejected - reference_rejected)
    if loss == "ipo":
        return (margin - 1 / (2 * beta)) ** 2
    return -F.logsigmoid(beta * margin) * (1 - label_smoothing) - F.logsigmoid(-beta * margin) * label_smoothing


def sequence_logps(
    model: nn.Module, batch: dict[str, torch.Tensor], supervised_only: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed log-probability of its supervised tokens (in float32 at least), and how many it has; the
    vocabulary projection on the supervised positions alone when ``supervised_only`` (``supervised_head``)."""
    labels = batch["labels"]
    rows, length = labels.shape
    positions = batch["supervised"] if "supervised" in batch else supervised_positions(labels)
    with supervised_head(model, labels.shape, positions if supervised_only else None):
        logits = model(**inputs_of(batch)).logits
    if logits.dim() == 3:  # every position's: keep the supervised ones
        logits = logits.reshape(-1, logits.size(-1)).index_select(0, positions)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    targets = labels.reshape(-1).index_select(0, positions + 1)
    token_logps = -F.cross_entropy(logits, targets, reduction="none")
    row = positions // length
    summed = token_logps.new_zeros(rows).index_add(0, row, token_logps)
    return summed, torch.bincount(row, minlength=rows).to(summed.dtype)
