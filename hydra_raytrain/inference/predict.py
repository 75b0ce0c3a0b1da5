"""Batch predictions of a trained run on the cluster: Ray Data reads the input, a pool of model actors predicts.

    python -m hydra_raytrain.predict outputs/runs/<name> new_rows.parquet --output predictions
    python -m hydra_raytrain.predict outputs/runs/<name> s3://bucket/rows/ --output s3://bucket/out --num-workers 4

INPUT is a Parquet, CSV or JSON-lines file, or a folder (or ``s3://`` prefix) of them, with the columns the run
trained on: a ``dataset=table`` run's features (its names and patterns, as in training) or a ``dataset=parquet``
run's features column(s). For a run on another dataset of arrays (the default run's ``digits``, ``diabetes``,
``fake``, a user's) the input's ``features`` column, else its columns of numbers but ``label``, hold each sample's
values (``--features`` names them: names or patterns); each row's values, flattened (a list or tensor column, or
scalar columns joined in order), are reshaped to the run's ``input_shape``, as serve takes a request's samples.
For a run trained on images (``imagefolder``, ``images``, ``mnist``, ``cifar10``, ...) INPUT is an image file or a
folder (or ``s3://`` prefix) of images, class folders or not. For a text run, INPUT's rows hold text: a causal LM's
``prompt`` column is completed (``prediction``); a text classifier's text column (the run's ``dataset.columns.text``)
is classified (``prediction``: the class, ``probability``: its probability), or a reward model's scored
(``prediction``: the score, after the row's ``prompt`` where INPUT has it); ``--features NAME`` names another.
Each row or image is decoded as training decoded it (the same column mapping, image transforms and
``input_shape``), the model is the run's (``load_model``), and the output is a folder of Parquet files: the input's
other columns (ids, labels; an image's ``path``, and its class folder as ``label`` where that is one of the run's
classes) carried through, ``prediction`` (the class, by name when the run's classes are strings; the value for
regression) and, for classification, ``probabilities`` (one per class, in class order). Rows come back in no
particular order: carry an id column to join them. The output must not exist yet (a path, or an ``s3://`` prefix
with nothing under it). The cluster: ``--address``, else the environment's ``RAY_ADDRESS``, else a local one.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import logging
import math
import os
import sys
import time
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError, did_you_mean
from hydra_raytrain.data import streamed, tables
from hydra_raytrain.data.decode import FEATURES, LABELS, resized
from hydra_raytrain.data.files import (
    IMAGE_EXTENSIONS,
    absolute_location,
    class_of,
    image_files,
    listing,
    parquet_files,
    row_counts,
)
from hydra_raytrain.data.vectors import features_of, holds_numbers, sample_shape
from hydra_raytrain.inference.actors import allocator, model_actor_env
from hydra_raytrain.inference.classify_text import is_classifier, labelled
from hydra_raytrain.inference.export_text import is_text
from hydra_raytrain.inference.finished import FinishedRun
from hydra_raytrain.inference.generate import completions, prompt_column
from hydra_raytrain.inference.output import check_output, writing
from hydra_raytrain.models.sampling import GREEDY, Sampling
from hydra_raytrain.shell.program import Command, at_least_one
from hydra_raytrain.storage import locks

READERS = {
    ".parquet": "read_parquet",
    ".csv": "read_csv",
    ".jsonl": "read_json",
    ".json": "read_json",
    ".ndjson": "read_json",
}
INPUTS = "a .parquet, .csv or .jsonl file, or a folder (or s3:// prefix) of them"
IMAGE_INPUTS = "an image file, or a folder (or s3:// prefix) of images (.png, .jpg, ...)"
IMAGE_BUILDERS = ("imagefolder", "torchvision_builtin", "images")  # hydra_raytrain.data's, by name
# A table run's model actor is handed up to CALL_BATCHES --batch-size batches at a time, as many as fit in
# CALL_BYTES of decoded input (at least one): Ray Data's costs of a call (~0.9 ms on one core: slicing the batch,
# its output block) are paid once for several model batches, and a call stays small enough to spread a small input
# over many actors (Ray Data bundles the input's blocks up to a call's rows before handing them to an actor)
CALL_BYTES, CALL_BATCHES = 2**20, 16


def call_rows(batch_size: int, dataset: dict[str, Any]) -> int:
    """Rows per call of a model actor: for a table run, whole batches of ``batch_size`` rows (the model predicts
    one at a time), up to ``CALL_BATCHES``, as many as fit in ``CALL_BYTES`` decoded (float32 samples of its
    ``input_shape``), at least one; for an image run one batch (its images are held at full size while decoded)."""
    if image_builder(dataset):
        return batch_size
    batch_bytes = batch_size * math.prod(int(n) for n in dataset["input_shape"]) * 4
    return batch_size * min(CALL_BATCHES, max(1, CALL_BYTES // max(batch_bytes, 1)))


def image_builder(dataset: dict[str, Any]) -> str | None:
    """The image dataset kind a run trained on (its preprocessing is predict's), or None."""
    target = str(dataset.get("_target_", ""))
    name = target.rsplit(".", 1)[-1]
    return name if target.startswith("hydra_raytrain.data.") and name in IMAGE_BUILDERS else None


def class_names(dataset: dict[str, Any]) -> list[str] | None:
    """An image run's class names (its class folders, sorted as training indexed them), where its training
    folder is still there; else None (predictions are then class indices)."""
    kind = image_builder(dataset)
    if kind == "torchvision_builtin":
        return None
    if kind == "imagefolder":
        from hydra_raytrain.data.folders import train_folder

        folder = train_folder(dataset["root"]) if os.path.isdir(dataset["root"]) else None
        return sorted(e.name for e in os.scandir(folder) if e.is_dir()) if folder else None
    try:
        return sorted({class_of(file) for file in image_files(dataset["path"])})
    except ConfigError:
        return None


class ImageDecoder:
    """One image file's bytes to a model input, as the run's dataset decoded its images in training: an image
    folder's and torchvision's sets through ``image_transform`` (an image folder's images opened as RGB first, as
    ImageFolder opens them), a streamed ``images`` run's as ``read_images`` loads them, then its ``transform``."""

    def __init__(self, dataset: dict[str, Any]) -> None:
        from hydra.utils import instantiate

        self.kind, self.shape = image_builder(dataset), tuple(int(n) for n in dataset["input_shape"])
        if self.kind == "images":
            transform = dataset.get("transform")
            self.transform = instantiate(transform, _convert_="all") if transform else None
        else:
            from hydra_raytrain.data.vision import image_transform

            self.transform = image_transform(self.shape, dataset.get("mean"), dataset.get("std"))

    def __call__(self, images: list[bytes]) -> np.ndarray:
        import io

        from PIL import Image

        opened: list[Any] = [Image.open(io.BytesIO(data)) for data in images]
        if self.kind != "images":
            if self.kind == "imagefolder":
                opened = [image.convert("RGB") for image in opened]
            return np.stack([self.transform(image).numpy() for image in opened]).astype(np.float32)  # type: ignore[misc]
        channels, height, width = self.shape
        mode = "L" if channels == 1 else "RGB"
        loaded = [resized(image, (height, width), mode) for image in opened]
        x = np.asarray(loaded, dtype=np.float32) / 255.0
        x = np.ascontiguousarray(x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2))
        if self.transform is None:
            return x
        return self.transform({FEATURES: x, LABELS: np.zeros(len(x), np.int64)})[FEATURES]


