"""Text for a causal language model (``dataset=text``): JSON lines or Parquet rows, tokenized into input ids and
labels, the labels of what is not learned masked (``IGNORE``, which the loss skips).

``format``:
- ``text``: every token is supervised (continued pre-training on documents);
- ``prompt_completion``: the prompt is read, the completion (and the end-of-sequence token) learned;
- ``messages``: a conversation (a list of ``{role, content}``) rendered by the tokenizer's chat template (or the
  Jinja file ``chat_template`` names: saved with the run, and what its export's tokenizer renders), its assistant
  turns learned: every one (``train_on=all_assistant``) or the last (``last_assistant``).

Rows longer than ``max_length`` tokens are cut (counted and said); a row left with no supervised token is
dropped (counted and said); batches are padded to their longest row (``TokenizedRows.collate``). The splits
follow the other datasets' rules (``val_path`` or ``val_fraction``, ``test_path`` or ``test_fraction``, folds).
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.data.packing import packed
from hydra_raytrain.data.preference import COLUMNS as PREFERENCE_COLUMNS
from hydra_raytrain.data.preference import PREFERENCE, SIDES, PreferenceRows, conversations, pair_flags, report_ties
from hydra_raytrain.data.splits import Splits, check_fractions, split_indices
from hydra_raytrain.data.text_files import LAYOUT, files_of, read_rows
from hydra_raytrain.data.text_labels import (
    CLASSIFICATION,
    COLUMNS,
    PAIR,
    check_trained_classes,
    class_indices,
    text_classes,
)
from hydra_raytrain.data.token_rows import IGNORE, Chunk, ClassifiedRows, TokenizedRows, chunk_of, supervised_positions

__all__ = ["IGNORE", "LAYOUT", "Chunk", "TokenizedRows", "chunk_of", "files_of", "supervised_positions", "text"]

FORMATS = ("text", "prompt_completion", "messages", CLASSIFICATION, PREFERENCE)
TRAIN_ON = ("all_assistant", "last_assistant")  # dataset.train_on: which assistant turns a conversation learns
TOKENIZERS = ("auto", "ray_data", "driver")  # dataset.tokenize: who tokenizes a run's rows
CHECKED_ROWS = 256  # the rows of each file set the checks before Ray starts tokenize (``text(sample=...)``)


def text(
    path: str,
    tokenizer: str,
    format: str = "text",
    max_length: int = 1024,
    columns: dict[str, str] | None = None,
    val_path: str | None = None,
    val_fraction: float = 0.1,
    split_seed: int = 0,
    test_path: str | None = None,
    test_fraction: float = 0.0,
    folds: int | None = None,
    fold: int = 0,
    tokenize: str = "auto",
    sample: int | None = None,
    packing: bool = False,
    chat_template: str | None = None,
    train_on: str = "all_assistant",
    classes: list[Any] | None = None,
) -> Splits:
    """The splits of the rows at ``path`` (and ``val_path`` / ``test_path``), tokenized here by ``tokenizer``'s
    tokenizer. ``columns`` renames the columns a format reads (``{prompt: question, completion: answer}``).
    ``tokenize``: who tokenizes a run's rows (``data/tokenized_ray.py``): ``ray_data``, ``driver``, or ``auto``
    (Ray Data for file sets over 64 MiB). ``sample``: the checks before Ray starts read the first rows of each file
    set, that many at most (nothing said of cuts). ``packing``: rows packed into sequences of ``max_length`` tokens,
    documents kept apart (``data/packing.py``). ``chat_template``: a Jinja file that replaces the tokenizer's
    template, or the template itself (:func:`chat_template_of`); ``train_on``: which assistant turns are learned
    (:data:`TRAIN_ON`). ``classes``: a classification's (``data/text_labels.py``; None: read from ``path``)."""
    if tokenize not in TOKENIZERS:
        raise ConfigError("dataset.tokenize", tokenize, "unknown.", ", ".join(TOKENIZERS))
    if format in (CLASSIFICATION, PREFERENCE) and tokenize == "ray_data":
        raise ConfigError("dataset.tokenize", tokenize, f"format={format} is tokenized by the driver.", "auto, driver")
    loaded, names = checked(tokenizer, format, max_length, columns, chat_template, train_on, packing)
    tokenizing = Tokenize(loaded, format, names, max_length, train_on)
    if format == CLASSIFICATION and classes is None:
        classes = text_classes(path, format, columns)
    chunks, kept, targets = {}, {}, {}
    for source, where in sources(path, val_path, test_path).items():
        key = f"dataset.{source}"
        optional = {CLASSIFICATION: [PAIR], PREFERENCE: [names.get("prompt", "")]}.get(format, [])
        required = [column for column in names.values() if column not in optional]
        rows = read_rows(where, required, key, sample, optional=optional)
        pairs, cut, learned = tokenizing.cut(rows)
        if format == PREFERENCE:  # the flags of each row's pair of sides
            cut, learned, tied = pair_flags(cut, learned, pairs)
            report_ties(key, tied, sampled=sample is not None)
        report(key, format, max_length, cut, learned, sampled=sample is not None)
        chunks[source], kept[source] = [chunk_of(pairs)], np.flatnonzero(learned)
        if format == CLASSIFICATION:
            targets[source] = class_indices([row[names["label"]] for row in rows], classes or [], key, where)
    picked = pick(kept, val_fraction, test_fraction, split_seed, folds, fold)
    if targets and sample is None:
        source, train = picked["train"]
        check_trained_classes(targets[source][train], classes or [], val_fraction)
    types = "token_type_ids" in loaded.model_input_names
    pad = loaded.pad_token_id
    return assemble(chunks, picked, pad, max_length if packing else None, targets, types, format == PREFERENCE)


