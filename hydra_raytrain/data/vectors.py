"""Columns of numbers as a sample's features: a scalar column (one value a row) or a vector column (a list, large
list or fixed-size list of numbers, nested or not; pyarrow's fixed-shape tensor; Ray Data's tensor column, which
``write_parquet`` stores as a list column with its shape in the field's metadata and reads back as Ray's extension
type). Each row's values are flattened, in the column's order; several columns are joined in the table's order.
Training (both table roads, the Parquet road's decode), ``predict`` and the config's shape resolvers read columns
through here, so a row becomes the same sample everywhere. No torch or Ray at import.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError

RAY_TENSORS = ("ray.data.arrow_tensor", "ray.data.arrow_tensor_v2")  # Ray Data's tensor columns, by extension name
WHAT = "columns of numbers, or of lists, fixed-size lists or tensors of numbers"


def _storage(kind: Any) -> Any:
    import pyarrow as pa

    return kind.storage_type if isinstance(kind, pa.BaseExtensionType) else kind


def _is_list(kind: Any) -> bool:
    import pyarrow.types as types

    return bool(types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind))


def is_number(kind: Any) -> bool:
    """A scalar of numbers: integers, floats, booleans."""
    import pyarrow.types as types

    return bool(types.is_integer(kind) or types.is_floating(kind) or types.is_boolean(kind))


def holds_numbers(kind: Any) -> bool:
    """A column of numbers, or of (nested) lists or tensors of numbers."""
    kind = _storage(kind)
    while _is_list(kind):
        kind = _storage(kind.value_type)
    return is_number(kind)


def is_vector(kind: Any) -> bool:
    return _is_list(_storage(kind))


def declared_shape(field: Any) -> list[int] | None:
    """A column's sample shape as its schema declares it: ``[]`` for a scalar, a tensor's shape (pyarrow's, or
    Ray's: its extension type or the field's metadata), each fixed-size list level's size; None where the rows say
    (a variable list)."""
    import pyarrow as pa

    kind = field.type
    if isinstance(kind, pa.FixedShapeTensorType) or (
        isinstance(kind, pa.BaseExtensionType) and kind.extension_name in RAY_TENSORS and hasattr(kind, "shape")
    ):
        return [int(n) for n in kind.shape]
    metadata = field.metadata or {}
    if metadata.get(b"ARROW:extension:name", b"").decode() in RAY_TENSORS:  # ray.data not imported here
        try:
            stored = json.loads(metadata[b"ARROW:extension:metadata"])
            return [int(n) for n in (stored["shape"] if isinstance(stored, dict) else stored)]
        except (KeyError, TypeError, ValueError):
            return None
    kind = _storage(kind)
    shape: list[int] = []
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = _storage(kind.value_type)
    return None if _is_list(kind) else shape


def column_shape(field: Any, first_row: Callable[[], Any]) -> list[int]:
    """A column's sample shape: declared by its schema, else its first row's (``first_row()``: that value as
    Python lists); ``[]`` for a scalar."""
    declared = declared_shape(field)
    if declared is not None:
        return declared
    first = first_row()
    if first is None:
        raise ConfigError("dataset.features", field.name, f"the column {field.name!r} is empty in the first row.")
    return list(np.asarray(first, dtype=np.float64).shape)


def sample_shape(fields: Sequence[Any], first_row: Callable[[str], Any]) -> list[int]:
    """The shape of a sample of these feature columns: one column's own (``[1]`` for a scalar), or the number of
    values the columns hold together, flattened."""
    shapes = [column_shape(field, functools.partial(first_row, field.name)) for field in fields]
    if len(shapes) == 1:
        return shapes[0] or [1]
    return [sum(math.prod(shape) for shape in shapes)]


def describe(schema: Any, leave_out: str | None = None) -> str:
    """A schema's columns and their types, for a refusal: ``a (double), b (list<item: string>)``."""
    return ", ".join(f"{field.name} ({field.type})" for field in schema if field.name != leave_out)


def flat_values(column: Any, name: str) -> np.ndarray:
    """A pyarrow column (array or chunked) as float32 ``[rows, values]``: a scalar column's values, a vector
    column's rows flattened. A ConfigError names ``dataset.features`` for empty values, rows of different lengths
    and values that are not numbers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    rows = len(column)
    if isinstance(column, pa.ExtensionArray):
        column = column.storage
    width = 1
    while True:
        if column.null_count:
            raise ConfigError("dataset.features", name, f"the column {name!r} holds {column.null_count} empty values.")
        if not _is_list(column.type):
            break
        if pa.types.is_fixed_size_list(column.type):
            size = column.type.list_size
        else:
            lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
            if len(lengths) and (lengths != lengths[0]).any():
                raise ConfigError(
                    "dataset.features",
                    name,
                    f"the column {name!r} holds lists of {lengths.min()} to {lengths.max()} values: a feature "
                    "column holds as many values in every row.",
                )
            size = int(lengths[0]) if len(lengths) else 0
        width, column = width * size, column.flatten()
        if isinstance(column, pa.ExtensionArray):
            column = column.storage
    if not is_number(column.type):
        raise ConfigError("dataset.features", name, f"the column {name!r} holds {column.type}, not numbers.", WHAT)
    return column.to_numpy(zero_copy_only=False).astype(np.float32).reshape(rows, width)


def features_of(table: Any, names: Sequence[str], shape: Sequence[int]) -> np.ndarray:
    """The feature columns ``names`` of a pyarrow table (or record batch) as float32 samples of ``shape``; a
    ConfigError names ``dataset.input_shape`` when they hold another number of values."""
    if not table.num_rows:
        return np.zeros((0, *shape), dtype=np.float32)
    parts = [flat_values(table.column(name), name) for name in names]
    values = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    check_values(shape, values.shape[1], names)
    return np.ascontiguousarray(values).reshape(len(values), *shape)


def check_values(shape: Sequence[int], values: int, names: Sequence[str]) -> None:
    """``shape`` (``dataset.input_shape``) holds the ``values`` a sample of the columns ``names`` holds."""
    if math.prod(shape) != values:
        raise ConfigError(
            "dataset.input_shape",
            list(shape),
            f"a sample of the columns {', '.join(names)} holds {values} value{'s' if values != 1 else ''}.",
            f"a shape of {values} values, e.g. [{values}]",
        )
