"""Where a worker's run starts: Ray's latest checkpoint (a restarted worker group, or the same run again), else
another run (``run.init_from``): its full state continued (``run.init_full_state``) or its weights as the start."""

from __future__ import annotations

import logging
from typing import Any

import ray.train

from hydra_raytrain.recipe import checkpoint, ema, warm_start
from hydra_raytrain.recipe.state import RecipeState

logger = logging.getLogger(__name__)


class Resuming(RecipeState):
    """The recipe's part that loads a checkpoint into the models, optimizers and schedules just built."""

    def _resume(self) -> dict[str, Any] | None:
        """Continue from Ray's latest checkpoint (after a worker failure, or a re-run of the same run);
        a checkpoint that does not load is skipped for the one before it. Returns this rank's RNG states to set
        once setup is done (None: not resumed, or a rank the checkpoint did not have)."""
        latest = ray.train.get_checkpoint()
        if latest is None:
            return None
        # Newest first: Ray lists them by score when checkpoint_score_attribute is set; every report has its step.
        reported = sorted(ray.train.get_all_reported_checkpoints(), key=lambda r: -r.metrics.get("step", -1))
        older = [r.checkpoint for r in reported]
        candidates = [latest] + [c for c in older if c.path != latest.path]
        state = checkpoint.read_newest_loadable(
            candidates, self.rank, lambda message: logger.warning(message), self.step.models, self.step.optimizers
        )
        if state is None:
            raise RuntimeError(f"None of the run's {len(candidates)} checkpoints loads; see the warnings above.")
        train = self._load_full_state(state)
        if self.rank == 0:
            where = (
                f"epoch {self.start_epoch + 1}, after batch {self.position['batches']}/{self.train_batches}"
                if self.position
                else f"the start of epoch {self.start_epoch + 1}"
            )
            print(f"Resuming from checkpoint {state['name']}: {where}, optimizer step {self.global_step}", flush=True)
        self.tracker_ids = dict(train.get("tracker_ids") or {})
        return state["rng"]

    def _load_full_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A full-state checkpoint's weights, optimizers, schedules, epoch, step and history; its train state."""
        train = state["train"]
        if state["model"] is not None:  # a full-state checkpoint (a sharded one loaded in read_newest_loadable)
            saved = checkpoint.unpack_models(state["model"], self.several_models)
            averaged = train.get("ema")  # trainer.ema: model.pt holds the averages, the raw weights are here
            models = checkpoint.unpack_models(averaged["raw"], self.several_models) if averaged else saved
            checkpoint.load(
                self.step.models, self.step.optimizers, models, train["optimizers"], trained_only=self.trained_only
            )
            if averaged and self.averages:
                ema.load(self.averages, saved, averaged["n_averaged"])
        self.step.load_state_dict(train["step"])
        self.start_epoch, self.global_step = train["epoch"], train["global_step"]
        self.position = self._position_now(train.get("position"))
        self.history = list(train["history"])
        self.callbacks.load_state_dict(train.get("callbacks") or {})  # a PBT exploit continues the donor's too
        return train

    def _from_another_run(self) -> None:
        """``run.init_from``, unless the run resumes (its checkpoint is newer) or the weights came in as the models
        were built (``warm_start.starts_built``): the source's full state continued, or its weights."""
        run = self.cfg.run
        built_start = warm_start.starts_built(self.cfg.peft.method, run.init_from, run.init_full_state)
        if run.init_from and ray.train.get_checkpoint() is None and not built_start:
            self._continue_from() if run.init_full_state else self._warm_start()

    def _continue_from(self) -> None:
        """``run.init_full_state``: another run's checkpoint continued as this run's own (a PBT exploit), with this
        run's optimizer settings in the live optimizers. Not its trackers' runs (this is another run), nor its RNG
        streams: this run's own seeded ones go on."""
        source = self.cfg.run.init_from
        assert source is not None
        configured = {name: warm_start.hyperparameters(o) for name, o in self.step.optimizers.items()}
        state = checkpoint.read_newest_loadable(
            [ray.train.Checkpoint(path=source)],
            self.rank,
            lambda message: logger.warning(message),
            self.step.models,
            self.step.optimizers,
        )
        if state is None:
            raise RuntimeError(f"run.init_from={source} does not load; see the warning above.")
        self._load_full_state(state)
        for name, optimizer in self.step.optimizers.items():
            schedules = list(self.step.lr_schedulers.get(name, [])) + [self.step.warmups.get(name)]
            warm_start.carry_over(optimizer, [s for s in schedules if s is not None], configured[name])
        if self.rank == 0:
            print(
                f"Continuing run.init_from={source}: epoch {self.start_epoch + 1}, optimizer step {self.global_step}",
                flush=True,
            )

    def _position_now(self, position: dict[str, Any] | None) -> dict[str, Any] | None:
        """A mid-epoch position in this run's batches: the same unless the world size changed with a per-worker
        batch size; an epoch whose consumed samples do not split into whole batches now starts again."""
        if position is None:
            return None
        samples, per_step = position["samples"], self.batch_size * self.world_size
        if samples % per_step:
            logger.warning(
                f"the checkpoint stopped {samples} samples into epoch {self.start_epoch + 1}, which is no whole number "
                f"of this run's batches ({per_step} samples each): the epoch starts again"
            )
            return None
        return {**position, "batches": samples // per_step}

    def _warm_start(self) -> None:
        """``run.init_from``: another run's weights (and optimizer state, ``run.init_optimizer``) as the start."""
        run = self.cfg.run
        assert run.init_from is not None
        state = warm_start.read(run.init_from, run.init_optimizer)
        saved = checkpoint.unpack_models(state["model"], self.several_models)
        warm_start.check_fit(self.step.unwrapped, saved, run.init_from, run.init_from_strict)
        models = {name: warm_start.fitting(m.state_dict(), saved[name]) for name, m in self.step.unwrapped.items()}
        optimizers = self.step.optimizers if state["optimizers"] else {}
        configured = {name: warm_start.hyperparameters(optimizer) for name, optimizer in optimizers.items()}
        checkpoint.load(self.step.models, optimizers, models, state["optimizers"] or {}, strict=run.init_from_strict)
        for name, optimizer in optimizers.items():  # the state (moments, step counts) came; the settings stay ours
            for group, settings in zip(optimizer.param_groups, configured[name], strict=True):
                group.update(settings)
        if self.rank == 0:
            loaded = sum(len(states) for states in models.values())
            also = " and the optimizer state" if state["optimizers"] else ""
            print(f"Starting from run.init_from={run.init_from}: {loaded} weights{also}", flush=True)