def is_text(node: Mapping[str, Any]) -> bool:
    """Whether a dataset config builds :func:`text`'s splits (a ``_target_`` that does not import: no)."""
    from hydra.utils import get_object

    try:
        return get_object(str(node.get("_target_"))) is text
    except Exception:
        return False


def checked(
    tokenizer: str,
    format: str,
    max_length: int,
    columns: dict[str, str] | None,
    chat_template: str | None = None,
    train_on: str = "all_assistant",
    packing: bool = False,
) -> tuple[Any, dict[str, str]]:
    """The tokenizer, loaded (its chat template replaced by ``chat_template``'s file when given), and the columns
    the format reads (renamed by ``columns``); a ConfigError for a format, a length, a template or a tokenizer that
    cannot serve."""
    from hydra_raytrain.models.text import chat_template_of, load_tokenizer

    if format not in FORMATS:
        raise ConfigError("dataset.format", format, "unknown format.", ", ".join(FORMATS))
    if max_length < 2:
        raise ConfigError("dataset.max_length", max_length, "a row needs at least 2 tokens to learn one.")
    if train_on not in TRAIN_ON:
        raise ConfigError("dataset.train_on", train_on, "unknown.", ", ".join(TRAIN_ON))
    if packing and format in (CLASSIFICATION, PREFERENCE):
        raise ConfigError(
            "dataset.packing", packing, f"format={format} reads each row's texts side by side: it packs nothing.",
            "dataset.packing=false",
        )  # fmt: skip
    if chat_template is not None and format not in ("messages", PREFERENCE):
        raise ConfigError(
            "dataset.chat_template", chat_template, f"dataset.format={format} renders no chat template.",
            "dataset.format=messages, or dataset.chat_template=null",
        )  # fmt: skip
    loaded = load_tokenizer(tokenizer, "dataset.tokenizer")
    if chat_template is not None:
        loaded.chat_template = chat_template_of(chat_template)  # models/text.py
    if format == "messages" and not loaded.chat_template:
        raise ConfigError(
            "dataset.format", format, f"the tokenizer at {tokenizer} has no chat template.",
            "a tokenizer with a chat template (its tokenizer_config.json's), or dataset.format=prompt_completion",
        )  # fmt: skip
    return loaded, {**default_columns(format), **(columns or {})}


def embed_chat_template(node: dict[str, Any], cwd: str) -> None:
    """A text dataset config's ``chat_template`` file replaced by its text, in place (see :func:`chat_template_of`)."""
    from hydra_raytrain.models.text import chat_template_of

    if is_text(node) and isinstance(node.get("chat_template"), str):
        node["chat_template"] = chat_template_of(node["chat_template"], cwd)


def sources(path: str, val_path: str | None, test_path: str | None) -> dict[str, str]:
    """The file sets read, by their key in the dataset's config: ``path``, and ``val_path`` / ``test_path`` when set."""
    given = {"path": path, "val_path": val_path, "test_path": test_path}
    return {source: where for source, where in given.items() if where is not None}


def report(key: str, format: str, max_length: int, cut: np.ndarray, learned: np.ndarray, sampled: bool) -> None:
    """A ConfigError when no row of ``key`` supervises a token; unless ``sampled``, the rows cut and dropped said."""
    if not learned.any():
        rows = f"the first {len(learned)} rows" if sampled else f"{len(learned)} rows"
        raise ConfigError(
            "dataset.format", format, f"no row of {key} supervises a token (of {rows}).",
            "a format whose rows have something to learn: completions that are not empty, assistant turns",
        )  # fmt: skip
    if sampled:
        return
    if cut.any():
        warnings.warn(f"dataset.max_length={max_length} cut {cut.sum():,} of {len(cut):,} rows of {key}", stacklevel=3)
    if not learned.all():
        warnings.warn(f"{(~learned).sum():,} rows of {key} supervise no token: dropped", stacklevel=3)


