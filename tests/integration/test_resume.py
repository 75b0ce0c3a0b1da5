"""Checkpoints and resumption on the session's real local Ray cluster: a killed worker, a killed driver,
a finished run re-run, a corrupt newest checkpoint, top-k retention."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import ray
import torch

from hydra_raytrain import load_model, train
from hydra_raytrain.data import digits
from hydra_raytrain.driver.run import TrainingFailed
from hydra_raytrain.recipe.augment import Augment
from hydra_raytrain.recipe.checkpoint import staging_folder
from hydra_raytrain.recipe.sampler import ShardedSampler
from tests.conftest import ROOT, TEST_CLUSTER_CPUS, compose_config, run_cli
from tests.helpers.loggers import read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.workers, pytest.mark.slow]

# The GAN under fp16: two models, two optimizers, the GradScaler, every rank's own noise (RNG), the random crops
# and flips of its real images, the weights' moving averages (trainer.ema) and the callbacks' states (the loss
# guard's running means, a step counter of the test's own) must all come back for the resumed run to match.
# 8 micro-batches per epoch,
# a checkpoint every 3 optimizer steps: the worker killed at micro-batch 20 (epoch 3) resumes from the mid-epoch
# checkpoint of step 18, 2 batches into epoch 3, with the epoch's partial sums.
EXACT = [
    "experiment=digits_gan",
    "trainer.max_epochs=4",
    "trainer.limit_train_batches=8",
    "trainer.precision=16-mixed",
    "checkpoint.every_n_steps=3",
    "failure.max_failures=1",
    "task._target_=tests.helpers.tasks.CrashOnceGAN",
    "+task.at_step=20",
    "+task.after=step_00000018",  # killed once Ray has counted that checkpoint
    "trainer.augment.random_crop_padding=1",
    "trainer.augment.horizontal_flip=true",
    "trainer.ema.decay=0.5",
    "callbacks=[lr_monitor,loss_guard]",
    "callbacks.loss_guard.spike_factor=1000",
    "+callbacks.counter._target_=tests.helpers.callbacks.StepCounter",
]
RESUMED_AFTER = 18


def epochs(run_dir):
    return [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def max_difference(a, b):
    """Largest absolute difference between two model.pt files ({name: state_dict} for several models)."""
    return max((a[name][k].float() - b[name][k].float()).abs().max().item() for name in a for k in a[name])


def trained_batches(record, rank):
    """The batches a rank trained, in order, grouped by attempt (worker process): lists of per-sample md5s."""
    attempts = {}
    for line in (record / f"rank{rank}.jsonl").read_text().splitlines():
        entry = json.loads(line)
        attempts.setdefault(entry["pid"], []).append(entry["samples"])
    return list(attempts.values())


def assert_every_hook_in_the_loops_order(log):
    """Rank 0's hooks of a 4-epoch run of 8 steps each, a checkpoint every 3 steps: each optimizer step once, a
    mid-epoch checkpoint right after every third step, and per epoch its start, validation, checkpoint and end."""
    assert log[0] == "run_start 1" and log[-1] == "run_end completed", log
    assert [int(line.split()[1]) for line in log if line.startswith("step ")] == list(range(1, 33))
    saved = [int(log[i - 1].split()[1]) for i, line in enumerate(log) if line.startswith("checkpoint step_")]
    assert saved and all(step % 3 == 0 for step in saved), log
    assert [line for line in log if line.split()[0] in ("epoch_start", "validation_end", "epoch_end")] == [
        f"{hook} {epoch}" for epoch in range(1, 5) for hook in ("epoch_start", "validation_end", "epoch_end")
    ]
    epoch_saves = [i for i, line in enumerate(log) if line.startswith("checkpoint epoch_")]
    assert [log[i] for i in epoch_saves] == [f"checkpoint epoch_{epoch:04d}" for epoch in range(1, 5)]
    assert all(log[i - 1].startswith("validation_end") and log[i + 1].startswith("epoch_end") for i in epoch_saves)


@pytest.mark.long("a kill/resume variant: a killed worker resumed exactly in the gate is test_text's LoRA run")
def test_a_worker_killed_mid_epoch_resumes_and_ends_exactly_like_an_uninterrupted_run(ray_address, tmp_path):
    """The crashed run also logs to W&B (offline): its two attempts must be one W&B run."""
    (tmp_path / "no_crash").touch()
    for record in ("record_a", "record_b"):
        (tmp_path / record).mkdir()
    hooks = (  # rank 0 writes down each hook it is called at
        "+callbacks.hooks._target_=tests.helpers.callbacks.HookLog",
        f"+callbacks.hooks.path={tmp_path / 'hooks.log'}",
    )
    uninterrupted = train(
        compose_config(
            *EXACT, f"+task.marker={tmp_path / 'no_crash'}", f"+task.record={tmp_path / 'record_a'}", *hooks
        ),
        run_dir=str(tmp_path / "a"),
    )
    assert_every_hook_in_the_loops_order((tmp_path / "hooks.log").read_text().splitlines())
    crashed = train(
        compose_config(
            *EXACT,
            f"+task.marker={tmp_path / 'crashed'}",
            f"+task.record={tmp_path / 'record_b'}",
            "logger=wandb",
            "logger.wandb.mode=offline",
            "+callbacks.reports._target_=tests.helpers.callbacks.ReportsSeen",  # a Ray Train callback: the driver's
            f"+callbacks.reports.path={tmp_path / 'reports.jsonl'}",
        ),
        run_dir=str(tmp_path / "b"),
    )
    assert (tmp_path / "crashed").exists()  # the worker really was killed
    # Each rank trained exactly the uninterrupted run's batches: its first attempt's up to the mid-epoch
    # checkpoint, then the rest of epoch 3 (no batch twice, none skipped) and epoch 4.
    whole = {rank: trained_batches(tmp_path / "record_a", rank)[0] for rank in (0, 1)}
    for rank in (0, 1):
        first, second = trained_batches(tmp_path / "record_b", rank)
        assert len(first) > RESUMED_AFTER and first[:RESUMED_AFTER] + second == whole[rank]
    # A batch is the sampler's samples, cropped and flipped on the worker: rank 0's first one, rebuilt here.
    images = digits().train.tensors[0]
    sampler = ShardedSampler(len(images), 2, 0, seed=0)
    expected = Augment(1, True, seed=0)(images[sampler.indices()[:32]], 0, 2 * torch.arange(32))
    assert whole[0][0] == [hashlib.md5(image.numpy().tobytes()).hexdigest() for image in expected]
    assert whole[0][0] != [hashlib.md5(image.numpy().tobytes()).hexdigest() for image in images[sampler.indices()[:32]]]
    for epoch in range(4):  # and each epoch's samples are distinct: every sample seen once in an epoch
        samples = [s for rank in (0, 1) for batch in whole[rank][8 * epoch : 8 * (epoch + 1)] for s in batch]
        assert len(samples) == len(set(samples)) == 8 * 64
    assert crashed["final"]["step"] == uninterrupted["final"]["step"] == 4 * 8  # optimizer steps
    [failure] = crashed["failures"]
    assert failure["retried"] is True and failure["why"] == "a worker process died", failure
    attempts = sorted((tmp_path / "b").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(attempts) == 2 and len({run.name for run in attempts}) == 1  # a resumed run continues the same W&B run
    assert epochs(tmp_path / "b") == [1, 2, 3, 4]
    # The callbacks ran on the workers and their states resumed: the counter went on from step 18's checkpoint
    # (each epoch's count is the run's step), the loss guard's running means are the uninterrupted run's.
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [row["counted_steps"] for row in rows] == [row["step"] for row in rows] == [8, 16, 24, 32]
    assert all(row["lr_generator"] == row["lr_discriminator"] == 5e-4 for row in rows), rows[-1]  # both Adams
    guards = [
        torch.load(next((tmp_path / run).glob("ray_storage/*/epoch_0004")) / "train_state.pt", weights_only=True)
        for run in ("a", "b")
    ]
    means = [state["callbacks"]["loss_guard"]["means"] for state in guards]
    assert set(means[0]) == {"loss_d", "loss_g"} and guards[1]["callbacks"]["loss_guard"]["checks"] == 32
    assert all(abs(means[0][name] - means[1][name]) <= 1e-6 for name in means[0]), means
    # The driver's Ray Train callback saw every report once, the failure between epochs 2 and 3 (Ray's controller
    # keeps its callbacks across the restart), and the mid-epoch checkpoints' reports (steps 3, 6, ..., 18 at least)
    seen = [json.loads(line) for line in (tmp_path / "reports.jsonl").read_text().splitlines()]
    step = {"epoch": None, "checkpoint": True}
    assert [e.get("epoch") or "failed" for e in seen if e != step] == [1, 2, "failed", 3, 4], seen
    assert sum(e == step for e in seen) >= 6, seen
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    assert set(a) == {"generator", "discriminator"} and max_difference(a, b) <= 1e-6
    # model.pt is the moving average of the weights; the last checkpoint keeps the raw ones, which trained on
    (last,) = sorted((tmp_path / "b").glob("ray_storage/*/epoch_0004"))
    kept = torch.load(last / "train_state.pt", weights_only=True)["ema"]
    assert kept["n_averaged"] == {"generator": 32, "discriminator": 32} and max_difference(a, kept["raw"]) > 1e-6
    for name in ("train_loss_d", "train_loss_g", "val_loss_d", "val_loss_g", "val_d_real"):
        assert abs(uninterrupted["final"][name] - crashed["final"][name]) <= 1e-6
    # The GAN trained: its discriminator tells real from generated, and each epoch left a sample grid.
    assert crashed["final"]["val_d_real"] > crashed["final"]["val_d_fake"]
    assert sorted(p.name for p in (tmp_path / "b" / "samples").glob("*.png")) == [
        f"epoch_{n:04d}.png" for n in range(1, 5)
    ]
    models = load_model(str(tmp_path / "b"))  # both models, rebuilt from the run dir alone
    assert models["generator"](torch.randn(5, 32)).shape == (5, 1, 8, 8)


def start_driver(args, cwd, output):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    return subprocess.Popen(
        [sys.executable, "-m", "hydra_raytrain", *args], cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT
    )


def wait_for(condition, driver, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and driver.poll() is None:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not reached in {timeout} s (driver exit code {driver.poll()})")


def step_checkpoints(tmp_path):
    return sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("outputs/runs/*/ray_storage/*/step_*"))


def counted_when_the_run_ended(run_dir, timeout=60):
    """The step of the newest checkpoint Ray had counted for a run whose driver was killed, read from Ray's own
    record in storage once the run's workers have gone (their CPUs free again): what a resume must start from."""
    deadline = time.time() + timeout
    while ray.available_resources().get("CPU", 0) < TEST_CLUSTER_CPUS and time.time() < deadline:
        time.sleep(0.2)
    [snapshot] = run_dir.glob("ray_storage/*/checkpoint_manager_snapshot.json")
    latest = json.loads(snapshot.read_text())["latest_checkpoint_result"]
    return int(latest["checkpoint_dir_name"].removeprefix("step_"))


