"""FSDP2 and activation checkpointing on the session's real local Ray cluster (CPU workers, gloo): the same result
as DDP, sharded checkpoints that resume after a killed worker and on another number of workers, memory shown."""

import json

import pytest
import torch
from hydra.utils import instantiate

from hydra_raytrain import evaluate, load_model, train
from hydra_raytrain.driver.run import TrainingFailed
from hydra_raytrain.inference.export import export
from hydra_raytrain.inference.predict import Predictor
from tests.conftest import compose_config, run_cli
from tests.helpers.same_result import GLOBAL_48, SAME_RESULT
from tests.integration.test_training_features import _difference, read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.workers, pytest.mark.slow]

FSDP = ["trainer.parallel_strategy=fsdp", "fsdp.shard_modules=[Linear]"]
FULL_RECOMPUTE = ["trainer.activation_checkpointing=full", "trainer.activation_checkpointing_modules=[Linear]"]
# 29 optimizer steps per epoch, a checkpoint every 10: rank 1 is SIGKILLed before its 40th batch (epoch 2), once
# step 30's checkpoint (one batch into epoch 2) is counted; the run resumes there.
CRASH = [
    "checkpoint.every_n_steps=10",
    "task._target_=tests.helpers.tasks.CrashOnce",
    "+task.at_step=40",
    "+task.after=step_00000030",
]
RUNS = {
    ("DDP", "64"): GLOBAL_48,
    ("DDP", "32"): GLOBAL_48,
    ("DDP, activations recomputed", "32"): [*GLOBAL_48, *FULL_RECOMPUTE],
    # Accumulating 2 micro-batches of 12 per worker: the same global batch of 48, gradients reduce-scattered once.
    ("FSDP", "32"): [
        *FSDP,
        "trainer.batch_size=24",
        "trainer.accumulate_grad_batches=2",
        "trainer.limit_train_batches=58",
    ],
    ("FSDP, a worker killed", "64"): [*GLOBAL_48, *FSDP, *CRASH, "failure.max_failures=1"],
}


@pytest.fixture(scope="module")
def runs(ray_address, ddp_float64_run, tmp_path_factory):
    """Each run of RUNS (2 workers, global batch 48): (metrics, model.pt, run dir)."""
    root = tmp_path_factory.mktemp("fsdp")
    results = {}
    for (label, precision), overrides in RUNS.items():
        run_dir = root / f"{label.replace(' ', '_').replace(',', '')}-{precision}"
        marker = f"+task.marker={root / f'crashed-{precision}'}"
        extra = [marker] if "task._target_=tests.helpers.tasks.CrashOnce" in overrides else []
        config = [
            *SAME_RESULT,
            "scaling.num_workers=2",
            *overrides,
            *extra,
            f"trainer.precision={precision}",
        ]
        if (label, precision) == ("DDP", "64"):  # the session's run of this config (test_training_features' too)
            run_dir, summary = ddp_float64_run
        else:
            summary = train(compose_config(*config), run_dir=str(run_dir))
        model = torch.load(run_dir / "model.pt", weights_only=True)
        results[label, precision] = {
            "metrics": read_metrics(run_dir),
            "model": model,
            "dir": run_dir,
            "summary": summary,
        }
    return results


def assert_resumed_from_step_30(run_dir):
    """The sharded mid-epoch checkpoint loaded: the resume started there, no checkpoint skipped as unloadable (an
    older one would reach the same float64 result, so the result alone cannot show it)."""
    log = (run_dir / "driver.log").read_text()
    assert "Resuming from checkpoint step_00000030: epoch 2, after batch 1/29, optimizer step 30" in log, log[-3000:]
    assert "cannot be loaded" not in log, log[-3000:]


def _compared(runs, a, b):
    return _difference((runs[a]["metrics"], runs[a]["model"]), (runs[b]["metrics"], runs[b]["model"]))


