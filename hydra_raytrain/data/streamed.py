"""Parquet and images read with Ray Data: streamed from a folder or an ``s3://`` URI, sharded across the workers.

``dataset=parquet`` and ``dataset=images`` build a :class:`Streamed` on the driver: the files of each split, their
row counts and the settings of the pipeline. Nothing is read then but the files' footers (schema, row counts, label
statistics). The runner hands ``Streamed.ray_datasets()`` to ``TorchTrainer(datasets=...)``: Ray Data reads and
decodes on the cluster's CPUs (its tasks, not the training loop), and each worker iterates its shard of every epoch
with ``iter_torch_batches`` (``recipe/streaming.py``).

This module holds the builders (``parquet``, ``images``: the ``_target_`` of ``conf/dataset/*.yaml``), the
``Streamed`` pipeline and the ``normalize`` transform. Where the files are and how they split: ``data/files.py``;
rows and images to batches: ``data/decode.py``; the shape of a sample and the number of outputs, which
``conf/dataset/parquet.yaml`` infers so that ``dataset=parquet dataset.path=PATH model=mlp`` needs nothing else:
``data/sizing.py``. No torch or Ray at import: the config's resolvers (``preflight/resolvers.py``) import it,
through ``data/tables.py``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.paths import LocalPath, OptionalPath
from hydra_raytrain.data.decode import FEATURES, LABELS, Decode, DecodeImages, load_image, numpy_column
from hydra_raytrain.data.files import (
    PARQUET_LAYOUT,
    check_classes,
    check_columns,
    class_of,
    filesystem_of,
    fold_files,
    image_files,
    parquet_files,
    pq_file,
    split_files,
    split_rows,
    test_split,
)
from hydra_raytrain.data.sizing import check_sample_values, label_is_class

SHUFFLES = ("files", "blocks", "full", "none")


@dataclass(frozen=True)
class Streamed:
    """A dataset that Ray Data streams: what the driver found, and how to read it."""

    train_files: list[str]
    val_files: list[str]
    rows: dict[str, int]  # rows of each split: from the files' footers (Parquet), the files (images)
    decode: Decode | DecodeImages
    shuffle: str = "files"
    seed: int = 0
    local_shuffle_buffer_size: int | None = None
    prefetch_batches: int = 1
    num_cpus: float | None = None  # each read and decode task's CPUs (Ray's default: 1)
    concurrency: int | None = None  # the most decode tasks at once (Ray's default: as many as fit)
    table: Any = None  # one table file split by rows (data.tables.TableRows): it reads, not the files' readers
    test_files: list[str] = field(default_factory=list)  # held out: scored once, on the best checkpoint

    @property
    def cpus(self) -> int:
        """CPUs a cluster keeps free of training workers for the read and decode tasks (at least one)."""
        return max(1, math.ceil(self.num_cpus or 1))

    def ray_datasets(self) -> dict[str, Any]:
        """The lazy Ray Datasets of both splits (needs a connected Ray): read, decoded, shuffled as configured."""
        return {"train": self._pipeline(self.train_files, train=True), "val": self._pipeline(self.val_files, False)}

    def _pipeline(self, files: list[str], train: bool) -> Any:
        import ray.data
        from ray.data import FileShuffleConfig, RandomSeedConfig

        shuffled = train and self.shuffle != "none"
        tasks = {"num_cpus": self.num_cpus} if self.num_cpus is not None else {}
        if self.table is not None:
            return self.table.dataset("train" if train else "val", self.decode, self.seed if shuffled else None, tasks)
        # A new order every epoch (every execution), the same sequence of orders for the same seed.
        reads: dict[str, Any] = (
            {"shuffle": FileShuffleConfig(self.seed)} if shuffled and self.shuffle == "files" else {}
        )
        if isinstance(self.decode, DecodeImages):
            size, mode = self.decode.size_and_mode
            dataset = ray.data.read_images(files, size=size, mode=mode, include_paths=True, **tasks, **reads)
        else:
            dataset = ray.data.read_parquet(files, **tasks, **reads)
            dataset = dataset.select_columns(self.decode.columns)  # pushed into the read: other columns stay unread
        dataset = dataset.map_batches(self.decode, batch_format="numpy", concurrency=self.concurrency, **tasks)
        if shuffled and self.shuffle == "blocks":
            dataset = dataset.randomize_block_order(seed=RandomSeedConfig(self.seed))
        elif shuffled and self.shuffle == "full":
            dataset = dataset.random_shuffle(seed=RandomSeedConfig(self.seed))
        return dataset

    def files(self, split: str) -> list[str]:
        return {"train": self.train_files, "val": self.val_files, "test": self.test_files}[split]

    def read(self, split: str, batch_size: int) -> Iterator[tuple[Any, Any]]:
        """Every row of ``split`` (``train``, ``val`` or ``test``), in file order, decoded into tensor batches here
        (pyarrow, PIL; no Ray): what ``hydra_raytrain.evaluate`` and the test split's score read."""
        import torch

        decoded_batches = (
            self.table.read_here(split, self.decode, batch_size)
            if self.table is not None
            else self._read_here(self.files(split), batch_size)
        )
        for decoded in decoded_batches:
            yield torch.from_numpy(decoded[FEATURES]), torch.from_numpy(decoded[LABELS])

    def sample(self, count: int) -> tuple[Any, Any]:
        """``count`` decoded samples spread over the training files, read here (no Ray): what the driver's
        rehearsal runs one step on."""
        import torch

        files = self.train_files
        if self.table is not None:  # the first training rows
            batch = next(self.table.read_here("train", self.decode, count))
        elif isinstance(self.decode, DecodeImages):  # a file per sample: ``count`` of them, spread over the classes
            picked = sorted({files[round(i * (len(files) - 1) / max(1, count - 1))] for i in range(count)})
            batch = next(self._read_here(picked, count))
        else:  # the first rows of the first files that have rows
            per_file, batches = max(1, math.ceil(count / len(files))), []
            for path in files:
                first = next(self._read_here([path], per_file), None)
                batches += [first] if first is not None and len(first[LABELS]) else []
                if sum(len(b[LABELS]) for b in batches) >= count:
                    break
            if not batches:
                raise ConfigError(
                    "dataset.path", os.path.dirname(files[0]), "its training files hold no rows.", PARQUET_LAYOUT
                )
            batch = {name: np.concatenate([b[name] for b in batches]) for name in (FEATURES, LABELS)}
        return torch.from_numpy(batch[FEATURES][:count]), torch.from_numpy(batch[LABELS][:count])

    def _read_here(self, files: list[str], batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Decoded numpy batches of ``files``, read in this process as Ray Data's tasks read them."""
        decode = self.decode
        if isinstance(decode, DecodeImages):
            size, mode = decode.size_and_mode
            for start in range(0, len(files), batch_size):
                chunk = files[start : start + batch_size]
                images = np.stack([load_image(path, size, mode) for path in chunk])
                yield decode({"image": images, "path": np.array(chunk, dtype=object)})
            return
        for path in files:
            fs, location = filesystem_of(path)
            with pq_file(location, fs) as file:
                for batch in file.iter_batches(batch_size=batch_size, columns=decode.columns):
                    yield decode({name: numpy_column(batch.column(name)) for name in decode.columns})


def normalize(batch: dict[str, np.ndarray], mean: Sequence[float], std: Sequence[float]) -> dict[str, np.ndarray]:
    """A transform: ``(x - mean) / std``, per channel (the first axis of a sample) when given one per channel.
    ``dataset.transform={_target_: hydra_raytrain.data.streamed.normalize, _partial_: true, mean: [0.5], std: [0.2]}``
    """
    x = batch[FEATURES]
    shape = (1, len(mean)) + (1,) * (x.ndim - 2) if len(mean) > 1 else ()
    m, s = np.asarray(mean, np.float32).reshape(shape), np.asarray(std, np.float32).reshape(shape)
    return {**batch, FEATURES: (x - m) / s}


def parquet(
    path: LocalPath,
    input_shape: Sequence[int],
    num_outputs: int,
    features: str | Sequence[str] = "features",
    label: str = "label",
    val_path: OptionalPath = None,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    shuffle: str = "files",
    local_shuffle_buffer_size: int | None = None,
    prefetch_batches: int = 1,
    transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    num_cpus: float | None = None,
    concurrency: int | None = None,
    test_path: OptionalPath = None,
    test_fraction: float = 0.0,
    folds: int | None = None,
    fold: int = 0,
) -> Streamed:
    """Parquet files under ``path`` (a file, a folder, an ``s3://`` URI), split into train and val by whole files
    (``val_fraction`` of them, chosen with ``split_seed``) unless ``val_path`` holds the validation files. The test
    split, scored once on the best checkpoint: ``test_path``'s files, or ``test_fraction`` of the training files.
    ``folds``/``fold``: cross-validation over whole files (``fold_files``)."""
    check_stream_options(shuffle, local_shuffle_buffer_size, prefetch_batches)
    names = (features,) if isinstance(features, str) else tuple(features)
    files = parquet_files(path, "dataset.path")
    check_columns(files[0], (*names, label), "dataset.path", path)
    if val_path is None:
        by_rows = f"dataset=table dataset.path={files[0]} 'dataset.features=[{','.join(names)}]' dataset.label={label}"
        train_files, val_files = split_files(files, val_fraction, split_seed, by_rows=by_rows)
    else:
        train_files, val_files = files, parquet_files(val_path, "dataset.val_path")
        check_columns(val_files[0], (*names, label), "dataset.val_path", val_path)
    train_files, test_files = test_split(train_files, test_path, test_fraction, split_seed, parquet_files)
    if test_path is not None:
        check_columns(test_files[0], (*names, label), "dataset.test_path", test_path)
    train_files, val_files = fold_files(train_files, val_files, folds, fold, split_seed, val_path)
    rows = split_rows({"train": train_files, "val": val_files, "test": test_files})
    check_sample_values(path, files[0], features, shape := tuple(input_shape))
    decode = Decode(
        features if isinstance(features, str) else names,
        label,
        shape,
        label_is_class(files[0], label) and num_outputs > 1,  # one output: the label is a value to regress
        transform,
    )
    return Streamed(
        train_files,
        val_files,
        rows,
        decode,
        test_files=test_files,
        shuffle=shuffle,
        seed=split_seed,
        local_shuffle_buffer_size=local_shuffle_buffer_size,
        prefetch_batches=prefetch_batches,
        num_cpus=num_cpus,
        concurrency=concurrency,
    )


def images(
    path: LocalPath,
    input_shape: Sequence[int],
    num_outputs: int,
    val_path: OptionalPath = None,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    shuffle: str = "files",
    local_shuffle_buffer_size: int | None = None,
    prefetch_batches: int = 1,
    transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    num_cpus: float | None = None,
    concurrency: int | None = None,
    test_path: OptionalPath = None,
    test_fraction: float = 0.0,
    folds: int | None = None,
    fold: int = 0,
) -> Streamed:
    """Image files in class folders, ``path/<class>/<image>`` (a folder or an ``s3://`` prefix), read by Ray Data's
    ``read_images`` and resized to ``input_shape``; ``val_fraction`` of the images (chosen with ``split_seed``)
    validate unless ``val_path`` holds the validation images in the same class folders. The test split:
    ``test_path``'s images (the same class folders), or ``test_fraction`` of the training images.
    ``folds``/``fold``: cross-validation over the images (``fold_files``)."""
    from hydra_raytrain.data.splits import check_image_shape
    from hydra_raytrain.data.vision import check_class_count

    check_stream_options(shuffle, local_shuffle_buffer_size, prefetch_batches)
    check_image_shape(input_shape)
    found = image_files(path, "dataset.path")
    classes = sorted({class_of(file) for file in found})
    check_class_count(num_outputs, classes, f"{path} (class folders)")
    if val_path is None:
        train_files, val_files = split_files(found, val_fraction, split_seed, what="images")
    else:
        train_files, val_files = found, image_files(val_path, "dataset.val_path")
        check_classes(val_files, classes, "dataset.val_path", val_path, path)
    train_files, test_files = test_split(train_files, test_path, test_fraction, split_seed, image_files)
    if test_path is not None:
        check_classes(test_files, classes, "dataset.test_path", test_path, path)
    train_files, val_files = fold_files(train_files, val_files, folds, fold, split_seed, val_path)
    rows = {"train": len(train_files), "val": len(val_files), **({"test": len(test_files)} if test_files else {})}
    return Streamed(
        train_files,
        val_files,
        rows,
        DecodeImages({name: index for index, name in enumerate(classes)}, tuple(input_shape), transform),
        test_files=test_files,
        shuffle=shuffle,
        seed=split_seed,
        local_shuffle_buffer_size=local_shuffle_buffer_size,
        prefetch_batches=prefetch_batches,
        num_cpus=num_cpus,
        concurrency=concurrency,
    )


def check_stream_options(shuffle: str, local_shuffle_buffer_size: int | None, prefetch_batches: int) -> None:
    if shuffle not in SHUFFLES:
        raise ConfigError("dataset.shuffle", shuffle, "is no way to shuffle.", " | ".join(SHUFFLES))
    for key, value in (
        ("local_shuffle_buffer_size", local_shuffle_buffer_size),
        ("prefetch_batches", prefetch_batches),
    ):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ConfigError(f"dataset.{key}", value, "must be a whole number >= 0.", "e.g. 1000, or null")
