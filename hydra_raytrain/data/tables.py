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
the stream on the driver.

This module holds the builder (``table``: the ``_target_`` of ``conf/dataset/table.yaml``), the columns and the
label picked, the resolvers and the streamed road's read units (``TableRows``). The row split: ``data/rowsplit.py``;
reading the file, and which road its size takes: ``data/table_files.py``."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.config.paths import LocalPath
from hydra_raytrain.data import streamed
from hydra_raytrain.data.decode import FEATURES, LABELS, Decode
from hydra_raytrain.data.files import pq_file
from hydra_raytrain.data.rowsplit import RowSplit, row_split
from hydra_raytrain.data.streamed import Streamed
from hydra_raytrain.data.table_files import (
    first_value,
    locate,
    parsing,
    read_table,
    record_batches,
    schema_of,
    streams_table,
    table_schema,
)
from hydra_raytrain.data.vectors import WHAT, check_values, describe, features_of, flat_values, holds_numbers


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
    x = torch.from_numpy(features_of(data, chosen, input_shape))
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


def feature_columns(data: Any, features: Sequence[str] | str, label: str) -> list[str]:
    """The columns ``features`` names (names or patterns, in the table's order), less the label; each pattern
    must name a column, and each column hold numbers (and, in a table read whole, no empty values)."""
    import pyarrow as pa

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
        return holds_numbers(schema.field(name).type)

    chosen = pick_columns(names, patterns, numbers)
    if not chosen:
        raise ConfigError(
            "dataset.features",
            patterns,
            f"picks no column of numbers; the table's columns: {describe(schema, label)}.",
            f"{WHAT}, by name or pattern",
        )
    for name in chosen:
        kind = schema.field(name).type
        if not numbers(name):
            raise ConfigError(
                "dataset.features",
                patterns,
                f"the column {name!r} holds {kind}, not numbers; the table's columns: {describe(schema, label)}.",
                f"{WHAT} (leave this one out: name the others, or encode it as numbers)",
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
    kind, location, _, _, size, mtime_ns = locate(path)
    check_label(schema_of(location, kind), label)
    return _label_stats(location, kind, label, mtime_ns, size)


@functools.lru_cache(maxsize=8)
def _label_stats(location: str, kind: str, label: str, mtime_ns: int | None, size: int) -> LabelStats:
    import pyarrow.compute as pc
    import pyarrow.types as types

    column_type = schema_of(location, kind).field(label).type
    strings = any(test(column_type) for test in (types.is_string, types.is_large_string, types.is_dictionary))
    values: set[str] = set()
    largest, nulls, rows = None, 0, 0
    with parsing(location, kind):
        for batch in record_batches(location, kind, [label]):
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
    """``dataset.input_shape``: one feature column's sample shape (``[1]`` a scalar; a vector's length, a tensor's
    shape), or the number of values the feature columns hold together."""
    return feature_shape(path, table_columns(path, features, label))


def feature_shape(path: str, columns: Sequence[str]) -> list[int]:
    """The sample shape of these columns of the file (``vectors.sample_shape``; a variable list's from its first
    row)."""
    from hydra_raytrain.data.vectors import sample_shape

    kind, location, *_ = locate(path)
    schema = schema_of(location, kind)
    return sample_shape([schema.field(name) for name in columns], lambda name: first_value(location, kind, name))


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
    kind, location, fs, inside, _, _ = locate(path)
    columns = feature_columns(schema_of(location, kind), features, label)
    check_values(input_shape, math.prod(feature_shape(path, columns)), columns)
    if kind == "parquet":
        with pq_file(inside, fs) as file:
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
        tuple(int(n) for n in input_shape),
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
        with parsing(self.location, self.kind):
            for batch in record_batches(
                self.location, self.kind, self.columns, groups if self.kind == "parquet" else None
            ):
                val, test = self.split.masks(np.arange(position, position + batch.num_rows), self.seed)
                position += batch.num_rows
                kept = batch.filter({"val": val, "test": test}.get(split, ~(val | test)))
                if kept.num_rows:  # the features flattened (vectors.flat_values), the label as it is
                    *features, label = self.columns
                    flat = {name: flat_values(kept.column(name), name) for name in features}
                    yield {**flat, label: kept.column(label).to_numpy(zero_copy_only=False)}

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
