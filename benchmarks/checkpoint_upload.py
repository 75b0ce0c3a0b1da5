"""Step time with checkpoints every few steps to S3: synchronous against asynchronous upload.

    .venv/bin/python benchmarks/checkpoint_upload.py            # or: make bench-checkpoint
    .venv/bin/python benchmarks/checkpoint_upload.py --rounds 1 --every 20

An S3-compatible server (moto) on loopback; the same run three times per round, each a fresh CLI process on its own
local cluster (2 workers): an MLP whose checkpoint is ~105 MB (8.7M weights and Adam's two moments), 3 epochs of
the digits (23 optimizer steps each), a checkpoint every 5 optimizer steps (``--every``) stored to ``s3://`` with
``checkpoint.checkpoint_upload_mode=SYNC`` and ``ASYNC``, and without mid-epoch checkpoints (the baseline: one at
the end). Printed: the median time per optimizer step of the training phase (mid-epoch checkpoints happen there),
over every epoch of every round, and the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.cli_run import epoch_metrics  # noqa: E402
from hydra_raytrain.runtime.reach import free_port  # noqa: E402
from tests.helpers.s3 import s3_environment, start_moto_server  # noqa: E402  (the tests' loopback S3 server)

COMMON = [
    "model=mlp",
    "model.hidden_sizes=[4096,2048]",
    "trainer.max_epochs=3",
    "trainer.limit_val_batches=2",
    "checkpoint.every_n_epochs=3",
    "trainer.progress_bar=false",
]


def contenders(every: int) -> dict[str, list[str]]:
    return {
        "no mid-epoch checkpoint": [],
        f"every {every} steps, SYNC": [f"checkpoint.every_n_steps={every}", "checkpoint.checkpoint_upload_mode=SYNC"],
        f"every {every} steps, ASYNC": [f"checkpoint.every_n_steps={every}", "checkpoint.checkpoint_upload_mode=ASYNC"],
    }


def start_s3() -> subprocess.Popen:
    """The loopback S3 server, its endpoint and dummy credentials in this process's environment (which the CLI runs
    and their Ray clusters inherit), and the benchmark's bucket."""
    port = free_port()
    server = start_moto_server(port)
    os.environ.update(s3_environment(f"http://127.0.0.1:{port}"))
    import pyarrow.fs

    pyarrow.fs.S3FileSystem(endpoint_override=os.environ["AWS_ENDPOINT_URL"], allow_bucket_creation=True).create_dir(
        "bench"
    )
    return server


def step_seconds(overrides: list[str], prefix: str) -> list[float]:
    """Seconds per optimizer step of each epoch's training phase, from metrics.jsonl."""
    epochs, config = epoch_metrics([*COMMON, *overrides, f"storage.path=s3://bench/{prefix}"])
    batch = config["trainer"]["batch_size"]  # global
    # samples_per_second counts the epoch's training phase (mid-epoch checkpoints included).
    return [batch / epoch["samples_per_second"] for epoch in epochs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--every", type=int, default=5, help="checkpoint.every_n_steps (default 5)")
    args = parser.parse_args()
    rounds, runs = args.rounds, contenders(args.every)
    server = start_s3()
    try:
        times: dict[str, list[float]] = {label: [] for label in runs}
        for round_ in range(rounds):  # alternating, so that a slow minute of the machine hits every contender
            for index, (label, overrides) in enumerate(runs.items()):
                times[label] += step_seconds(overrides, f"r{round_}-{index}")
                print(
                    f"round {round_ + 1}: {label}: {[f'{t * 1000:.0f}' for t in times[label][-3:]]} ms/step", flush=True
                )
    finally:
        server.terminate()
        server.wait()
    medians = {label: statistics.median(values) for label, values in times.items()}
    base = medians["no mid-epoch checkpoint"]
    for label, median in medians.items():
        print(f"{label:26} median {median * 1000:7.1f} ms per optimizer step  ({median / base:.2f}x the baseline)")
    sync, async_ = (medians[f"every {args.every} steps, {mode}"] for mode in ("SYNC", "ASYNC"))
    print(f"ASYNC / SYNC step time: {async_ / sync:.2f}")


if __name__ == "__main__":
    main()
