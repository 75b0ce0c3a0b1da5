"""A run's text (``dataset=text``), tokenized once for all its workers, after the checks (which tokenized the first
rows only: ``text(sample=...)``), as ``dataset.tokenize`` says:

- ``ray_data``: each file set read by Ray Data and tokenized by a pool of actors (``map_batches``; one tokenizer per
  actor, loaded once), the blocks kept in Ray's object store. The driver holds references and each row's two flags
  (cut, supervises something): it says what was cut and dropped and picks the splits' rows as ``text()`` picks
  them; the corpus never passes through it. Every worker reads the same blocks in place
  (:meth:`TokenizedBlocks.splits`).
- ``driver``: ``text()`` in the driver, the splits put in Ray's object store once, read in place by every worker.
  An actor pool's start (a process importing transformers: ~5 s on a small machine) costs more than a small
  corpus's tokenization.
- ``auto`` (default): Ray Data for file sets over 64 MiB, else the driver.

Never once per worker. Ray Train's local mode (no cluster): its one worker tokenizes.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.splits import Splits
from hydra_raytrain.data.tokenized import (
    LAYOUT,
    Chunk,
    Tokenize,
    assemble,
    checked,
    chunk_of,
    files_of,
    is_text,
    pick,
    report,
    sources,
    text,
)

FLAGS = ("cut", "learned")  # each row: cut at max_length; supervises a token (else dropped)
ROWS_PER_CALL = 512  # rows an actor tokenizes per call: the fast tokenizer's batch encoding
RAY_DATA_BYTES = 64 * 2**20  # dataset.tokenize=auto: Ray Data for file sets holding more
HUB_SETTINGS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT")


@dataclass(frozen=True)
class TokenizedBlocks:
    """A run's tokenized text in Ray's object store: each file set's blocks (``sources``' keys), the rows each split
    takes (``pick``'s: its file set and the rows' numbers across its blocks), the padding id and the length of a
    pack (``dataset.packing``; None: not packed), each worker packing its splits alike."""

    blocks: dict[str, list[Any]]  # source -> ObjectRefs of pyarrow Tables: input_ids, labels (list<int32>)...
    picked: dict[str, tuple[str, np.ndarray]]  # train / val / test -> (source, row numbers)
    pad_id: int
    pack_to: int | None = None

    def splits(self) -> Splits:
        """The splits, over the blocks read in place."""
        import ray

        chunks = {
            source: [chunk for table in ray.get(refs) for chunk in chunks_of_table(table)]
            for source, refs in self.blocks.items()
        }
        return assemble(chunks, self.picked, self.pad_id, self.pack_to)


class TokenizeBatch:
    """``map_batches``' callable class: one tokenizer per actor, loaded when the actor starts."""

    def __init__(self, tokenizer: str, format: str, columns: dict[str, str], max_length: int, **conversation: Any):
        loaded, _ = checked(tokenizer, format, max_length, columns, **conversation)
        self.tokenize = Tokenize(loaded, format, columns, max_length, conversation.get("train_on", "all_assistant"))

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        pairs, cut, learned = self.tokenize.cut(batch.to_pylist())
        ids, labels, offsets = chunk_of(pairs)  # flat: Arrow lists built from them without a copy per row
        starts = pa.array(offsets.astype(np.int32))
        return pa.table({
            "input_ids": pa.ListArray.from_arrays(starts, pa.array(ids)),
            "labels": pa.ListArray.from_arrays(starts, pa.array(labels)),
            "cut": pa.array(cut, type=pa.bool_()), "learned": pa.array(learned, type=pa.bool_()),
        })  # fmt: skip


def chunks_of_table(table: Any) -> list[Chunk]:
    """A block's rows as :data:`Chunk`s, one per record batch, its Arrow buffers read in place (a block joins many
    calls' tables: combining them would copy the block into every worker's memory)."""
    return [chunk_of_lists(batch.column("input_ids"), batch.column("labels")) for batch in table.to_batches()]