def test_sigterm_preempts_and_a_killed_driver_resumes_mid_epoch_when_the_same_command_runs_again(
    ray_address, tmp_path, capsys
):
    """23 optimizer steps per epoch (digits, 2 workers), a checkpoint every 4. SIGTERM mid-epoch 2: checkpoint,
    status preempted, exit code 75. The same command resumes there; SIGKILL it mid-epoch 3; the same command
    resumes from that epoch's last step checkpoint and ends (epoch 3) with the uninterrupted run's steps and weights."""
    args = [
        f"ray.address={ray_address}",
        "trainer.max_epochs=3",
        "checkpoint.every_n_steps=4",
        "checkpoint.checkpoint_score_attribute=val_accuracy",  # mid-epoch checkpoints get a finite worst score
        "task._target_=tests.helpers.tasks.Slow",
        "+task.seconds_per_batch=0.1",
    ]
    with open(tmp_path / "preempted.txt", "w") as output:
        driver = start_driver(args, tmp_path, output)
        metrics = wait_for(lambda: next(tmp_path.glob("outputs/runs/*/metrics.jsonl"), None), driver)
        driver.send_signal(signal.SIGTERM)  # in epoch 2: the first epoch's row is written at its end
        assert driver.wait(timeout=60) == 75
    run_dir, printed = metrics.parent, (tmp_path / "preempted.txt").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["preempted_by"] == "SIGTERM", printed[-3000:]
    assert epochs(run_dir) == [1]
    preempted_at = int(printed.split("Preempted (SIGTERM) after optimizer step ")[1].split(":")[0])
    assert 23 < preempted_at < 46 and preempted_at in step_checkpoints(tmp_path)  # nothing trained after it

    with open(tmp_path / "killed.txt", "w") as output:
        driver = start_driver(args, tmp_path, output)  # the identical command resumes the preempted run
        wait_for(lambda: [s for s in step_checkpoints(tmp_path) if s >= 52], driver)  # epoch 3: steps 47-69
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    killed_at = counted_when_the_run_ended(run_dir)
    with capsys.disabled():  # shown in the test's output (this test reads what the commands print through capsys)
        print(f"killed at step {killed_at}")
    assert 46 < killed_at <= 69 and killed_at % 4 == 0, killed_at  # a checkpoint of epoch 3's
    printed = (tmp_path / "killed.txt").read_text()
    assert f"Resuming from checkpoint step_{preempted_at:08d}: epoch 2, after batch {preempted_at - 23}/23" in printed
    assert epochs(run_dir) == [1, 2] and json.loads((run_dir / "summary.json").read_text())["status"] == "preempted"

    done = run_cli(args, cwd=str(tmp_path))  # the identical command
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Run dir: {run_dir}" in done.stdout  # the same run dir, found from the config alone
    assert f"Resuming from checkpoint step_{killed_at:08d}: epoch 3, after batch {killed_at - 46}/23" in done.stdout
    assert "epoch 1/3" not in done.stdout and "epoch 2/3" not in done.stdout
    assert epochs(run_dir) == [1, 2, 3]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final"]["step"] == 3 * 23
    # The same weights as a run never interrupted (the same training without the sleeps).
    uninterrupted = train(compose_config(*args[1:-1], "+task.seconds_per_batch=0"), run_dir=str(tmp_path / "whole"))
    assert uninterrupted["final"]["step"] == 3 * 23
    a = torch.load(tmp_path / "whole" / "model.pt", weights_only=True)
    b = torch.load(run_dir / "model.pt", weights_only=True)
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) <= 1e-6

    # A finished run is reported, not retrained; a logger added to it (loggers are not part of its identity) gets
    # its epochs from metrics.jsonl.
    capsys.readouterr()
    train(compose_config(*args, "logger=tensorboard"), run_dir=str(run_dir))
    logged = capsys.readouterr().out
    assert "Run already complete: 3 epochs" in logged and epochs(run_dir) == [1, 2, 3]
    assert "Logged the finished run's 3 epochs (metrics.jsonl) to: tensorboard" in logged
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert read_scalars(run_dir / "tensorboard")["val_accuracy"] == [
        (m["epoch"], pytest.approx(m["val_accuracy"], rel=1e-6)) for m in history
    ]
    assert json.loads((run_dir / "summary.json").read_text())["loggers"] == ["tensorboard"]
    train(compose_config(*args, "logger=tensorboard"), run_dir=str(run_dir))
    once_more = capsys.readouterr().out
    assert "Run already complete" in once_more and "Logged the finished run" not in once_more
    assert len(list((run_dir / "tensorboard").iterdir())) == 1