def input_columns(
    dataset: dict[str, Any], names: list[str], types: dict[str, Any], features: list[str] | None = None
) -> list[str]:
    """The input's columns that hold the run's features, in training's order: ``features`` (``--features``: names
    or patterns) where given; else a table run's columns by the names it trained on (``dataset.columns``; an older
    run's patterns over the input's number columns), a Parquet run's column or columns; for the other runs whose
    samples are arrays (the bundled datasets, a user's), the input's ``features`` column, else its columns of
    numbers but ``label``. ``types``: whether each column holds numbers. A ConfigError names what is missing."""
    from hydra.utils import get_object

    builder = get_object(dataset["_target_"]) if "_target_" in dataset else None
    if features is not None or (builder is not tables.table and builder is not streamed.parquet):
        patterns = features or (["features"] if "features" in names else ["*"])
        candidates = [name for name in names if features is not None or name != "label"]
        for pattern in features or ():  # each column or pattern named is there, as in training
            if not any(fnmatch.fnmatchcase(name, pattern) for name in candidates):
                raise ConfigError(
                    "--features", patterns, f"{pattern!r} names no column of the input{did_you_mean(pattern, names)}."
                )
        chosen = tables.pick_columns(candidates, patterns, types.__getitem__)
        if not chosen:
            raise ConfigError(
                "--features" if features else "INPUT",
                patterns,
                "picks no column of numbers of the input.",
                f"feature columns by name or pattern, of: {', '.join(names)}",
            )
    elif dataset.get("columns") is not None:
        chosen = list(dataset["columns"])
    elif builder is tables.table:
        patterns = [dataset["features"]] if isinstance(dataset["features"], str) else list(dataset["features"])
        candidates = [name for name in names if name != dataset["label"]]
        chosen = tables.pick_columns(candidates, patterns, types.__getitem__)
        wanted = int(dataset["input_shape"][0])
        if len(chosen) != wanted:
            raise ConfigError(
                "INPUT",
                chosen,
                f"the run trained on {wanted} feature columns ({patterns}); the input has {len(chosen)} that match.",
                "the columns of the training table",
            )
    else:
        chosen = [dataset["features"]] if isinstance(dataset["features"], str) else list(dataset["features"])
    missing = [name for name in chosen if name not in names]
    if missing:
        raise ConfigError(
            "INPUT", missing, "the input lacks these feature columns of the run.", f"its columns: {', '.join(names)}"
        )
    return chosen


