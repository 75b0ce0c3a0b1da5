"""hydra/sweeper=ray_tune through the real CLI, on the session's real local Ray cluster."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration


def rows_by_overrides(sweep_dir):
    summary = json.loads((sweep_dir / "sweep_summary.json").read_text())
    return summary, {row["overrides"]: row for row in summary["trials"]}


def world_sizes(row):
    return {json.loads(line)["world_size"] for line in open(f"{row['run_dir']}/metrics.jsonl")}


VARIANTS = {  # three trials as one sweep of a config group: two that train, one that fails in its workers
    "one_worker": "scaling:\n  num_workers: 1\n",
    "two_workers": "scaling:\n  num_workers: 2\n",
    "bad_shape": "scaling:\n  num_workers: 1\ndataset:\n  input_shape: [1, 9, 9]\n",  # digits are 8x8: refused in the workers
}


def test_trials_run_concurrently_with_their_own_workers_and_a_failure_does_not_stop_the_sweep(ray_address, tmp_path):
    (tmp_path / "conf" / "variant").mkdir(parents=True)
    for name, body in VARIANTS.items():
        (tmp_path / "conf" / "variant" / f"{name}.yaml").write_text("# @package _global_\n" + body)
    args = ["-m", "hydra/sweeper=ray_tune", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"ray.address={ray_address}",
            "model=mlp", "+variant=one_worker,two_workers,bad_shape", "trainer.max_epochs=2", "trainer.limit_train_batches=5",
            "hydra.sweep.dir=sweep"]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary, rows = rows_by_overrides(tmp_path / "sweep")
    assert set(rows) == {"+variant=one_worker", "+variant=two_workers", "+variant=bad_shape"}  # the swept key only
    good = [rows["+variant=one_worker"], rows["+variant=two_workers"]]
    assert [row["status"] for row in good] == ["completed", "completed"] and [row["epochs"] for row in good] == [2, 2]
    bad = rows["+variant=bad_shape"]
    assert bad["status"] == "failed" and "ValueError" in bad["error"] and "input_shape" in bad["error"], bad["error"]
    assert [world_sizes(row) for row in good] == [{1}, {2}]  # each trial's own scaling.num_workers
    first, second = good
    assert first["started"] < second["finished"] and second["started"] < first["finished"]  # their time windows overlap
    assert summary["best"]["overrides"] in {row["overrides"] for row in good}
    for name in ("sweep_summary.csv", "best_config.yaml", "sweep.png"):
        assert (tmp_path / "sweep" / name).stat().st_size > 0
    assert "hydra_raytrain sweep: 3 trials" in done.stdout and "failed" in done.stdout


def test_asha_stops_weak_trials_and_best_config_reproduces_the_best(ray_address, tmp_path):
    """Two at a time in grid order: the good learning rates set the bar at the first rung, the two hopeless
    ones fall under it and stop there (ASHA keeps the top 1/2 at each rung)."""
    args = ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=asha", "hydra.sweeper.max_concurrent_trials=2",
            f"ray.address={ray_address}", "model=mlp", "scaling.num_workers=1", "optimizer.lr=3e-3,1e-3,1e-6,1e-7",
            "trainer.max_epochs=4", "trainer.limit_train_batches=10", "hydra.sweep.dir=sweep"]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary, rows = rows_by_overrides(tmp_path / "sweep")
    status = {row["overrides"].split("lr=")[1].split()[0]: (row["status"], row["epochs"]) for row in rows.values()}
    assert status["0.003"] == ("completed", 4), status
    assert all(state == "stopped" and epochs < 4 for state, epochs in (status["1e-06"], status["1e-07"])), status
    assert sum(epochs for _, epochs in status.values()) < 16  # fewer epochs than the full grid
    best = summary["best"]
    assert "lr=0.003" in best["overrides"]

    finished_at = {name: row["finished"] for name, row in rows.items()}
    rerun = run_cli(args, cwd=str(tmp_path), timeout=300)  # the identical command: nothing runs again
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "4 trials; 4 already done in an earlier run of this sweep" in rerun.stdout
    _, rows = rows_by_overrides(tmp_path / "sweep")
    assert {name: row["finished"] for name, row in rows.items()} == finished_at

    # best_config.yaml through the plain CLI is the best trial's run: the same run identity (a hash of everything
    # that can change the result), so pointed at that trial's run dir it finds it complete instead of training.
    again = run_cli(["--config-dir", str(tmp_path / "sweep"), "--config-name", "best_config", f"ray.address={ray_address}",
                     f"hydra.run.dir={best['run_dir']}"], cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"Run already complete: 4 epochs, best val_accuracy {best['best']:.4f}" in again.stdout