@pytest.mark.long("a mid-epoch resume variant: the SIGTERM test in the gate checkpoints every 4 steps")
def test_every_n_minutes_checkpoints_mid_epoch_and_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
    ray_address, tmp_path
):
    """12 optimizer steps of 0.1 s or more, a checkpoint every 0.3 s (every_n_minutes=0.005) stored synchronously:
    rank 0's clock decides, every rank checkpoints at the same step (one step after rank 0 saw it due). Then the
    newest checkpoint (the epoch's) is truncated, as by a crash mid-copy: the run, continued to 2 epochs, resumes
    from the newest mid-epoch checkpoint before it."""
    shared = [
        f"storage.path={tmp_path / 'storage'}",
        "storage.name=shared",
        "trainer.limit_train_batches=12",
        "trainer.limit_val_batches=2",
        "task._target_=tests.helpers.tasks.Slow",
        "+task.seconds_per_batch=0.1",
        "checkpoint.every_n_minutes=0.005",
        "checkpoint.checkpoint_upload_mode=SYNC",
    ]
    summary = train(compose_config(*shared, "trainer.max_epochs=1"), run_dir=str(tmp_path / "first"))
    assert summary["status"] == "completed" and epochs(tmp_path / "first") == [1]  # mid-epoch reports: no rows
    steps = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "storage" / "shared").glob("step_*"))
    assert len(steps) >= 2 and all(b - a >= 2 for a, b in zip(steps, steps[1:], strict=False)), steps
    for step in steps:  # complete: every rank's share
        files = {p.name for p in (tmp_path / "storage" / "shared" / f"step_{step:08d}").iterdir()}
        assert {"model.pt", "train_state.pt", "rng_rank0.pt", "rng_rank1.pt"} <= files

    newest = tmp_path / "storage" / "shared" / "epoch_0001" / "model.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    summary = train(compose_config(*shared, "trainer.max_epochs=2"), run_dir=str(tmp_path / "second"))
    assert summary["status"] == "completed" and summary["final"]["step"] == 2 * 12
    log = (tmp_path / "second" / "driver.log").read_text()
    assert f"Resuming from checkpoint step_{steps[-1]:08d}: epoch 1, after batch {steps[-1]}/12" in log, log[-3000:]
    assert "epoch_0001 cannot be loaded" in log and epochs(tmp_path / "second") == [1, 2]


