"""``dataset=table``: one table file (Parquet, CSV or JSON lines, by its suffix; a local path or an ``s3://`` URI)
split by rows. Features are number columns picked by name or fnmatch pattern; the label is a column of classes
(integers, or strings mapped to indices in sorted order: ``dataset.classes``, stored with the run's config so
``evaluate`` maps them alike) or of values (floats: regression).

Two roads, chosen by size (``dataset.read``): a table that fits (``dataset.memory_limit_mb``, its columns as
held in memory) is read whole into every worker's memory as tensors, the fast path; a larger one streams through
Ray Data, read in parallel by row groups (Parquet) and decoded on the cluster's CPUs. Both split alike: a row
validates when a hash of its position and ``split_seed`` is among the ``val_fraction`` smallest (``row_split``;
with ``folds``, in its fold's band of those hashes), so the same rows validate on either road, on every worker,
wherever the file is stored.

The resolvers below read the file on the driver for the config's ``input_shape``, ``num_outputs`` and
``classes`` (a streamed table's schema and label column only); the builder reads it in each worker, or describes
the stream on the driver."""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.config.paths import LocalPath
from hydra_raytrain.data import streamed
from hydra_raytrain.data.decode import FEATURES, LABELS, Decode
from hydra_raytrain.data.files import absolute_location, filesystem_of
from hydra_raytrain.data.streamed import Streamed

SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json", ".ndjson": "json"}
FORMATS = "a .parquet, .csv or .jsonl (JSON lines) file, local or s3://"
READS = ("auto", "memory", "stream")
MB = 2**20


def table(
    path: LocalPath,
    input_shape: Sequence[int],
    num_outputs: int,
    features: Sequence[str] = ("*",),
    label: str = "label",
    classes: Sequence[str] | None = None,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    read: str = "auto",
    memory_limit_mb: float = 1024,
    local_shuffle_buffer_size: int | None = None,
    columns: Sequence[str] | None = None,
    test_fraction: float = 0.0,
    folds: int | None = None,
    fold: int = 0,
) -> Any:
    """The table's rows as ``(features float32 [F], label)`` pairs, ``val_fraction`` of them validating and
    ``test_fraction`` held out to test (``row_split``; with ``folds``, fold ``fold`` of the other rows
    validates): ``Splits`` of tensors read here, or a ``Streamed`` for Ray Data (``streams_table``).
    ``columns``: the feature columns the config resolved (``table_columns``), checked against the file's."""
    split = functools.partial(
        row_split, val_fraction=val_fraction, test_fraction=test_fraction, seed=split_seed, folds=folds, fold=fold
    )
    if streams_table(path, read, memory_limit_mb):
        stream = streamed_table(path, input_shape, num_outputs, features, label, classes, split, split_seed)
        check_columns(columns, stream.table.columns[:-1])
        streamed.check_stream_options("files", local_shuffle_buffer_size, 1)
        return dataclasses.replace(stream, local_shuffle_buffer_size=local_shuffle_buffer_size)
    import torch
    from torch.utils.data import TensorDataset

    from hydra_raytrain.data.splits import Splits  # torch: not for the driver's resolvers

    data = read_table(path)
    chosen = feature_columns(data, features, label)
    check_columns(columns, chosen)
    check_input_shape(input_shape, chosen)
    x = torch.tensor(_matrix(data, chosen), dtype=torch.float32)
    y = label_tensor(data, label, classes, num_outputs)
    val, test = (torch.from_numpy(mask) for mask in split(len(y)).masks(np.arange(len(y)), split_seed))
    train = ~(val | test)
    held = TensorDataset(x[test], y[test]) if test_fraction else None
    return Splits(TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val]), held)


def check_columns(columns: Sequence[str] | None, chosen: Sequence[str]) -> None:
    if columns is not None and list(columns) != list(chosen):
        raise ConfigError(
            "dataset.columns", list(columns), f"the file's columns that dataset.features picks are {list(chosen)}."
        )


