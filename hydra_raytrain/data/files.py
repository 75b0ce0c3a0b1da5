"""Where the data is, and how whole files split: a path or ``s3://`` URI listed (``listing``), its Parquet files
(``parquet_files``: their footers' schema and row counts) or its images in class folders (``image_files``), and
those files cut into the train, validation and test splits (``split_files``, ``test_split``, ``fold_files``) as the
streamed builders (``data/streamed.py``) take them: whole files, for a stream cannot pick rows without reading
them all. No torch or Ray at import: the config's resolvers (``data/sizing.py``) import this module.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hydra_raytrain.config.errors import ConfigError, did_you_mean

PARQUET_LAYOUT = "a .parquet file, or a folder (or s3:// prefix) holding .parquet files"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif")  # what read_images reads
LAYOUT = "a folder (or s3:// prefix) of class folders of images: path/<class>/<image>"


def filesystem_of(path: str) -> tuple[Any, str]:
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(path if "://" in path else f"file://{os.path.abspath(path)}")


def absolute_location(path: str) -> str:
    """A URI as given; a local path made absolute (from the folder the command runs in)."""
    return str(path) if "://" in str(path) else os.path.abspath(os.path.expanduser(str(path)))


def listing(path: str, key: str, layout: str) -> list[str]:
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
    found = [file for file in listing(absolute_location(path), key, PARQUET_LAYOUT) if file.endswith(".parquet")]
    if not found:
        raise ConfigError(key, path, "holds no .parquet file.", PARQUET_LAYOUT)
    return found


def image_files(path: str, key: str = "dataset.path") -> list[str]:
    """The images in the class folders under ``path``, sorted (by class, then name)."""
    import pyarrow.fs

    root = absolute_location(path)
    files = listing(root, key, LAYOUT)
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


def class_of(path: str) -> str:
    """The class of an image: the name of the folder it is in."""
    return os.path.basename(os.path.dirname(path))


def pq_file(location: str, fs: Any) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(location, filesystem=fs)


def parquet_schema(file: str) -> Any:
    import pyarrow.parquet as pq

    fs, location = filesystem_of(file)
    return pq.read_schema(location, filesystem=fs)


def check_columns(file: str, wanted: Sequence[str], key: str, path: str) -> None:
    schema = parquet_schema(file)
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


def split_rows(splits: dict[str, list[str]]) -> dict[str, int]:
    """Each split's rows, from its Parquet files' footers (read at once); a split without files is left out."""
    every = [file for files in splits.values() for file in files]
    counted = iter(row_counts(every))
    return {split: sum(next(counted) for _ in files) for split, files in splits.items() if files}


def split_files(
    files: list[str], val_fraction: float, seed: int, what: str = "", by_rows: str = ""
) -> tuple[list[str], list[str]]:
    """Whole files to validation (a streamed split cannot pick rows without reading them all); ``what``: the
    files are samples (images), and a split of one is no split; ``by_rows``: the command line that splits one
    file's rows instead (``dataset=table``'s options)."""
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
            f"{by_rows or 'dataset=table dataset.path=FILE'} (the file's rows split, in memory or streamed), "
            "dataset.val_path=PATH (the validation files), or the data written as several files (e.g. "
            "pyarrow.dataset.write_dataset(..., max_rows_per_file=N))",
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


def check_classes(files: list[str], classes: list[str], key: str, value: str, path: str) -> None:
    unknown = sorted({class_of(file) for file in files} - set(classes))
    if unknown:
        raise ConfigError(key, value, f"has class folders that {path} has not: {', '.join(unknown)}.", LAYOUT)
