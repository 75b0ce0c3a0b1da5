"""Reading one table file (Parquet, CSV or JSON lines, by its suffix; a local path or an ``s3://`` URI): where
it is and its format (``locate``), read whole once per process and file version (``read_table``) or streamed as
record batches (``record_batches``), its schema, pyarrow's parse errors as one ConfigError naming the bad line;
and which road it takes (``streams_table``): its size in memory against ``dataset.memory_limit_mb``.
No torch or Ray at import: the config's resolvers read the file through this module.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.files import absolute_location, filesystem_of, pq_file

SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json", ".ndjson": "json"}
FORMATS = "a .parquet, .csv or .jsonl (JSON lines) file, local or s3://"
READS = ("auto", "memory", "stream")
MB = 2**20


# Which road: the table's size in memory against dataset.memory_limit_mb.


def streams_table(path: str, read: str = "auto", memory_limit_mb: float = 1024) -> bool:
    """Whether the table streams through Ray Data: ``read=stream``, or ``auto`` and above the limit."""
    if read not in READS:
        raise ConfigError("dataset.read", read, "is no way to read a table.", " | ".join(READS))
    if read != "auto":
        return read == "stream"
    if not isinstance(memory_limit_mb, (int, float)) or memory_limit_mb < 0:
        raise ConfigError("dataset.memory_limit_mb", memory_limit_mb, "must be a number of MB >= 0.", "e.g. 1024")
    return table_bytes(path) > memory_limit_mb * MB


def table_bytes(path: str) -> int:
    """The table's size in memory, near enough to choose a road: a Parquet file's uncompressed row groups (its
    footer), a text file's size."""
    kind, _, fs, inside, size, _ = locate(path)
    if kind != "parquet":
        return size
    with pq_file(inside, fs) as file:
        meta = file.metadata
        return sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))


def reading_line(node: Mapping[str, Any]) -> str:
    """The sizing line of a table: its size and the road taken, and why."""
    read, limit = node.get("read", "auto"), node.get("memory_limit_mb", 1024)
    size = table_bytes(node["path"]) / MB
    road = (
        "streamed through Ray Data, read and decoded by its tasks on the cluster's CPUs"
        if streams_table(node["path"], read, limit)
        else "read whole into each worker's memory as tensors"
    )
    why = f"dataset.read={read}" + (f", dataset.memory_limit_mb={limit:g}" if read == "auto" else "")
    return f"Data: {node['path']} ({size:,.1f} MB in memory): {road} ({why})"


def locate(path: str) -> tuple[str, str, Any, str, int, int | None]:
    """The file's format, URI, filesystem, path inside it, size and modification time; a ConfigError naming
    ``dataset.path`` when it is missing or of another format."""
    suffix = os.path.splitext(str(path).lower())[1]
    if suffix not in SUFFIXES:
        raise ConfigError("dataset.path", path, f"has the suffix {suffix or '(none)'!r}.", FORMATS)
    import pyarrow.fs

    location = absolute_location(path)
    try:
        fs, inside = filesystem_of(location)
        info = fs.get_file_info(inside)
    except Exception as error:  # no credentials, no bucket, no endpoint
        raise ConfigError("dataset.path", path, f"cannot be read: {' '.join(str(error).split())}", FORMATS) from None
    if info.type != pyarrow.fs.FileType.File:
        raise ConfigError("dataset.path", path, "no such file.", FORMATS)
    return SUFFIXES[suffix], location, fs, inside, int(info.size or 0), info.mtime_ns


def read_table(path: str) -> Any:
    """The file as a pyarrow Table (read once per process and file version); a ConfigError naming
    ``dataset.path`` when it is missing, of another format, or does not parse (the parser's row and reason)."""
    kind, location, _, _, size, mtime_ns = locate(path)
    return _read(location, kind, mtime_ns, size)


@functools.lru_cache(maxsize=4)
def _read(location: str, kind: str, mtime_ns: int | None, size: int | None) -> Any:
    import pyarrow.csv
    import pyarrow.json
    import pyarrow.parquet

    fs, inside = filesystem_of(location)
    with parsing(location, kind):
        if kind == "parquet":
            return pyarrow.parquet.read_table(inside, filesystem=fs)
        with fs.open_input_stream(inside) as stream:  # whole-file readers: each column's type from all its values
            if kind == "json":
                return pyarrow.json.read_json(stream)
            return pyarrow.csv.read_csv(stream, parse_options=_csv_parsing(location))


