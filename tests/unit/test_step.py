"""TrainStep: the runner's optimisation switches on real models and optimizers, in one process."""

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hydra_raytrain.recipe.metrics import reported, should_stop
from hydra_raytrain.recipe.step import Precision, TrainStep
from hydra_raytrain.runtime.reach import free_port

CPU = torch.device("cpu")


def make_step(model, precision="32", lr=1.0, **options):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return TrainStep({"model": model}, {"model": optimizer}, {"model": []}, Precision.build(precision, CPU), **options)


def flat(model):
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def run_batch(step, inputs, targets):
    with step.no_sync():
        with step.forward():
            loss = nn.functional.mse_loss(step.model(inputs).float(), targets)
        step.optimize(loss)
    step.end_iteration()


@pytest.mark.parametrize("precision", ["32", "16-mixed"])
def test_clipping_bounds_the_true_gradient_norm(precision):
    """SGD with lr=1 moves the weights by exactly the clipped gradient: its norm must be the clip value. Under
    16-mixed, clipping before unscaling would shrink the step by the scaler's factor (128 here; a smaller start
    than the default 65536, which overflows fp16 on the first step and skips it, as it should)."""
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    step = make_step(model, precision, gradient_clip_val=0.01)
    if precision == "16-mixed":
        step.precision.scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    before = flat(model)
    run_batch(step, torch.randn(32, 16), torch.randn(32, 4) * 3)
    assert step.precision.scaler.get_scale() == (128.0 if precision == "16-mixed" else 1.0)  # no step was skipped
    assert torch.linalg.vector_norm(flat(model) - before).item() == pytest.approx(0.01, rel=1e-3)


def test_accumulating_k_micro_batches_equals_one_k_times_larger_batch():
    torch.manual_seed(0)
    inputs, targets = torch.randn(48, 16), torch.randn(48, 4)
    big, small = nn.Linear(16, 4), nn.Linear(16, 4)
    small.load_state_dict(big.state_dict())
    run_batch(make_step(big, lr=0.1), inputs, targets)
    step = make_step(small, lr=0.1, accumulate_grad_batches=4)
    for index, (x, y) in enumerate(zip(inputs.chunk(4), targets.chunk(4), strict=True)):
        step.sync = index == 3
        before = flat(small)
        run_batch(step, x, y)
        assert torch.equal(flat(small), before) == (index < 3)  # weights move on the window's last micro-batch only
    assert torch.allclose(flat(small), flat(big), atol=1e-6)


@pytest.fixture
def process_group():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_all_reduces_once_per_accumulation_window(process_group):
    """A communication hook counts DDP's gradient all-reduces: 8 micro-batches in windows of 4 -> 2."""
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    calls = []

    def counting_allreduce(state, bucket):
        calls.append(bucket.index())
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    model.register_comm_hook(None, counting_allreduce)
    step = make_step(model, lr=0.1, accumulate_grad_batches=4)
    for index in range(8):
        step.sync = (index + 1) % 4 == 0
        run_batch(step, torch.randn(8, 16), torch.randn(8, 4))
    assert len(calls) == 2


def test_warmup_rises_linearly_then_hands_over_to_the_schedule():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, 0.25, total_iters=3)
    step = TrainStep(
        {"model": model},
        {"model": optimizer},
        {"model": [cosine]},
        Precision.build("32", CPU),
        warmups={"model": warmup},
    )
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(4):
        run_batch(step, torch.randn(4, 2), torch.randn(4, 1))
        seen.append(optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    step.end_epoch()  # the epoch schedule multiplies on top of what the warm-up left
    assert optimizer.param_groups[0]["lr"] == pytest.approx((1 + torch.cos(torch.tensor(torch.pi / 4)).item()) / 2)
    saved = step.state_dict()
    fresh_optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    fresh = TrainStep(
        {"model": model},
        {"model": fresh_optimizer},
        {"model": [torch.optim.lr_scheduler.CosineAnnealingLR(fresh_optimizer, T_max=4)]},
        Precision.build("32", CPU),
        warmups={"model": torch.optim.lr_scheduler.LinearLR(fresh_optimizer, 0.25, total_iters=3)},
    )
    fresh.load_state_dict(saved)
    assert fresh.lr_schedulers["model"][0].last_epoch == cosine.last_epoch and fresh.warmups["model"].last_epoch == 4


def test_the_fp16_scaler_state_round_trips():
    step = make_step(nn.Linear(2, 1), "16-mixed")
    run_batch(step, torch.randn(4, 2), torch.randn(4, 1))
    step.precision.scaler.update(1024.0)
    fresh = make_step(nn.Linear(2, 1), "16-mixed")
    fresh.load_state_dict(step.state_dict())
    assert fresh.precision.scaler.get_scale() == 1024.0
    assert make_step(nn.Linear(2, 1), "bf16-mixed").precision.scaler.is_enabled() is False  # bf16 needs no scaler


def test_a_task_with_several_optimizers_must_name_one():
    models = {"generator": nn.Linear(2, 2), "discriminator": nn.Linear(2, 1)}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.1) for name, m in models.items()}
    step = TrainStep(models, optimizers, {}, Precision.build("32", CPU))
    with pytest.raises(ValueError, match="step.optimize\\(loss, name\\)"):
        step.optimize(models["discriminator"](torch.randn(3, 2)).sum())
    with pytest.raises(AttributeError, match="step.models\\[name\\]"):
        _ = step.model


@pytest.mark.parametrize(
    "scores, mode, patience, min_delta, stop",
    [
        ([0.5, 0.6, 0.7], "max", 2, 0.0, False),
        ([0.5, 0.7, 0.69, 0.7], "max", 2, 0.0, True),  # 0.7 again is no improvement
        ([0.5, 0.7, 0.705, 0.709], "max", 2, 0.01, True),  # improvements smaller than min_delta do not count
        ([1.0, 0.9, 0.95, 0.85], "min", 2, 0.0, False),
        ([1.0, 0.9, 0.95, 0.96], "min", 2, 0.0, True),
        ([1.0, None, None], "min", 2, 0.0, True),  # a missing score is no improvement
        ([], "min", 1, 0.0, False),
    ],
)
def test_early_stopping_rule(scores, mode, patience, min_delta, stop):
    assert should_stop(scores, mode, patience, min_delta) is stop


def test_early_stopping_counts_the_epochs_that_report_its_metric():
    """A metric of every other epoch (task.eval_generation_every=2): patience 2 is two of its epochs, not two epochs."""
    history = [{"val_loss": 1.0}, {"val_loss": 0.9, "val_exact_match": 0.5}, {"val_loss": 0.8}]
    history += [{"val_loss": 0.7, "val_exact_match": 0.4}, {"val_loss": 0.6}]
    assert reported(history, "val_exact_match") == [0.5, 0.4]
    assert not should_stop(reported(history, "val_exact_match"), "max", 2)  # one epoch of it without improvement
    history.append({"val_loss": 0.5, "val_exact_match": 0.45})
    assert should_stop(reported(history, "val_exact_match"), "max", 2)
    assert reported(history, "val_loss") == [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]