@pytest.mark.long("FSDP in the gate: the GAN in bf16; a killed worker: test_resume's GAN")
def test_fsdp_trains_to_ddps_result_and_resumes_exactly_after_a_killed_worker(runs):
    """float64: FSDP equals DDP to 1e-9 (and so the 1-worker run: test_training_features), through a worker killed
    mid-epoch and a resume from the sharded mid-epoch checkpoint. float32, FSDP accumulating 2 micro-batches: to
    1e-5."""
    killed = runs["FSDP, a worker killed", "64"]
    [failure] = killed["summary"]["failures"]
    assert failure["retried"] is True and failure["why"] == "a worker process died", failure
    assert [m["epoch"] for m in killed["metrics"]] == [1, 2]
    assert_resumed_from_step_30(killed["dir"])
    metrics, weights = _compared(runs, ("FSDP, a worker killed", "64"), ("DDP", "64"))
    print(f"FSDP float64 (killed, resumed) vs DDP: metrics {metrics:.1e}, weights {weights:.1e}")
    assert metrics <= 1e-9 and weights <= 1e-9
    assert [m["step"] for m in runs["FSDP", "32"]["metrics"]] == [29, 58]  # 58 micro-batches an epoch, 29 steps
    metrics, weights = _compared(runs, ("FSDP", "32"), ("DDP", "32"))
    print(f"FSDP float32 vs DDP: metrics {metrics:.1e}, weights {weights:.1e}")
    assert metrics <= 1e-5 and weights <= 1e-5


@pytest.mark.long("the same single-process property in the gate: tests/unit/test_parallel.py")
def test_activation_checkpointing_changes_nothing_in_the_result(runs):
    recomputed, plain = runs["DDP, activations recomputed", "32"], runs["DDP", "32"]
    assert [m["val_loss"] for m in recomputed["metrics"]] == [m["val_loss"] for m in plain["metrics"]]
    assert all(torch.equal(recomputed["model"][k], plain["model"][k]) for k in plain["model"])


@pytest.mark.long("FSDP in the gate: the GAN in bf16 (sharded units); bytes per rank: make bench-memory")
def test_each_fsdp_rank_holds_half_of_the_parameters_and_optimizer_state(runs):
    """The MLP's every sharded dimension is even: each of 2 ranks holds exactly half of what a DDP rank holds."""
    fsdp, ddp = runs["FSDP", "32"]["metrics"][-1], runs["DDP", "32"]["metrics"][-1]
    parameters = sum(w.numel() for w in runs["DDP", "32"]["model"].values())
    assert ddp["param_bytes"] == 4 * parameters and ddp["optimizer_state_bytes"] == 4 * parameters  # SGD momentum
    assert 2 * fsdp["param_bytes"] == ddp["param_bytes"]
    assert 2 * fsdp["optimizer_state_bytes"] == ddp["optimizer_state_bytes"]


