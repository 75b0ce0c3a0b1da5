"""Training switches on the session's real local Ray cluster: each one correct under DDP, not just present."""

import json
import os

import pytest
import torch

from hydra_raytrain import train
from hydra_raytrain.recipe.metrics import should_stop
from tests.conftest import compose_config
from tests.helpers.same_result import GLOBAL_48, SAME_RESULT

pytestmark = pytest.mark.integration


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


COMPARED = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr")
RUNS = {
    "1 process": ["scaling.num_workers=0", *GLOBAL_48],  # Ray Train's local mode: no DDP, no cluster
    "2 workers": ["scaling.num_workers=2", *GLOBAL_48],
    "3 workers": ["scaling.num_workers=3", *GLOBAL_48],
    "2 workers x 2 micro-batches": [
        "scaling.num_workers=2",
        "trainer.batch_size=24",
        "trainer.accumulate_grad_batches=2",
        "trainer.limit_train_batches=58",
    ],
}
# float64 keeps ~16 digits: the reduction orders of 1, 2 or 3 ranks (gloo's sums) and of accumulation move the
# result by a few ulps, measured <= 1e-15 after 58 steps; asserted to 1e-9. float32 keeps ~7 digits, and a rounding
# that puts a ReLU's input on the other side of 0 changes a gradient by a finite amount: measured on AMD EPYC,
# 3 workers in float32 ended 4e-4 (weights), 1.4e-4 (val_loss) and 2 of 359 validation images from the float64
# result, where 1 worker stayed within 1.2e-7 (on the Intel machines that wrote the old 1e-4 test, 3 workers stayed
# within it). The float32 bound, 2e-2, is 50x that weight gap and 7 images; the exactness claim is float64's.
TOLERANCE = {"64": 1e-9, "32": 2e-2}
# The reference's validation accuracy after its 58 steps at least (measured 0.3955: SGD still warming up, and what
# the exactness needs is weights that move, not a good model); weights that never moved score chance, 0.1.
TRAINED = 0.3


def _difference(run, reference):
    (history, weights), (reference_history, reference_weights) = run, reference
    metrics = max(
        abs(ours[name] - theirs[name])
        for ours, theirs in zip(history, reference_history, strict=True)
        for name in COMPARED
    )
    return metrics, max((weights[k].double() - reference_weights[k].double()).abs().max().item() for k in weights)


@pytest.mark.long("exactness over workers and accumulation in the gate: test_text's loss test")
@pytest.mark.slow
@pytest.mark.workers
def test_the_result_does_not_depend_on_the_worker_count_accumulation_or_the_day(ray_address, ddp_float64_run, tmp_path):
    """At a fixed global batch, in float64: one process without DDP (Ray Train's local mode), 2 and 3 workers, and
    2 workers accumulating 2 micro-batches of 12, give the same metrics and weights (to 1e-9). In float32 (the
    default), 3 workers give the float64 result to float32's accuracy, and the same run again, reading through
    DataLoaders instead of slicing data on the device, gives it bit for bit: the same batches, and a result that does
    not change from one run to the next."""
    runs = {(label, "64"): overrides for label, overrides in RUNS.items()}
    loaded = [*RUNS["3 workers"], "trainer.data_on_device=false"]
    runs.update({("3 workers", "32"): RUNS["3 workers"], ("3 workers through DataLoaders", "32"): loaded})
    results = {}
    for (label, precision), overrides in runs.items():
        run_dir = tmp_path / f"{label.replace(' ', '_')}-{precision}"
        if (label, precision) == ("2 workers", "64"):  # the session's run of this config (test_fsdp's too)
            run_dir, _ = ddp_float64_run
        else:
            train(compose_config(*SAME_RESULT, *overrides, f"trainer.precision={precision}"), run_dir=str(run_dir))
        results[label, precision] = (read_metrics(run_dir), torch.load(run_dir / "model.pt", weights_only=True))

    reference_history, reference_weights = results["1 process", "64"]
    assert [m["epoch"] for m in reference_history] == [1, 2]
    # It trains: a recipe whose weights never moved would agree with itself to the last bit, and score ~0.1.
    first, last = reference_history
    assert last["val_accuracy"] >= TRAINED and last["val_loss"] < first["val_loss"], reference_history
    assert all(w.dtype == torch.float64 for w in reference_weights.values())
    # The negative control: another seed (local mode too) ends far from the reference, where the agreements
    # below are to 1e-9: a comparison that cannot tell runs apart would pass those as well.
    another_seed = [*(o for o in SAME_RESULT if not o.startswith("trainer.seed=")), "trainer.seed=4", *GLOBAL_48]
    train(compose_config(*another_seed, "scaling.num_workers=0", "trainer.precision=64"), run_dir=str(tmp_path / "4"))
    other = (read_metrics(tmp_path / "4"), torch.load(tmp_path / "4" / "model.pt", weights_only=True))
    metrics, weights = _difference(other, (reference_history, reference_weights))
    print(f"another seed: max difference from the reference's metrics {metrics:.2e}, weights {weights:.2e}")
    assert metrics > 1e-3 and weights > 1e-2, (metrics, weights)
    for (label, precision), (history, weights) in results.items():
        assert [m["world_size"] for m in history] == [int(label[0])] * 2, label
        reference = results["1 process" if precision == "64" else "3 workers", "64"]
        metrics, weights = _difference((history, weights), reference)
        print(f"{label} float{precision}: max difference from float64 metrics {metrics:.2e}, weights {weights:.2e}")
        assert metrics <= TOLERANCE[precision] and weights <= TOLERANCE[precision], (label, precision, metrics, weights)
    loaded, resident = results["3 workers through DataLoaders", "32"], results["3 workers", "32"]
    assert [[m[k] for k in COMPARED] for m in loaded[0]] == [[m[k] for k in COMPARED] for m in resident[0]]
    assert all(torch.equal(loaded[1][k], resident[1][k]) for k in resident[1])  # bit for bit
    for precision in ("32", "64"):
        for metrics in results["3 workers", precision][0]:
            # 359 validation images over 3 unpadded shards: each counted once, so accuracy is k/359 exactly.
            correct = metrics["val_accuracy"] * 359
            assert abs(correct - round(correct)) < 1e-6


