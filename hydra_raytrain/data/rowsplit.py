"""The row split of one table file (``dataset=table``): which rows validate, which test, which train, from the
row count and ``split_seed`` alone, so the driver knows each split's rows (and each worker its steps) before
anything is read, and both roads (read whole, streamed) keep the same rows wherever the file is stored.
No torch or Ray at import.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from hydra_raytrain.config.errors import ConfigError

# The split: a row's position, mixed with the seed (splitmix64's finalizer: a bijection, so distinct positions
# never tie), and the ``val_fraction`` smallest keys validate. Computed from the row count alone, so the driver
# knows each split's rows (and each worker its steps) before anything is read.

_SPLIT_CHUNK = 1 << 24


def split_keys(positions: np.ndarray, seed: int) -> np.ndarray:
    """A well-mixed, distinct uint64 per row position (splitmix64 of ``position + seed * golden ratio``)."""
    with np.errstate(over="ignore"):
        keys = positions.astype(np.uint64) + np.uint64((int(seed) * 0x9E3779B97F4A7C15) % 2**64)
        keys ^= keys >> np.uint64(30)
        keys *= np.uint64(0xBF58476D1CE4E5B9)
        keys ^= keys >> np.uint64(27)
        keys *= np.uint64(0x94D049BB133111EB)
        keys ^= keys >> np.uint64(31)
    return keys


def validation_rows(rows: int, val_fraction: float) -> int:
    """How many of ``rows`` validate: ``round(rows * val_fraction)``, at least one, and at least one trains."""
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise ConfigError(
            "dataset.val_fraction", val_fraction, "must be between 0 and 1 (exclusive).", "a fraction, e.g. 0.2"
        )
    if rows < 2:
        raise ConfigError("dataset.path", rows, "the table has fewer than 2 rows: nothing to split.")
    return min(rows - 1, max(1, round(rows * val_fraction)))


def val_threshold(rows: int, val_fraction: float, seed: int) -> int:
    """The largest validating key: the ``validation_rows``-th smallest of the rows' keys."""
    return nth_key(rows, validation_rows(rows, val_fraction), seed)


def nth_key(rows: int, wanted: int, seed: int) -> int:
    """The ``wanted``-th smallest of the rows' keys (in chunks of 16M rows: a histogram of the keys' top 16 bits
    finds the bucket it is in, then that bucket is sorted)."""
    if rows <= _SPLIT_CHUNK:
        return int(np.partition(split_keys(np.arange(rows), seed), wanted - 1)[wanted - 1])

    def chunks() -> Iterator[np.ndarray]:  # the keys, 16M rows at a time
        for start in range(0, rows, _SPLIT_CHUNK):
            yield split_keys(np.arange(start, min(rows, start + _SPLIT_CHUNK)), seed)

    top = np.uint64(48)
    counts = sum(np.bincount((keys >> top).astype(np.int64), minlength=1 << 16) for keys in chunks())
    cumulative = np.cumsum(counts)
    bucket = int(np.searchsorted(cumulative, wanted))
    before = int(cumulative[bucket - 1]) if bucket else 0
    inside = np.concatenate([keys[(keys >> top) == bucket] for keys in chunks()])
    return int(np.partition(inside, wanted - before - 1)[wanted - before - 1])


def val_mask(positions: np.ndarray, threshold: int, seed: int) -> np.ndarray:
    """Which of the rows at ``positions`` validate."""
    return split_keys(positions, seed) <= np.uint64(threshold)


@dataclass(frozen=True)
class RowSplit:
    """Which rows validate and which test, as two bands of keys: a row whose key is in ``test`` tests, one whose
    key is in ``val`` (and not in ``test``) validates, the rest train. A band is (exclusive low, inclusive high),
    a low of -1 meaning none. ``counts``: each split's rows."""

    val: tuple[int, int]
    test: tuple[int, int]
    counts: Mapping[str, int]

    def masks(self, positions: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Which of the rows at ``positions`` validate, and which test (the rest train)."""
        keys = split_keys(positions, seed)
        test = _in_band(keys, self.test)
        return _in_band(keys, self.val) & ~test, test


def _in_band(keys: np.ndarray, band: tuple[int, int]) -> np.ndarray:
    inside = keys <= np.uint64(band[1])
    return inside & (keys > np.uint64(band[0])) if band[0] >= 0 else inside


def row_split(
    rows: int, val_fraction: float, test_fraction: float, seed: int, folds: int | None = None, fold: int = 0
) -> RowSplit:
    """The split of a table of ``rows`` rows, from the row count alone (so the driver knows each split's rows, and
    each worker its steps, before anything is read). Validation: the ``val_fraction`` smallest keys; the test rows:
    the ``test_fraction`` whose keys come next (so asking for a test split leaves validation as it was).

    With ``folds=K`` (cross-validation, as ``splits.split_indices``): the test rows as above; the other rows, in
    key order, cut into K near-equal folds, fold ``fold`` validating. The K runs of ``fold=0..K-1`` validate on
    disjoint folds that together hold every row outside the test split once."""
    from hydra_raytrain.data.splits import check_fractions, fold_range

    check_fractions(val_fraction, test_fraction)
    n_val = validation_rows(rows, val_fraction)
    n_test = validation_rows(rows, val_fraction + test_fraction) - n_val if test_fraction else 0
    if test_fraction and not n_test:
        raise ConfigError("dataset.test_fraction", test_fraction, f"holds no row of {rows} (a larger fraction).")
    usual = val_threshold(rows, val_fraction, seed)
    test = (usual, nth_key(rows, n_val + n_test, seed)) if n_test else (usual, usual)
    tested = {"test": n_test} if test_fraction else {}
    cut = fold_range(rows - n_test, folds, fold)  # the fold's ranks among the rows outside the test split
    if cut is None:
        return RowSplit((-1, usual), test, {"train": rows - n_val - n_test, "val": n_val, **tested})
    first, end = cut

    def key_at(rank: int) -> int:  # the key of the row at this rank among the other rows (skipping the test band)
        return nth_key(rows, rank + 1 + (n_test if rank >= n_val else 0), seed)

    val = (key_at(first - 1) if first else -1, key_at(end - 1))
    return RowSplit(val, test, {"train": rows - n_test - (end - first), "val": end - first, **tested})