def test_an_error_that_would_repeat_is_not_retried_and_the_summary_says_why(ray_address, tmp_path):
    """A shape mismatch in the training step, with 3 retries allowed: one attempt, not four (on 1 worker: the
    failure is classified per worker, so a second one adds nothing but its start-up)."""
    overrides = ("debug=smoke", "scaling.num_workers=1", "failure.max_failures=3")
    with pytest.raises(TrainingFailed) as caught:
        train(compose_config(*overrides, "task._target_=tests.helpers.tasks.ShapeMismatch"), run_dir=str(tmp_path))
    message = str(caught.value)
    assert "worker 0: RuntimeError: mat1 and mat2 shapes cannot be multiplied" in message, message
    assert "not retried: worker 0's error would repeat (matches failure.not_retried" in message
    assert "Traceback" not in (tmp_path / "driver.log").read_text()  # said once, by the driver's last line
    summary = json.loads((tmp_path / "summary.json").read_text())
    [failure] = summary["failures"]  # a retry would have failed again, and been recorded
    assert summary["status"] == "failed" and failure["retried"] is False
    assert "shapes cannot be multiplied" in failure["errors"]["0"]


@pytest.mark.long("a callback variant: the callbacks page's runs are in the gate (test_docs)")
def test_the_loss_guard_stops_a_diverging_run_at_once_and_says_where(ray_address, tmp_path):
    """Adam at a learning rate of 1e20: the weights overflow at the first step, the loss with them. With 2 retries
    allowed, the run stops at the guard's first check of a bad loss, and is not retried."""
    overrides = ("debug=smoke", "failure.max_failures=2", "callbacks=loss_guard", "optimizer.lr=1e20")
    reports = (  # a driver's callback sees the failure that ends the run; rank 0's hooks are written down
        "+callbacks.reports._target_=tests.helpers.callbacks.ReportsSeen",
        f"+callbacks.reports.path={tmp_path / 'reports.jsonl'}",
        "+callbacks.hooks._target_=tests.helpers.callbacks.HookLog",
        f"+callbacks.hooks.path={tmp_path / 'hooks.log'}",
    )
    with pytest.raises(TrainingFailed) as caught:
        train(compose_config(*overrides, *reports), run_dir=str(tmp_path / "run"))
    message = str(caught.value)
    assert re.search(r"worker \d: StopTraining: the training loss is (nan|inf) at epoch 1, optimizer step 2:", message)
    assert "lower optimizer.lr" in message and "not retried: a callback of worker" in message, message
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    [failure] = summary["failures"]
    assert summary["status"] == "failed" and failure["retried"] is False and summary["epochs_completed"] == 0
    # Both ranks stop alike (the unit tests show it); Ray hands over the errors it has collected when it looks
    [seen] = [json.loads(line) for line in (tmp_path / "reports.jsonl").read_text().splitlines()]
    # The guard came first, so the log's step 2 never came; on_run_end was told the run failed
    log = (tmp_path / "hooks.log").read_text().splitlines()
    assert log == ["run_start 1", "epoch_start 1", "step 1", "run_end failed"], log
    assert seen["failed"] == sorted(int(rank) for rank in failure["errors"]) and seen["failed"], (seen, failure)


