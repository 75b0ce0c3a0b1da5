"""``task.metrics``: torchmetrics' metrics from sums, exact over batches (and so over workers), by name."""

import pytest
import torch
import torchmetrics.functional.classification as tmc
import torchmetrics.functional.regression as tmr

from hydra_raytrain.config import ConfigError
from hydra_raytrain.recipe.metrics import SumMeter
from tasks.classification import Classification
from tasks.regression import Regression


def totals(task, model, inputs, targets, sizes):
    """The task's validation totals over batches of uneven ``sizes`` (as two workers' shards would add up)."""
    meter, start = SumMeter(), 0
    for size in sizes:
        meter.add(task.validation_step(model, (inputs[start : start + size], targets[start : start + size])))
        start += size
    return meter.totals()


def test_classification_metrics_equal_torchmetrics_on_the_whole_split():
    torch.manual_seed(0)
    model, x, y = torch.nn.Linear(6, 5), torch.randn(101, 6), torch.randint(0, 5, (101,))
    task = Classification(metrics=["f1", "precision", "recall", "auroc", "top2_accuracy", "top1_accuracy"])
    values = task.compute(totals(task, model, x, y, [40, 7, 33, 21]))
    probabilities = model(x).detach().softmax(dim=1)
    expected = {
        "f1": tmc.multiclass_f1_score(probabilities, y, 5, average="macro"),
        "precision": tmc.multiclass_precision(probabilities, y, 5, average="macro"),
        "recall": tmc.multiclass_recall(probabilities, y, 5, average="macro"),
        "auroc": tmc.multiclass_auroc(probabilities, y, 5, average="macro", thresholds=200),
        "top2_accuracy": tmc.multiclass_accuracy(probabilities, y, 5, top_k=2, average="micro"),
        "top1_accuracy": tmc.multiclass_accuracy(probabilities, y, 5, top_k=1, average="micro"),
    }
    assert {name: round(values[name], 6) for name in expected} == {k: round(float(v), 6) for k, v in expected.items()}
    assert values["accuracy"] == pytest.approx(float((probabilities.argmax(1) == y).float().mean()))
    plain = Classification()  # without metrics: the sums and figures as before
    assert set(plain.compute(totals(plain, model, x, y, [101]))) == {"loss", "accuracy"}


def test_the_confusion_matrix_is_torchmetrics_on_the_whole_split_and_no_scalar():
    torch.manual_seed(2)
    model, x, y = torch.nn.Linear(6, 4), torch.randn(90, 6), torch.randint(0, 4, (90,))
    task = Classification(metrics=["confusion_matrix", "f1"])
    sums = totals(task, model, x, y, [50, 3, 37])
    expected = tmc.multiclass_confusion_matrix(model(x).detach().argmax(1), y, 4)
    assert task.metrics.matrices(sums) == {"confusion_matrix": expected.tolist()}
    assert set(task.compute(sums)) == {"loss", "accuracy", "f1"}  # the epochs' reports hold numbers only


def test_regression_metrics_equal_torchmetrics_and_training_sums_carry_none():
    torch.manual_seed(1)
    model, x, y = torch.nn.Linear(4, 1), torch.randn(64, 4), torch.randn(64, 1) + 3
    task = Regression(metrics=["rmse", "mape", "r2"])
    values = task.compute(totals(task, model, x, y, [30, 34]))
    predictions = model(x).detach().reshape(-1)
    assert values["rmse"] == pytest.approx(float(tmr.mean_squared_error(predictions, y.reshape(-1), squared=False)))
    assert values["mape"] == pytest.approx(float(tmr.mean_absolute_percentage_error(predictions, y.reshape(-1))))
    assert values["r2"] == pytest.approx(float(tmr.r2_score(predictions, y.reshape(-1))), rel=1e-5)
    train = SumMeter()
    train.add(task.training_step(model, (x, y)).sums)
    assert set(task.compute(train.totals())) == {"loss", "mae", "r2"}  # metrics are validation's


@pytest.mark.parametrize(
    ("task", "metrics", "says"),
    [
        (Classification, ["f2"], "'f2' is no classification metric. Valid: f1, precision, recall, auroc"),
        (Regression, ["f1"], "'f1' is no regression metric. Valid: mae, rmse, r2, mape"),
        (Classification, ["f1", "f1"], "names a metric twice"),
        (Classification, "f1", "is a list of metric names"),
    ],
)
def test_unknown_metrics_are_refused_by_name(task, metrics, says):
    with pytest.raises(ConfigError, match="task.metrics=") as raised:
        task(metrics=metrics)
    assert says in str(raised.value)


def test_top_k_beyond_the_classes_is_refused_at_the_first_step():
    task = Classification(metrics=["top4_accuracy"])
    with pytest.raises(ConfigError, match="the model scores 3 classes. Valid: top1_accuracy to top3_accuracy"):
        task.validation_step(torch.nn.Linear(2, 3), (torch.randn(4, 2), torch.tensor([0, 1, 2, 0])))


def test_metrics_compute_from_the_runners_totals_without_a_collective_of_their_own(tmp_path, monkeypatch):
    """In a worker the process group is up: torchmetrics would gather the (already all-reduced) states again,
    and NCCL refuses CPU tensors. The metrics compute from the totals alone."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:

        def refused(*args, **kwargs):
            raise AssertionError("a collective in compute")

        task = Classification(metrics=["f1", "auroc"])
        torch.manual_seed(3)
        model, x, y = torch.nn.Linear(3, 4), torch.randn(20, 3), torch.randint(0, 4, (20,))
        sums = totals(task, model, x, y, [20])  # the runner's one all-reduce
        for name in ("all_gather", "barrier", "all_reduce"):
            monkeypatch.setattr(dist, name, refused)
        values = task.compute(sums)
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()
    probabilities = model(x).detach().softmax(dim=1)  # torchmetrics on the whole split, with no process group
    expected = {
        "f1": tmc.multiclass_f1_score(probabilities, y, 4, average="macro"),
        "auroc": tmc.multiclass_auroc(probabilities, y, 4, average="macro", thresholds=200),
    }
    assert {name: round(values[name], 6) for name in expected} == {k: round(float(v), 6) for k, v in expected.items()}
