"""``dataset=table``: one table file (Parquet, CSV or JSON lines, by its suffix; a local path or an ``s3://`` URI)
read whole into every worker's memory as tensors, and split by rows. Features are number columns picked by name
or fnmatch pattern; the label is a column of classes (integers, or strings mapped to indices in sorted order:
``dataset.classes``, stored with the run's config so ``evaluate`` maps them alike) or of values (floats:
regression). The resolvers below read the file on the driver for the config's ``input_shape``, ``num_outputs``
and ``classes``; the builder reads it in each worker."""

from __future__ import annotations

import fnmatch
import functools
import os
from collections.abc import Sequence
from typing import Any

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.config.paths import LocalPath
from hydra_raytrain.data.streamed import absolute_location, filesystem_of

SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json", ".ndjson": "json"}
FORMATS = "a .parquet, .csv or .jsonl (JSON lines) file, local or s3://"


def table(
    path: LocalPath,
    input_shape: Sequence[int],
    num_outputs: int,
    features: Sequence[str] = ("*",),
    label: str = "label",
    classes: Sequence[str] | None = None,
    val_fraction: float = 0.2,
    split_seed: int = 0,
) -> Any:
    """The table's rows as ``(features float32 [F], label)`` pairs: ``val_fraction`` of them (chosen with
    ``split_seed``, the same on every worker) validate."""
    import torch
    from torch.utils.data import TensorDataset

    from hydra_raytrain.data.splits import Splits, random_split_indices  # torch: not for the driver's resolvers

    data = read_table(path)
    columns = feature_columns(data, features, label)
    if list(input_shape) != [len(columns)]:
        raise ConfigError(
            "dataset.input_shape", list(input_shape), f"the features are {len(columns)} columns.", f"[{len(columns)}]"
        )
    x = torch.tensor(_matrix(data, columns), dtype=torch.float32)
    y = label_tensor(data, label, classes, num_outputs)
    train, val = random_split_indices(len(y), val_fraction, split_seed)
    return Splits(TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val]))


def read_table(path: str) -> Any:
    """The file as a pyarrow Table (read once per process and file version); a ConfigError naming
    ``dataset.path`` when it is missing, of another format, or does not parse (the parser's row and reason)."""
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
    return _read(location, SUFFIXES[suffix], info.mtime_ns, info.size)


@functools.lru_cache(maxsize=4)
def _read(location: str, kind: str, mtime_ns: int | None, size: int | None) -> Any:
    import pyarrow
    import pyarrow.csv
    import pyarrow.fs
    import pyarrow.json
    import pyarrow.parquet

    fs, inside = filesystem_of(location)
    invalid: list[Any] = []  # CSV rows of another column count: the first is named with its line

    def first_invalid(row: Any) -> str:
        invalid.append(row)
        return "error"

    try:
        if kind == "parquet":
            return pyarrow.parquet.read_table(inside, filesystem=fs)
        with fs.open_input_stream(inside) as stream:
            if kind == "json":
                return pyarrow.json.read_json(stream)
            parsing = pyarrow.csv.ParseOptions(invalid_row_handler=first_invalid)
            return pyarrow.csv.read_csv(stream, parse_options=parsing)
    except pyarrow.ArrowInvalid as error:
        reason = " ".join(str(error).split())
        if invalid:
            row = invalid[0]
            reason = (
                f"line {_line_of(fs, inside, row.text)} has {row.actual_columns} columns, the header "
                f"{row.expected_columns}: {row.text[:80]!r}"
            )
        raise ConfigError("dataset.path", location, f"does not parse as {kind.upper()}: {reason}.", FORMATS) from None


def _line_of(fs: Any, inside: str, text: str) -> int | str:
    """The line number of a row's text in the file (pyarrow does not say), or "a" line."""
    with fs.open_input_stream(inside) as stream:
        for number, line in enumerate(stream.read().decode(errors="replace").splitlines(), start=1):
            if number > 1 and line.rstrip("\r") == text:
                return number
    return "a"


def feature_columns(data: Any, features: Sequence[str] | str, label: str) -> list[str]:
    """The columns ``features`` names (names or patterns, in the table's order), less the label; each pattern
    must name a column, and each column hold numbers."""
    import pyarrow.types as types

    check_label(data, label)
    patterns = [features] if isinstance(features, str) else list(features)
    names = [name for name in data.column_names if name != label]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ConfigError(
                "dataset.features",
                patterns,
                f"{pattern!r} names no column of the table{did_you_mean(pattern, names)}.",
                f"column names or patterns of: {', '.join(names)}",
            )

    def numbers(name: str) -> bool:
        kind = data.schema.field(name).type
        return bool(types.is_integer(kind) or types.is_floating(kind) or types.is_boolean(kind))

    chosen = [
        name
        for name in names
        # a pattern takes the number columns it matches; a column named outright must hold numbers
        if name in patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns if p not in names) and numbers(name)
    ]
    for name in chosen:
        kind = data.schema.field(name).type
        if not numbers(name):
            raise ConfigError(
                "dataset.features",
                patterns,
                f"the column {name!r} holds {kind}, not numbers.",
                "number columns (leave this one out: name the others, or encode it as numbers)",
            )
        if data.column(name).null_count:
            raise ConfigError(
                "dataset.features", patterns, f"the column {name!r} has {data.column(name).null_count} empty values."
            )
    return chosen


def check_label(data: Any, label: str) -> None:
    if label not in data.column_names:
        raise ConfigError(
            "dataset.label",
            label,
            f"the table has no such column{did_you_mean(label, data.column_names)}.",
            f"one of its columns: {', '.join(data.column_names)}",
        )
    if data.column(label).null_count:
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


# The resolvers of conf/dataset/table.yaml: what the driver reads from the file for the config.


def table_classes(path: str, label: str = "label") -> list[str] | None:
    """``dataset.classes``: a string label's values, sorted (their indices are the classes); None otherwise."""
    import pyarrow.types as types

    data = read_table(path)
    check_label(data, label)
    kind = data.schema.field(label).type
    if not (types.is_string(kind) or types.is_large_string(kind) or types.is_dictionary(kind)):
        return None
    return sorted({str(value) for value in data.column(label).to_pylist()})


def table_shape(path: str, features: Any = ("*",), label: str = "label") -> list[int]:
    """``dataset.input_shape``: ``[the number of feature columns]``."""
    patterns = [features] if isinstance(features, str) else [str(pattern) for pattern in features]
    return [len(feature_columns(read_table(path), patterns, label))]


def table_outputs(path: str, label: str = "label") -> int:
    """The classes of a string label, the largest integer label + 1, or 1 for a float label (regression)."""
    import pyarrow.compute as pc
    import pyarrow.types as types

    named = table_classes(path, label)
    if named is not None:
        return len(named)
    column = read_table(path).column(label)
    if types.is_integer(column.type):
        return int(pc.max(column).as_py()) + 1
    return 1
