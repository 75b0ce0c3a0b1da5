"""Parquet and images streamed by Ray Data on the real local cluster: from a folder and from S3 (moto), sharded
across two workers, validated once per sample, resumed after a killed worker."""

import json
import os

import numpy as np
import pyarrow.fs
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from hydra_raytrain import evaluate, load_model, train
from hydra_raytrain.config import ConfigError
from hydra_raytrain.data.files import split_files
from hydra_raytrain.inference.predict import ImageDecoder, predict
from tests.conftest import compose_config
from tests.helpers.data import write_digits_parquet

pytestmark = [pytest.mark.integration, pytest.mark.workers]


def _history(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long("the gate's budget: data streamed by Ray Data runs in the long tier only (12 epochs to the bar)")
def test_digits_as_parquet_train_to_the_bar_over_two_workers_and_validate_every_sample_once(ray_address, tmp_path):
    folder = tmp_path / "digits"
    write_digits_parquet(folder, files=5)
    train_files, val_files = split_files(sorted(str(p) for p in folder.glob("*.parquet")), 0.2, 0)
    val_labels = sum(pq.read_table(f).column("label").to_numpy().sum() for f in val_files)
    val_rows = sum(pq.read_metadata(f).num_rows for f in val_files)
    train_rows = sum(pq.read_metadata(f).num_rows for f in train_files)
    summary = train(
        compose_config(
            "dataset=parquet",
            f"dataset.path={folder}",
            "dataset.input_shape=[1,8,8]",  # the embedded default's simple_cnn, as dataset=digits feeds it
            "task._target_=tests.helpers.tasks.Counted",
            "scaling.num_workers=2",
            "trainer.max_epochs=12",
        ),
        run_dir=str(tmp_path / "run"),
    )
    assert summary["status"] == "completed" and summary["best"]["val_accuracy"] >= 0.95  # dataset=digits' bar
    history = _history(tmp_path / "run")
    assert len(history) == 12 and history[-1]["world_size"] == 2
    # Validation: every sample once per epoch over the two shards (uneven, nothing dropped), never twice.
    assert {(m["val_samples"], m["val_label_sum"]) for m in history} == {(val_rows, val_labels)}
    # Training: equal shards, at most one row of 1,437 dropped per epoch; the files in a new order each epoch (the
    # labels weighted by their place in their batches differ; which row is dropped varies less: often one of the
    # same label, so the label sums alone repeat, all 12 alike about one run in a hundred).
    assert {m["train_samples"] for m in history} == {2 * (train_rows // 2)}
    assert len({m["train_label_order"] for m in history}) > 1
    # The driver's evaluation reads every validation row itself: it scores the model as the workers did.
    evaluated = evaluate(str(tmp_path / "run"))
    assert abs(evaluated["val_loss"] - history[-1]["val_loss"]) < 1e-5
    assert evaluated["val_samples"] == val_rows and evaluated["val_label_sum"] == val_labels
    log = (tmp_path / "run" / "driver.log").read_text()
    assert f"data streamed by Ray Data ({train_rows:,} training rows, {train_rows // 2:,} per worker" in log


@pytest.mark.long("a kill/resume variant: Ray Data in the gate is the Parquet run")
def test_images_on_s3_stream_to_two_workers_and_a_killed_worker_resumes_with_the_epochs_remaining_steps(
    ray_address, s3_endpoint, tmp_path
):
    """``dataset=images`` from S3 (moto): PNGs in class folders, read by Ray Data's read_images; each class a
    brightness, learned in a few epochs. Rank 1 is SIGKILLed in epoch 2, after step 8's checkpoint (epoch 2's
    second step) was counted: the restarted workers take the epoch's remaining steps from a new pass over the
    data (a stream cannot seek), and the run ends on the planned optimizer step."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(["dark", "mid", "light"]):
        (tmp_path / "shades" / name).mkdir(parents=True)
        for i in range(40):
            pixels = np.clip(rng.normal(40 + 80 * c, 12, (8, 8)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(tmp_path / "shades" / name / f"{i:02d}.png")
    s3 = pyarrow.fs.S3FileSystem(endpoint_override=s3_endpoint, allow_bucket_creation=True)
    s3.create_dir("images-bucket")
    pyarrow.fs.copy_files(str(tmp_path / "shades"), "images-bucket/shades", pyarrow.fs.LocalFileSystem(), s3)
    summary = train(
        compose_config(
            "dataset=images",
            "dataset.path=s3://images-bucket/shades",
            "dataset.local_shuffle_buffer_size=32",
            # Ray Data's own settings pass through: half a CPU per read and decode task, at most 2 decode tasks
            # at once, 2 batches prepared ahead by each worker
            "dataset.num_cpus=0.5",
            "dataset.concurrency=2",
            "dataset.prefetch_batches=2",
            "scaling.num_workers=2",
            "trainer.max_epochs=4",
            "trainer.batch_size=16",
            "trainer.limit_val_batches=2",  # each epoch leaves the validation shards unfinished
            "optimizer.lr=0.01",
            # the shades' mean and spread: centred inputs learn in the run's 24 steps (0.875 once without)
            "dataset.transform={_target_: hydra_raytrain.data.streamed.normalize, _partial_: true, mean: [0.47], "
            "std: [0.33]}",
            "checkpoint.every_n_steps=8",
            "failure.max_failures=1",
            "task._target_=tests.helpers.tasks.CrashOnce",
            f"+task.marker={tmp_path / 'crashed'}",
            "+task.at_step=10",
            "+task.after=step_00000008",
        ),
        run_dir=str(tmp_path / "run"),
    )
    assert (tmp_path / "crashed").exists()
    steps_per_epoch = 96 // 2 // 8  # 120 images, 24 validate; 48 per rank in batches of 8
    log = (tmp_path / "run" / "driver.log").read_text()
    assert f"Resuming from checkpoint step_00000008: epoch 2, after batch 2/{steps_per_epoch}" in log
    assert summary["status"] == "completed" and summary["final"]["step"] == 4 * steps_per_epoch
    history = _history(tmp_path / "run")
    assert [m["epoch"] for m in history] == [1, 2, 3, 4] and summary["best"]["val_accuracy"] >= 0.9, history
    [failure] = summary["failures"]
    assert failure["retried"] is True and failure["why"] == "a worker process died", failure
    # evaluate reads the validation images from S3 itself, every one of them (training validated 2 batches).
    assert evaluate(str(tmp_path / "run"))["val_accuracy"] >= 0.9

    # Batch predictions of one class folder on S3, written to S3: decoded as training decoded them (read_images'
    # resize, the run's transform), each image once, its class folder carried as its label; an output that
    # exists on S3 is refused.
    done = predict(str(tmp_path / "run"), "s3://images-bucket/shades/mid", "s3://images-bucket/predicted", num_cpus=2)
    assert done["rows"] == 40, done  # called in this process: one model actor of 2 CPUs on the session's cluster
    predicted = pq.read_table("images-bucket/predicted", filesystem=s3).to_pydict()
    assert sorted(predicted["path"]) == [f"s3://images-bucket/shades/mid/{i:02d}.png" for i in range(40)]
    assert set(predicted["label"]) == {"mid"} and predicted["prediction"].count("mid") >= 36, predicted["prediction"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    local = [(tmp_path / "shades" / "mid" / os.path.basename(path)).read_bytes() for path in predicted["path"]]
    with torch.no_grad():
        x = torch.from_numpy(ImageDecoder(config["dataset"])(local))
        expected = torch.softmax(load_model(str(tmp_path / "run"))(x), dim=1)
    assert torch.allclose(torch.tensor(predicted["probabilities"]), expected, atol=1e-5)
    with pytest.raises(ConfigError, match=r"--output='s3://images-bucket/predicted': exists"):
        predict(str(tmp_path / "run"), "s3://images-bucket/shades/mid", "s3://images-bucket/predicted")