RETAINED = [
    "trainer.max_epochs=5",
    "trainer.limit_train_batches=3",
    "checkpoint.num_to_keep=2",
    "checkpoint.checkpoint_score_attribute=val_accuracy",
    "checkpoint.checkpoint_score_order=max",
]


@pytest.fixture(scope="module")
def retained_run(ray_address, tmp_path_factory):
    """A 5-epoch run keeping its 2 best checkpoints (and the latest): the retention test's, and the warm
    starts' source."""
    run_dir = tmp_path_factory.mktemp("retained")
    return run_dir, train(compose_config(*RETAINED), run_dir=str(run_dir))


def test_top_k_retention_keeps_the_best_and_the_latest_and_no_rank_leaves_a_staging_folder(retained_run):
    tmp_path, summary = retained_run
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    best_two = sorted(history, key=lambda m: m["val_accuracy"], reverse=True)[:2]
    expected = {f"epoch_{m['epoch']:04d}" for m in best_two} | {"epoch_0005"}  # Ray never deletes the latest
    kept = {p.name for p in (tmp_path / "ray_storage").glob("*/epoch_*")}
    assert kept == expected, (kept, [(m["epoch"], m["val_accuracy"]) for m in history])
    assert os.path.isdir(summary["storage"])
    name, ranks = os.path.basename(summary["storage"]), range(history[-1]["world_size"])
    staged = [staging_folder(name, str(tmp_path), rank) for rank in ranks]
    assert len(staged) == 2 and not any(map(os.path.exists, staged))  # each rank's, once its last upload was stored


