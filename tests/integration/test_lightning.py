"""task=lightning on the real local cluster: a LightningModule trained by lightning.Trainer in two Ray Train
workers (RayDDPStrategy, gloo), resumed after a killed worker and after a preemption, stopped early, swept by
Ray Tune. (Its config errors: test_cli.py's bad inputs and tests/unit/test_lightning_config.py.)"""

import json
import os

import pytest
import torch
from hydra.utils import instantiate

from hydra_raytrain import evaluate, load_model, train
from hydra_raytrain.driver.run import TrainingFailed
from hydra_raytrain.inference.export import export
from hydra_raytrain.inference.predict import Predictor
from hydra_raytrain.inference.scoring import score
from hydra_raytrain.recipe.checkpoint import staging_folder
from hydra_raytrain.sweep.space import start_order
from tests.conftest import compose_config, run_cli
from tests.helpers.loggers import read_scalars
from tests.helpers.preempt import sigterm_once_written
from tests.helpers.wandb_files import wandb_runs

pytestmark = [pytest.mark.integration, pytest.mark.workers]

EPOCHS = 6  # the uninterrupted run's; the killed one stops after KILLED_EPOCHS (no LR schedule: the same epochs)
KILLED_EPOCHS = 4


def _history(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long("a kill/resume variant: Lightning in the gate is the BoringModel run and early stopping")
@pytest.mark.slow
def test_lightning_module_trains_to_the_bar_and_a_killed_worker_resumes_to_the_same_metrics(ray_address, tmp_path):
    """experiment=digits_lightning over 2 workers reaches the default run's bar, with the output contract. The
    same run with rank 1 SIGKILLed at the start of epoch 3 resumes from Lightning's epoch-2 checkpoint in Ray
    storage (weights, Adam's moments, epoch and step counters) and each epoch ends on the uninterrupted run's
    metrics. A checkpoint scores a test split, and the module exports and serves as it computes."""
    common = ("experiment=digits_lightning", "scaling.num_workers=2")
    plain = train(compose_config(*common, f"trainer.max_epochs={EPOCHS}"), run_dir=str(tmp_path / "plain"))
    assert plain["status"] == "completed" and plain["best"]["val_accuracy"] >= 0.95, plain  # dataset=digits' bar
    history = _history(tmp_path / "plain")
    assert [m["epoch"] for m in history] == list(range(1, EPOCHS + 1)) and history[-1]["world_size"] == 2
    steps = history[0]["step"]
    assert [m["step"] for m in history] == [steps * e for e in range(1, EPOCHS + 1)]
    for name in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr", "samples_per_second"):
        assert all(name in m for m in history), name
    for name in ("summary.json", "curves.png", "config.json"):
        assert (tmp_path / "plain" / name).stat().st_size > 0
    # model.pt is the module's state_dict: it loads into the configured module, which scores as the last epoch did.
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    module = instantiate(config["model"])
    module.load_state_dict(torch.load(tmp_path / "plain" / "model.pt", weights_only=True))
    evaluated = evaluate(str(tmp_path / "plain"))  # every one of the 359 validation digits once
    # Training's validation shards are padded to 180 each (Lightning's rule: every rank runs as many batches), so
    # one digit counted twice there: the two figures differ by at most one sample's share.
    assert abs(evaluated["val_accuracy"] - history[-1]["val_accuracy"]) <= 1 / 359, evaluated
    (last,) = (tmp_path / "plain" / "ray_storage").glob(f"*/epoch_{EPOCHS:04d}")  # a Lightning checkpoint folder
    assert evaluate(str(last)) == evaluated
    # Scoring a Lightning checkpoint: lightning.Trainer validates on the split, its val_ names as test_ for a test
    # split (this run held none out: the 180 rows are training rows here; what is checked is the path and names)
    tested = score(str(last), config, "val")
    held = {**config, "dataset": {**config["dataset"], "test_fraction": 0.1}}
    test = score(str(last), held, "test")
    assert set(test) == {"test_loss", "test_accuracy"} and test["test_accuracy"] >= 0.9 and tested == evaluated
    # Exported (ONNX, checked against the module) and served: serve's replicas compute what load_model does
    assert export(str(tmp_path / "plain"), "onnx")["max_abs_diff"] <= 1e-4
    x = torch.stack([instantiate(config["dataset"], _convert_="all").val[i][0] for i in range(4)])
    replica = Predictor(str(tmp_path / "plain"), [], config["dataset"])
    predictions, probabilities = replica.answer(replica.forward(x.numpy()))
    with torch.no_grad():
        expected = torch.softmax(load_model(str(tmp_path / "plain"))(x), dim=1)
    assert torch.allclose(torch.from_numpy(probabilities), expected, atol=1e-6)
    assert list(predictions) == expected.argmax(dim=1).tolist()

    killed = train(
        compose_config(
            *common,
            f"trainer.max_epochs={KILLED_EPOCHS}",
            "model._target_=tests.helpers.lit.CrashOnceLit",
            "model.net.hidden=128",  # set on the command line: the replaced target keeps its net
            f"+model.marker={tmp_path / 'crashed'}",
            "+model.at_epoch=3",
            "+model.after=epoch_0002",
            "failure.max_failures=1",
            "logger=[wandb,tensorboard]",
            "logger.wandb.mode=offline",
        ),
        run_dir=str(tmp_path / "killed"),
    )
    assert (tmp_path / "crashed").exists()
    log = (tmp_path / "killed" / "driver.log").read_text()
    assert f"Resuming from checkpoint epoch_0002: the start of epoch 3, optimizer step {2 * steps}" in log
    resumed = _history(tmp_path / "killed")
    assert [m["epoch"] for m in resumed] == list(range(1, KILLED_EPOCHS + 1))  # each epoch once
    [failure] = killed["failures"]
    assert failure["retried"] is True and failure["why"] == "a worker process died", failure
    # Our loggers, from rank 0: the resumed attempt continues the same W&B run; TensorBoard has each epoch once.
    attempts = wandb_runs(tmp_path / "killed")
    assert len(attempts) == 2 and len({run.name for run in attempts}) == 1
    scalars = read_scalars(tmp_path / "killed" / "tensorboard")
    assert sorted(step for step, _ in scalars["val_accuracy"]) == list(range(1, KILLED_EPOCHS + 1))
    # The same data order (the sampler's epoch) and no randomness after the weights' seeded start: every epoch of
    # the resumed run ends where the uninterrupted one's did, up to float rounding (measured: to the last bit).
    for before, after in zip(history, resumed, strict=False):
        for name in ("val_loss", "val_accuracy", "train_loss", "step"):
            assert after[name] == before[name], (name, after, before)


@pytest.mark.long("a sweep variant: ASHA in the gate is test_sweep's")
@pytest.mark.slow
def test_lightning_sweep_with_a_datamodule_and_asha_on_the_modules_metric(ray_address, tmp_path):
    """hydra/sweeper=ray_tune unchanged: two trials of a module fed by a LightningDataModule (Lightning's own
    DistributedSampler), ASHA on the module's val_accuracy. One at a time, in ASHA's seeded start order (seed 0
    keeps this list's order): the good learning rate sets the bar at the first rung, the hopeless one stops there."""
    assert start_order(range(2), shuffle=True, seed=0) == [0, 1]
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        "hydra.sweeper.scheduler=asha",
        "hydra.sweeper.max_concurrent_trials=1",
        f"ray.address={ray_address}",
        "experiment=digits_lightning",
        "+datamodule._target_=tests.helpers.lit.DigitsDataModule",
        "scaling.num_workers=1",
        "optimizer.lr=3e-3,1e-7",
        "trainer.max_epochs=3",
        "trainer.limit_train_batches=20",
        "hydra.sweep.dir=sweep",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    rows = {row["overrides"]: row for row in summary["trials"]}
    assert set(rows) == {"optimizer.lr=0.003", "optimizer.lr=1e-07"}, rows
    best = rows["optimizer.lr=0.003"]
    assert best["status"] == "completed" and best["epochs"] == 3 and summary["best"]["overrides"] == best["overrides"]
    assert best["best"] >= 0.8, best  # val_accuracy, as the module logged it
    hopeless = rows["optimizer.lr=1e-07"]
    assert (hopeless["status"], hopeless["epochs"]) == ("stopped", 1) and hopeless["best"] < 0.5, hopeless


@pytest.mark.long("a SIGTERM variant: preemption in the gate is test_resume's")
@pytest.mark.slow
def test_sigterm_preempts_a_lightning_run_and_running_it_again_resumes_it(ray_address, tmp_path):
    """SIGTERM to the driver (this process) in epoch 2 (23 optimizer steps per epoch, 0.1 s each): every worker
    stops at the same step, status preempted, epoch 2 neither reported nor checkpointed. The same config run again
    finds the run by its identity and resumes from Lightning's epoch-1 checkpoint in Ray storage."""
    overrides = (
        "experiment=digits_lightning",
        "trainer.max_epochs=2",
        "model._target_=tests.helpers.lit.SlowLit",
        "model.net.hidden=128",
        "+model.seconds_per_batch=0.1",
    )
    run_dir = tmp_path / "run"

    sigterm_once_written(run_dir / "metrics.jsonl")  # in epoch 2
    summary = train(compose_config(*overrides), run_dir=str(run_dir))
    assert summary["status"] == "preempted" and summary["preempted_by"] == "SIGTERM", summary
    assert [m["epoch"] for m in _history(run_dir)] == [1]
    summary = train(compose_config(*overrides), run_dir=str(run_dir))  # the same config again
    log = (run_dir / "driver.log").read_text()
    assert "Resuming from checkpoint epoch_0001: the start of epoch 2, optimizer step 23" in log
    assert [m["epoch"] for m in _history(run_dir)] == [1, 2]
    assert summary["status"] == "completed" and summary["final"]["step"] == 2 * 23


@pytest.mark.long("Lightning in the gate: the BoringModel run; early stopping: test_training_features' fp16 run")
def test_early_stopping_ends_the_run_on_a_checkpointed_epoch_and_no_staging_folder_is_left(ray_address, tmp_path):
    """trainer.early_stopping becomes Lightning's EarlyStopping, decided when validation ends: the epoch it stops on
    is the run's final one, checkpointed. Also: a datamodule with one worker, and trainer.lightning_kwargs."""
    summary = train(
        compose_config(
            "experiment=digits_lightning",
            "+datamodule._target_=tests.helpers.lit.DigitsDataModule",
            "scaling.num_workers=1",
            "optimizer.lr=1e-7",  # nothing is learned: no epoch improves val_accuracy by 0.1
            "trainer.max_epochs=5",
            "trainer.limit_train_batches=2",
            "trainer.early_stopping.patience=1",
            "trainer.early_stopping.min_delta=0.1",
            "+trainer.lightning_kwargs.num_sanity_val_steps=0",
            "checkpoint.every_n_epochs=3",  # epoch 2 is checkpointed only as the final one
        ),
        run_dir=str(tmp_path / "run"),
    )
    assert summary["status"] == "completed" and summary["stopped_early"] is True, summary
    assert [m["epoch"] for m in _history(tmp_path / "run")] == [1, 2]
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "ray_storage").glob("*/epoch_*"))
    assert checkpoints == ["epoch_0002"]
    staged = staging_folder(os.path.basename(summary["storage"]), str(tmp_path / "run"), 0)
    assert not os.path.exists(staged)  # removed once the last upload was stored, not left in the temp dir


