"""How long the commands of a CI recipe take, each in a fresh process (median of ``--runs`` runs each).

    python benchmarks/commands.py [--runs 5]          # make bench-commands

The figures the tests do not assert (a test that fails on a wall-clock limit fails on a slow day): composing a
config, refusing a bad one (it rehearses a step), checking every shipped experiment, and a smoke run in local mode
and on a local Ray cluster of 2 workers. Each command runs in a scratch folder; the first run of each is a warm-up
that is not counted (the page cache, Python's bytecode).
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "--cfg job (composition only)": ["-m", "hydra_raytrain", "--cfg", "job"],
    "a refused config (trainer.monitor=val_bogus)": ["-m", "hydra_raytrain", "trainer.monitor=val_bogus"],
    "check of every shipped experiment": ["-m", "hydra_raytrain.check", "-m", "experiment=glob(*)"],
    "debug=smoke, local mode": ["-m", "hydra_raytrain", "debug=smoke", "scaling.num_workers=0"],
    "debug=smoke, local cluster, 2 workers": ["-m", "hydra_raytrain", "debug=smoke"],
}


def seconds(args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        subprocess.run([sys.executable, *args], cwd=folder, capture_output=True, timeout=600)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    for label, args in COMMANDS.items():
        seconds(args)  # warm-up
        times = sorted(seconds(args) for _ in range(runs))
        print(f"{label:46} median {statistics.median(times):6.1f} s  (min {times[0]:.1f}, max {times[-1]:.1f})")


if __name__ == "__main__":
    main()
