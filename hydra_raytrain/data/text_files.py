"""The files ``dataset=text`` reads: JSON lines and Parquet, a file, a folder or an ``s3://`` prefix of them, read
by pyarrow (no torch here: the config's resolvers read a classification's labels through this module)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.files import absolute_location, filesystem_of, listing

SUFFIXES = (".jsonl", ".json", ".parquet")
LAYOUT = "a .jsonl or .parquet file, or a folder (or s3:// prefix) of them, one row per example"


def read_rows(
    path: str, columns: list[str], key: str, limit: int | None = None, optional: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The rows of every JSON-lines / Parquet file at ``path`` (a file, a folder, an ``s3://`` prefix), in file
    order, holding ``columns`` and those of ``optional`` a file has (the first ``limit`` rows: only the files they
    take are read); a ConfigError naming ``key`` for a missing column or no such file."""
    import pyarrow
    import pyarrow.json
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for file in files_of(path, key):
        fs, location = filesystem_of(file)
        with fs.open_input_file(location) as stream:
            try:
                table = pq.read_table(stream) if file.endswith(".parquet") else pyarrow.json.read_json(stream)
            except pyarrow.ArrowInvalid as error:  # a JSON value of another type than the column's first ones
                reason = str(error).splitlines()[0]
                raise ConfigError(key, path, f"{file} cannot be read: {reason}.", LAYOUT) from None
        check_columns(table.column_names, columns, key, path, file)
        rows.extend(table.select(columns + [c for c in optional if c in table.column_names]).to_pylist())
        if limit is not None and len(rows) >= limit:
            return rows[:limit]
    return rows


def files_of(path: str, key: str) -> list[str]:
    """The JSON-lines and Parquet files at ``path``, in order; a ConfigError naming ``key`` when there is none."""
    files = [file for file in listing(absolute_location(path), key, LAYOUT) if file.lower().endswith(SUFFIXES)]
    if not files:
        raise ConfigError(key, path, "holds no .jsonl or .parquet file.", LAYOUT)
    return files


def check_columns(found: Sequence[str], columns: Sequence[str], key: str, path: str, file: str) -> None:
    missing = [column for column in columns if column not in found]
    if missing:
        raise ConfigError(
            key, path, f"{file} has no column {', '.join(missing)} (its columns: {', '.join(found)}).",
            "the format's columns, or dataset.columns mapping them to yours, e.g. {prompt: question}",
        )  # fmt: skip
