"""Training switches on the session's real local Ray cluster: each one correct under DDP, not just present."""

import json

import pytest
import torch

from hydra_raytrain import train
from hydra_raytrain.recipe.metrics import should_stop
from tests.conftest import compose_config

pytestmark = pytest.mark.integration


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# An MLP without batch norm or dropout, SGD with momentum, clipping, a warm-up and a cosine schedule. 29 full
# global batches of 48 per epoch (1,437 training images: the 30th would be partial, and padded differently
# for different worker counts).
SAME_RESULT = ["model=mlp", "optimizer=sgd", "scheduler=cosine", "scheduler.warmup_steps=10", "trainer.gradient_clip_val=1.0",
               "trainer.max_epochs=2", "trainer.seed=3"]
COMPARED = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr")


def test_the_result_does_not_depend_on_the_worker_count_accumulation_or_the_day(ray_address, tmp_path):
    """At a fixed global batch, 1, 2 and 3 workers, and 2 workers accumulating 2 micro-batches of 12, give the
    same metrics and weights (to 1e-4); the same command twice gives them again."""
    runs = {
        "1 worker": ["scaling.num_workers=1", "trainer.batch_size=48", "trainer.limit_train_batches=29"],
        "2 workers": ["scaling.num_workers=2", "trainer.batch_size=48", "trainer.limit_train_batches=29"],
        "3 workers": ["scaling.num_workers=3", "trainer.batch_size=48", "trainer.limit_train_batches=29"],
        "2 workers x 2 micro-batches": ["scaling.num_workers=2", "trainer.batch_size=24", "trainer.accumulate_grad_batches=2",
                                        "trainer.limit_train_batches=58"],
        "2 workers again": ["scaling.num_workers=2", "trainer.batch_size=48", "trainer.limit_train_batches=29"],
    }
    results = {}
    for label, overrides in runs.items():
        run_dir = tmp_path / label.replace(" ", "_")
        train(compose_config(*SAME_RESULT, *overrides), run_dir=str(run_dir))
        results[label] = (read_metrics(run_dir), torch.load(run_dir / "model.pt", weights_only=True))

    reference_history, reference_weights = results["1 worker"]
    assert [m["epoch"] for m in reference_history] == [1, 2]
    assert reference_history[-1]["val_accuracy"] > reference_history[0]["val_accuracy"] - 0.05  # it trains
    for label, (history, weights) in results.items():
        assert [m["world_size"] for m in history] == [int(label[0])] * 2, label
        for ours, reference in zip(history, reference_history, strict=True):
            for name in COMPARED:
                assert ours[name] == pytest.approx(reference[name], abs=1e-4), (label, ours["epoch"], name)
        assert max((weights[k] - reference_weights[k]).abs().max().item() for k in weights) <= 1e-4, label
    again, first = results["2 workers again"], results["2 workers"]
    assert [m["val_loss"] for m in again[0]] == [m["val_loss"] for m in first[0]]  # bit for bit
    for metrics in results["3 workers"][0]:
        # 359 validation images over 3 unpadded shards: each counted once, so accuracy is k/359 exactly.
        correct = metrics["val_accuracy"] * 359
        assert abs(correct - round(correct)) < 1e-6


def test_bf16_with_the_speed_worker_and_profiling_switches(ray_address, tmp_path):
    probe = tmp_path / "probe.json"
    summary = train(compose_config(
        "trainer.precision=bf16-mixed", "trainer.channels_last=true", "trainer.compile=true", "trainer.compile_kwargs={backend: aot_eager}",
        "trainer.profile=true", "trainer.profiler_steps=3", "trainer.max_epochs=6",
        "scaling.worker_env={HYDRA_RAYTRAIN_PROBE: from-the-config}",
        "trainer.parallel_strategy_kwargs={find_unused_parameters: true, bucket_cap_mb: 1}",
        "task._target_=tests.helpers.tasks.Probe", f"+task.path={probe}", "+task.variable=HYDRA_RAYTRAIN_PROBE",
    ), run_dir=str(tmp_path))
    history = read_metrics(tmp_path)
    assert history[-1]["train_loss"] < history[0]["train_loss"] and summary["final"]["val_accuracy"] >= 0.95
    seen = json.loads(probe.read_text())
    assert seen == {"env": "from-the-config", "wrapper": "DistributedDataParallel", "find_unused_parameters": True,
                    "bucket_bytes_cap": 1024 * 1024, "channels_last": True, "compiled": True}
    for metrics in history:  # the per-epoch time breakdown, and it accounts for most of the epoch
        phases = [metrics[f"time_{phase}"] for phase in ("data", "forward", "backward", "optimizer")]
        assert all(seconds > 0 for seconds in phases) and sum(phases) <= metrics["epoch_seconds"]
    (trace,) = (tmp_path / "profiler").glob("rank0_*.json")
    assert json.loads(trace.read_text())["traceEvents"]


def test_fp16_trains_to_the_bar_and_stops_early(ray_address, tmp_path):
    summary = train(compose_config(
        "model=mlp", "trainer.precision=16-mixed", "trainer.max_epochs=40",
        "trainer.early_stopping.patience=2", "trainer.early_stopping.min_delta=0.003",
    ), run_dir=str(tmp_path))
    history = read_metrics(tmp_path)
    scores = [m["val_accuracy"] for m in history]
    assert summary["status"] == "completed" and summary["stopped_early"] and len(history) < 40
    assert should_stop(scores, "max", 2, 0.003) and not should_stop(scores[:-1], "max", 2, 0.003)  # stopped at the first chance
    assert summary["best"]["val_accuracy"] >= 0.95 and history[-1]["train_loss"] < history[0]["train_loss"]
    assert (tmp_path / "model.pt").stat().st_size > 0