def pick(
    kept: dict[str, np.ndarray],
    val_fraction: float,
    test_fraction: float,
    seed: int,
    folds: int | None,
    fold: int,
) -> dict[str, tuple[str, np.ndarray]]:
    """Each split's file set (``sources``' keys) and rows, from the rows each file set kept: validation and test
    from their own files when given, else from ``path``'s rows by the fractions (or the folds)."""
    held = {source.removesuffix("_path"): rows for source, rows in kept.items() if source != "path"}
    train, val, test = _split(len(kept["path"]), held, val_fraction, test_fraction, seed, folds, fold)
    main = kept["path"]
    picked = {"train": ("path", main[train])}
    picked["val"] = ("val_path", held["val"]) if "val" in held else ("path", main[val])
    if "test" in held or test:
        picked["test"] = ("test_path", held["test"]) if "test" in held else ("path", main[test])
    return picked


def assemble(
    chunks: dict[str, list[Chunk]],
    picked: dict[str, tuple[str, np.ndarray]],
    pad_id: int,
    pack_to: int | None = None,
    targets: dict[str, np.ndarray] | None = None,
    types: bool = False,
    pairs: bool = False,
) -> Splits:
    """The splits ``pick`` chose, over each file set's chunks; packed into sequences of ``pack_to`` tokens when
    given (``data/packing.py``); with ``targets`` (each file set's class indices), a classification's rows
    (``types``: with their token types); ``pairs``: preference pairs (``data/preference.py``)."""

    def rows_of(source: str, rows: np.ndarray) -> TokenizedRows:
        if pairs:
            return PreferenceRows(chunks[source], rows, pad_id)
        if targets:
            return ClassifiedRows(chunks[source], rows, pad_id, targets[source], types)
        return packed(TokenizedRows(chunks[source], rows, pad_id), pack_to)

    part = {name: rows_of(source, rows) for name, (source, rows) in picked.items()}
    return Splits(part["train"], part["val"], part.get("test"))


def _split(
    n: int, held: dict[str, Any], val_fraction: float, test_fraction: float, seed: int, folds: int | None, fold: int
) -> tuple[list[int], list[int], list[int]]:
    """The rows of each split (indices): validation and test from their own files when held, else a seeded
    fraction of the rows (as every dataset splits, ``data/splits.py``)."""
    if "val" not in held:
        return split_indices(n, val_fraction, seed, 0.0 if "test" in held else test_fraction, folds, fold)
    if folds is not None:
        raise ConfigError(
            "dataset.folds", folds, "dataset.val_path holds the validation rows: cross-validation cuts its folds "
            "from dataset.path's rows.", "dataset.val_path=null (the folds from dataset.path), or dataset.folds=null",
        )  # fmt: skip
    check_fractions(val_fraction, test_fraction)
    if "test" in held or not test_fraction:
        return list(range(n)), [], []
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_test = min(n - 1, max(1, round(n * test_fraction)))
    return order[n_test:], [], order[:n_test]


