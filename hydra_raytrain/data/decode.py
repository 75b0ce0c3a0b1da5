"""Rows and images to training batches, as Ray Data's decode tasks make them (and the driver's reads alike):
``Decode`` (Parquet or table rows: the feature column(s) as one float32 array a sample, the label) and
``DecodeImages`` (images in class folders), each a numpy batch ``{"x": ..., "y": ...}`` (``FEATURES``,
``LABELS``); an image loaded and resized as ``read_images`` does, an Arrow column made numpy as Ray Data hands it.
No torch or Ray at import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hydra_raytrain.data.files import class_of, filesystem_of

FEATURES = "x"  # the columns of the decoded batches each worker receives
LABELS = "y"


@dataclass(frozen=True)
class Decode:
    """Rows to training batches, in Ray Data's decode tasks: the feature column(s), each row's values flattened
    and joined in order (``vectors``), as one float32 array of ``input_shape`` per sample, the label as int64
    (classes) or float32 ``[n, 1]`` (a value), then the configured ``transform`` (a function of the numpy batch
    ``{"x": ..., "y": ...}``)."""

    features: str | tuple[str, ...]
    label: str
    input_shape: tuple[int, ...]
    classes: bool
    transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None
    class_names: tuple[str, ...] | None = None  # a label of strings: these, in this order, are the classes

    @property
    def columns(self) -> list[str]:
        names = [self.features] if isinstance(self.features, str) else list(self.features)
        return [*names, self.label]

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        labels = np.asarray(batch[self.label])
        names = [self.features] if isinstance(self.features, str) else self.features
        if len(labels):
            parts = [dense(batch[name]).reshape(len(labels), -1) for name in names]  # each row flattened
            values = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
            x = np.ascontiguousarray(values, dtype=np.float32).reshape(len(labels), *self.input_shape)
        else:  # a batch with no rows
            x = np.zeros((0, *self.input_shape), dtype=np.float32)
        if self.class_names is not None:
            index = {name: position for position, name in enumerate(self.class_names)}
            labels = np.array([index[str(value)] for value in labels], dtype=np.int64)
        y = labels.astype(np.int64) if self.classes else labels.astype(np.float32).reshape(len(labels), 1)
        decoded = {FEATURES: x, LABELS: y}
        return self.transform(decoded) if self.transform is not None else decoded


def dense(column: np.ndarray) -> np.ndarray:
    """A column of lists as one float32 array: lists arrive as object arrays of rows, and nested lists as object
    arrays of object arrays (Ray Data's and pyarrow's ``to_numpy(zero_copy_only=False)``)."""
    if column.dtype != object:
        return np.asarray(column, dtype=np.float32)
    return np.stack([dense(np.asarray(row)) for row in column]) if len(column) else np.zeros((0,), np.float32)


@dataclass(frozen=True)
class DecodeImages:
    """Images to training batches, in Ray Data's decode tasks: ``read_images`` resized them to ``input_shape``'s
    height and width, in its channels (1: grayscale, 3: RGB); here float32 in 0..1, channels first, and the label
    the index of the class folder the file is in; then the configured ``transform``."""

    classes: dict[str, int]
    input_shape: tuple[int, ...]
    transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None

    @property
    def size_and_mode(self) -> tuple[tuple[int, int], str]:
        channels, height, width = self.input_shape
        return (height, width), "L" if channels == 1 else "RGB"

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        images = np.asarray(batch["image"], dtype=np.float32) / 255.0
        x = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
        y = np.array([self.classes[class_of(str(path))] for path in batch["path"]], dtype=np.int64)
        decoded = {FEATURES: np.ascontiguousarray(x), LABELS: y}
        return self.transform(decoded) if self.transform is not None else decoded


def load_image(path: str, size: tuple[int, int], mode: str) -> np.ndarray:
    """An image as ``read_images(size=, mode=)`` loads it (ray/data/_internal/datasource/image_datasource.py)."""
    import io

    from PIL import Image

    fs, location = filesystem_of(path)
    with fs.open_input_file(location) as file:
        return resized(Image.open(io.BytesIO(file.readall())), size, mode)


def resized(image: Any, size: tuple[int, int], mode: str) -> np.ndarray:
    """A PIL image at ``size`` (height, width) in ``mode``, as ``read_images`` makes it."""
    from PIL import Image

    if image.size != tuple(reversed(size)):
        image = image.resize((size[1], size[0]), resample=Image.Resampling.BILINEAR)
    if image.mode != mode:
        image = image.convert(mode)
    return np.asarray(image)


def numpy_column(column: Any) -> np.ndarray:
    """A pyarrow column as Ray Data hands it to a numpy batch: tensors as one array, lists as object arrays of
    rows, booleans and columns with nulls copied (``zero_copy_only=False``)."""
    import pyarrow as pa

    if isinstance(column.type, pa.FixedShapeTensorType):
        return column.to_numpy_ndarray()
    return column.to_numpy(zero_copy_only=False)
