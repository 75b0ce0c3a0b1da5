"""Exact epoch metrics: per-shard sums added, then divided once, equal the metric over the whole split."""

import numpy as np
import torch
from sklearn.metrics import r2_score

from hydra_raytrain.recipe.metrics import SumMeter
from hydra_raytrain.tasks.classification import Classification
from hydra_raytrain.tasks.regression import Regression


def add_over_shards(task, model, inputs, targets, world, batch):
    """What the runner does: each 'rank' adds its batches' sums; the all-reduce adds the ranks' totals."""
    totals = {}
    for rank in range(world):
        meter = SumMeter()
        x, y = inputs[rank::world], targets[rank::world]
        for start in range(0, len(y), batch):
            meter.add(task.validation_step(model, (x[start : start + batch], y[start : start + batch])))
        for name, value in meter.totals().items():
            totals[name] = totals.get(name, 0.0) + value
    return task.compute(totals)


def test_classification_metrics_are_exact_with_uneven_shards():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(103, 5), torch.randint(0, 3, (103,))
    with torch.no_grad():
        logits = model(x)
        expected_loss = torch.nn.functional.cross_entropy(logits, y).item()
        expected_accuracy = (logits.argmax(1) == y).sum().item() / len(y)
        for world in (1, 2, 3, 4):
            metrics = add_over_shards(Classification(), model, x, y, world, batch=8)
            assert abs(metrics["loss"] - expected_loss) < 1e-6
            assert abs(metrics["accuracy"] - expected_accuracy) < 1e-12


def test_regression_metrics_match_sklearn():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x = torch.randn(57, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]]) + 0.3 * torch.randn(57, 1)
    with torch.no_grad():
        predicted = model(x).numpy()
        metrics = add_over_shards(Regression(), model, x, y, world=3, batch=5)
    assert np.isclose(metrics["loss"], np.mean((predicted - y.numpy()) ** 2), atol=1e-6)
    assert np.isclose(metrics["mae"], np.mean(np.abs(predicted - y.numpy())), atol=1e-6)
    assert np.isclose(metrics["r2"], r2_score(y.numpy(), predicted), atol=1e-6)


def test_meter_without_process_group_returns_local_sums():
    meter = SumMeter()
    meter.add({"loss": torch.tensor(1.5), "count": torch.tensor(2)})
    meter.add({"loss": torch.tensor(0.5), "count": torch.tensor(3)})
    assert meter.totals() == {"count": 5.0, "loss": 2.0}


def test_a_resumed_meter_continues_the_epochs_sums_on_rank_0_only():
    import torch

    from hydra_raytrain.recipe.metrics import SumMeter

    partial = {"count": 64.0, "loss": 12.5}
    rank0 = SumMeter.resumed(partial, rank=0, device=torch.device("cpu"))
    rank1 = SumMeter.resumed(partial, rank=1, device=torch.device("cpu"))
    for meter in (rank0, rank1):
        meter.add({"count": torch.tensor(32.0), "loss": torch.tensor(1.5)})
    assert rank0.totals() == {"count": 96.0, "loss": 14.0}  # one process: no all-reduce to add rank 1's
    assert rank1.totals() == {"count": 32.0, "loss": 1.5}  # zeros under the same names: the same all-reduce shape
    assert SumMeter.resumed({}, rank=1, device=torch.device("cpu")).totals() == {}