@pytest.mark.long("bf16 in the gate: test_fsdp's GAN; these switches: the gate's budget")
@pytest.mark.workers
def test_bf16_with_the_speed_worker_and_profiling_switches(ray_address, tmp_path):
    probe = tmp_path / "probe.json"
    summary = train(
        compose_config(
            "trainer.precision=bf16-mixed",
            "trainer.channels_last=true",
            "trainer.compile=true",
            "trainer.compile_kwargs={backend: aot_eager}",
            "trainer.profile=true",
            "trainer.profiler_steps=3",
            "trainer.max_epochs=6",
            "scaling.worker_env={HYDRA_RAYTRAIN_PROBE: from-the-config}",
            "trainer.parallel_strategy_kwargs={find_unused_parameters: true, bucket_cap_mb: 1}",
            "task._target_=tests.helpers.tasks.Probe",
            f"+task.path={probe}",
            "+task.variable=HYDRA_RAYTRAIN_PROBE",
        ),
        run_dir=str(tmp_path),
    )
    history = read_metrics(tmp_path)
    assert history[-1]["train_loss"] < history[0]["train_loss"] and summary["final"]["val_accuracy"] >= 0.95
    seen = json.loads(probe.read_text())
    assert seen.pop("pid") != os.getpid()  # in a Ray worker
    assert seen == {
        "env": "from-the-config",
        "wrapper": "DistributedDataParallel",
        "find_unused_parameters": True,
        "bucket_bytes_cap": 1024 * 1024,
        "channels_last": True,
        "compiled": True,
    }
    for metrics in history:  # the per-epoch time breakdown, and it accounts for most of the epoch
        phases = [metrics[f"time_{phase}"] for phase in ("data", "forward", "backward", "optimizer")]
        assert all(seconds > 0 for seconds in phases) and sum(phases) <= metrics["epoch_seconds"]
    (trace,) = (tmp_path / "profiler").glob("rank0_*.json")
    assert json.loads(trace.read_text())["traceEvents"]


def test_fp16_trains_to_the_bar_and_stops_early(tmp_path):
    """fp16's loss scaling and the stop at the first chance: nothing about Ray (every rank deciding alike is
    test_callbacks'), so in Ray Train's local mode."""
    summary = train(
        compose_config(
            "scaling.num_workers=0",
            "model=mlp",
            "trainer.precision=16-mixed",
            "trainer.max_epochs=40",
            "trainer.early_stopping.patience=2",
            "trainer.early_stopping.min_delta=0.003",
        ),
        run_dir=str(tmp_path),
    )
    history = read_metrics(tmp_path)
    scores = [m["val_accuracy"] for m in history]
    assert summary["status"] == "completed" and summary["stopped_early"] and len(history) < 40
    assert should_stop(scores, "max", 2, 0.003) and not should_stop(
        scores[:-1], "max", 2, 0.003
    )  # stopped at the first chance
    assert summary["best"]["val_accuracy"] >= 0.95 and history[-1]["train_loss"] < history[0]["train_loss"]
    assert (tmp_path / "model.pt").stat().st_size > 0
