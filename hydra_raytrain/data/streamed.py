"""Parquet read with Ray Data: streamed from a folder or an ``s3://`` URI, sharded across the workers.

``dataset=parquet`` builds a :class:`Streamed` on the driver: the files of each split, their row counts and the
settings of the pipeline. Nothing is read then but the files' footers (schema, row counts, label statistics).
The runner hands ``Streamed.ray_datasets()`` to ``TorchTrainer(datasets=...)``: Ray Data reads and decodes on
the cluster's CPUs (its tasks, not the training loop), and each worker iterates its shard of every epoch with
``iter_torch_batches`` (``recipe/streaming.py``).

``conf/dataset/parquet.yaml`` infers the shape of a sample and the number of outputs with the resolvers below
(``parquet_shape``, ``parquet_outputs``), so ``dataset=parquet dataset.path=PATH model=mlp`` needs nothing else.
No torch or Ray at import: the config's resolvers (``preflight/resolvers.py``) import this module.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.config.paths import LocalPath, OptionalPath

SHUFFLES = ("files", "blocks", "full", "none")
PARQUET_LAYOUT = "a .parquet file, or a folder (or s3:// prefix) holding .parquet files"
FEATURES = "x"  # the columns of the decoded batches each worker receives
LABELS = "y"
FOOTER_READERS_ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"


def few_footer_readers() -> None:
    """Before a local cluster starts (its processes inherit the environment): Ray Data lists a Parquet read's
    files with a pool of footer-reading actors, 32 by default and a new process each, sized for thousands of files
    on a large cluster, and a streamed dataset is read again every epoch. One machine needs one (it keeps 128
    reads in flight): measured on 2 cores, a 12-epoch streamed Parquet run's test 71 -> 58 s, a 1,000-row predict
    ~1 s sooner. Unless the environment sets it."""
    os.environ.setdefault(FOOTER_READERS_ENV, "1")


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
                    yield decode({name: _numpy(batch.column(name)) for name in decode.columns})


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


def class_of(path: str) -> str:
    """The class of an image: the name of the folder it is in."""
    return os.path.basename(os.path.dirname(path))


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


@dataclass(frozen=True)
class Decode:
    """Rows to training batches, in Ray Data's decode tasks: the feature column(s) as one float32 array of
    ``input_shape`` per sample, the label as int64 (classes) or float32 ``[n, 1]`` (a value), then the
    configured ``transform`` (a function of the numpy batch ``{"x": ..., "y": ...}``)."""

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
        if isinstance(self.features, str):
            values = dense(batch[self.features])
        else:
            values = np.stack([batch[name] for name in self.features], axis=1)
        x = np.ascontiguousarray(values, dtype=np.float32).reshape(len(values), *self.input_shape)
        labels = np.asarray(batch[self.label])
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
        train_files, val_files = split_files(files, val_fraction, split_seed)
    else:
        train_files, val_files = files, parquet_files(val_path, "dataset.val_path")
        check_columns(val_files[0], (*names, label), "dataset.val_path", val_path)
    train_files, test_files = test_split(train_files, test_path, test_fraction, split_seed, parquet_files)
    if test_path is not None:
        check_columns(test_files[0], (*names, label), "dataset.test_path", test_path)
    train_files, val_files = fold_files(train_files, val_files, folds, fold, split_seed, val_path)
    rows = split_rows({"train": train_files, "val": val_files, "test": test_files})
    shape = tuple(input_shape)
    check_sample_values(path, files[0], features, shape)
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


def split_rows(splits: dict[str, list[str]]) -> dict[str, int]:
    """Each split's rows, from its Parquet files' footers (read at once); a split without files is left out."""
    every = [file for files in splits.values() for file in files]
    counted = iter(row_counts(every))
    return {split: sum(next(counted) for _ in files) for split, files in splits.items() if files}


def check_classes(files: list[str], classes: list[str], key: str, value: str, path: str) -> None:
    unknown = sorted({class_of(file) for file in files} - set(classes))
    if unknown:
        raise ConfigError(key, value, f"has class folders that {path} has not: {', '.join(unknown)}.", LAYOUT)


def test_split(
    train_files: list[str],
    test_path: str | None,
    test_fraction: float,
    seed: int,
    listing: Callable[[str, str], list[str]],
) -> tuple[list[str], list[str]]:
    """The training files, and the test split's: ``test_path``'s (listed by ``listing``), or a seeded
    ``test_fraction`` of the training files (whole files, as validation's), or none."""
    if test_path is not None and test_fraction:
        raise ConfigError(
            "dataset.test_fraction", test_fraction, f"dataset.test_path ({test_path}) is the test split already.", "0"
        )
    if test_path is not None:
        return train_files, listing(test_path, "dataset.test_path")
    if not test_fraction:
        return train_files, []
    if not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
        raise ConfigError("dataset.test_fraction", test_fraction, "must be at least 0 and below 1.", "e.g. 0.1")
    if len(train_files) < 2:
        raise ConfigError(
            "dataset.test_fraction",
            test_fraction,
            f"one training file is left ({train_files[0]}), and a streamed split takes whole files.",
            "dataset.test_path=PATH (the test files), or the data written as more files",
        )
    order = list(train_files)
    random.Random(seed + 1).shuffle(order)  # another draw than validation's
    n_test = min(len(order) - 1, max(1, round(len(order) * test_fraction)))
    return sorted(order[n_test:]), sorted(order[:n_test])


IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif")  # what read_images reads
LAYOUT = "a folder (or s3:// prefix) of class folders of images: path/<class>/<image>"


def image_files(path: str, key: str = "dataset.path") -> list[str]:
    """The images in the class folders under ``path``, sorted (by class, then name)."""
    import pyarrow.fs

    root = absolute_location(path)
    files = _listing(root, key, LAYOUT)
    fs, location = filesystem_of(root)
    found = [
        file
        for file in files
        if file.lower().endswith(IMAGE_EXTENSIONS) and os.path.dirname(os.path.dirname(file)) == root.rstrip("/")
    ]
    if not found:
        kind = fs.get_file_info(location).type
        problem = "no such folder." if kind != pyarrow.fs.FileType.Directory else "holds no images in class folders."
        raise ConfigError(key, path, problem, LAYOUT)
    return found


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


def pq_file(location: str, fs: Any) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(location, filesystem=fs)


def check_stream_options(shuffle: str, local_shuffle_buffer_size: int | None, prefetch_batches: int) -> None:
    if shuffle not in SHUFFLES:
        raise ConfigError("dataset.shuffle", shuffle, "is no way to shuffle.", " | ".join(SHUFFLES))
    for key, value in (
        ("local_shuffle_buffer_size", local_shuffle_buffer_size),
        ("prefetch_batches", prefetch_batches),
    ):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ConfigError(f"dataset.{key}", value, "must be a whole number >= 0.", "e.g. 1000, or null")


def filesystem_of(path: str) -> tuple[Any, str]:
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(path if "://" in path else f"file://{os.path.abspath(path)}")


def absolute_location(path: str) -> str:
    """A URI as given; a local path made absolute (from the folder the command runs in)."""
    return str(path) if "://" in str(path) else os.path.abspath(os.path.expanduser(str(path)))


def _listing(path: str, key: str, layout: str) -> list[str]:
    """Every file at ``path`` (itself when a file, else every file below it), sorted; URIs stay URIs (Ray Data
    reads them from every node). A ConfigError naming ``key`` when nothing is there or it cannot be listed."""
    import pyarrow.fs

    try:
        fs, location = filesystem_of(path)
        info = fs.get_file_info(location)
        if info.type == pyarrow.fs.FileType.File:
            found = [location]
        elif info.type == pyarrow.fs.FileType.Directory:
            found = sorted(
                i.path for i in fs.get_file_info(pyarrow.fs.FileSelector(location, recursive=True)) if i.is_file
            )
        else:
            raise ConfigError(key, path, "no such file or folder.", layout)
    except ConfigError:
        raise
    except Exception as error:  # no credentials, no bucket, no endpoint
        raise ConfigError(key, path, f"cannot be listed: {' '.join(str(error).split())}", layout) from None
    scheme = path.split("://")[0] + "://" if "://" in path else ""
    return [scheme + name for name in found]


def parquet_files(path: str, key: str = "dataset.path") -> list[str]:
    """The ``.parquet`` files at ``path``, sorted."""
    found = [file for file in _listing(absolute_location(path), key, PARQUET_LAYOUT) if file.endswith(".parquet")]
    if not found:
        raise ConfigError(key, path, "holds no .parquet file.", PARQUET_LAYOUT)
    return found


def _schema(file: str) -> Any:
    import pyarrow.parquet as pq

    fs, location = filesystem_of(file)
    return pq.read_schema(location, filesystem=fs)


def check_columns(file: str, wanted: Sequence[str], key: str, path: str) -> None:
    schema = _schema(file)
    for name in wanted:
        if name not in schema.names:
            column_key = "dataset.label" if name == wanted[-1] else "dataset.features"
            raise ConfigError(
                column_key,
                name,
                f"{file} has no such column{did_you_mean(name, schema.names)}.",
                f"one of its columns: {', '.join(schema.names)}",
            )


def row_counts(files: Sequence[str]) -> list[int]:
    """Each file's rows, from its footer (read in parallel: a footer is one request to S3)."""
    import pyarrow.parquet as pq

    def rows(file: str) -> int:
        fs, location = filesystem_of(file)
        with pq.ParquetFile(location, filesystem=fs) as parquet_file:
            return parquet_file.metadata.num_rows

    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        return list(pool.map(rows, files))


def split_files(files: list[str], val_fraction: float, seed: int, what: str = "") -> tuple[list[str], list[str]]:
    """Whole files to validation (a streamed split cannot pick rows without reading them all); ``what``: the
    files are samples (images), and a split of one is no split."""
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise ConfigError(
            "dataset.val_fraction", val_fraction, "must be between 0 and 1 (exclusive).", "a fraction, e.g. 0.2"
        )
    if len(files) < 2:
        if what:
            raise ConfigError("dataset.path", files[0], f"is one of {what}: nothing to split.", LAYOUT)
        raise ConfigError(
            "dataset.val_fraction",
            val_fraction,
            f"the data is one file ({files[0]}), and a streamed split takes whole files.",
            "dataset.val_path=PATH (the validation files), the data written as several files (e.g. "
            "pyarrow.dataset.write_dataset(..., max_rows_per_file=N)), or dataset=table dataset.read=stream "
            "(number columns, split by rows)",
        )
    order = list(files)
    random.Random(seed).shuffle(order)
    n_val = min(len(files) - 1, max(1, round(len(files) * val_fraction)))
    return sorted(order[n_val:]), sorted(order[:n_val])


def fold_files(
    train_files: list[str], val_files: list[str], folds: int | None, fold: int, seed: int, val_path: str | None
) -> tuple[list[str], list[str]]:
    """Cross-validation over whole files (``folds=K``): the files outside the test split, in a seeded order, cut
    into K near-equal folds, fold ``fold`` validating; so the K runs of ``fold=0..K-1`` validate on disjoint folds
    that together hold every such file once, and the test split is the usual one. Without ``folds``: the files as
    split."""
    from hydra_raytrain.data.splits import fold_range

    if folds is not None and val_path is not None:
        raise ConfigError(
            "dataset.folds",
            folds,
            f"dataset.val_path ({val_path}) holds the validation files: cross-validation cuts its folds from "
            "dataset.path's files.",
            "dataset.val_path=null (the folds from dataset.path), or dataset.folds=null",
        )
    pool = sorted(train_files + val_files)
    cut = fold_range(len(pool), folds, fold)
    if cut is None:
        return train_files, val_files
    random.Random(seed).shuffle(pool)
    return sorted(pool[: cut[0]] + pool[cut[1] :]), sorted(pool[cut[0] : cut[1]])


def sample_shape(file: str, features: str | Sequence[str]) -> list[int]:
    """The shape of one sample's features: ``[n]`` for ``n`` scalar columns; for one column, a fixed-size list's
    (nested lists: each level), a fixed-shape tensor's, or a variable list's first row length."""
    import pyarrow as pa

    schema = _schema(file)
    if not isinstance(features, str):
        return [len(features)]
    kind = schema.field(features).type
    if isinstance(kind, pa.FixedShapeTensorType):
        return list(kind.shape)
    shape: list[int] = []
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = kind.value_type
    if shape:
        return shape
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        import pyarrow.parquet as pq

        fs, location = filesystem_of(file)
        with pq.ParquetFile(location, filesystem=fs) as parquet_file:
            first = next(parquet_file.iter_batches(batch_size=1, columns=[features])).column(0)
        return list(np.asarray(first.to_pylist()[0]).shape)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return [1]
    raise ConfigError(
        "dataset.features",
        features,
        f"its type ({kind}) is no array of numbers.",
        "a column of numbers, of fixed-size lists or tensors of numbers, or a list of scalar columns",
    )


def label_is_class(file: str, label: str) -> bool:
    import pyarrow as pa

    kind = _schema(file).field(label).type
    return pa.types.is_integer(kind) or pa.types.is_boolean(kind)


def _numpy(column: Any) -> np.ndarray:
    """A pyarrow column as Ray Data hands it to a numpy batch: tensors as one array, lists as object arrays of
    rows, booleans and columns with nulls copied (``zero_copy_only=False``)."""
    import pyarrow as pa

    if isinstance(column.type, pa.FixedShapeTensorType):
        return column.to_numpy_ndarray()
    return column.to_numpy(zero_copy_only=False)


# Resolvers of conf/dataset/parquet.yaml: run where the config is resolved (the driver).


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
