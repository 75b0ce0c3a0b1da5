"""Ray Data against the in-worker loader, and a data set streamed past one worker's memory.

    .venv/bin/python benchmarks/streaming.py         # or: make bench-streaming

1. Throughput: the bundled digits (1,797 8x8 images) as ``dataset=digits`` (built in each worker: its DataLoader,
   ``trainer.data_on_device=false``, and its default, the tensors held in memory) and the same digits written as
   Parquet (``dataset=parquet``: read and decoded by Ray Data's tasks, sharded with ``iter_torch_batches``). Then
   the one-file case: the digits as one file of 64 number columns, read whole into the workers (``dataset=table``,
   the road its size takes) and streamed by Ray Data from that same file with the same split
   (``dataset.read=stream``). MLP, global batch 64,
   one worker sized to the machine, 6 epochs, each a fresh CLI process on its own local cluster: the median
   training samples/s of epochs 2-6, and its ratio to the in-worker DataLoader's.
2. Memory: a synthetic Parquet table of ``--rows`` rows of 2,048 float32 features (2 GiB at the default 262,144
   rows) streamed through one epoch with an object store of 3% of RAM (~0.7 GiB here); the worker's peak
   private memory (USS) and resident memory, sampled every 16 batches (``benchmarks/timing.py``'s PeakMemory
   task), against the table's size in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.cli_run import epoch_metrics  # noqa: E402

COMMON = ["model=mlp", "trainer.max_epochs=6", "trainer.batch_size=64", "trainer.progress_bar=false"]
FEATURES = 2048
GIB = 2**30
STORE_SHARE = 0.03


def steady_samples_per_second(args: list[str]) -> float:
    epochs, _ = epoch_metrics([*COMMON, *args])
    return statistics.median(epoch["samples_per_second"] for epoch in epochs[1:])


def write_digits(folder: str) -> None:
    import pathlib

    from tests.helpers.data import write_digits_parquet

    write_digits_parquet(pathlib.Path(folder), files=5)


def write_one_file(folder: str) -> str:
    """The digits as one Parquet file of 64 number columns and the label (``dataset=table``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hydra_raytrain.data.bundled import digits_arrays

    pixels, target = digits_arrays()
    values = (pixels.reshape(len(pixels), 64) / 16.0).astype(np.float32)
    os.makedirs(folder, exist_ok=True)
    columns = os.path.join(folder, "columns.parquet")
    pq.write_table(pa.table({**{f"p{i}": values[:, i] for i in range(64)}, "label": target.astype(np.int64)}), columns)
    return columns


def write_table(folder: str, rows: int, files: int = 16) -> int:
    """``rows`` rows of FEATURES random float32 features and a label in 0..9, ``files`` files; its bytes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file = rows // files
    for i in range(files):
        values = rng.standard_normal(per_file * FEATURES, dtype=np.float32)
        table = pa.table(
            {
                "features": pa.FixedSizeListArray.from_arrays(pa.array(values), FEATURES),
                "label": pa.array(rng.integers(0, 10, per_file)),
            }
        )
        pq.write_table(table, os.path.join(folder, f"part-{i:03d}.parquet"), compression="none")
    return per_file * files * (FEATURES * 4 + 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=262_144)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if not options.skip_throughput:
            digits = os.path.join(scratch, "digits")
            write_digits(digits)
            columns = write_one_file(os.path.join(scratch, "one"))
            figures = {
                "in-worker DataLoader": steady_samples_per_second(["dataset=digits", "trainer.data_on_device=false"]),
                "in-worker tensors (default)": steady_samples_per_second(["dataset=digits"]),
                "Ray Data (dataset=parquet)": steady_samples_per_second(
                    ["dataset=parquet", f"dataset.path={digits}", "dataset.input_shape=[1,8,8]"]
                ),
                "one file, in memory (table)": steady_samples_per_second(["dataset=table", f"dataset.path={columns}"]),
                "one file, streamed (table)": steady_samples_per_second(
                    ["dataset=table", f"dataset.path={columns}", "dataset.read=stream"]
                ),
            }
            base = figures["in-worker DataLoader"]
            for name, value in figures.items():
                print(f"{name:30s} {value:9,.0f} samples/s  {value / base:.2f}x", flush=True)
        if options.skip_memory:
            return
        # A small object store (Ray's share of RAM for it; the CLI's local cluster reads the variable): the table
        # cannot sit in it either.
        os.environ["RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION"] = str(STORE_SHARE)
        for rows in (options.rows // 4, options.rows):  # the worker's memory should not grow with the data
            stream_once(os.path.join(scratch, f"table{rows}"), rows, os.path.join(scratch, f"peak{rows}.json"))


def stream_once(table: str, rows: int, record: str) -> None:
    size = write_table(table, rows)
    epochs, _ = epoch_metrics(
        [
            "model=mlp",
            "dataset=parquet",
            f"dataset.path={table}",
            "trainer.max_epochs=1",
            "trainer.batch_size=256",
            "trainer.progress_bar=false",
            "task._target_=benchmarks.timing.PeakMemory",
            f"+task.record_to={record}",
        ]
    )
    with open(record) as file:
        peak = json.load(file)
    print(
        f"streamed {rows:,} rows x {FEATURES} float32 ({size / GIB:.2f} GiB in memory) through one epoch at "
        f"{epochs[0]['samples_per_second']:,.0f} samples/s, object store {STORE_SHARE:.0%} of RAM: the worker's "
        f"peak private memory (USS) {peak['uss'] / GIB:.2f} GiB, peak RSS {peak['rss'] / GIB:.2f} GiB (with the "
        "object store's pages it read)",
        flush=True,
    )
    shutil.rmtree(table)


if __name__ == "__main__":
    main()