def chunk_of_lists(ids: Any, labels: Any) -> Chunk:
    """Two Arrow list arrays of the same lengths as a :data:`Chunk`, without a copy (a sliced array's offsets point
    into its whole values)."""
    offsets = ids.offsets.to_numpy()
    first, last = int(offsets[0]), int(offsets[-1])
    start = int(labels.offsets.to_numpy()[0])
    return (
        ids.values.to_numpy()[first:last],
        labels.values.to_numpy()[start : start + last - first],
        (offsets - first).astype(np.int64),
    )


@dataclass(frozen=True)
class TokenizedHere:
    """Splits the driver tokenized (``text()``), in Ray's object store once."""

    ref: Any

    def splits(self) -> Splits:
        import ray

        return ray.get(self.ref)


def tokenized_for_run(node: Mapping[str, Any]) -> TokenizedBlocks | TokenizedHere | None:
    """A text dataset's rows (``dataset=text``), tokenized as ``dataset.tokenize`` says; else None."""
    import ray

    if not is_text(node):
        return None
    given = arguments(node)
    wanted = given["tokenize"]
    if wanted == "auto" and given["format"] in ("classification", "preference"):
        wanted = "driver"  # a classification's labels, a preference's pairs are read with their texts
    if wanted == "auto":  # Ray Data's actors may run on any node: on one node, or files every node reads
        where = sources(given["path"], given["val_path"], given["test_path"])
        held = sum(total_bytes(files_of(path, f"dataset.{source}")) for source, path in where.items())
        nodes = [node for node in ray.nodes() if node["Alive"]]
        everywhere = len(nodes) == 1 or all("://" in path for path in where.values())
        wanted = "ray_data" if held > RAY_DATA_BYTES and everywhere else "driver"
    started = time.perf_counter()
    tokenized = tokenize_on_ray(node) if wanted == "ray_data" else TokenizedHere(ray.put(text(**given)))
    who = "Ray Data's actors" if wanted == "ray_data" else "the driver"
    print(f"Text tokenized once for the workers, by {who} ({time.perf_counter() - started:.1f} s)", flush=True)
    return tokenized


def tokenized_once(nodes: Sequence[Mapping[str, Any]], probes: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Each distinct text dataset of ``nodes`` (a sweep's trials'), tokenized once (``tokenized_for_run``), by
    :func:`key_of`: its trials read it (``train(tokenized=...)``) and tokenize nothing. ``probes``: a search's
    points of its space: their dataset too when they share one (no dataset key searched)."""
    shared = list(probes[:1]) if len({key_of(node) for node in probes}) == 1 else []
    found: dict[str, Any] = {}
    for node in [*nodes, *shared]:
        if is_text(node) and key_of(node) not in found:
            found[key_of(node)] = tokenized_for_run(node)
    return found


def for_sweep(plan: Any) -> dict[str, Any]:
    """A sweep's text (``plan``: its ``Trials``), once for the trials still to run (a search's: its probes' dataset
    when they share one)."""
    return tokenized_once([job.cfg.dataset for job in plan.todo], [job.cfg.dataset for job in plan.probes])


def key_of(node: Mapping[str, Any]) -> str:
    """A dataset config's key: trials with equal dataset configs share their tokens."""
    return json.dumps(dict(node), sort_keys=True, default=str)


def arguments(node: Mapping[str, Any]) -> dict[str, Any]:
    """``text()``'s arguments in a dataset config (defaults filled in)."""
    bound = inspect.signature(text).bind(**{key: value for key, value in node.items() if key != "_target_"})
    bound.apply_defaults()
    return dict(bound.arguments)


def total_bytes(files: list[str]) -> int:
    from hydra_raytrain.data.files import filesystem_of

    total = 0
    for file in files:
        fs, location = filesystem_of(file)
        total += fs.get_file_info(location).size or 0
    return total