def check_input_shape(input_shape: Sequence[int], columns: Sequence[str]) -> None:
    if list(input_shape) != [len(columns)]:
        raise ConfigError(
            "dataset.input_shape", list(input_shape), f"the features are {len(columns)} columns.", f"[{len(columns)}]"
        )


# The split: a row's position, mixed with the seed (splitmix64's finalizer: a bijection, so distinct positions
# never tie), and the ``val_fraction`` smallest keys validate. Computed from the row count alone, so the driver
# knows each split's rows (and each worker its steps) before anything is read.

_SPLIT_CHUNK = 1 << 24


def split_keys(positions: np.ndarray, seed: int) -> np.ndarray:
    """A well-mixed, distinct uint64 per row position (splitmix64 of ``position + seed * golden ratio``)."""
    with np.errstate(over="ignore"):
        keys = positions.astype(np.uint64) + np.uint64((int(seed) * 0x9E3779B97F4A7C15) % 2**64)
        keys ^= keys >> np.uint64(30)
        keys *= np.uint64(0xBF58476D1CE4E5B9)
        keys ^= keys >> np.uint64(27)
        keys *= np.uint64(0x94D049BB133111EB)
        keys ^= keys >> np.uint64(31)
    return keys


def validation_rows(rows: int, val_fraction: float) -> int:
    """How many of ``rows`` validate: ``round(rows * val_fraction)``, at least one, and at least one trains."""
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise ConfigError(
            "dataset.val_fraction", val_fraction, "must be between 0 and 1 (exclusive).", "a fraction, e.g. 0.2"
        )
    if rows < 2:
        raise ConfigError("dataset.path", rows, "the table has fewer than 2 rows: nothing to split.")
    return min(rows - 1, max(1, round(rows * val_fraction)))


def val_threshold(rows: int, val_fraction: float, seed: int) -> int:
    """The largest validating key: the ``validation_rows``-th smallest of the rows' keys."""
    return nth_key(rows, validation_rows(rows, val_fraction), seed)


def nth_key(rows: int, wanted: int, seed: int) -> int:
    """The ``wanted``-th smallest of the rows' keys (in chunks of 16M rows: a histogram of the keys' top 16 bits
    finds the bucket it is in, then that bucket is sorted)."""
    if rows <= _SPLIT_CHUNK:
        return int(np.partition(split_keys(np.arange(rows), seed), wanted - 1)[wanted - 1])

    def chunks() -> Iterator[np.ndarray]:  # the keys, 16M rows at a time
        for start in range(0, rows, _SPLIT_CHUNK):
            yield split_keys(np.arange(start, min(rows, start + _SPLIT_CHUNK)), seed)

    top = np.uint64(48)
    counts = sum(np.bincount((keys >> top).astype(np.int64), minlength=1 << 16) for keys in chunks())
    cumulative = np.cumsum(counts)
    bucket = int(np.searchsorted(cumulative, wanted))
    before = int(cumulative[bucket - 1]) if bucket else 0
    inside = np.concatenate([keys[(keys >> top) == bucket] for keys in chunks()])
    return int(np.partition(inside, wanted - before - 1)[wanted - before - 1])


def val_mask(positions: np.ndarray, threshold: int, seed: int) -> np.ndarray:
    """Which of the rows at ``positions`` validate."""
    return split_keys(positions, seed) <= np.uint64(threshold)


