"""What a sample of streamed data is, inferred on the driver from the files: the shape of its features, whether
its label is a class, how many outputs (``conf/dataset/parquet.yaml``'s ``parquet_shape`` and ``parquet_outputs``,
``conf/dataset/images.yaml``'s ``stream_image_shape`` and ``stream_classes``: resolvers registered in
``preflight/resolvers.py``), and ``dataset.input_shape`` checked against it. Nothing is read but the files'
footers (schema, row group statistics) and a first row or image. No torch or Ray at import: the config's
resolvers import this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.files import (
    check_columns,
    class_of,
    filesystem_of,
    image_files,
    parquet_files,
    parquet_schema,
    pq_file,
)


def sample_shape(file: str, features: str | Sequence[str]) -> list[int]:
    """The shape of one sample's features (``vectors.sample_shape``): one column's own (a scalar ``[1]``, a
    fixed-size list's at each level, a tensor's, a variable list's first row's), or the number of values several
    columns hold together. A column that holds no numbers is refused by name, with the file's columns."""
    from hydra_raytrain.data import vectors

    schema = parquet_schema(file)
    names = [features] if isinstance(features, str) else list(features)
    for name in names:
        if not vectors.holds_numbers(schema.field(name).type):
            raise ConfigError(
                "dataset.features",
                features,
                f"the column {name!r} holds {schema.field(name).type}, not numbers; the columns of {file}: "
                f"{vectors.describe(schema)}.",
                f"{vectors.WHAT}: one, or a list of them",
            )

    def first_row(name: str) -> object:
        fs, location = filesystem_of(file)
        with pq_file(location, fs) as parquet_file:
            first = next(parquet_file.iter_batches(batch_size=1, columns=[name]), None)
        if first is None or not first.num_rows:
            raise ConfigError("dataset.path", file, "holds no rows.", "a Parquet file of at least one row")
        return first.column(0)[0].as_py()

    return vectors.sample_shape([schema.field(name) for name in names], first_row)


def label_is_class(file: str, label: str) -> bool:
    import pyarrow as pa

    kind = parquet_schema(file).field(label).type
    return pa.types.is_integer(kind) or pa.types.is_boolean(kind)


def check_sample_values(path: str, file: str, features: str | Sequence[str], shape: tuple[int, ...]) -> None:
    """``dataset.input_shape`` holds as many values as a sample of the files."""
    found = sample_shape(file, features)
    if math.prod(shape) != math.prod(found):
        raise ConfigError(
            "dataset.input_shape",
            list(shape),
            f"a sample of {path} holds {math.prod(found)} values ({'x'.join(map(str, found))}).",
            f"a shape of {math.prod(found)} values, e.g. {list(found)}".replace(" ", ""),
        )


# Resolvers of conf/dataset/parquet.yaml and images.yaml: run where the config is resolved (the driver).


def parquet_shape(path: str, features: Any = "features") -> list[int]:
    names = features if isinstance(features, str) else [str(name) for name in features]
    files = parquet_files(str(path))
    check_columns(files[0], [names] if isinstance(names, str) else names, "dataset.path", str(path))
    return sample_shape(files[0], names)


def parquet_outputs(path: str, label: str = "label", val_path: str | None = None) -> int:
    """Classes (an integer label): its largest value + 1 over the training and validation files, from the row
    groups' statistics where written, else read; 1 for a value (a float label: regression)."""
    files = parquet_files(str(path)) + (parquet_files(str(val_path), "dataset.val_path") if val_path else [])
    label = str(label)
    check_columns(files[0], [label], "dataset.path", str(path))
    if not label_is_class(files[0], label):
        return 1

    def largest(file: str) -> int:
        fs, location = filesystem_of(file)
        with pq_file(location, fs) as parquet_file:
            meta = parquet_file.metadata
            leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
            index = leaves.index(label) if label in leaves else None
            stats = (
                [meta.row_group(g).column(index).statistics for g in range(meta.num_row_groups)]
                if index is not None
                else []
            )
            if index is not None and meta.num_row_groups and all(s is not None and s.has_min_max for s in stats):
                return int(max(s.max for s in stats))
            values = parquet_file.read(columns=[label]).column(0).to_numpy(zero_copy_only=False)
            return int(values.max()) if len(values) else -1

    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        return max(pool.map(largest, files)) + 1


def stream_classes(path: str) -> int:
    """``num_outputs`` of ``dataset=images``: the class folders under ``path``."""
    return len({class_of(file) for file in image_files(str(path))})


def stream_image_shape(path: str) -> list[int]:
    """``input_shape`` of ``dataset=images``: ``[channels, height, width]`` of the first image (1 channel for
    grayscale modes)."""
    import io

    from PIL import Image

    from hydra_raytrain.data.folders import GRAYSCALE_MODES

    first = image_files(str(path))[0]
    fs, location = filesystem_of(first)
    try:
        with fs.open_input_file(location) as file, Image.open(io.BytesIO(file.readall())) as image:
            width, height = image.size
            channels = 1 if image.mode in GRAYSCALE_MODES else 3
    except OSError as error:
        raise ConfigError(
            "dataset.input_shape", None, f"cannot read {first} to infer it ({error}).", "dataset.input_shape=[C,H,W]"
        ) from None
    return [channels, height, width]