def test_load_model_and_evaluate_reproduce_the_reported_metrics(retained_run):
    from hydra_raytrain import evaluate, load_model

    tmp_path, summary = retained_run
    for path in (tmp_path, tmp_path / "ray_storage" / os.path.basename(summary["storage"]) / "epoch_0005"):
        model = load_model(str(path))  # a run dir, then its latest checkpoint
        assert model(torch.zeros(1, 1, 8, 8)).shape == (1, 10) and not model.training
        metrics = evaluate(str(path))
        for name in ("val_loss", "val_accuracy"):
            assert abs(metrics[name] - summary["final"][name]) <= 1e-5
        assert json.loads((path / "evaluation.json").read_text()) == metrics


# A warm start trained with a learning rate of 0 keeps the weights it started from: its epoch shows them.
WARM = ["trainer.max_epochs=1", "trainer.limit_train_batches=1", "optimizer.lr=0"]


def test_a_warm_start_from_a_run_dir_starts_from_its_weights(retained_run, tmp_path):
    """The 2-worker run's weights, read in Ray Train's local mode: what is read does not depend on Ray."""
    source, finished = retained_run
    summary = train(compose_config(*WARM, f"run.init_from={source}", "scaling.num_workers=0"), run_dir=str(tmp_path))
    assert summary["status"] == "completed" and summary["epochs_completed"] == 1  # a new run: its own identity
    assert f"Starting from run.init_from={source}: " in (tmp_path / "driver.log").read_text()
    a = torch.load(source / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "model.pt", weights_only=True)
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0
    # One process sums the validation in another order than two workers' all-reduce: float32's accuracy.
    assert summary["final"]["val_loss"] == pytest.approx(finished["final"]["val_loss"], rel=1e-6)


def test_a_warm_start_from_a_checkpoint_can_take_the_optimizer_state(retained_run, tmp_path):
    source, _ = retained_run
    [checkpoint] = source.glob("ray_storage/*/epoch_0005")
    warm = (*WARM, f"run.init_from={checkpoint}", "run.init_optimizer=true", "scaling.num_workers=1")
    train(compose_config(*warm), run_dir=str(tmp_path))
    assert "weights and the optimizer state" in (tmp_path / "driver.log").read_text()
    [warm] = tmp_path.glob("ray_storage/*/epoch_0001")
    before = torch.load(checkpoint / "train_state.pt", weights_only=True)["optimizers"]["model"]
    after = torch.load(warm / "train_state.pt", weights_only=True)["optimizers"]["model"]
    steps = {name: float(state["step"]) for name, state in after["state"].items()}
    assert set(steps.values()) == {5 * 3 + 1}  # Adam's step counts went on from the source's 15
    assert after["param_groups"][0]["lr"] == 0 and before["param_groups"][0]["lr"] == 0.002  # our lr, its state