def check_arrays(cfg: dict[str, Any], run: str) -> None:
    """A run predict reads rows for: one model that takes its dataset's samples, arrays of ``input_shape``."""
    if "_target_" not in (cfg.get("model") or {}) or not cfg["dataset"].get("input_shape"):
        raise ConfigError(
            "RUN_DIR",
            run,
            "predict feeds one model samples of the run's dataset.input_shape; this run "
            + ("holds several models." if "_target_" not in (cfg.get("model") or {}) else "has no input_shape."),
            "a run of one model on arrays (a table, Parquet or bundled dataset; INPUT: rows whose feature columns "
            "hold its input_shape's values) or on images (INPUT: image files); a GAN's generator: "
            "python -m hydra_raytrain.export RUN_DIR",
        )


class Predictor:
    """One actor of the pool: the run's model, and each batch's rows (or images) decoded, predicted and written
    back. ``classes``: an image run's class names (its dataset node holds a table run's); ``scheme``: the input's
    (``s3://``), which Ray Data's image paths lack; ``threads``: torch's, said on the terminal (None: as Ray set
    them, one per CPU the actor holds, as for serve's replicas); ``batch_size``: the rows of a model call (None:
    a whole batch at once, as serve's)."""

    def __init__(
        self,
        run: str,
        features: list[str],
        dataset: dict[str, Any],
        device: str = "cpu",
        classes: list[str] | None = None,
        scheme: str = "",
        threads: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        import torch
        from hydra.utils import instantiate

        from hydra_raytrain.inference.evaluate import load_model
        from hydra_raytrain.inference.export import Exported

        if threads is not None:  # predict's actors: their CPUs, as a training worker's (serve's: Ray's default)
            torch.set_num_threads(threads)
            threads = torch.get_num_threads()
            said = f"Model actor: {threads} torch thread{'s' if threads > 1 else ''}, {allocator()}"
            print(said + (f", batches of {batch_size} rows" if batch_size else ""), flush=True)
        self.torch, self.device = torch, torch.device(device)
        self.model = Exported(load_model(run)).to(self.device).eval()  # type: ignore[arg-type]
        self.features, self.shape = features, tuple(int(n) for n in dataset["input_shape"])
        self.classes = classes or dataset.get("classes")
        self.outputs = int(dataset.get("num_outputs") or 1)
        self.images = ImageDecoder(dataset) if image_builder(dataset) else None
        self.scheme, self.batch_size = scheme, batch_size
        transform = dataset.get("transform") if self.images is None else None  # an images run's: its decoder's
        self.transform = instantiate(transform, _convert_="all") if transform else None

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        prediction, probabilities = self.answer(self.forward(self.decode(batch)))
        carried = {name: batch.column(name) for name in batch.column_names if name not in self.features}
        if self.images is not None:  # an image's path, and its class folder where it names one of the run's
            paths = [self.scheme + path for path in batch.column("path").to_pylist()]
            folders = [class_of(path) for path in paths]
            known = set(self.classes or ())
            carried = {"path": pa.array(paths), "label": pa.array([f if f in known else None for f in folders])}
        if probabilities is None:
            return pa.table({**carried, "prediction": pa.array(prediction)})
        probs = pa.FixedSizeListArray.from_arrays(pa.array(probabilities.ravel()), self.outputs)
        return pa.table({**carried, "prediction": pa.array(prediction), "probabilities": probs})

    def forward(self, x: np.ndarray) -> Any:
        """The model's output (float32, on the CPU) for samples in the run's ``input_shape``, ``batch_size`` of
        them a model call."""
        x, step = self.prepare(x), self.batch_size or max(len(x), 1)
        with self.torch.no_grad():
            outputs = [
                self.model(self.torch.as_tensor(x[start : start + step]).to(self.device)).float().cpu()
                for start in range(0, max(len(x), 1), step)
            ]
        return outputs[0] if len(outputs) == 1 else self.torch.cat(outputs)

    def prepare(self, x: np.ndarray) -> np.ndarray:
        """Samples as the model saw them in training: the dataset's own transform applied, where it has one."""
        if self.transform is None:
            return x
        return self.transform({FEATURES: x, LABELS: np.zeros(len(x), np.int64)})[FEATURES]

    def answer(self, output: Any) -> tuple[Any, np.ndarray | None]:
        """Predictions (the class, by name when the run's classes are strings; the value for regression) and,
        for classification, each class's probability."""
        if self.outputs == 1:
            return output[:, 0].numpy(), None
        probabilities = self.torch.softmax(output, dim=1).numpy().astype(np.float32)
        index = probabilities.argmax(axis=1)
        return ([self.classes[i] for i in index] if self.classes else index.astype(np.int64)), probabilities

    def decode(self, batch: Any) -> np.ndarray:
        """The batch's samples: its images decoded, or its feature columns' values (each row flattened, the
        columns joined in order: ``vectors``, as training read them) in the run's ``input_shape``."""
        if self.images is not None:
            return self.images(batch.column("bytes").to_pylist())
        return features_of(batch, self.features, self.shape)


def read_input(path: str) -> Any:
    """The input as a Ray Dataset, by its suffix (a folder's: its first data file's)."""
    import ray.data

    location = absolute_location(path)
    suffix = os.path.splitext(location.rstrip("/").lower())[1]
    if suffix not in READERS:
        files = [f for f in listing(location, "INPUT", INPUTS) if os.path.splitext(f)[1].lower() in READERS]
        if not files:
            raise ConfigError("INPUT", path, "holds no .parquet, .csv or .jsonl file.", INPUTS)
        suffix = os.path.splitext(files[0])[1].lower()
    elif "://" not in location and not os.path.exists(location):
        raise ConfigError("INPUT", path, "no such file or folder.", INPUTS)
    options = {"file_extensions": [suffix.lstrip(".")]} if suffix != ".parquet" else {}
    return getattr(ray.data, READERS[suffix])(location, **options)


def read_images(path: str) -> Any:
    """An image run's input: every image file at ``path`` as its bytes and path (decoded by the actors)."""
    import ray.data

    location = absolute_location(path)
    found = [f for f in listing(location, "INPUT", IMAGE_INPUTS) if f.lower().endswith(IMAGE_EXTENSIONS)]
    if not found:
        raise ConfigError("INPUT", path, "holds no image file.", IMAGE_INPUTS)
    return ray.data.read_binary_files(found, include_paths=True)


def actor_cpus(cpus: int, num_workers: int, num_gpus: float, local: bool) -> int:
    """The CPUs (and torch threads) of each model actor when ``--num-cpus`` is not given: on a local cluster
    this command started, its CPUs less one for Ray Data's reads, divided among the actors (as a training command
    sizes its workers to its machine); on a joined cluster, or on GPUs (where the GPU computes), Ray's one."""
    return max(1, (cpus - 1) // max(num_workers, 1)) if local and not num_gpus else 1


def check_pool(num_workers: int, num_gpus: float, num_cpus: int = 1) -> None:
    """The actors fit the connected cluster: their CPUs and one more for Ray Data's reads, and their GPUs."""
    import ray

    gpus = float(ray.cluster_resources().get("GPU", 0))
    if num_gpus < 0 or num_workers * num_gpus > gpus:
        raise ConfigError(
            "--num-gpus", num_gpus, f"{num_workers} actors x {num_gpus:g} GPUs; the cluster has {gpus:g}.", "0 (CPU)"
        )
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if num_workers < 1 or num_workers + 1 > cpus:
        raise ConfigError(
            "--num-workers",
            num_workers,
            f"each model actor holds a CPU, and Ray Data's reads need one more; the cluster has {cpus}.",
            f"1 to {max(1, cpus - 1)}",
        )
    if num_cpus < 1 or num_workers * num_cpus + 1 > cpus:
        asked = f"{num_workers} actor{'s' if num_workers > 1 else ''} x {num_cpus} CPUs"
        raise ConfigError(
            "--num-cpus",
            num_cpus,
            "an actor needs a CPU."
            if num_cpus < 1
            else f"{asked}, and Ray Data's reads need one more; the cluster has {cpus}.",
            f"1 to {(cpus - 1) // num_workers}",
        )


def read_rows(dataset: dict[str, Any], input: str, features: list[str] | None = None) -> tuple[Any, list[str]]:
    """A run's rows as a Ray Dataset, and its columns that hold the run's features: they must hold numbers and,
    together, as many values a row as the run's ``input_shape`` (checked on the schema, or a first row)."""
    data = read_input(input)
    schema = data.schema()
    names = list(schema.names)
    fields = dict(zip(names, schema.types, strict=True))
    chosen = input_columns(dataset, names, {name: holds_numbers(kind) for name, kind in fields.items()}, features)
    for name in chosen:
        if not holds_numbers(fields[name]):
            raise ConfigError(
                "--features" if features else "INPUT",
                name,
                f"the column holds {fields[name]}, not numbers.",
                f"columns of numbers, or of lists or tensors of numbers: {', '.join(names)}",
            )
    first = functools.cache(lambda: data.take_batch(1, batch_format="pyarrow"))  # read only for a variable list
    found = sample_shape(
        [arrow_field(name, fields[name], schema) for name in chosen], lambda name: first().column(name)[0].as_py()
    )
    values = math.prod(found)  # as training's config resolves it (vectors.sample_shape)
    shape = [int(n) for n in dataset["input_shape"]]
    if math.prod(shape) != values:
        raise ConfigError(
            "--features" if features else "INPUT",
            few(chosen),
            f"a row of these columns holds {values} values; the run's samples hold {math.prod(shape)} "
            f"(dataset.input_shape {shape}).",
            f"feature columns of {math.prod(shape)} values a row (--features NAMES: which), of: {few(names)}",
        )
    return data, chosen


def few(names: list[str], shown: int = 8) -> str:
    """Column names for a message: all of a few, else the first ones and how many."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])}, ... ({len(names)} columns)"


def arrow_field(name: str, kind: Any, schema: Any) -> Any:
    """A column of a Ray Dataset's schema as a pyarrow field (with its metadata, where the schema keeps it)."""
    import pyarrow as pa

    base = getattr(schema, "base_schema", None)
    if isinstance(base, pa.Schema) and name in base.names:
        return base.field(name)
    return pa.field(name, kind)


def predict(
    run: str,
    input: str,
    output: str,
    num_workers: int = 1,
    batch_size: int = 256,
    num_gpus: float = 0,
    num_cpus: int = 1,
    columns: list[str] | None = None,
    max_new_tokens: int = 32,
    sampling: Sampling = GREEDY,
) -> dict[str, Any]:
    """Predict every row of ``input`` with a pool of ``num_workers`` model actors of ``num_cpus`` CPUs (as
    many torch threads) each; write ``output`` (Parquet). ``columns``: the input's feature columns (names or
    patterns; default: ``input_columns``'). The plan is printed."""
    from ray.data import ActorPoolStrategy

    from hydra_raytrain.runtime.host import import_path

    cfg = FinishedRun.read(run).checked("predict").config
    location = check_output(output)
    images = image_builder(cfg["dataset"]) is not None
    if not images and not is_text(cfg):
        check_arrays(cfg, run)
    check_pool(num_workers, num_gpus, num_cpus)
    with writing(location) as folder:  # held from here: another predict writing it is refused before any work
        plural = "s" if num_workers > 1 else ""
        gpus = f", {num_gpus:g} GPU" if num_gpus else ""
        cpus = f"{num_cpus} CPU{'s' if num_cpus > 1 else ''}"
        print(f"Predicting with {num_workers} model actor{plural} x {cpus}{gpus}", flush=True)
        started = time.time()
        pool = dict(
            compute=ActorPoolStrategy(size=num_workers),
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            runtime_env={"env_vars": model_actor_env(import_path())},
        )
        device = "cuda" if num_gpus else "cpu"
        if is_classifier(cfg):  # a text classifier: each row's text classified
            options = dict(device=device, batch_size=batch_size, threads=num_cpus)
            predictions, features = labelled(read_input(input), run, cfg, columns, options, pool)
        elif is_text(cfg):  # a causal LM: each row's prompt completed
            data = read_input(input)
            features = [prompt_column(data, columns)]
            generating = dict(device=device, max_new_tokens=max_new_tokens, batch_size=batch_size, threads=num_cpus)
            generating["sampling"] = sampling
            predictions = completions(data, run, features[0], generating, {**pool, "batch_size": batch_size})
        else:
            predictions, features = _predictions(cfg, run, input, columns, images, device, num_cpus, batch_size, pool)
        # The writes hold no CPU: the actors may take every CPU of a small cluster, and a write waiting for one would
        # wait for ever (Ray Data keeps the pool until the dataset ends).
        predictions.write_parquet(folder, ray_remote_args={"num_cpus": 0})
    rows = row_counts(parquet_files(location, "--output"))
    seconds = time.time() - started
    return {"rows": sum(rows), "output": location, "seconds": seconds, "features": features}


def _predictions(
    cfg: dict[str, Any],
    run: str,
    input: str,
    columns: list[str] | None,
    images: bool,
    device: str,
    num_cpus: int,
    batch_size: int,
    pool: dict[str, Any],
) -> tuple[Any, list[str]]:
    """A table's or images' rows predicted by the pool's Predictors, and the input's columns they read."""
    data, features = (read_images(input), ["bytes", "path"]) if images else read_rows(cfg["dataset"], input, columns)
    predictions = data.map_batches(
        Predictor,
        fn_constructor_kwargs={
            "run": os.path.abspath(run),
            "features": features,
            "dataset": cfg["dataset"],
            "device": device,
            "classes": class_names(cfg["dataset"]) if images else None,
            "scheme": absolute_location(input).split("://")[0] + "://" if "://" in input else "",
            "threads": num_cpus,
            "batch_size": batch_size,
        },
        batch_size=call_rows(batch_size, cfg["dataset"]),
        batch_format="pyarrow",
        **pool,
    )
    return predictions, features


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a finished run dir (trained on a table, or on images)")
    parser.add_argument("input", help=f"{INPUTS}; for an image run: {IMAGE_INPUTS}")
    parser.add_argument("--output", required=True, help="the folder of Parquet files to write (a path or s3://)")
    parser.add_argument(
        "--features",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        help="the input's feature columns, names or patterns, comma-separated (default: the run's own; for a run "
        "not trained on a table, the column 'features', else every column of numbers but 'label')",
    )
    parser.add_argument("--num-workers", type=int, default=1, help="model actors predicting at once")
    parser.add_argument(
        "--max-new-tokens", type=at_least_one, default=32, help="a causal LM's run: new tokens a completion"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="a causal LM's run: 0 greedy (default), else sampled"
    )
    parser.add_argument(
        "--top-p", type=float, default=1.0, help="sampled: the nucleus's probability (default 1: every token)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="sampled: a row's completion depends on it and the row alone"
    )
    parser.add_argument(
        "--stop", action="append", default=[], help="a text that ends a completion (left out); repeatable"
    )
    parser.add_argument("--batch-size", type=at_least_one, default=256, help="rows per model call")
    parser.add_argument("--num-gpus", type=float, default=0, help="GPUs per actor (0: CPU)")
    parser.add_argument(
        "--num-cpus",
        type=int,
        help="CPUs (and torch threads) per actor (default: on a local cluster its CPUs less one for the reads, "
        "divided among the actors; on a joined cluster or GPUs, 1)",
    )
    parser.add_argument("--address", help="the Ray cluster to run on (default: RAY_ADDRESS, else a local cluster)")


def _predict(options: argparse.Namespace) -> None:
    import ray

    from hydra_raytrain.runtime.host import machine_cores
    from hydra_raytrain.runtime.reach import reach_ray

    sampling = Sampling(options.temperature, options.top_p, options.seed, tuple(options.stop))  # before Ray starts
    # A local cluster of its own: the cores this command may use, or a CPU for every actor and one for the reads
    local_cpus = max(machine_cores(), options.num_workers + 1)
    try:
        joined = reach_ray(options.address, local_cpus, given_as="--address")
        if not sys.stderr.isatty():  # Ray Data's progress, logged every few seconds where no bar can be drawn
            logging.getLogger("ray.data").setLevel(logging.WARNING)
        cpus = options.num_cpus
        if cpus is None:
            cpus = actor_cpus(1 if joined else local_cpus, options.num_workers, options.num_gpus, not joined)
        done = predict(
            options.run,
            options.input,
            options.output,
            options.num_workers,
            options.batch_size,
            options.num_gpus,
            cpus,
            options.features,
            options.max_new_tokens,
            sampling,
        )
    finally:
        ray.shutdown()
    rate = done["rows"] / max(done["seconds"], 1e-9)
    print(f"Predicted {done['rows']:,} rows in {done['seconds']:.1f} s ({rate:,.0f} rows/s): {done['output']}")


COMMAND = Command(
    "predict", __doc__, _options, _predict, refused="Cannot predict", failed="Cannot predict", failures=(locks.Held,)
)
main = COMMAND.run


if __name__ == "__main__":
    main()
