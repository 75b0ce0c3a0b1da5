"""``dataset=table`` on 2 workers of the session's cluster, through the CLI: a CSV with string classes read into
each worker's memory (the in-worker tensor path), and the digits as one Parquet file of a vector column, streamed
by Ray Data above ``dataset.memory_limit_mb`` and read whole below it; on both roads the same rows validate, every
one counted once per epoch, and the class mapping is kept with the run and read back by ``evaluate``. Both hold a
test split out (``dataset.test_fraction``): the best checkpoint scores every test row once after training, as
``evaluate --split test`` does later."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchmetrics.functional.classification import multiclass_auroc, multiclass_confusion_matrix, multiclass_f1_score

from hydra_raytrain import evaluate, load_model
from hydra_raytrain.data import tables
from hydra_raytrain.data.bundled import digits_arrays
from hydra_raytrain.data.rowsplit import row_split, val_mask, val_threshold
from hydra_raytrain.runtime.host import machine_cores
from tests.conftest import ROOT, run_cli
from tests.helpers.loggers import read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.workers]

SPECIES = ["virginica", "setosa", "versicolor"]  # not in sorted order: the mapping sorts them
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]  # sorted: another order


@pytest.mark.long("tables in the gate: the own-data page's CSV, Parquet and list-column runs (test_docs)")
def test_a_csv_with_string_classes_trains_over_two_workers_and_evaluates_with_its_mapping(ray_address, tmp_path):
    rng = np.random.default_rng(0)
    rows = [(i % 3, *(rng.normal(size=3) + 2.5 * (i % 3)).round(3)) for i in range(150)]
    lines = ["sepal,petal_length,petal_width,species"] + [f"{a},{b},{c},{SPECIES[k]}" for k, a, b, c in rows]
    (tmp_path / "iris.csv").write_text("\n".join(lines) + "\n")
    args = [
        f"ray.address={ray_address}",
        "dataset=table",
        "dataset.path=iris.csv",  # relative: read from the folder the command runs in
        "dataset.label=species",
        "dataset.features=[sepal,petal_*]",
        "model=mlp",
        "task._target_=tests.helpers.tasks.Counted",
        "trainer.max_epochs=12",
        "optimizer.lr=0.01",
        "dataset.test_fraction=0.2",
        "+task.metrics=[f1,auroc,confusion_matrix]",  # torchmetrics: F1, AUROC, counts; exact over both workers
        "trainer.monitor=val_f1",
        "logger=tensorboard",
        "hydra.run.dir=run",
    ]
    done = run_cli(args, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "data on cpu as tensors" in done.stdout + done.stderr  # read into the workers' memory
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["dataset"]["classes"] == ["setosa", "versicolor", "virginica"]
    assert config["dataset"]["input_shape"] == [3] and config["dataset"]["num_outputs"] == 3
    # Every validation row once per epoch, over both workers: the rows val_mask picks
    val = np.flatnonzero(val_mask(np.arange(150), val_threshold(150, 0.2, 0), 0))
    label_sum = sum(sorted(SPECIES).index(SPECIES[rows[i][0]]) for i in val)
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {(m["val_samples"], m["val_label_sum"], m["world_size"]) for m in history} == {(30, label_sum, 2)}
    assert history[-1]["val_accuracy"] >= 0.9, history[-1]
    evaluated = evaluate(str(tmp_path / "run"))  # the file read again, mapped with the run's classes
    assert evaluated["val_samples"] == 30 and abs(evaluated["val_loss"] - history[-1]["val_loss"]) < 1e-5
    # task.metrics: the figures torchmetrics gives on the whole validation split in one process
    model = load_model(str(tmp_path / "run"))
    x = torch.tensor([rows[i][1:] for i in val], dtype=torch.float32)
    y = torch.tensor([sorted(SPECIES).index(SPECIES[rows[i][0]]) for i in val])
    with torch.no_grad():
        probabilities = model(x).softmax(dim=1)
    f1 = float(multiclass_f1_score(probabilities, y, 3, average="macro"))
    auroc = float(multiclass_auroc(probabilities, y, 3, average="macro", thresholds=200))
    assert abs(history[-1]["val_f1"] - f1) < 1e-5 and abs(history[-1]["val_auroc"] - auroc) < 1e-5, history[-1]
    assert abs(evaluated["val_f1"] - f1) < 1e-5 and abs(evaluated["val_auroc"] - auroc) < 1e-5
    assert evaluated["val_confusion_matrix"] == multiclass_confusion_matrix(probabilities.argmax(1), y, 3).tolist()
    # The test split: 30 more rows held out of training (validation kept its own), scored once on the best
    # checkpoint after training; the same figures from evaluate --split test, and in the run's logger
    _, test = row_split(150, 0.2, 0.2, 0).masks(np.arange(150), 0)
    test_label_sum = sum(sorted(SPECIES).index(SPECIES[rows[i][0]]) for i in np.flatnonzero(test))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    tested = summary["test"]
    assert (tested["test_samples"], tested["test_label_sum"], tested["monitor"]) == (30, test_label_sum, "val_f1")
    best = max(history, key=lambda m: m["val_f1"])  # the first of equals, as Ray's checkpoint manager
    assert tested["epoch"] == summary["best"]["epoch"] and history[tested["epoch"] - 1]["val_f1"] == best["val_f1"]
    assert "test_f1" in tested and "test_auroc" in tested
    test_counts = np.bincount([sorted(SPECIES).index(SPECIES[rows[i][0]]) for i in np.flatnonzero(test)], minlength=3)
    assert [sum(row) for row in tested["test_confusion_matrix"]] == test_counts.tolist()  # a row per true class
    assert (
        tested["checkpoint"].endswith(f"epoch_{tested['epoch']:04d}") and "Test (the checkpoint of epoch" in done.stdout
    )
    again = evaluate(tested["checkpoint"], split="test")
    assert again.pop("test_confusion_matrix") == tested["test_confusion_matrix"]
    assert all(abs(again[name] - tested[name]) < 1e-6 for name in again), (again, tested)
    scalars = read_scalars(tmp_path / "run" / "tensorboard")
    assert [round(v, 5) for _, v in scalars["test_accuracy"]] == [round(tested["test_accuracy"], 5)]


@pytest.mark.long("a second table road: tables in the gate are the CSV run")
def test_digits_in_one_vector_column_file_train_on_both_roads_and_validate_the_same_rows(ray_address, tmp_path):
    """The digits as one Parquet file, as Ray Data's write_parquet or pandas write them: each row's 64 pixels in
    one list column, the class by name, a text key. Above dataset.memory_limit_mb the file streams through Ray Data
    (an MLP on the 64 values); read whole (dataset.read=memory) the same file trains the default CNN, its rows
    reshaped by dataset.input_shape=[1,8,8]. Both roads validate the same rows and reach 0.9 on 2 workers."""
    pixels, target = digits_arrays()
    features = (pixels.reshape(len(pixels), 64) / 16.0).astype(np.float32)
    keys = [f"row{i}" for i in range(len(target))]  # text: not a feature ("*" takes numbers); predict carries it
    table = pa.table({"features": list(features), "digit": np.array(DIGITS)[target], "key": keys})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=100)
    args = [
        f"ray.address={ray_address}",
        "dataset=table",
        "dataset.path=t.parquet",
        "dataset.label=digit",
        "task._target_=tests.helpers.tasks.Counted",
        "trainer.max_epochs=5",
        "optimizer.lr=0.01",
    ]
    streaming = ["dataset.memory_limit_mb=0.1", "dataset.test_fraction=0.1", "model=mlp", "hydra.run.dir=run"]
    done = run_cli(args + streaming, cwd=str(tmp_path))  # the file's columns take 0.44 MB: auto streams them
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "MB in memory): streamed through Ray Data" in output and "data streamed by Ray Data" in output
    classes = sorted(DIGITS)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["dataset"]["input_shape"] == [64] and config["dataset"]["classes"] == classes
    whole = tables.table(str(tmp_path / "t.parquet"), [64], 10, ["*"], "digit", classes, read="memory")
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    expected = (len(whole.val), int(whole.val.tensors[1].sum()), 2)
    assert {(m["val_samples"], m["val_label_sum"], m["world_size"]) for m in history} == {expected}
    assert history[-1]["val_accuracy"] >= 0.9, history[-1]
    evaluated = evaluate(str(tmp_path / "run"))  # the stream read again here, mapped with the run's classes
    assert evaluated["val_samples"] == len(whole.val) and abs(evaluated["val_loss"] - history[-1]["val_loss"]) < 1e-5
    held = tables.table(str(tmp_path / "t.parquet"), [64], 10, ["*"], "digit", classes, test_fraction=0.1)
    tested = json.loads((tmp_path / "run" / "summary.json").read_text())["test"]  # the streamed road's test rows
    assert (tested["test_samples"], tested["test_label_sum"]) == (len(held.test), int(held.test.tensors[1].sum()))

    in_memory = ["dataset.read=memory", "dataset.input_shape=[1,8,8]", "hydra.run.dir=run_memory"]  # the CNN
    done = run_cli(args + in_memory, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "data on cpu as tensors" in done.stdout + done.stderr
    memory_history = [json.loads(line) for line in (tmp_path / "run_memory" / "metrics.jsonl").read_text().splitlines()]
    assert {(m["val_samples"], m["val_label_sum"], m["world_size"]) for m in memory_history} == {expected}
    assert memory_history[-1]["val_accuracy"] >= 0.9, memory_history[-1]
    predicts_every_row(tmp_path, ray_address, features, keys, target)


def predicts_every_row(tmp_path, ray_address, features, keys, target):
    """python -m hydra_raytrain.predict on the streamed run's own file: on the session's cluster and on a local one
    of its own, every row once, as load_model computes."""
    classes = sorted(DIGITS)

    def predict(output: str, *options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "hydra_raytrain.predict", "run", "t.parquet", "--output", output, *options],
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
            # the run's task: tests.helpers.tasks.Counted; no allocator of the environment's (Ray's jemalloc then)
            env={**{k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}, "PYTHONPATH": ROOT},
        )

    # Batch predictions of the same file on the cluster: 2 model actors, every row once, as load_model computes
    done = predict("predictions", "--num-workers", "2", "--batch-size", "100", "--address", ray_address)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Predicted {len(keys):,} rows in" in done.stdout
    # A joined cluster's actors take Ray's one CPU each (and one torch thread), as other jobs may share it
    assert "Predicting with 2 model actors x 1 CPU\n" in done.stdout
    # Ray prints a repeated line once; each actor runs on Ray's jemalloc (glibc's malloc grew a big model's actor)
    # and predicts --batch-size rows at a time (handed up to 16 batches a call)
    assert "Model actor: 1 torch thread, jemalloc, batches of 100 rows\n" in done.stdout, done.stdout[-3000:]
    predicted = pq.read_table(tmp_path / "predictions").to_pydict()
    assert set(predicted) == {"key", "digit", "prediction", "probabilities"}
    assert sorted(predicted["key"]) == sorted(keys)  # every row once
    order = [int(key[3:]) for key in predicted["key"]]
    with torch.no_grad():
        expected = torch.softmax(load_model(str(tmp_path / "run"))(torch.from_numpy(features[order])), dim=1)
    assert torch.allclose(torch.tensor(predicted["probabilities"]), expected, atol=1e-5)
    assert predicted["prediction"] == [classes[i] for i in expected.argmax(dim=1).tolist()]
    assert predicted["digit"] == [DIGITS[target[i]] for i in order]  # the label carried through

    # Without a cluster (no --address, no RAY_ADDRESS): a local cluster of its own, sized to the machine's cores, one
    # of them left for Ray Data's reads; the same predictions.
    assert "RAY_ADDRESS" not in os.environ
    done = predict("predictions_local")
    assert done.returncode == 0, done.stderr[-3000:]
    cpus = max(machine_cores(), 2) - 1
    plural = "s" if cpus > 1 else ""
    assert f"Predicting with 1 model actor x {cpus} CPU{plural}\n" in done.stdout, done.stdout[-3000:]
    assert f"Model actor: {cpus} torch thread{plural}, jemalloc, batches of 256 rows\n" in done.stdout
    local = pq.read_table(tmp_path / "predictions_local").to_pydict()
    assert sorted(zip(local["key"], local["prediction"], strict=True)) == sorted(
        zip(predicted["key"], predicted["prediction"], strict=True)
    )