@dataclass(frozen=True)
class RowSplit:
    """Which rows validate and which test, as two bands of keys: a row whose key is in ``test`` tests, one whose
    key is in ``val`` (and not in ``test``) validates, the rest train. A band is (exclusive low, inclusive high),
    a low of -1 meaning none. ``counts``: each split's rows."""

    val: tuple[int, int]
    test: tuple[int, int]
    counts: Mapping[str, int]

    def masks(self, positions: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Which of the rows at ``positions`` validate, and which test (the rest train)."""
        keys = split_keys(positions, seed)
        test = _in_band(keys, self.test)
        return _in_band(keys, self.val) & ~test, test


def _in_band(keys: np.ndarray, band: tuple[int, int]) -> np.ndarray:
    inside = keys <= np.uint64(band[1])
    return inside & (keys > np.uint64(band[0])) if band[0] >= 0 else inside


def row_split(
    rows: int, val_fraction: float, test_fraction: float, seed: int, folds: int | None = None, fold: int = 0
) -> RowSplit:
    """The split of a table of ``rows`` rows, from the row count alone (so the driver knows each split's rows, and
    each worker its steps, before anything is read). Validation: the ``val_fraction`` smallest keys; the test rows:
    the ``test_fraction`` whose keys come next (so asking for a test split leaves validation as it was).

    With ``folds=K`` (cross-validation, as ``splits.split_indices``): the test rows as above; the other rows, in
    key order, cut into K near-equal folds, fold ``fold`` validating. The K runs of ``fold=0..K-1`` validate on
    disjoint folds that together hold every row outside the test split once."""
    from hydra_raytrain.data.splits import check_fractions, fold_range

    check_fractions(val_fraction, test_fraction)
    n_val = validation_rows(rows, val_fraction)
    n_test = validation_rows(rows, val_fraction + test_fraction) - n_val if test_fraction else 0
    if test_fraction and not n_test:
        raise ConfigError("dataset.test_fraction", test_fraction, f"holds no row of {rows} (a larger fraction).")
    usual = val_threshold(rows, val_fraction, seed)
    test = (usual, nth_key(rows, n_val + n_test, seed)) if n_test else (usual, usual)
    tested = {"test": n_test} if test_fraction else {}
    cut = fold_range(rows - n_test, folds, fold)  # the fold's ranks among the rows outside the test split
    if cut is None:
        return RowSplit((-1, usual), test, {"train": rows - n_val - n_test, "val": n_val, **tested})
    first, end = cut

    def key_at(rank: int) -> int:  # the key of the row at this rank among the other rows (skipping the test band)
        return nth_key(rows, rank + 1 + (n_test if rank >= n_val else 0), seed)

    val = (key_at(first - 1) if first else -1, key_at(end - 1))
    return RowSplit(val, test, {"train": rows - n_test - (end - first), "val": end - first, **tested})


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
    kind, _, fs, inside, size, _ = _locate(path)
    if kind != "parquet":
        return size
    with _parquet(fs, inside) as file:
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


def _locate(path: str) -> tuple[str, str, Any, str, int, int | None]:
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


def _parquet(fs: Any, inside: str) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(inside, filesystem=fs)


def read_table(path: str) -> Any:
    """The file as a pyarrow Table (read once per process and file version); a ConfigError naming
    ``dataset.path`` when it is missing, of another format, or does not parse (the parser's row and reason)."""
    kind, location, _, _, size, mtime_ns = _locate(path)
    return _read(location, kind, mtime_ns, size)


@functools.lru_cache(maxsize=4)
def _read(location: str, kind: str, mtime_ns: int | None, size: int | None) -> Any:
    import pyarrow.csv
    import pyarrow.json
    import pyarrow.parquet

    fs, inside = filesystem_of(location)
    with _parsing(location, kind):
        if kind == "parquet":
            return pyarrow.parquet.read_table(inside, filesystem=fs)
        with fs.open_input_stream(inside) as stream:  # whole-file readers: each column's type from all its values
            if kind == "json":
                return pyarrow.json.read_json(stream)
            return pyarrow.csv.read_csv(stream, parse_options=_csv_parsing(location))


def _batches(location: str, kind: str, columns: Sequence[str] | None, row_groups: Sequence[int] | None = None) -> Any:
    """The file's record batches, streamed (``columns``: only those; ``row_groups``: only those, of a Parquet
    file). A JSON file is read whole where pyarrow has no streaming JSON reader."""
    import pyarrow.csv
    import pyarrow.json

    fs, inside = filesystem_of(location)
    if kind == "parquet":
        with _parquet(fs, inside) as file:
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
def _parsing(location: str, kind: str) -> Iterator[None]:
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


def _schema(location: str, kind: str) -> Any:
    """The file's columns and types: a Parquet footer, or a text file's first block."""
    import pyarrow.parquet as pq

    fs, inside = filesystem_of(location)
    if kind == "parquet":
        return pq.read_schema(inside, filesystem=fs)
    with _parsing(location, kind):
        first = next(iter(_batches(location, kind, None)), None)
    if first is None:
        raise ConfigError("dataset.path", location, "holds no rows.", FORMATS)
    return first.schema


def table_schema(path: str) -> Any:
    kind, location, *_ = _locate(path)
    return _schema(location, kind)


def _line_of(fs: Any, inside: str, text: str) -> int | str:
    """The line number of a row's text in the file (pyarrow does not say), or "a" line."""
    with fs.open_input_stream(inside) as stream:
        for number, line in enumerate(stream.read().decode(errors="replace").splitlines(), start=1):
            if number > 1 and line.rstrip("\r") == text:
                return number
    return "a"


def feature_columns(data: Any, features: Sequence[str] | str, label: str) -> list[str]:
    """The columns ``features`` names (names or patterns, in the table's order), less the label; each pattern
    must name a column, and each column hold numbers (and, in a table read whole, no empty values)."""
    import pyarrow as pa
    import pyarrow.types as types

    check_label(data, label)
    read = isinstance(data, pa.Table)
    schema = data.schema if read else data
    patterns = [features] if isinstance(features, str) else list(features)
    names = [name for name in schema.names if name != label]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ConfigError(
                "dataset.features",
                patterns,
                f"{pattern!r} names no column of the table{did_you_mean(pattern, names)}.",
                f"column names or patterns of: {', '.join(names)}",
            )

    def numbers(name: str) -> bool:
        kind = schema.field(name).type
        return bool(types.is_integer(kind) or types.is_floating(kind) or types.is_boolean(kind))

    chosen = pick_columns(names, patterns, numbers)
    for name in chosen:
        kind = schema.field(name).type
        if not numbers(name):
            raise ConfigError(
                "dataset.features",
                patterns,
                f"the column {name!r} holds {kind}, not numbers.",
                "number columns (leave this one out: name the others, or encode it as numbers)",
            )
        if read and data.column(name).null_count:
            raise ConfigError(
                "dataset.features", patterns, f"the column {name!r} has {data.column(name).null_count} empty values."
            )
    return chosen


def pick_columns(names: Sequence[str], patterns: Sequence[str], numbers: Callable[[str], bool]) -> list[str]:
    """The columns ``patterns`` pick, in ``names``' order: a column named outright (which must then hold numbers),
    and the number columns a pattern matches."""
    return [
        name
        for name in names
        if name in patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns if p not in names) and numbers(name)
    ]


def check_label(data: Any, label: str) -> None:
    """The label is a column of the table (or schema), with no empty values where the table was read."""
    names = list(data.schema.names if hasattr(data, "column_names") else data.names)
    if label not in names:
        raise ConfigError(
            "dataset.label",
            label,
            f"the table has no such column{did_you_mean(label, names)}.",
            f"one of its columns: {', '.join(names)}",
        )
    if hasattr(data, "column_names") and data.column(label).null_count:
        raise ConfigError("dataset.label", label, f"has {data.column(label).null_count} empty values.")


def _matrix(data: Any, columns: list[str]) -> Any:
    import numpy as np

    return np.stack([data.column(name).to_numpy(zero_copy_only=False).astype(np.float32) for name in columns], axis=1)


def label_tensor(data: Any, label: str, classes: Sequence[str] | None, num_outputs: int) -> Any:
    """Class indices (``classes``' order for strings), or the values as a ``[N, 1]`` float column for regression."""
    import numpy as np
    import torch

    values = data.column(label).to_numpy(zero_copy_only=False)
    if classes is not None:
        index = {name: position for position, name in enumerate(classes)}
        unknown = sorted({str(v) for v in values} - set(index))
        if unknown:
            raise ConfigError(
                "dataset.classes", list(classes), f"the label column has values it lacks: {', '.join(unknown[:5])}."
            )
        return torch.tensor([index[str(v)] for v in values], dtype=torch.long)
    if num_outputs > 1:  # integer classes
        return torch.tensor(values.astype(np.int64))
    return torch.tensor(values.astype(np.float32)).unsqueeze(1)  # a value (num_outputs=1 regresses an integer too)


# The resolvers of conf/dataset/table.yaml: what the driver reads from the file for the config (the schema, and
# one pass over the label column; never the whole table).


@dataclass(frozen=True)
class LabelStats:
    strings: bool
    values: tuple[str, ...]  # a string label's distinct values, sorted
    largest: float | None  # a number label's largest value
    integers: bool
    nulls: int
    rows: int


def label_stats(path: str, label: str) -> LabelStats:
    kind, location, _, _, size, mtime_ns = _locate(path)
    check_label(_schema(location, kind), label)
    return _label_stats(location, kind, label, mtime_ns, size)


@functools.lru_cache(maxsize=8)
def _label_stats(location: str, kind: str, label: str, mtime_ns: int | None, size: int) -> LabelStats:
    import pyarrow.compute as pc
    import pyarrow.types as types

    column_type = _schema(location, kind).field(label).type
    strings = any(test(column_type) for test in (types.is_string, types.is_large_string, types.is_dictionary))
    values: set[str] = set()
    largest, nulls, rows = None, 0, 0
    with _parsing(location, kind):
        for batch in _batches(location, kind, [label]):
            column = batch.column(0)
            nulls, rows = nulls + column.null_count, rows + len(column)
            if strings:
                values.update(str(v) for v in pc.unique(column).to_pylist() if v is not None)
            elif len(column) > column.null_count:
                top = pc.max(column).as_py()
                largest = top if largest is None else max(largest, top)
    integers = bool(types.is_integer(column_type) or types.is_boolean(column_type))
    return LabelStats(strings, tuple(sorted(values)), largest, integers, nulls, rows)


def table_classes(path: str, label: str = "label") -> list[str] | None:
    """``dataset.classes``: a string label's values, sorted (their indices are the classes); None otherwise."""
    stats = label_stats(path, label)
    if stats.nulls:
        raise ConfigError("dataset.label", label, f"has {stats.nulls} empty values.")
    return list(stats.values) if stats.strings else None


def table_columns(path: str, features: Any = ("*",), label: str = "label") -> list[str]:
    """``dataset.columns``: the feature columns ``dataset.features`` picks, in the table's order (what the run
    trained on, kept with it: ``predict`` reads its inputs' columns by these names)."""
    patterns = [features] if isinstance(features, str) else [str(pattern) for pattern in features]
    return feature_columns(table_schema(path), patterns, label)


def table_shape(path: str, features: Any = ("*",), label: str = "label") -> list[int]:
    """``dataset.input_shape``: ``[the number of feature columns]``."""
    return [len(table_columns(path, features, label))]


def table_outputs(path: str, label: str = "label") -> int:
    """The classes of a string label, the largest integer label + 1, or 1 for a float label (regression)."""
    named = table_classes(path, label)
    if named is not None:
        return len(named)
    stats = label_stats(path, label)
    if stats.integers:
        return int(stats.largest if stats.largest is not None else 0) + 1
    return 1


# The streamed road: Ray Data reads the file in parallel read units (runs of a Parquet file's row groups; a
# text file whole), each knowing its first row's position, so each unit keeps its split's rows by ``RowSplit.masks``.

ROWS_PER_UNIT = 1 << 20  # about this many rows per read unit (whole row groups)


def streamed_table(
    path: str,
    input_shape: Sequence[int],
    num_outputs: int,
    features: Sequence[str],
    label: str,
    classes: Sequence[str] | None,
    split: Callable[[int], RowSplit],
    split_seed: int,
) -> Streamed:
    """The table as Ray Data reads it: its read units, and ``split`` (of its row count) saying which rows each
    split keeps."""
    kind, location, fs, inside, _, _ = _locate(path)
    columns = feature_columns(_schema(location, kind), features, label)
    check_input_shape(input_shape, columns)
    if kind == "parquet":
        with _parquet(fs, inside) as file:
            sizes = [file.metadata.row_group(g).num_rows for g in range(file.metadata.num_row_groups)]
        units, start, group = [], 0, 0
        while group < len(sizes):  # runs of whole row groups of about ROWS_PER_UNIT rows
            first, run = start, list[int]()
            while group < len(sizes) and (not run or sum(sizes[g] for g in run) + sizes[group] <= ROWS_PER_UNIT):
                run.append(group)
                start, group = start + sizes[group], group + 1
            units.append((first, tuple(run)))
        rows = start
    else:
        rows, units = label_stats(path, label).rows, [(0, ())]
    if classes is not None:  # read here, where a worker's decode task would fail on it
        unknown = sorted(set(label_stats(path, label).values) - set(classes))
        if unknown:
            raise ConfigError(
                "dataset.classes", list(classes), f"the label column has values it lacks: {', '.join(unknown[:5])}."
            )
    rows_split = split(rows)
    decode = Decode(
        tuple(columns),
        label,
        (len(columns),),
        classes is not None or num_outputs > 1,
        class_names=tuple(classes) if classes is not None else None,
    )
    source = TableRows(location, kind, (*columns, label), rows_split, split_seed, tuple(units))
    return Streamed([location], [location], dict(rows_split.counts), decode, seed=split_seed, table=source)


@dataclass(frozen=True)
class TableRows:
    """One table file as the streamed road reads it: its read units, and which rows each split keeps."""

    location: str
    kind: str
    columns: tuple[str, ...]
    split: RowSplit  # which rows validate and which test
    seed: int
    units: tuple[tuple[int, tuple[int, ...]], ...]  # (the first row's position, the Parquet row groups)

    def rows(self, split: str, unit: tuple[int, tuple[int, ...]]) -> Iterator[dict[str, np.ndarray]]:
        """The unit's rows of one split (train, val or test), as numpy columns, in file order."""
        position, groups = unit
        with _parsing(self.location, self.kind):
            for batch in _batches(self.location, self.kind, self.columns, groups if self.kind == "parquet" else None):
                val, test = self.split.masks(np.arange(position, position + batch.num_rows), self.seed)
                position += batch.num_rows
                kept = batch.filter({"val": val, "test": test}.get(split, ~(val | test)))
                if kept.num_rows:
                    yield {name: kept.column(name).to_numpy(zero_copy_only=False) for name in self.columns}

    def dataset(self, split: str, decode: Decode, shuffle_seed: int | None, tasks: Mapping[str, Any]) -> Any:
        """The split as a Ray Dataset: the units (in a new order every epoch when ``shuffle_seed`` is set), each
        read and decoded by one task of ``map_batches``."""
        import ray.data
        from ray.data import RandomSeedConfig

        units = ray.data.from_items([{"unit": index} for index in range(len(self.units))])
        if shuffle_seed is not None:
            units = units.random_shuffle(seed=RandomSeedConfig(shuffle_seed))
        units = units.repartition(len(self.units))  # one unit per block: read in parallel

        def read(batch: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
            for index in batch["unit"]:
                for rows in self.rows(split, self.units[int(index)]):
                    yield decode(rows)

        return units.map_batches(read, batch_size=1, batch_format="numpy", **tasks)

    def read_here(self, split: str, decode: Decode, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """The split's decoded rows in file order, in batches of ``batch_size``, read in this process."""
        pending: list[dict[str, np.ndarray]] = []
        for unit in self.units:
            for rows in self.rows(split, unit):
                pending.append(decode(rows))
                if sum(len(p[LABELS]) for p in pending) < batch_size:
                    continue
                joined = {name: np.concatenate([p[name] for p in pending]) for name in (FEATURES, LABELS)}
                full = len(joined[LABELS]) // batch_size * batch_size
                for start in range(0, full, batch_size):
                    yield {name: joined[name][start : start + batch_size] for name in joined}
                pending = [{name: joined[name][full:] for name in joined}]
        if pending and sum(len(p[LABELS]) for p in pending):
            yield {name: np.concatenate([p[name] for p in pending]) for name in (FEATURES, LABELS)}