def default_columns(format: str) -> dict[str, str]:
    return {
        "text": {"text": "text"},
        "prompt_completion": {"prompt": "prompt", "completion": "completion"},
        CLASSIFICATION: COLUMNS,
        PREFERENCE: PREFERENCE_COLUMNS,
    }.get(format, {"messages": "messages"})


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was after)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Tokenize:
    """Rows of one format to ``(input_ids, labels)`` arrays, cut at ``max_length``; a conversation's assistant turns
    learned as ``train_on`` says."""

    def __init__(
        self, tokenizer: Any, format: str, columns: dict[str, str], max_length: int, train_on: str = "all_assistant"
    ):
        self.tokenizer, self.format, self.columns, self.max_length = tokenizer, format, columns, max_length
        self.train_on = train_on

    def cut(self, rows: list[dict[str, Any]]) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
        """Each row's ids and labels cut at ``max_length``; which rows were cut; which supervise a token (the first
        token is never predicted: a row supervising only it has nothing to learn). Python's cyclic collector is
        paused meanwhile: the many small lists made here hold no cycle, and its passes over them took a third of
        the time."""
        with collector_paused():
            return self._cut(rows)

    def _cut(self, rows: list[dict[str, Any]]) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
        pairs = {
            "text": self._text,
            "prompt_completion": self._prompt_completion,
            "messages": self._messages,
            CLASSIFICATION: self._classification,
            PREFERENCE: self._preference,
        }[self.format](rows)
        cut = np.array([len(ids) > self.max_length for ids, _ in pairs], dtype=bool)
        kept = [
            (np.asarray(ids[: self.max_length], dtype=np.int32), np.asarray(labels[: self.max_length], dtype=np.int32))
            for ids, labels in pairs
        ]
        learned = np.array([bool((labels[1:] != IGNORE).any()) for _, labels in kept], dtype=bool)
        return kept, cut, learned

    def _ids(self, texts: list[str], special: bool) -> list[list[int]]:
        """Each text's ids, as ``tokenizer(texts)["input_ids"]`` gives them; from a fast tokenizer's Rust backend
        directly when it neither cuts nor pads (transformers' conversion of each encoding to a dict is more than
        half the time of its call)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None and backend.truncation is None and backend.padding is None:
            return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=special)]
        return self.tokenizer(texts, add_special_tokens=special)["input_ids"]

    def _text(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        eos = [self.tokenizer.eos_token_id]
        ids = [row + eos for row in self._ids([row[self.columns["text"]] for row in rows], True)]
        return [(row, row) for row in ids]

    def _prompt_completion(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        return self.completed(
            [row[self.columns["prompt"]] for row in rows], [row[self.columns["completion"]] for row in rows]
        )

    def completed(self, prompts: list[str], completions: list[str]) -> list[tuple[list[int], list[int]]]:
        """Each prompt (with the tokenizer's special tokens), then its completion and the end-of-sequence token;
        the prompt's labels masked."""
        heads = self._ids(prompts, True)
        eos = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        tails = [row + eos for row in self._ids(completions, False)]
        return [(p + c, [IGNORE] * len(p) + c) for p, c in zip(heads, tails, strict=True)]

    def _classification(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        """Each row's text (and ``text_pair``, when the file has that column) as the tokenizer encodes it for a
        classifier (its special tokens: BERT's [CLS] ... [SEP]), and its token types in place of labels."""
        texts = [str(row[self.columns["text"]]) for row in rows]
        second = [row.get(self.columns.get(PAIR, PAIR)) for row in rows]
        if any(value is not None for value in second) and any(value is None for value in second):
            raise ConfigError(
                f"dataset.columns.{PAIR}", self.columns.get(PAIR, PAIR), "is empty in some rows and not in others.",
                "a second text in every row, or in none",
            )  # fmt: skip
        encoded = self.tokenizer(texts, [str(v) for v in second] if second and second[0] is not None else None)
        types = encoded.get("token_type_ids") or [[0] * len(ids) for ids in encoded["input_ids"]]
        return list(zip(encoded["input_ids"], types, strict=True))

    def _messages(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        return [self._conversation(row[self.columns["messages"]]) for row in rows]

    def _preference(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        """Each row's chosen side, then its rejected side (``data/preference.py``): a prompt and completion as
        ``prompt_completion`` tokenizes them, or a conversation's last assistant turn through the chat template."""
        whole = conversations(rows, self.columns)
        if whole is not None:
            if not self.tokenizer.chat_template:
                raise ConfigError(
                    "dataset.format", PREFERENCE, "the rows hold conversations; the tokenizer has no chat template.",
                    "a tokenizer with a chat template, dataset.chat_template=PATH, or rows of prompt, chosen and "
                    "rejected strings",
                )  # fmt: skip
            return [self._conversation(turns, "last_assistant") for pair in whole for turns in pair]
        prompts = [row[self.columns["prompt"]] for row in rows for _ in SIDES]
        return self.completed(prompts, [row[self.columns[side]] for row in rows for side in SIDES])

    def _conversation(self, messages: list[dict[str, Any]], train_on: str | None = None) -> tuple[list[int], list[int]]:
        """The whole conversation's ids; supervised: each assistant turn learned (``train_on``, else the dataset's),
        what the template adds after the conversation up to it with the generation prompt."""
        train_on = train_on or self.train_on

        def render(turns: list[dict[str, Any]], prompt: bool) -> list[int]:  # fmt: skip
            rendered = self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=prompt)
            return self._ids([rendered], False)[0]

        ids = render(messages, False)
        labels = [IGNORE] * len(ids)
        turns = [index for index, message in enumerate(messages) if message.get("role") == "assistant"]
        for index in turns[-1:] if train_on == "last_assistant" else turns:
            before, through = render(messages[:index], True), render(messages[: index + 1], False)
            if ids[: len(before)] != before or ids[: len(through)] != through:
                raise ConfigError(
                    "dataset.train_on", train_on, f"the chat template renders assistant turn {index} of a "
                    "conversation otherwise once later turns follow (a template that drops earlier turns' "
                    "reasoning, as Qwen3's does, or tokens that merge across turns): the turn cannot be found in "
                    "the whole conversation's tokens.",
                    "dataset.train_on=last_assistant (the last turn alone, rendered as it is at inference), or "
                    "dataset.chat_template=PATH, a training template that renders every turn alike whatever follows",
                )  # fmt: skip
            labels[len(before) : len(through)] = ids[len(before) : len(through)]
        return ids, labels