@pytest.mark.long("a bad-input variant: the CLI's bad inputs are in the gate")
def test_a_datamodule_run_whose_module_logs_no_monitored_metric_stops_naming_trainer_monitor(ray_address, tmp_path):
    """A datamodule is not rehearsed on the driver (its data may download): the workers check trainer.monitor after
    the first epoch and stop the run with the config error, not retried."""
    cfg = compose_config(
        "experiment=digits_lightning",
        "model._target_=tests.helpers.lit.NoValidationMetric",
        "model.net.hidden=128",
        "+datamodule._target_=tests.helpers.lit.DigitsDataModule",
        "scaling.num_workers=1",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=2",
        "failure.max_failures=1",
    )
    with pytest.raises(TrainingFailed) as caught:
        train(cfg, run_dir=str(tmp_path))
    message = str(caught.value)
    assert "ConfigError" in message and "trainer.monitor='val_accuracy'" in message, message
    assert "NoValidationMetric logs no such metric" in message and "train_accuracy" in message, message
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and [f["retried"] for f in summary["failures"]] == [False], summary


def test_lightnings_own_demo_module_trains_unchanged_on_its_own_loaders_sharded_over_two_workers(ray_address, tmp_path):
    """``task=lightning model._target_=...BoringModel`` is the whole command: the module brings its loaders and logs
    nothing (its last epoch is the run's best)."""
    boring = "lightning.pytorch.demos.boring_classes.BoringModel"
    args = [f"ray.address={ray_address}", "task=lightning", f"model._target_={boring}", "trainer.max_epochs=2"]
    done = run_cli([*args, "hydra.run.dir=run"], cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "brings its own train_dataloader: it feeds the run (dataset=module)" in done.stderr
    assert "logs no validation metric" in done.stderr and "Traceback" not in done.stderr
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # RandomDataset(32, 64) in batches of 1: Lightning's DistributedSampler gives each of the 2 workers 32
    assert [(m["epoch"], m["step"], m["world_size"]) for m in history] == [(1, 32, 2), (2, 64, 2)]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["monitor"] == "epoch" and summary["best"]["epoch"] == 2
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["dataset"]["_target_"] == "hydra_raytrain.data.module_loaders"
