"""hydra/sweeper=ray_tune through the real CLI, on the session's real local Ray cluster."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.api_pb2 import Status
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from hydra_raytrain.sweep.space import start_order
from tests.conftest import ROOT, run_cli
from tests.helpers.text import text_overrides
from tests.helpers.wandb_files import run_group, wandb_runs

pytestmark = [pytest.mark.integration, pytest.mark.workers, pytest.mark.slow]


def asha(ray_address):
    """A ray_tune sweep under ASHA keeping the top half at each rung, two trials at a time on the session's cluster."""
    return [
        "-m",
        "hydra/sweeper=ray_tune",
        "hydra.sweeper.scheduler=asha",
        "hydra.sweeper.reduction_factor=2",
        "hydra.sweeper.max_concurrent_trials=2",
        f"ray.address={ray_address}",
    ]


def rows_by_overrides(sweep_dir):
    summary = json.loads((sweep_dir / "sweep_summary.json").read_text())
    return summary, {row["overrides"]: row for row in summary["trials"]}


def epochs(run_dir):
    return [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def world_sizes(row):
    return {json.loads(line)["world_size"] for line in open(f"{row['run_dir']}/metrics.jsonl")}


def start_driver(args, tmp_path):
    """``python -m hydra_raytrain ARGS`` in the background (a test kills it), its output in a log file."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    log = tmp_path / "killed_driver.log"
    with open(log, "w") as output:
        driver = subprocess.Popen(
            [sys.executable, "-m", "hydra_raytrain", *args], cwd=tmp_path, env=env, stdout=output, stderr=output
        )
    return driver, log


VARIANTS = {  # three trials as one sweep of a config group: two that train, one that fails in its workers
    "one_worker": "scaling:\n  num_workers: 1\n",
    "two_workers": "scaling:\n  num_workers: 2\n",
    # A failure only its workers meet (a config error would stop the sweep before any trial starts).
    "fails": "scaling:\n  num_workers: 1\ntask:\n  _target_: tests.helpers.tasks.FailsInTraining\n",
}


def test_trials_run_concurrently_with_their_own_workers_and_a_failure_does_not_stop_the_sweep(ray_address, tmp_path):
    """Also: each trial is its own W&B run in a group named after the sweep; keep_checkpoints=1 keeps the best's."""
    (tmp_path / "conf" / "variant").mkdir(parents=True)
    for name, body in VARIANTS.items():
        (tmp_path / "conf" / "variant" / f"{name}.yaml").write_text("# @package _global_\n" + body)
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        f"ray.address={ray_address}",
        "model=mlp",
        "+variant=one_worker,two_workers,fails",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=5",
        "logger=[wandb,tensorboard]",
        "logger.wandb.mode=offline",
        "hydra.sweeper.keep_checkpoints=1",
        "hydra.sweep.dir=sweep-7f",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary, rows = rows_by_overrides(tmp_path / "sweep-7f")
    assert set(rows) == {"+variant=one_worker", "+variant=two_workers", "+variant=fails"}  # the swept key only
    good = [rows["+variant=one_worker"], rows["+variant=two_workers"]]
    assert [row["status"] for row in good] == ["completed", "completed"] and [row["epochs"] for row in good] == [2, 2]
    bad = rows["+variant=fails"]
    assert bad["status"] == "failed" and "RuntimeError: the loss diverged at the first step" in bad["error"], bad[
        "error"
    ]
    assert [world_sizes(row) for row in good] == [{1}, {2}]  # each trial's own scaling.num_workers
    first, second = good
    assert first["started"] < second["finished"] and second["started"] < first["finished"]  # their time windows overlap
    assert summary["best"]["overrides"] in {row["overrides"] for row in good}
    for name in ("sweep_summary.csv", "best_config.yaml", "sweep.png"):
        assert (tmp_path / "sweep-7f" / name).stat().st_size > 0
    for row in good:
        (run,) = wandb_runs(row["run_dir"])
        assert run_group(run) == "sweep-7f"
    # TensorBoard's HParams table of the sweep (tensorboard --logdir sweep-7f): a session per trial, its own settings
    sessions = {}
    for row in rows.values():
        events = EventAccumulator(os.path.join(row["run_dir"], "tensorboard"))
        events.Reload()
        plugin = {tag: HParamsPluginData.FromString(data) for tag, data in events.PluginTagToContent("hparams").items()}
        started = plugin["_hparams_/session_start_info"].session_start_info.hparams
        ended = plugin["_hparams_/session_end_info"].session_end_info.status
        sessions[row["overrides"]] = (started["scaling.num_workers"].number_value, Status.Name(ended))
    assert sessions == {
        "+variant=one_worker": (1, "STATUS_SUCCESS"),
        "+variant=two_workers": (2, "STATUS_SUCCESS"),
        "+variant=fails": (1, "STATUS_FAILURE"),
    }, sessions
    kept = [row for row in good if os.path.isdir(os.path.join(row["run_dir"], "ray_storage"))]
    assert kept == [rows[summary["best"]["overrides"]]]  # keep_checkpoints=1: the best trial's Ray storage only
    assert "hydra_raytrain sweep: 3 trials" in done.stdout and "failed" in done.stdout
    assert "Configuration for experiment" not in done.stdout + done.stderr  # Tune's own console output is off


@pytest.mark.parametrize(
    "workers",
    [
        0,
        pytest.param(1, marks=pytest.mark.long("the same sweep on worker trials: ASHA in the gate is the local one")),
    ],
)
def test_asha_stops_weak_trials_and_best_config_reproduces_the_best(ray_address, tmp_path, workers):
    """Two at a time, in ASHA's seeded start order (seed 0 starts this list's trials 2, 0, 1, 3: the two good
    learning rates first): they set the bar at the first rung, the two hopeless ones fall under it and stop
    there (ASHA keeps the top 1/2 at each rung). Trials in Ray Train's local mode (``scaling.num_workers=0``: each
    trains in its trial's process) and on a worker each: every epoch reaches ASHA and metrics.jsonl as it ends."""
    assert start_order(range(4), shuffle=True, seed=0) == [2, 0, 1, 3]
    args = [
        *asha(ray_address),
        "model=mlp",
        f"scaling.num_workers={workers}",
        "optimizer.lr=3e-3,1e-6,1e-3,1e-7",
        "trainer.max_epochs=4",
        "trainer.limit_train_batches=10",
        "hydra.sweep.dir=sweep",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary, rows = rows_by_overrides(tmp_path / "sweep")
    status = {row["overrides"].split("lr=")[1].split()[0]: (row["status"], row["epochs"]) for row in rows.values()}
    first_two = sorted(rows.values(), key=lambda row: row["started"])[:2]
    assert {row["overrides"] for row in first_two} == {"optimizer.lr=0.003", "optimizer.lr=0.001"}, first_two
    assert status["0.003"] == ("completed", 4), status
    assert all(state == "stopped" and epochs < 4 for state, epochs in (status["1e-06"], status["1e-07"])), status
    assert sum(epochs for _, epochs in status.values()) < 16  # fewer epochs than the full grid
    best = summary["best"]
    assert "lr=0.003" in best["overrides"]
    for row in rows.values():  # the history of a stopped trial too, as it was when ASHA stopped it
        assert epochs(Path(row["run_dir"])) == list(range(1, row["epochs"] + 1)) and world_sizes(row) == {1}, row
    interrupted_best_trial_is_resumed_by_the_same_command(args, rows, tmp_path, workers)

    # best_config.yaml through the plain CLI is the best trial's run: the same run identity (a hash of everything
    # that can change the result), so pointed at that trial's run dir it finds it complete instead of training.
    again = run_cli(
        [
            "--config-dir",
            str(tmp_path / "sweep"),
            "--config-name",
            "best_config",
            f"ray.address={ray_address}",
            f"hydra.run.dir={best['run_dir']}",
        ],
        cwd=str(tmp_path),
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"Run already complete: 4 epochs, best val_accuracy {best['best']:.4f}" in again.stdout


def interrupted_best_trial_is_resumed_by_the_same_command(args, rows, tmp_path, workers):
    """The best trial as a Ctrl-C after its last epoch's checkpoint, before its summary, leaves it: "interrupted", no
    summary.json. The identical command runs nothing else again. On workers that trial resumes from its last
    checkpoint with nothing left to train, and Tune gets its final figures (without them it would fail the trial for
    the missing metric); in local mode, which stores no checkpoint, it trains its 4 epochs again, to the same
    figures."""
    finished_at = {name: row["finished"] for name, row in rows.items()}
    written = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    for row in written["trials"]:
        row["status"] = "interrupted" if row["overrides"] == "optimizer.lr=0.003" else row["status"]
    (tmp_path / "sweep" / "sweep_summary.json").write_text(json.dumps(written))
    good = Path(rows["optimizer.lr=0.003"]["run_dir"])
    (good / "summary.json").unlink()
    rerun = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "4 trials; 3 already done in an earlier run of this sweep" in rerun.stdout
    _, again_rows = rows_by_overrides(tmp_path / "sweep")
    assert {name: row["finished"] for name, row in again_rows.items() if "0.003" not in name} == {
        name: at for name, at in finished_at.items() if "0.003" not in name
    }
    resumed = again_rows["optimizer.lr=0.003"]
    assert (resumed["status"], resumed["epochs"], resumed["error"]) == ("completed", 4, None), resumed
    assert resumed["final"] == rows["optimizer.lr=0.003"]["final"] and epochs(good) == [1, 2, 3, 4]  # each once
    tried = sorted((tmp_path / "sweep" / "tune" / "tune").glob(f"trial_{resumed['index']}_*/result.json"))
    latest = max(tried, key=lambda path: path.stat().st_mtime)  # the re-run's Tune trial
    reported = [json.loads(line) for line in latest.read_text().splitlines()]
    assert [r["epoch"] for r in reported] == ([4] if workers else [1, 2, 3, 4]), reported
    assert reported[-1]["val_accuracy"] == resumed["final"], reported  # final: the metric


def test_an_optuna_sweep_of_local_mode_trials_draws_every_lr_inside_its_interval(ray_address, tmp_path):
    """search_alg=optuna over a log interval, 3 trials two at a time, each training in its trial's own process (Ray
    Train's local mode): Optuna draws 3 learning rates inside the interval, every trial's epochs reach Tune (the
    sweep's summary) and metrics.jsonl, and the best is the best of them."""
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        "hydra.sweeper.search_alg=optuna",
        "hydra.sweeper.num_samples=3",
        "hydra.sweeper.max_concurrent_trials=2",
        f"ray.address={ray_address}",
        "model=mlp",
        "scaling.num_workers=0",
        "optimizer.lr=tag(log,interval(1e-4,1e-1))",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=3",
        "hydra.sweep.dir=sweep",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    rows = summary["trials"]
    assert len(rows) == 3 and all((row["status"], row["epochs"]) == ("completed", 2) for row in rows), rows
    lrs = [json.loads(Path(row["run_dir"], "job.json").read_text())["params"]["optimizer.lr"] for row in rows]
    assert len(set(lrs)) == 3 and all(1e-4 <= lr <= 1e-1 for lr in lrs), lrs
    for row in rows:
        assert epochs(Path(row["run_dir"])) == [1, 2] and world_sizes(row) == {1}, row
    assert summary["best"]["best"] == max(row["best"] for row in rows), summary["best"]


@pytest.mark.long("a killed-sweep variant: Optuna's search in the gate is the local-mode Optuna sweep")
def test_optuna_sweep_killed_mid_trial_resumes_without_rerunning_finished_trials(ray_address, tmp_path, monkeypatch):
    """search_alg=optuna, one trial at a time. The sweep's driver is killed during its second trial; the identical
    command then tells Optuna the finished trial instead of re-running it, resumes the interrupted trial from its
    checkpoint, and asks Optuna for the third. Secrets (one typed, one from the environment) reach every trial's
    workers, and no file of the sweep holds them (a trial's job.json is written without them)."""
    typed, from_env = "typed-secret-5d1e", "env-secret-a77c"
    monkeypatch.setenv("TEST_SWEEP_TOKEN", from_env)
    probe = tmp_path / "probe.jsonl"  # outside the sweep dir: what each trial's workers received
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        "hydra.sweeper.search_alg=optuna",
        "hydra.sweeper.num_samples=3",
        "hydra.sweeper.max_concurrent_trials=1",
        f"ray.address={ray_address}",
        "model=mlp",
        "scaling.num_workers=1",
        "optimizer.lr=tag(log,interval(1e-3,1e-1))",
        "trainer.max_epochs=3",
        "trainer.limit_train_batches=3",
        "task._target_=tests.helpers.tasks.SlowProbe",
        "+task.seconds_per_batch=0.4",
        f"+task.path={probe}",
        "+task.variable=API_KEY",
        "scaling.worker_env={API_KEY: " + typed + ", HF_TOKEN: ${oc.env:TEST_SWEEP_TOKEN}}",
        "hydra.sweep.dir=sweep",
    ]
    driver, log = start_driver(args, tmp_path)
    deadline, second = time.time() + 180, None
    while time.time() < deadline and driver.poll() is None:
        jobs = sorted(tmp_path.glob("sweep/*/job.json"), key=lambda p: json.loads(p.read_text())["index"])
        metrics = jobs[1].parent / "metrics.jsonl" if len(jobs) > 1 else None
        if metrics and metrics.exists() and metrics.read_text().strip():
            second = jobs[1].parent
            break
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert second is not None, "the second trial never reported an epoch:\n" + log.read_text()[-3000:]
    first = jobs[0].parent
    first_finished = (first / "summary.json").stat().st_mtime
    before_kill = (second / "metrics.jsonl").read_text().splitlines()
    assert 1 <= len(before_kill) < 3 and not (second / "summary.json").exists()

    done = run_cli(args, cwd=str(tmp_path), timeout=300)  # the identical command
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Sweep: 3 trials; 1 already done in an earlier run of this sweep" in done.stdout
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    rows = {os.path.basename(row["run_dir"]): row for row in summary["trials"]}
    assert len(rows) == 3 and all(row["status"] == "completed" and row["epochs"] == 3 for row in rows.values()), rows
    assert (first / "summary.json").stat().st_mtime == first_finished  # not re-run
    # Resumed from its checkpoint: the epochs it had finished were not trained again (a retrained epoch replaces
    # its line in metrics.jsonl, with other timings).
    assert (
        epochs(second) == [1, 2, 3]
        and (second / "metrics.jsonl").read_text().splitlines()[: len(before_kill)] == before_kill
    )
    lrs = [json.loads((tmp_path / "sweep" / name / "job.json").read_text())["params"]["optimizer.lr"] for name in rows]
    assert len(set(lrs)) == 3 and all(1e-3 <= lr <= 1e-1 for lr in lrs)
    received = [json.loads(line)["env"] for line in probe.read_text().splitlines()]
    assert len(received) >= 3 and set(received) == {typed}, received  # each trial's workers, the resumed one's too
    written = [path for path in (tmp_path / "sweep").rglob("*") if path.is_file()] + [log]
    assert len(written) > 30
    for path in written:
        content = path.read_bytes()
        assert typed.encode() not in content and from_env.encode() not in content, path


@pytest.mark.long("a killed-sweep variant: PBT's exploits in the gate are PB2's")
def test_pbt_exploits_continue_the_donors_state_and_a_killed_sweep_resumes(ray_address, tmp_path):
    """PBT over two trials, a good and a hopeless lr, perturbing every epoch: once both have a score, each report of
    the weaker trial continues the stronger one's checkpoint with an explored lr. The driver is killed once a trial
    has exploited the other; the identical command resumes every trial at its generation, and each ends 4 epochs
    whose optimizer steps continue the donor's."""
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        "hydra.sweeper.scheduler=pbt",
        "hydra.sweeper.perturbation_interval=1",
        f"ray.address={ray_address}",
        "model=mlp",
        "scaling.num_workers=1",
        "optimizer.lr=3e-3,1e-7",
        "trainer.max_epochs=4",
        "trainer.limit_train_batches=10",
        "task._target_=tests.helpers.tasks.Slow",  # 4 s an epoch: the trials' start-ups differ by less than the run
        "+task.seconds_per_batch=0.4",
        "hydra.sweep.dir=sweep",
    ]
    driver, log = start_driver(args, tmp_path)
    deadline = time.time() + 240
    while time.time() < deadline and driver.poll() is None and not list(tmp_path.glob("sweep/*/pbt.jsonl")):
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert list(tmp_path.glob("sweep/*/pbt.jsonl")), "no exploit before the kill:\n" + log.read_text()[-3000:]

    done = run_cli(args, cwd=str(tmp_path), timeout=400)  # the identical command
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    rows = {row["index"]: row for row in summary["trials"]}
    assert all(row["status"] == "completed" and row["epochs"] == 4 for row in rows.values()), rows
    exploited = [row for row in rows.values() if row.get("exploits")]
    assert exploited and "PBT: " in done.stdout, summary
    # The hopeless trial was the weaker one when both first had a score: its first exploit continued the good one
    by_lr = {row["overrides"]: row for row in rows.values()}
    weak, good = by_lr["optimizer.lr=1e-07"], by_lr["optimizer.lr=0.003"]
    first = json.loads((Path(weak["run_dir"]) / "pbt.jsonl").read_text().splitlines()[0])
    assert (first["generation"], first["donor"]) == (1, good["index"]), first
    assert float(first["donor_values"]["optimizer.lr"]) == 3e-3 and float(first["before"]["optimizer.lr"]) == 1e-7
    for row in exploited:
        run_dir = Path(row["run_dir"])
        lineage = [json.loads(line) for line in (run_dir / "pbt.jsonl").read_text().splitlines()]
        assert [r["generation"] for r in lineage] == list(range(1, len(lineage) + 1))
        assert len(row["exploits"]) == len(lineage) and row["values"] == lineage[-1]["after"]
        history = {m["epoch"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
        assert sorted(history) == [1, 2, 3, 4]
        last = lineage[-1]  # the weights it ends with continue the donor's checkpoint: its step, then 10 per epoch
        assert history[last["epoch"]]["step"] == last["step"] == 10 * last["epoch"], (last, history)
        for epoch in range(last["epoch"] + 1, 5):
            assert history[epoch]["step"] == history[epoch - 1]["step"] + 10
            assert history[epoch]["lr"] == pytest.approx(float(last["after"]["optimizer.lr"]))
        assert (run_dir / "ray_storage" / f"{run_dir.name}-g{last['generation']}").is_dir()
        for record in lineage:
            assert Path(record["checkpoint"]).is_dir() and record["donor"] != row["index"]
    # best_config.yaml gives the best trial's schedule of exploits exactly when it has one (either trial may end best)
    best_config, exploits = (tmp_path / "sweep" / "best_config.yaml").read_text(), summary["best"].get("exploits", [])
    assert ("# The best trial of this PBT sweep" in best_config) == bool(exploits), best_config
    assert all(exploit in best_config for exploit in exploits[-1:]), best_config


@pytest.mark.long("the gate's budget: HyperBand and BOHB run in the long tier only")
def test_hyperband_stops_the_weaker_trial_of_a_bracket_and_continues_the_others(ray_address, tmp_path):
    """HyperBand over 2 epochs, reduction_factor 2: two brackets of two trials, added in the seeded start order
    (trials 2, 0, 1, 3). The first bracket trains its trials to the end; in the second, both train one epoch
    (the first there pauses until the other gets there), then the better one continues (restarted from its
    checkpoint of epoch 1 when it was the one paused) and the hopeless one stops."""
    assert start_order(range(4), shuffle=True, seed=0) == [2, 0, 1, 3]
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        "hydra.sweeper.scheduler=hyperband",
        "hydra.sweeper.reduction_factor=2",
        f"ray.address={ray_address}",
        "model=mlp",
        "scaling.num_workers=1",
        "optimizer.lr=3e-3,1e-3,2e-3,1e-7",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=10",
        "task._target_=tests.helpers.tasks.Slow",  # an epoch lasts longer than stopping a trial takes
        "+task.seconds_per_batch=0.3",
        "hydra.sweep.dir=sweep",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary, rows = rows_by_overrides(tmp_path / "sweep")
    assert summary["scheduler"] == "hyperband"
    status = {name.split("lr=")[1]: (row["status"], row["epochs"]) for name, row in rows.items()}
    assert status == {
        "0.003": ("completed", 2),
        "0.001": ("completed", 2),
        "0.002": ("completed", 2),
        "1e-07": ("stopped", 1),
    }, status
    for row in rows.values():  # each epoch once, a paused and continued trial's too
        assert epochs(Path(row["run_dir"])) == list(range(1, row["epochs"] + 1)), row


@pytest.mark.long("HyperBand's brackets in the gate are the HyperBand test's; BOHB adds its searcher")
def test_bohb_searches_inside_hyperbands_brackets(ray_address, tmp_path):
    """BOHB (Tune's TuneBOHB in HyperBandForBOHB) over a drawn learning rate: 4 trials, BOHB's brackets largest
    first, so trials 0 and 1 race to epoch 1 and the weaker there stops; trials 2 and 3 train both epochs."""
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        "hydra.sweeper.scheduler=hyperband",
        "hydra.sweeper.search_alg=bohb",
        "hydra.sweeper.reduction_factor=2",
        "hydra.sweeper.num_samples=4",
        f"ray.address={ray_address}",
        "model=mlp",
        "scaling.num_workers=1",
        "optimizer.lr=tag(log,interval(1e-7,1e-2))",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=10",
        "task._target_=tests.helpers.tasks.Slow",
        "+task.seconds_per_batch=0.3",
        "hydra.sweep.dir=sweep",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    rows = {row["index"]: row for row in summary["trials"]}
    assert sorted(rows) == [0, 1, 2, 3] and summary["scheduler"] == "hyperband"
    lrs = {i: float(row["overrides"].split("optimizer.lr=")[1].split()[0]) for i, row in rows.items()}
    assert all(1e-7 <= lr <= 1e-2 for lr in lrs.values()) and len(set(lrs.values())) == 4, lrs
    first = {i: json.loads((Path(rows[i]["run_dir"]) / "metrics.jsonl").read_text().splitlines()[0]) for i in (0, 1)}
    weaker = min((0, 1), key=lambda i: first[i]["val_accuracy"])
    assert (rows[weaker]["status"], rows[weaker]["epochs"]) == ("stopped", 1), rows
    assert all((rows[i]["status"], rows[i]["epochs"]) == ("completed", 2) for i in rows if i != weaker), rows
    for row in rows.values():
        assert epochs(Path(row["run_dir"])) == list(range(1, row["epochs"] + 1)), row


@pytest.mark.long("the gate's budget: PBT and PB2 run in the long tier only")
def test_pb2_explores_inside_the_intervals_bounds(ray_address, tmp_path):
    """PB2 (Tune's bandit PBT) over two drawn learning rates: the weaker trial continues the stronger one's
    checkpoint with a value the bandit picks inside the interval, and its steps continue the donor's."""
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        "hydra.sweeper.scheduler=pb2",
        "hydra.sweeper.perturbation_interval=1",
        "hydra.sweeper.num_samples=2",
        f"ray.address={ray_address}",
        "model=mlp",
        "scaling.num_workers=1",
        "optimizer.lr=interval(1e-7,1e-2)",
        "trainer.max_epochs=3",
        "trainer.limit_train_batches=10",
        "task._target_=tests.helpers.tasks.Slow",  # 3 s an epoch: the trials' start-ups differ by less than the run
        "+task.seconds_per_batch=0.3",
        "hydra.sweep.dir=sweep",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    assert summary["scheduler"] == "pb2" and all(row["status"] == "completed" for row in summary["trials"])
    exploited = [row for row in summary["trials"] if row.get("exploits")]
    assert exploited, summary["trials"]
    for row in exploited:
        run_dir = Path(row["run_dir"])
        last = [json.loads(line) for line in (run_dir / "pbt.jsonl").read_text().splitlines()][-1]
        assert 1e-7 <= last["after"]["optimizer.lr"] <= 1e-2
        history = {m["epoch"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
        assert sorted(history) == [1, 2, 3] and history[last["epoch"]]["step"] == last["step"]
        assert history[last["epoch"] + 1]["lr"] == pytest.approx(last["after"]["optimizer.lr"])


def test_cross_validation_ranks_configurations_by_their_mean_over_the_folds(ray_address, tmp_path):
    """2 learning rates x 2 folds: each trial validates on its own fold; the summary gives each configuration's
    mean and std over its folds, and best_config.yaml is the best mean's configuration on the usual split. Each
    trial trains in its own process (Ray Train's local mode), two at a time, each process taking the next trial."""
    args = [
        "-m",
        "hydra/sweeper=ray_tune",
        "hydra.sweeper.max_concurrent_trials=2",
        f"ray.address={ray_address}",
        "model=mlp",
        "scaling.num_workers=0",  # each trial trains in its own process: Ray Train's local mode
        "optimizer.lr=3e-3,1e-6",
        "dataset.folds=2",
        "dataset.fold=range(0,2)",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=5",
        "hydra.sweep.dir=cv",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary, rows = rows_by_overrides(tmp_path / "cv")
    assert len(rows) == 4 and {row["status"] for row in rows.values()} == {"completed"}
    folds = {}
    for row in rows.values():
        dataset = json.loads(open(f"{row['run_dir']}/config.json").read())["dataset"]
        folds[row["overrides"]] = (dataset["folds"], dataset["fold"], row["configuration"])
    assert sorted(folds.values()) == [
        (2, 0, "optimizer.lr=0.003"),
        (2, 0, "optimizer.lr=1e-06"),
        (2, 1, "optimizer.lr=0.003"),
        (2, 1, "optimizer.lr=1e-06"),
    ]
    ranked = summary["configurations"]
    assert [c["folds"] for c in ranked] == [2, 2]
    means = {}
    for configuration in ranked:
        values = [row["best"] for row in rows.values() if row["configuration"] == configuration["configuration"]]
        means[configuration["configuration"]] = sum(values) / 2
        assert configuration["mean"] == pytest.approx(sum(values) / 2)
        assert configuration["std"] == pytest.approx(abs(values[0] - values[1]) / 2)
    assert [c["configuration"] for c in ranked] == sorted(means, key=means.__getitem__, reverse=True)
    assert summary["best_configuration"] == ranked[0]
    best_config = (tmp_path / "cv" / "best_config.yaml").read_text()
    assert f"best configuration of this sweep ({ranked[0]['configuration']}: mean" in best_config
    assert "  folds: null\n  fold: 0\n" in best_config
    assert "cross-validated: val_accuracy per configuration" in done.stdout


@pytest.mark.long("a text variant: ASHA in the gate is the local-mode sweep, perplexity test_text's")
def test_an_asha_sweep_on_validation_perplexity_stops_the_hopeless_learning_rates(ray_address, tmp_path):
    """A causal LM's sweep (its runs: tests/integration/test_text.py): ASHA on val_perplexity, two trials at a time
    in ASHA's seeded start order (seed 0 starts this list's trials 2, 0, 1, 3: the two learning rates that learn
    first): the best of them trains to the end, the two that barely move fall under the first rung's bar and stop
    there, and every trial logged its perplexity and supervised tokens/s. The rows are tokenized once, for the sweep
    (its 4 trials read them from the object store)."""
    text_run = text_overrides(tmp_path / "text")
    assert start_order(range(4), shuffle=True, seed=0) == [2, 0, 1, 3]
    args = [
        *asha(ray_address),
        *(a for a in text_run if not a.startswith(("trainer.max_epochs", "trainer.precision", "optimizer.lr"))),
        "trainer.monitor=val_perplexity",
        "trainer.monitor_mode=min",
        "scaling.num_workers=1",
        "optimizer.lr=3e-3,1e-8,1e-2,1e-9",
        "trainer.max_epochs=3",
        "hydra.sweep.dir=sweep",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    status = {row["overrides"].split("lr=")[1]: (row["status"], row["epochs"]) for row in summary["trials"]}
    assert status["0.01"] == ("completed", 3), status  # the best at every rung (0.003 may fall under it at the first)
    assert all(state == "stopped" and epochs < 3 for state, epochs in (status["1e-08"], status["1e-09"])), status
    assert summary["best"]["overrides"] == "optimizer.lr=0.01", summary["best"]
    for row in summary["trials"]:
        last = json.loads(Path(row["run_dir"], "metrics.jsonl").read_text().splitlines()[-1])
        assert last["val_perplexity"] > 1 and last["tokens_per_second"] > 0
        assert "Text tokenized" not in Path(row["run_dir"], "driver.log").read_text()  # the trial read the sweep's
    assert done.stdout.count("Text tokenized once for the workers, by the driver") == 1, done.stdout[-3000:]


@pytest.mark.long("a text variant: ASHA in the gate is the local-mode sweep, exact match test_text's")
def test_an_asha_sweep_on_validation_exact_match_stops_the_learning_rates_that_say_nothing_right(ray_address, tmp_path):
    """A sweep picked on what the models say: ASHA on val_exact_match (upwards: the task's direction for it, no
    mode given) over a memorisation run's learning rates; the two that barely move complete no prompt and stop at
    a rung, the best learning rate trains to the end and is the sweep's best."""
    from tests.helpers.text import pair_rows, write_jsonl

    text_run = text_overrides(tmp_path / "text")
    train, val = write_jsonl(tmp_path / "train.jsonl", pair_rows(8)), write_jsonl(tmp_path / "val.jsonl", pair_rows())
    args = [
        *asha(ray_address),
        *(
            a
            for a in text_run
            if not a.startswith(("trainer.max_epochs", "trainer.precision", "optimizer.lr", "dataset.path"))
        ),
        f"dataset.path={train}",
        f"dataset.val_path={val}",
        "optimizer=adamw",
        "trainer.batch_size=16",
        "task.eval_generation=true",
        "task.eval_max_new_tokens=8",
        "hydra.sweeper.metric=val_exact_match",
        "scaling.num_workers=1",
        "optimizer.lr=1e-2,1e-8,3e-3,1e-9",
        "trainer.max_epochs=8",
        "hydra.sweep.dir=sweep",
    ]
    done = run_cli(args, cwd=str(tmp_path), timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    status = {row["overrides"].split("lr=")[1]: (row["status"], row["epochs"]) for row in summary["trials"]}
    assert status["0.01"] == ("completed", 8), status
    assert all(state == "stopped" and epochs < 8 for state, epochs in (status["1e-08"], status["1e-09"])), status
    assert summary["best"]["overrides"] == "optimizer.lr=0.01" and summary["mode"] == "max", summary
    assert summary["best"]["best"] >= 0.5, summary["best"]  # 0.95 of 20 rows here
