"""Sweeps on this machine: hydra/sweeper=ray_tune against Hydra's sequential basic sweeper, and ASHA against
the full grid.

    .venv/bin/python benchmarks/sweep.py             # or: make bench-sweep
    .venv/bin/python benchmarks/sweep.py concurrency # only part 1 (asha: only part 2)
    .venv/bin/python benchmarks/sweep.py concurrency --epochs 240  # longer trials: start-up weighs less
    .venv/bin/python benchmarks/sweep.py scale --trials 8          # part 3 with 8 trials instead of 64
    .venv/bin/python benchmarks/sweep.py local                     # part 4: local-mode trials against 1-worker ones

1. The same 4-trial sweep of 1-worker trials (a wider SimpleCNN on the digits, 4 learning rates, ~1 s per epoch
   on one core, EPOCHS epochs: two-minute trials) twice, each command in a fresh process that starts its own
   local cluster: with Hydra's basic sweeper (one job after another) and with hydra/sweeper=ray_tune (concurrent
   Tune trials). Printed: wall time of each command, the ratio, and the seconds spent in epochs (the rest is
   start-up: ~20 s per Ray Train run, CPU-bound, which no launcher avoids). A 1-worker trial trains on one
   thread (Ray sets OMP_NUM_THREADS to the worker's CPUs), so one trial at a time leaves the second core idle.
2. An 8-trial learning-rate grid with ASHA (the defaults, Tune's: grace_period 1, reduction_factor 4) against the same
   grid run to the end (both ray_tune, 2 trials at a time): epochs consumed and the best config each finds.
   ASHA runs twice, on the learning rates listed in a scrambled order and in ascending order (the order users
   write): both start in ASHA's seeded random order (hydra_raytrain.sweep.space.start_order), without which
   ascending order stops nothing. Which trials ASHA stops depends on the order they reach each rung, so the
   sweep's own scheduler is then replayed on the grid's per-epoch metrics over 500 seeded start orders
   (equal epoch times, and trials that start together report in start order; in a real run they race, so a
   run's own replay matches it unless the race went the other way: it is printed).
3. Sweeps at scale: 64 one-epoch trials (the MLP, 2 batches, 1 worker each), as many at a time as the cores hold:
   the wall time, trials per hour, each trial's start-up (its run's wall time less its epochs: Ray Train's
   start, the workers' imports, the checkpoint) and the driver's resident memory after 8, 32 and 64 trials.
4. Trials in Ray Train's local mode: the same 16-trial ASHA sweep of the MLP (a fixed grid of 16 learning rates,
   4 epochs of 10 batches, as many trials at a time as the cores hold), each command in a fresh process with its
   own local cluster, once with every trial training in its own process (scaling.num_workers=0) and once on one
   worker each (scaling.num_workers=1): the wall time, trials per hour, and their ratio (target >= 3x).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["scaling.num_workers=1", "trainer.progress_bar=false"]
EPOCHS = 120  # ~1 s each on one core: two-minute trials, beside the ~20 s every Ray Train run takes to start
CONCURRENCY = [
    *COMMON,
    "model=simple_cnn",
    "model.channels=[64,128]",
    "model.hidden=256",
    "optimizer.lr=3e-4,1e-3,3e-3,1e-2",
]
ASHA = [*COMMON, "model=mlp", "trainer.max_epochs=16", "trainer.limit_train_batches=10"]
# The same 8 learning rates in two orders. Asynchronous halving can only stop a trial that is worse than the
# trials already seen at its rung, so started in ascending order (each trial better than the last) it would
# stop none: under ASHA the sweep starts the grid in a seeded random order.
ASCENDING = "optimizer.lr=1e-5,3e-5,1e-4,3e-4,1e-3,3e-3,1e-2,3e-2"
SCRAMBLED = "optimizer.lr=1e-3,3e-5,1e-2,1e-5,3e-2,3e-4,1e-4,3e-3"
REPLAYS = 500
SCALE = [
    *COMMON,
    "model=mlp",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "optimizer.lr=tag(log,interval(1e-4,1e-1))",
]


def run(args, folder):
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "hydra_raytrain", "-m", *args, "hydra.sweep.dir=sweep"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return wall


def sweep_summary(folder):
    with open(os.path.join(folder, "sweep", "sweep_summary.json")) as file:
        return json.load(file)


def training_seconds(run_dirs):
    """Seconds spent in epochs (metrics.jsonl's epoch_seconds), over the given run dirs."""
    total = 0.0
    for run_dir in run_dirs:
        with open(os.path.join(run_dir, "metrics.jsonl")) as file:
            total += sum(json.loads(line)["epoch_seconds"] for line in file if line.strip())
    return total


def concurrency(epochs: int = EPOCHS) -> None:
    args = [*CONCURRENCY, f"trainer.max_epochs={epochs}"]
    with tempfile.TemporaryDirectory() as sequential, tempfile.TemporaryDirectory() as concurrent:
        basic = run(args, sequential)
        sweep_root = os.path.join(sequential, "sweep")
        basic_training = training_seconds(
            os.path.join(sweep_root, d)
            for d in os.listdir(sweep_root)
            if os.path.isdir(os.path.join(sweep_root, d, ".hydra"))
        )
        tune = run(["hydra/sweeper=ray_tune", *args], concurrent)
        summary = sweep_summary(concurrent)
        tune_training = training_seconds(row["run_dir"] for row in summary["trials"])
    print(
        f"4 trials x 1 worker, {epochs} epochs each: basic sweeper {basic:.1f} s "
        f"({basic_training:.0f} s of it in epochs), ray_tune {tune:.1f} s ({tune_training:.0f} s in epochs, "
        f"summed over trials) -> {basic / tune:.2f}x faster (target >= 1.6x)"
    )


def curves(summary):
    """Each trial's per-epoch metrics from its run dir, by learning rate."""
    return {
        row["overrides"].split("=")[1]: [
            json.loads(line) for line in open(os.path.join(row["run_dir"], "metrics.jsonl"))
        ]
        for row in summary["trials"]
    }


def replay_asha(history, order, metric, max_epochs, concurrent=2):
    """The sweep's own ASHA scheduler (Tune's) fed the grid's per-epoch metrics, trials started in ``order``,
    ``concurrent`` at a time, every epoch taking the same time: the epochs each trial would run."""
    from types import SimpleNamespace

    from hydra_raytrain.config.sweeper import SweepSettings
    from hydra_raytrain.sweep.tuner import asha_scheduler

    scheduler = asha_scheduler(SweepSettings(scheduler="asha"), max_epochs)
    scheduler.set_search_properties(metric, "max")
    waiting, running, epochs = list(order), [], {}
    while waiting or running:
        while waiting and len(running) < concurrent:
            trial = SimpleNamespace(trial_id=waiting.pop(0))
            scheduler.on_trial_add(None, trial)
            running.append(trial)
            epochs[trial.trial_id] = 0
        for trial in list(running):  # each running trial ends one epoch, in the order they started
            epochs[trial.trial_id] += 1
            result = {
                "training_iteration": epochs[trial.trial_id],
                metric: history[trial.trial_id][epochs[trial.trial_id] - 1][metric],
            }
            if epochs[trial.trial_id] == max_epochs:
                scheduler.on_trial_complete(None, trial, result)
                running.remove(trial)
            elif scheduler.on_trial_result(None, trial, result) == "STOP":
                scheduler.on_trial_remove(None, trial)
                running.remove(trial)
    return epochs


def asha() -> None:
    from hydra_raytrain.sweep.space import start_order

    with tempfile.TemporaryDirectory() as grid_dir:
        grid_wall = run(["hydra/sweeper=ray_tune", *ASHA, ASCENDING], grid_dir)
        grid = sweep_summary(grid_dir)
        history = curves(grid)
    grid_epochs = sum(row["epochs"] for row in grid["trials"])
    best = grid["best"]["overrides"]
    print(
        f"8-trial grid run to the end: {grid_epochs} epochs in {grid_wall:.1f} s; "
        f"best {best} ({grid['best']['best']:.4f})"
    )
    for label, values in (("scrambled", SCRAMBLED), ("ascending", ASCENDING)):
        with tempfile.TemporaryDirectory() as asha_dir:
            asha_wall = run(["hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=asha", *ASHA, values], asha_dir)
            asha = sweep_summary(asha_dir)
        asha_epochs = sum(row["epochs"] for row in asha["trials"])
        per_trial = {row["overrides"].split("=")[1]: row["epochs"] for row in asha["trials"]}
        listed = values.split("=")[1].split(",")
        started = [
            lr
            for value in (listed[i] for i in start_order(range(len(listed)), shuffle=True, seed=0))
            for lr in history
            if float(lr) == float(value)
        ]
        print(
            f"ASHA, lr in {label} order: {asha_epochs} epochs in {asha_wall:.1f} s -> "
            f"{asha_epochs / grid_epochs:.0%} of the grid's epochs (target <= 50%); "
            f"best {asha['best']['overrides']} ({asha['best']['best']:.4f}), same as the grid's: "
            f"{asha['best']['overrides'] == best}; epochs per trial {per_trial}, the same in the replay below: "
            f"{replay_asha(history, started, grid['metric'], len(history[started[0]])) == per_trial}"
        )
    # Which trials ASHA stops depends on the order they reach each rung: the same scheduler replayed on the
    # grid's own metrics over many start orders gives the spread a single run cannot.
    lrs, metric, max_epochs = list(history), grid["metric"], len(next(iter(history.values())))
    fractions, same = [], 0
    for seed in range(REPLAYS):
        epochs = replay_asha(
            history, [lrs[i] for i in start_order(range(len(lrs)), shuffle=True, seed=seed)], metric, max_epochs
        )
        fractions.append(sum(epochs.values()) / grid_epochs)
        found = max(
            lrs, key=lambda lr: max(m[metric] for m in history[lr][: epochs[lr]])
        )  # first in the list on ties, as the summary
        same += f"optimizer.lr={found}" == best
    fractions.sort()
    print(
        f"ASHA replayed on the grid's per-epoch metrics over {REPLAYS} seeded start orders: "
        f"median {fractions[REPLAYS // 2]:.0%} of the grid's epochs (mean {sum(fractions) / REPLAYS:.0%}, "
        f"<= 50% in {sum(f <= 0.5 for f in fractions) / REPLAYS:.0%} of orders), "
        f"the grid's best found in {same / REPLAYS:.0%}; without the shuffle, ascending order: "
        f"{sum(replay_asha(history, lrs, metric, max_epochs).values()) / grid_epochs:.0%}"
    )


def driver_rss_mb(pid: int) -> float | None:
    """The resident memory of a process (Linux: /proc), MB; None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as file:
            line = next((line for line in file if line.startswith("VmRSS:")), None)
    except FileNotFoundError:
        return None
    return int(line.split()[1]) / 1024 if line else None


def finished_trials(sweep_dir: str) -> int:
    if not os.path.isdir(sweep_dir):
        return 0
    return sum(os.path.exists(os.path.join(sweep_dir, d, "summary.json")) for d in os.listdir(sweep_dir))


def scale(trials: int = 64) -> None:
    """``trials`` one-epoch trials (2 batches each, 1 worker) sampled from a log-uniform learning rate, as many at a
    time as the cluster holds: start-up per trial, trials per hour, and the driver's memory as trials finish."""
    args = [*SCALE, f"hydra.sweeper.num_samples={trials}", "hydra.sweep.dir=sweep"]
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    marks, memory = sorted({m for m in (8, 32, 64, trials) if m <= trials}), {}
    with tempfile.TemporaryDirectory() as folder, open(os.path.join(folder, "log"), "w") as log:
        started = time.perf_counter()
        command = [sys.executable, "-m", "hydra_raytrain", "-m", "hydra/sweeper=ray_tune", *args]
        process = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
        while process.poll() is None:
            done = finished_trials(os.path.join(folder, "sweep"))
            for mark in marks:
                if done >= mark and mark not in memory and (rss := driver_rss_mb(process.pid)) is not None:
                    memory[mark] = rss
            time.sleep(0.5)
        wall = time.perf_counter() - started
        if process.returncode:
            sys.exit(f"the {trials}-trial sweep failed:\n{open(os.path.join(folder, 'log')).read()[-3000:]}")
        summary = sweep_summary(folder)
        rows = summary["trials"]
        start_up = [row["wall_seconds"] - training_seconds([row["run_dir"]]) for row in rows]
        running = sum(row["wall_seconds"] for row in rows) / wall  # trials at a time, on average over the sweep
    start_up.sort()
    print(
        f"{trials} trials x 1 worker, 1 epoch each: {wall:.0f} s ({len(rows) / wall * 3600:.0f} trials/hour, "
        f"{running:.1f} at a time on average); start-up per trial (its run's wall time less its epochs) median "
        f"{start_up[len(start_up) // 2]:.1f} s, max {start_up[-1]:.1f} s; driver memory "
        + ", ".join(f"{memory[m]:.0f} MB after {m} trials" for m in marks if m in memory)
    )


LOCAL = [
    "trainer.progress_bar=false",
    "hydra/sweeper=ray_tune",
    "hydra.sweeper.scheduler=asha",
    "model=mlp",
    "trainer.max_epochs=4",
    "trainer.limit_train_batches=10",
    "optimizer.lr=" + ",".join(f"{lr:.1e}" for lr in (10 ** (-6 + i * 5 / 15) for i in range(16))),
]


def local() -> None:
    """The same 16-trial ASHA sweep, trials in local mode and on one worker each: trials per hour, and the ratio."""
    hours, epochs = {}, {}
    for workers in (0, 1):
        with tempfile.TemporaryDirectory() as folder:
            wall = run([*LOCAL, f"scaling.num_workers={workers}"], folder)
            rows = sweep_summary(folder)["trials"]
            hours[workers] = len(rows) / wall * 3600
            epochs[workers] = sum(row["epochs"] for row in rows)
            print(
                f"16-trial ASHA sweep, scaling.num_workers={workers}: {wall:.0f} s, {hours[workers]:.0f} trials/hour, "
                f"{epochs[workers]} epochs trained of the grid's 64"
            )
    print(f"local-mode trials: {hours[0] / hours[1]:.2f}x the trials per hour of 1-worker trials (target >= 3x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", help="concurrency, asha, scale and/or local (default: all four)")
    parser.add_argument(
        "--epochs", type=int, default=EPOCHS, help=f"epochs per trial in the concurrency part (default {EPOCHS})"
    )
    parser.add_argument("--trials", type=int, default=64, help="trials of the scale part (default 64)")
    args = parser.parse_args()
    parts = {
        "concurrency": lambda: concurrency(args.epochs),
        "asha": asha,
        "scale": lambda: scale(args.trials),
        "local": local,
    }
    unknown = [part for part in args.parts if part not in parts]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}: valid are {', '.join(parts)}")
    for part in args.parts or parts:
        parts[part]()


if __name__ == "__main__":
    main()
