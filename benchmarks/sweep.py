"""Sweeps on this machine: hydra/sweeper=ray_tune against Hydra's sequential basic sweeper, and ASHA against
the full grid.

    .venv/bin/python benchmarks/sweep.py             # or: make bench-sweep

1. The same 4-trial sweep of 1-worker trials (an MLP on the digits, 4 learning rates) twice, each command in a
   fresh process that starts its own local cluster: with Hydra's basic sweeper (one job after another) and
   with hydra/sweeper=ray_tune (concurrent Tune trials). Printed: wall time of each command and the ratio.
2. An 8-trial learning-rate grid with ASHA against the same grid run to the end (both ray_tune): epochs
   consumed and the best config each finds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["model=mlp", "scaling.num_workers=1", "trainer.max_epochs=4", "trainer.limit_train_batches=10", "trainer.progress_bar=false"]
FOUR = ["optimizer.lr=3e-4,1e-3,3e-3,1e-2"]
EIGHT = ["optimizer.lr=1e-5,3e-5,1e-4,3e-4,1e-3,3e-3,1e-2,3e-2"]


def run(args, folder):
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hydra_raytrain", "-m", *args, "hydra.sweep.dir=sweep"], cwd=folder, env=env,
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return wall


def sweep_summary(folder):
    with open(os.path.join(folder, "sweep", "sweep_summary.json")) as file:
        return json.load(file)


def main() -> None:
    with tempfile.TemporaryDirectory() as sequential, tempfile.TemporaryDirectory() as concurrent:
        basic = run([*COMMON, *FOUR], sequential)
        tune = run(["hydra/sweeper=ray_tune", *COMMON, *FOUR], concurrent)
    print(f"4 trials x 1 worker: basic sweeper {basic:.1f} s, ray_tune {tune:.1f} s -> {basic / tune:.2f}x faster (target >= 1.6x)")

    with tempfile.TemporaryDirectory() as grid_dir, tempfile.TemporaryDirectory() as asha_dir:
        grid_wall = run(["hydra/sweeper=ray_tune", *COMMON, *EIGHT], grid_dir)
        asha_wall = run(["hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=asha", *COMMON, *EIGHT], asha_dir)
        grid, asha = sweep_summary(grid_dir), sweep_summary(asha_dir)
    grid_epochs = sum(row["epochs"] for row in grid["trials"])
    asha_epochs = sum(row["epochs"] for row in asha["trials"])
    print(f"8-trial grid: full {grid_epochs} epochs in {grid_wall:.1f} s, ASHA {asha_epochs} epochs in {asha_wall:.1f} s "
          f"-> {asha_epochs / grid_epochs:.0%} of the grid's epochs (target <= 50%)")
    print(f"best config: full grid {grid['best']['overrides']} ({grid['best']['best']:.4f}), "
          f"ASHA {asha['best']['overrides']} ({asha['best']['best']:.4f}); same: {grid['best']['overrides'] == asha['best']['overrides']}")


if __name__ == "__main__":
    main()
