"""Batch predictions (``python -m hydra_raytrain.predict``) against a plain ``torch.no_grad()`` loop over the same rows.

    .venv/bin/python benchmarks/predict.py            # or: make bench-predict
    .venv/bin/python benchmarks/predict.py --rows 400000 --rounds 1
    .venv/bin/python benchmarks/predict.py --rounds 1 --actors 1 --gpu    # one CPU actor, then one GPU actor

A table of ``--rows`` rows of 64 float32 features and an integer class is written as one Parquet file; an MLP
run trains on it for one short epoch in local mode (what is measured is prediction, not the model's quality).
Then, each in a fresh process, best of ``--rounds``: the plain loop (``load_model``, the file read with pyarrow,
batches of 1,024 rows, softmax and argmax, predictions gathered in memory), that loop on the torch threads one
model actor gets here (the cores less one), the same two loops writing what predict writes (the other columns,
prediction, probabilities) to one Parquet file, and ``hydra_raytrain.predict`` with 1 and 2 model actors on a local
cluster, sized by default (reading, decoding, predicting, writing Parquet; its own figure, from before the first
read to the last write: the actors' start included, Ray's excluded); ``--actors`` chooses the pools, ``--gpu`` adds
one GPU actor. Printed: each figure as it is measured; then rows/s and the ratio to the plain loop (and to the
loops that write, and to the loops on the actor's threads), and for predict the seconds 1,000 rows take (the fixed
cost) and the rate beyond them.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 1024


def write_rows(path: str, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, size=rows)
    features = {f"f{i}": (rng.normal(size=rows) + labels * (i % 3 == 0)).astype(np.float32) for i in range(64)}
    pq.write_table(pa.table({**features, "label": labels, "key": np.arange(rows)}), path)


def train(folder: str, table: str, hidden: list[int]) -> str:
    run = os.path.join(folder, "run")
    args = ["dataset=table", f"dataset.path={table}", "model=mlp", "scaling.num_workers=0", "trainer.max_epochs=1"]
    args += [f"model.hidden_sizes=[{','.join(str(n) for n in hidden)}]"]
    args += [
        "trainer.limit_train_batches=20",
        "trainer.limit_val_batches=2",
        f"hydra.run.dir={run}",
        "dataset.features=[f*]",
    ]
    subprocess.run([sys.executable, "-m", "hydra_raytrain", *args], cwd=folder, check=True, capture_output=True)
    return run


def plain(run: str, table: str, output: str | None = None, threads: int | None = None) -> None:
    """The baseline, in this process: rows/s from the first read to the last prediction; with ``output``, to the
    last row written there as predict writes it (the other columns, prediction, probabilities; Parquet).
    ``threads``: torch's (default: one per core)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from hydra_raytrain import load_model

    if threads:
        torch.set_num_threads(threads)

    model = load_model(run)
    started, predicted = time.perf_counter(), []
    data = pq.ParquetFile(table)
    features = [f"f{i}" for i in range(64)]
    writer = None
    with torch.no_grad():
        for batch in data.iter_batches(batch_size=BATCH, columns=features + (["label", "key"] if output else [])):
            x = torch.from_numpy(np.stack([batch.column(name).to_numpy() for name in features], axis=1))
            probabilities = torch.softmax(model(x), dim=1)
            predicted.append(probabilities.argmax(dim=1).numpy())
            if output:
                p = probabilities.numpy()
                written = pa.table(
                    {
                        "label": batch.column("label"),
                        "key": batch.column("key"),
                        "prediction": pa.array(predicted[-1].astype(np.int64)),
                        "probabilities": pa.FixedSizeListArray.from_arrays(pa.array(p.ravel()), p.shape[1]),
                    }
                )
                writer = writer or pq.ParquetWriter(output, written.schema)
                writer.write_table(written)
    if writer is not None:
        writer.close()
    seconds = time.perf_counter() - started
    print(f"rows {sum(len(p) for p in predicted)} seconds {seconds:.3f}", flush=True)


