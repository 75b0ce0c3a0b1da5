"""Reading what W&B wrote offline: a run's ``run-<id>.wandb`` file as its protobuf records.

The file is a LevelDB-style log (W&B's own format): a 7-byte header (``:W&B``, magic, version), then 32 KiB
blocks of chunks, each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

BLOCK = 32768
HEADER = 7


def wandb_runs(run_dir: Path) -> list[Path]:
    return sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))


def records(path: Path) -> Iterator[object]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    offset, pending = HEADER, b""
    while offset + HEADER <= len(data):
        left = BLOCK - offset % BLOCK
        if left < HEADER:  # the rest of a block too short for a chunk header is padding
            offset += left
            continue
        length, kind = int.from_bytes(data[offset + 4 : offset + 6], "little"), data[offset + 6]
        pending += data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def run_group(path: Path) -> str:
    """The group the run was started with (its first run record)."""
    return next(record.run.run_group for record in records(path) if record.HasField("run"))


def run_record(path: Path) -> object:
    """The run's first run record: project, entity, group, ... as wandb.init received them."""
    return next(record.run for record in records(path) if record.HasField("run"))
