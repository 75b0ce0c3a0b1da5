"""What a worker's run saves: a full-state checkpoint at an epoch's end (every ``checkpoint.every_n_epochs`` and the
last) or in the middle of one (its position and partial sums), reported to Ray; the final weights for ``model.pt``."""

from __future__ import annotations

import io
import sys
from typing import Any

import torch

from hydra_raytrain.config.monitor import monitored
from hydra_raytrain.recipe import checkpoint, ema
from hydra_raytrain.recipe.metrics import SumMeter
from hydra_raytrain.recipe.state import RecipeState


class Saving(RecipeState):
    """The recipe's part that writes checkpoints: every rank its share, rank 0 the weights and the train state."""

    def _weights(self) -> bytes | None:
        """The full model weights (their averages with ``trainer.ema``) as ``torch.save`` bytes on rank 0 (None
        elsewhere); a collective under FSDP."""
        if self.averages:  # never sharded (FSDP refuses trainer.ema)
            averages = checkpoint.pack_models(ema.states(self.averages), self.several_models)
            return _to_bytes(averages) if self.rank == 0 else None
        model_states, _ = checkpoint.gather(self.step.models, {}, self.trained_only)
        return _to_bytes(checkpoint.pack_models(model_states, self.several_models)) if self.rank == 0 else None

    def _epoch_checkpoint_due(self, epochs_done: int) -> bool:
        return epochs_done == self.cfg.trainer.max_epochs or epochs_done % self.cfg.checkpoint.every_n_epochs == 0

    def _report(self, metrics: dict[str, float], epochs_done: int, final: bool) -> bytes | None:
        """Every rank reports (a barrier). Every ``checkpoint.every_n_epochs`` epochs and at the end, each rank
        adds its share of a full-state checkpoint; at the end rank 0 also returns the weights' bytes."""
        if not (final or self._epoch_checkpoint_due(epochs_done)):
            self.uploads.report(metrics)
            return None
        weights = self._checkpoint(metrics, f"epoch_{epochs_done:04d}", epochs_done, position=None, final=final)
        return weights if final else None

    def _save_mid_epoch(self, epoch: int, batches: int, meter: SumMeter) -> None:
        """A checkpoint after ``batches`` batches of ``epoch`` (0-based): its report carries no epoch metrics (the
        driver's metrics.jsonl and a sweep's Tune results take epoch reports only), and ranks last among the
        best checkpoints when ``checkpoint.checkpoint_score_attribute`` orders them."""
        samples = batches * self.batch_size * self.world_size  # positions of the epoch's order consumed
        position = {"samples": samples, "sums": meter.totals()}  # sums: over every rank
        metrics: dict[str, Any] = {"step": self.global_step, "epoch_progress": epoch + batches / self.train_batches}
        score = self.cfg.checkpoint.checkpoint_score_attribute
        if score is not None and score not in metrics:  # the worst score there is, and finite: Ray saves it as JSON
            metrics[score] = (
                -sys.float_info.max if self.cfg.checkpoint.checkpoint_score_order == "max" else sys.float_info.max
            )
        self._checkpoint(metrics, f"step_{self.global_step:08d}", epoch, position)

    def _checkpoint(
        self, metrics: dict[str, Any], name: str, epoch: int, position: dict[str, Any] | None, final: bool = False
    ) -> bytes | None:
        """Every rank reports its share of a full-state checkpoint named ``name`` (a barrier); rank 0 returns the
        weights' bytes (sharded: only when ``final``). ``epoch`` is the epoch to train next (0-based), ``position``
        how far into it."""
        sharded, weights, model_state, optimizer_states = self.sharded, None, None, None
        if sharded:  # every rank writes its shards; the full weights are gathered only for the final model.pt
            weights = self._weights() if final else None
        else:
            model_states, optimizer_states = checkpoint.gather(  # every rank
                self.step.models, self.step.optimizers, self.trained_only
            )
            if self.rank == 0:
                model_state = checkpoint.pack_models(model_states, self.several_models)
        averaged = None  # with trainer.ema: model.pt holds the averages, the train state the raw weights
        if self.averages and self.rank == 0:
            averaged = {"raw": model_state, "n_averaged": ema.counts(self.averages)}
            model_state = checkpoint.pack_models(ema.states(self.averages), self.several_models)
        if model_state is not None:
            weights = _to_bytes(model_state)
        train_state = self._train_state(epoch, optimizer_states, position) if self.rank == 0 else None
        if train_state is not None and averaged is not None:
            train_state["ema"] = averaged
        config = self.saved if self.rank == 0 else None

        def write(folder: str) -> None:
            if sharded:
                checkpoint.write_sharded(folder, self.step.models, self.step.optimizers)  # a collective
            checkpoint.write(folder, self.rank, model_state, train_state, config)

        self.uploads.report(metrics, write, name)
        self.cadence.saved()
        self._hook("on_checkpoint", name)
        return weights

    def _train_state(
        self, epoch: int, optimizer_states: dict[str, Any] | None, position: dict[str, Any] | None
    ) -> dict[str, Any]:
        monitor, mode = monitored(self.task, (self.cfg.trainer.monitor, self.cfg.trainer.monitor_mode))
        scores = [m[monitor] for m in self.history if monitor in m]
        pick = max if mode == "max" else min
        return {
            "optimizers": optimizer_states,  # None in a sharded checkpoint: they are in sharded/
            "step": self.step.state_dict(),  # LR schedules, warm-ups, the fp16 scaler
            "epoch": epoch,  # the epoch to train next (0-based): the sampler's
            "position": position,  # None at an epoch's end; mid-epoch: samples of its order consumed, partial sums
            "global_step": self.global_step,  # optimizer steps
            "best": {"monitor": monitor, "value": pick(scores) if scores else None},
            "history": self.history,
            "tracker_ids": self.tracker_ids,  # so a resumed run continues the same tracker runs
            "callbacks": self.callbacks.state_dict(),  # rank 0's callbacks' (hydra_raytrain/callbacks/base.py)
        }


def _to_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()
