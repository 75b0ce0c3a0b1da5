"""Sweeps without Ray: Hydra's grammar as trials, trial status, the summary files."""

import json
import math

import pytest

from hydra_raytrain.sweep import results
from hydra_raytrain.sweep.space import trial_overrides


def test_comma_lists_choice_and_range_make_a_grid():
    trials = trial_overrides(["optimizer.lr=1e-3,1e-2", "model=choice(mlp,simple_cnn)", "trainer.seed=range(0,2)", "trainer.max_epochs=3"])
    assert len(trials) == 8
    assert trials[0] == ["optimizer.lr=0.001", "model=mlp", "trainer.seed=0", "trainer.max_epochs=3"]
    assert len({tuple(t) for t in trials}) == 8


def test_intervals_are_sampled_num_samples_times_per_grid_point_and_reproducibly():
    arguments = ["model=mlp,simple_cnn", "optimizer.lr=tag(log,interval(1e-4,1e-1))", "optimizer.weight_decay=interval(0,0.1)"]
    trials = trial_overrides(arguments, num_samples=3, seed=7)
    assert len(trials) == 6 and trials == trial_overrides(arguments, num_samples=3, seed=7)
    lrs = [float(t[1].split("=")[1]) for t in trials]
    assert all(1e-4 <= lr <= 1e-1 for lr in lrs) and len(set(lrs)) == 3  # one draw per sample, shared by the grid
    decays = [float(t[2].split("=")[1]) for t in trials]
    assert all(0 <= d <= 0.1 for d in decays)
    logs = sorted(math.log10(lr) for lr in set(lrs))
    assert trial_overrides(arguments, num_samples=3, seed=8) != trials and logs[0] < logs[-1]


@pytest.mark.parametrize(
    "summary, history, error, status",
    [
        ({"status": "completed"}, [{}] * 4, None, "completed"),
        (None, [{}] * 2, None, "stopped"),
        (None, [{}] * 4, None, "stopped"),  # stopped at a rung on its last epoch
        (None, [{}] * 2, "boom", "failed"),
        (None, [], None, "not run"),
    ],
)
def test_trial_status(summary, history, error, status):
    assert results.trial_status(summary, history, error) == status


def test_summary_csv_best_config_and_plot(tmp_path):
    jobs, errors = [], {}
    for index, lr in enumerate((0.1, 0.01, 0.5)):
        run_dir = tmp_path / f"run{index}"
        run_dir.mkdir()
        history = [{"epoch": e, "val_accuracy": lr * e} for e in (1, 2)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in history))
        if index < 2:
            (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "wall_seconds": 3.0}))
        cfg = {"trainer": {"max_epochs": 2 if index < 2 else 4}, "optimizer": {"lr": lr}}
        jobs.append({"index": index, "overrides": [f"optimizer.lr={lr}"], "cfg": cfg, "name": f"run{index}", "run_dir": str(run_dir)})
    errors[1] = RuntimeError("Traceback ...\n  raise TrainingFailed(f\"Training failed: {_first_cause(error)}\")\n"
                             "hydra_raytrain.driver.run.TrainingFailed: Training failed: worker 0: ValueError: bad\nRun dir: /x")
    summary = results.collect(jobs, errors, {}, "val_accuracy", "max", str(tmp_path), "asha")
    assert [row["status"] for row in summary["trials"]] == ["completed", "failed", "stopped"]
    assert summary["trials"][1]["error"] == "worker 0: ValueError: bad"  # our cause line, not the traceback
    assert summary["best"]["index"] == 2 and summary["best"]["best"] == 1.0
    results.write_all(summary, jobs, str(tmp_path), keep_checkpoints=None)
    assert json.loads((tmp_path / "sweep_summary.json").read_text())["best"]["index"] == 2
    rows = (tmp_path / "sweep_summary.csv").read_text().splitlines()
    assert rows[0].startswith("index,overrides,status,final,best,epochs") and len(rows) == 4
    best_config = (tmp_path / "best_config.yaml").read_text()
    assert "lr: 0.5" in best_config and "train_schema" in best_config and "--config-name best_config" in best_config
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert set(results.read_previous(str(tmp_path))) == {"run0", "run1", "run2"}