def tokenize_on_ray(node: Mapping[str, Any], actors: int | None = None) -> TokenizedBlocks:
    """``dataset=text``'s splits (``node``: the resolved dataset config), tokenized by Ray Data on the cluster Ray
    is connected to, by ``actors`` actors at most (default: the cluster's CPUs). The cuts and drops are said here."""
    import ray

    given = arguments(node)
    conversation = {"chat_template": given["chat_template"], "train_on": given["train_on"]}
    loaded, names = checked(given["tokenizer"], given["format"], given["max_length"], given["columns"], **conversation)
    actors = actors or max(1, int(ray.cluster_resources().get("CPU", 1)))
    tokenizer = os.path.abspath(given["tokenizer"]) if os.path.isdir(given["tokenizer"]) else given["tokenizer"]
    tokenize = dict(tokenizer=tokenizer, format=given["format"], columns=names, max_length=given["max_length"])
    tokenize.update(conversation)
    blocks, kept = {}, {}
    for source, where in sources(given["path"], given["val_path"], given["test_path"]).items():
        key = f"dataset.{source}"
        refs, cut, learned = _tokenized(where, key, list(names.values()), tokenize, actors)
        report(key, given["format"], given["max_length"], cut, learned, sampled=False)
        blocks[source], kept[source] = refs, np.flatnonzero(learned)
    fractions = given["val_fraction"], given["test_fraction"]
    picked = pick(kept, *fractions, given["split_seed"], given["folds"], given["fold"])
    return TokenizedBlocks(blocks, picked, loaded.pad_token_id, given["max_length"] if given["packing"] else None)


def _tokenized(
    path: str, key: str, columns: list[str], tokenize: dict[str, Any], actors: int
) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """The blocks of ``path``'s rows tokenized, in file order, and every row's flags: cut, supervises a token. Each
    run of files of one kind is read and tokenized in turn (a union of JSON lines and Parquet keeps no order)."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    context = DataContext.get_current()
    ordered, context.execution_options.preserve_order = context.execution_options.preserve_order, True
    refs: list[Any] = []
    flags: list[Any] = []
    try:
        for kind, group in itertools.groupby(files_of(path, key), key=_kind):
            tokenized = _read(list(group), kind).select_columns(columns).map_batches(
                TokenizeBatch, fn_constructor_kwargs=tokenize, batch_size=ROWS_PER_CALL, batch_format="pyarrow",
                compute=ActorPoolStrategy(min_size=1, max_size=actors), num_cpus=1,
                runtime_env={"env_vars": actor_env()},
            ).materialize()  # fmt: skip
            refs += tokenized.to_arrow_refs()
            flags += ray.get(tokenized.select_columns(list(FLAGS)).to_arrow_refs())  # not the tokens: the flags
    except ConfigError:
        raise
    except Exception as error:  # a file with other columns, or unreadable: Ray Data's error, its cause chained
        said = f"{type(error).__name__}: {_last_line(error)}"
        raise ConfigError(key, path, f"Ray Data could not read or tokenize it ({said})", LAYOUT) from error
    finally:
        context.execution_options.preserve_order = ordered
    cut, learned = (np.concatenate([np.asarray(t.column(c)) for t in flags] or [np.zeros(0, bool)]) for c in FLAGS)
    return refs, cut, learned


def _kind(file: str) -> str:
    return "parquet" if file.lower().endswith(".parquet") else "json"


def _read(files: list[str], kind: str) -> Any:
    import ray.data

    return ray.data.read_parquet(files) if kind == "parquet" else ray.data.read_json(files)


def actor_env() -> dict[str, str]:
    """The tokenizer actors' environment: the driver's import path and where the Hugging Face hub's files are (not
    its token: a runtime environment is shown by Ray's dashboard)."""
    from hydra_raytrain.runtime.host import import_path

    hub = {name: os.environ[name] for name in HUB_SETTINGS if name in os.environ}
    return {"PYTHONPATH": import_path(), **hub}


def _last_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(error).__name__