def record_batches(
    location: str, kind: str, columns: Sequence[str] | None, row_groups: Sequence[int] | None = None
) -> Any:
    """The file's record batches, streamed (``columns``: only those; ``row_groups``: only those, of a Parquet
    file). A JSON file is read whole where pyarrow has no streaming JSON reader."""
    import pyarrow.csv
    import pyarrow.json

    fs, inside = filesystem_of(location)
    if kind == "parquet":
        with pq_file(inside, fs) as file:
            groups = range(file.metadata.num_row_groups) if row_groups is None else row_groups
            if groups:
                yield from file.iter_batches(row_groups=list(groups), columns=list(columns) if columns else None)
        return
    with fs.open_input_stream(inside) as stream:
        if kind == "csv":
            converting = pyarrow.csv.ConvertOptions(include_columns=list(columns) if columns else None)
            yield from pyarrow.csv.open_csv(stream, parse_options=_csv_parsing(location), convert_options=converting)
        elif hasattr(pyarrow.json, "open_json"):
            reader = pyarrow.json.open_json(stream)
            yield from (batch.select(list(columns)) if columns else batch for batch in reader)
        else:
            data = pyarrow.json.read_json(stream)
            yield from (data.select(list(columns)) if columns else data).to_batches()


_INVALID: dict[str, list[Any]] = {}  # per CSV file: the rows of another column count, the first named with its line


def _csv_parsing(location: str) -> Any:
    import pyarrow.csv

    invalid = _INVALID.setdefault(location, [])

    def first_invalid(row: Any) -> str:
        invalid.append(row)
        return "error"

    return pyarrow.csv.ParseOptions(invalid_row_handler=first_invalid)


@contextlib.contextmanager
def parsing(location: str, kind: str) -> Iterator[None]:
    """Turns pyarrow's parse errors into one ConfigError naming ``dataset.path`` (a CSV's bad line by number)."""
    import pyarrow

    _INVALID.pop(location, None)
    try:
        yield
    except pyarrow.ArrowInvalid as error:
        reason = " ".join(str(error).split())
        invalid = _INVALID.get(location)
        if invalid:
            fs, inside = filesystem_of(location)
            row = invalid[0]
            reason = (
                f"line {_line_of(fs, inside, row.text)} has {row.actual_columns} columns, the header "
                f"{row.expected_columns}: {row.text[:80]!r}"
            )
        raise ConfigError("dataset.path", location, f"does not parse as {kind.upper()}: {reason}.", FORMATS) from None
    finally:
        _INVALID.pop(location, None)


def schema_of(location: str, kind: str) -> Any:
    """The file's columns and types: a Parquet footer, or a text file's first block."""
    import pyarrow.parquet as pq

    fs, inside = filesystem_of(location)
    if kind == "parquet":
        return pq.read_schema(inside, filesystem=fs)
    with parsing(location, kind):
        first = next(iter(record_batches(location, kind, None)), None)
    if first is None:
        raise ConfigError("dataset.path", location, "holds no rows.", FORMATS)
    return first.schema


def first_value(location: str, kind: str, name: str) -> Any:
    """The column's value in the file's first row, as Python (a vector column's: lists)."""
    with parsing(location, kind):
        for batch in record_batches(location, kind, [name]):
            if batch.num_rows:
                return batch.column(0)[0].as_py()
    raise ConfigError("dataset.path", location, "holds no rows.", FORMATS)


def table_schema(path: str) -> Any:
    kind, location, *_ = locate(path)
    return schema_of(location, kind)


def _line_of(fs: Any, inside: str, text: str) -> int | str:
    """The line number of a row's text in the file (pyarrow does not say), or "a" line."""
    with fs.open_input_stream(inside) as stream:
        for number, line in enumerate(stream.read().decode(errors="replace").splitlines(), start=1):
            if number > 1 and line.rstrip("\r") == text:
                return number
    return "a"