def measure(command: list[str], cwd: str) -> tuple[int, float]:
    """The rows and seconds a command reports."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True)
    found = re.search(r"Predicted ([\d,]+) rows in ([\d.]+) s", done.stdout) or re.search(
        r"rows (\d+) seconds ([\d.]+)", done.stdout
    )
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    return int(found.group(1).replace(",", "")), float(found.group(2))


def sizes(text: str) -> list[int]:
    if not re.fullmatch(r"\d+(,\d+)*", text):
        raise argparse.ArgumentTypeError(f"{text!r}: layer widths, comma-separated (128,64)")
    return [int(n) for n in text.split(",")]


def main() -> None:
    from hydra_raytrain.shell.program import at_least_one

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--actors", type=at_least_one, action="append", help="model actors of a run (repeatable; 1, 2)")
    parser.add_argument("--gpu", action="store_true", help="predict on one GPU actor (--num-gpus 1) too")
    parser.add_argument("--hidden", type=sizes, default=[128, 64], help="the MLP's hidden layers (128,64)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        table = os.path.join(folder, "rows.parquet")
        write_rows(table, options.rows)
        run = train(folder, table, options.hidden)
        small = os.path.join(folder, "small.parquet")
        write_rows(small, 1000)
        from hydra_raytrain.runtime.host import machine_cores

        threads = max(1, machine_cores() - 1)  # what one model actor gets on a local cluster of this machine
        on = f"{threads} thread{'s' if threads > 1 else ''}"
        alone, same = f"plain loop, {on}", f"the same, {on}"
        actors = options.actors or (1, 2)
        pools = {f"predict, {n} actor{'s' if n > 1 else ''}": ["--num-workers", str(n)] for n in actors}
        if options.gpu:
            pools["predict, 1 GPU actor"] = ["--num-workers", "1", "--num-gpus", "1"]
        names = ("plain loop", alone, "plain loop, writing", same, *pools)
        figures: dict[str, list[float]] = {name: [] for name in names}
        fixed: dict[str, list[float]] = {name: [] for name in figures}
        for round_ in range(options.rounds):
            written = os.path.join(folder, f"plain{round_}.parquet")
            loops = {
                "plain loop": [],
                alone: ["", str(threads)],
                "plain loop, writing": [written],
                same: [written, str(threads)],
            }
            for name, extra in loops.items():
                rows, seconds = measure([sys.executable, __file__, "plain", run, table, *extra], ROOT)
                figures[name].append(rows / seconds)
                print(f"round {round_ + 1} {name:22s} {rows / seconds:11,.0f} rows/s", flush=True)
                if os.path.exists(written):
                    os.remove(written)
            for number, (name, pool) in enumerate(pools.items()):
                for data, into in ((table, figures), (small, fixed)):
                    output = os.path.join(folder, f"out{round_}-{number}-{'fixed' if into is fixed else 'all'}")
                    command = [sys.executable, "-m", "hydra_raytrain.predict", run, data, "--output", output]
                    rows, seconds = measure([*command, *pool, "--batch-size", str(BATCH)], folder)
                    into[name].append(rows / seconds if into is figures else seconds)
                    print(f"round {round_ + 1} {name:22s} {rows:,} rows in {seconds:.2f} s", flush=True)
        base, same_work, base_on = max(figures["plain loop"]), max(figures["plain loop, writing"]), max(figures[alone])
        for name, values in figures.items():
            line = f"{name:22s} {max(values):11,.0f} rows/s  {max(values) / base:.2f}x"
            if name.startswith("predict"):
                line += f" ({max(values) / base_on:.2f}x the plain loop on {on}; {max(values) / same_work:.2f}x the "
                line += f"loop that writes, {max(values) / max(figures[same]):.2f}x on {on})"
            if fixed[name]:  # the seconds 1,000 rows take (the actors' start, Ray Data's planning), and the rest
                start = min(fixed[name])
                rest = options.rows / (options.rows / max(values) - start)
                line += f"   1,000 rows take {start:.1f} s; beyond them {rest:,.0f} rows/s ({rest / base:.2f}x; "
                line += f"{rest / base_on:.2f}x on {on})"
            print(line, flush=True)


if __name__ == "__main__":
    if len(sys.argv) in (4, 5, 6) and sys.argv[1] == "plain":
        plain(*sys.argv[2:5], *(int(n) for n in sys.argv[5:]))
    else:
        main()
