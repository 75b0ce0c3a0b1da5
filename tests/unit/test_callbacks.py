"""The callbacks' dispatch and the shipped ones: the learning-rate monitor's figures, the loss guard's stops."""

import math

import pytest
import torch

from hydra_raytrain.callbacks.base import Callbacks, RunState, StopTraining
from hydra_raytrain.callbacks.loss_guard import LossGuard
from hydra_raytrain.callbacks.lr_monitor import LearningRateMonitor


def run_state(optimizers=None, step=1):
    model = torch.nn.Linear(2, 1)
    optimizers = optimizers or {"model": torch.optim.SGD(model.parameters(), lr=0.1)}
    return RunState(0, 1, "/tmp", {"model": model}, optimizers, epoch=1, global_step=step)


def sums(**losses):
    return {**{name: torch.tensor(value * 4) for name, value in losses.items()}, "count": torch.tensor(4)}


def test_the_lr_monitor_names_every_optimizer_and_group():
    backbone, head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    groups = [{"params": backbone.parameters(), "lr": 0.01}, {"params": head.parameters()}]
    optimizers = {
        "generator": torch.optim.Adam(groups, lr=0.1, betas=(0.5, 0.999)),
        "discriminator": torch.optim.SGD(head.parameters(), lr=0.2, momentum=0.9),
    }
    figures = LearningRateMonitor(log_momentum=True).on_validation_end(run_state(optimizers), {})
    assert figures == {
        "lr_generator_group0": 0.01,
        "lr_generator_group1": 0.1,
        "momentum_generator_group0": 0.5,
        "momentum_generator_group1": 0.5,
        "lr_discriminator": 0.2,
        "momentum_discriminator": 0.9,
    }
    assert set(LearningRateMonitor().on_validation_end(run_state(), {})) == {"lr_model"}


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_the_loss_guard_stops_at_a_loss_that_is_not_finite_and_names_where(value):
    guard = LossGuard()
    guard.on_after_optimizer_step(run_state(step=1), sums(loss=0.5))
    with pytest.raises(StopTraining, match=f"the training loss_g is {value} at epoch 1, optimizer step 2:"):
        guard.on_after_optimizer_step(run_state(step=2), sums(loss_d=0.3, loss_g=value))


def test_the_loss_guard_checks_every_n_steps_only():
    guard = LossGuard(check_every_n_steps=3)
    guard.on_after_optimizer_step(run_state(step=2), sums(loss=math.nan))  # not a step it checks
    with pytest.raises(StopTraining):
        guard.on_after_optimizer_step(run_state(step=3), sums(loss=math.nan))


def test_the_loss_guard_stops_a_spike_after_its_warm_up_and_resumes_its_means():
    guard = LossGuard(spike_factor=5, decay=0.5, warmup_checks=3)
    guard.on_after_optimizer_step(run_state(step=1), sums(loss=1.0))
    guard.on_after_optimizer_step(run_state(step=2), sums(loss=8.0))  # in the warm-up: no stop
    guard.on_after_optimizer_step(run_state(step=3), sums(loss=1.0))
    assert guard.state_dict() == {"means": {"loss": 2.75}, "checks": 3}  # 1, then (1+8)/2, then (4.5+1)/2
    resumed = LossGuard(spike_factor=5, decay=0.5, warmup_checks=3)
    resumed.load_state_dict(guard.state_dict())
    resumed.on_after_optimizer_step(run_state(step=4), sums(loss=13.0))  # under 5 x 2.75
    with pytest.raises(StopTraining, match="over spike_factor=5 times its running mean 7.875"):
        resumed.on_after_optimizer_step(run_state(step=5), sums(loss=40.0))


def test_the_loss_guards_settings_are_checked():
    for settings, text in [({"check_every_n_steps": 0}, "check_every_n_steps"), ({"spike_factor": 1}, "spike_factor")]:
        with pytest.raises(ValueError, match=text):
            LossGuard(**settings)


class Counter:  # a duck-typed callback: two hooks and a state, no base class
    def __init__(self):
        self.steps = 0

    def on_after_optimizer_step(self, run, sums):
        self.steps += 1

    def on_validation_end(self, run, metrics):
        return {"steps_seen": self.steps, "saw_lr": metrics["lr_model"]}

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


def test_callbacks_run_in_order_and_keep_the_states_of_those_that_have_one():
    callbacks = Callbacks({"lr": LearningRateMonitor(), "counter": Counter(), "guard": LossGuard()})
    run = run_state()
    callbacks.call("on_after_optimizer_step", run, sums(loss=0.1))
    callbacks.call("on_epoch_start", run)  # a hook the counter does not have
    assert callbacks.validation_end(run, {"lr": 0.1}) == {"lr_model": 0.1, "steps_seen": 1, "saw_lr": 0.1}
    states = callbacks.state_dict()
    assert states == {"counter": {"steps": 1}, "guard": {"means": {"loss": pytest.approx(0.1)}, "checks": 1}}
    again = Callbacks({"counter": Counter()})
    again.load_state_dict({**states, "gone": {}})  # a callback no longer configured: its state is left
    assert again.callbacks["counter"].steps == 1
    assert not Callbacks.build({}) and Callbacks.build(None).state_dict() == {}


def test_a_figure_the_report_has_already_is_refused_naming_the_callback():
    class Overwrites:
        def on_validation_end(self, run, metrics):
            return {"val_loss": 0.0}

    with pytest.raises(ValueError, match="callbacks.mine returned val_loss, which the report has already"):
        Callbacks({"mine": Overwrites()}).validation_end(run_state(), {"val_loss": 0.3})


def test_a_state_a_checkpoint_could_not_load_is_refused_when_saved():
    class Odd:
        pass

    class Keeps:
        def state_dict(self):
            return {"thing": Odd()}

    with pytest.raises(TypeError, match="callbacks.keeps.state_dict\\(\\) holds what a checkpoint cannot load"):
        Callbacks({"keeps": Keeps()}).state_dict()


def test_a_driver_callback_that_fails_warns_and_the_others_run(caplog):
    from ray.train import UserCallback

    from hydra_raytrain.callbacks.base import Warned

    class Broken(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            raise OSError("disk full")

    Warned("broken", Broken()).after_report(None, [{}], None)
    assert "callbacks.broken.after_report failed: disk full" in caplog.text


def _guard_on_rank(rank, init_file, results):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    guard, state = LossGuard(), RunState(rank, 2, "/tmp", {}, {}, epoch=1, global_step=1)
    guard.on_after_optimizer_step(state, sums(loss=0.5 + rank))  # the mean over both: 1.0
    state.global_step = 2
    try:
        guard.on_after_optimizer_step(state, sums(loss=math.nan if rank == 0 else 0.5))  # rank 0's alone
        results[rank] = "went on"
    except StopTraining as stop:
        results[rank] = f"{stop} means {guard.means}"
    dist.destroy_process_group()


def test_every_rank_decides_the_same_from_the_losses_over_every_worker(tmp_path):
    """A non-finite loss on one rank stops every rank at the same step (none waits in a collective for the
    others), and the running means are the same on every rank: the ones rank 0's checkpoint gives back."""
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    mp.spawn(_guard_on_rank, args=(str(tmp_path / "init"), results), nprocs=2)
    assert results[0] == results[1], dict(results)
    assert "the training loss is nan at epoch 1, optimizer step 2:" in results[0] and "{'loss': 1.0}" in results[0]