@pytest.mark.long("FSDP in the gate: the GAN in bf16, its sharded models loaded and exported whole")
def test_a_sharded_checkpoint_holds_every_ranks_part_and_loads_as_a_whole(runs):
    run = runs["FSDP, a worker killed", "64"]
    [storage] = (run["dir"] / "ray_storage").iterdir()
    last = storage / "epoch_0002"
    assert not (last / "model.pt").exists()  # nothing gathered on rank 0
    assert sorted(p.name for p in (last / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert {p.name for p in storage.glob("step_*")} >= {"step_00000010", "step_00000020", "step_00000030"}
    for path in (run["dir"], last):  # the run dir's model.pt, and the sharded checkpoint read whole
        state = load_model(str(path)).state_dict()  # built as configured: float32, the float64 weights copied in
        assert all(torch.equal(state[k], run["model"][k].to(state[k].dtype)) for k in run["model"])
    scores = evaluate(str(last))
    assert abs(scores["val_loss"] - run["metrics"][-1]["val_loss"]) <= 1e-5  # evaluated in float32
    # What predict's actors and serve's replicas compute: the shards read whole, as load_model reads them
    config = json.loads((last / "config.json").read_text())
    x = torch.stack([instantiate(config["dataset"], _convert_="all").val[i][0] for i in range(4)])
    replica = Predictor(str(last), [], config["dataset"])
    with torch.no_grad():
        assert torch.allclose(replica.forward(x.numpy()), load_model(str(last))(x).float(), atol=1e-6)


@pytest.mark.long("a resume variant: resume is test_resume's in the gate, FSDP the GAN in bf16")
def test_a_sharded_checkpoint_resumes_on_another_number_of_workers(runs, tmp_path):
    """A pinned run name and storage: the 2-worker run's worker is killed (no retry), the same run re-run with 3
    workers reshards step 30's checkpoint and ends where the uninterrupted run ends (float64, to 1e-9)."""
    shared = [
        *SAME_RESULT,
        *GLOBAL_48,
        *FSDP,
        *FULL_RECOMPUTE,
        *CRASH,
        "trainer.precision=64",
        f"+task.marker={tmp_path / 'crashed'}",
        "storage.name=resharded",
        f"storage.path={tmp_path / 'storage'}",
    ]
    with pytest.raises(TrainingFailed):
        train(compose_config(*shared, "scaling.num_workers=2"), run_dir=str(tmp_path / "two"))
    assert (tmp_path / "crashed").exists()
    train(compose_config(*shared, "scaling.num_workers=3"), run_dir=str(tmp_path / "three"))
    assert_resumed_from_step_30(tmp_path / "three")
    history = read_metrics(tmp_path / "two") + read_metrics(tmp_path / "three")  # each run dir: its own epochs
    assert [(m["epoch"], m["world_size"]) for m in history] == [(1, 2), (2, 3)]
    model = torch.load(tmp_path / "three" / "model.pt", weights_only=True)
    reference = runs["DDP", "64"]
    metrics, weights = _difference((history, model), (reference["metrics"], reference["model"]))
    print(f"FSDP float64, 2 then 3 workers, vs DDP: metrics {metrics:.1e}, weights {weights:.1e}")
    assert metrics <= 1e-9 and weights <= 1e-9


def test_a_gan_in_bf16_with_uneven_validation_shards_and_rank_0_samples(ray_address, tmp_path):
    """Two sharded models, bf16 parameters (batch norm kept float32), validation shards of 180 and 179 images in
    batches of 179 (rank 0 runs 2 forwards, rank 1 one and a repeat), and the sample grid drawn on rank 0 alone with
    every unit gathered. Through the CLI, with a time limit: a collective one rank misses would hang."""
    result = run_cli(
        [
            f"ray.address={ray_address}",
            "experiment=digits_gan",
            "trainer.parallel_strategy=fsdp",
            "trainer.precision=bf16-mixed",
            "trainer.max_epochs=2",
            "trainer.limit_train_batches=3",
            "trainer.val_batch_size_per_worker=179",
            "hydra.run.dir=run",
        ],
        cwd=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    history = read_metrics(tmp_path / "run")
    assert [m["epoch"] for m in history] == [1, 2] and all(0 < m["val_d_real"] < 1 for m in history)
    assert sorted(p.name for p in (tmp_path / "run" / "samples").glob("*.png")) == ["epoch_0001.png", "epoch_0002.png"]
    models = load_model(str(tmp_path / "run"))
    assert models["generator"](torch.randn(2, 32)).shape == (2, 1, 8, 8)
    # The sharded run's generator exported whole, its batch axis dynamic, computing what it computes
    described = export(str(tmp_path / "run"), "torch_export")
    assert described["model"] == "generator" and described["input"]["shape"] == ["batch", 32]
    assert described["max_abs_diff"] == 0.0 and (tmp_path / "run" / "export" / "model.pt2").exists()
