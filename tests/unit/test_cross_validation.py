"""Cross-validation: ``dataset.folds=K`` and ``dataset.fold`` cut the data into K disjoint validation folds; the
sweep ranks configurations by their mean over the folds."""

from __future__ import annotations

import re
import statistics

import pytest
import torch
from omegaconf import OmegaConf

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.config.identity import run_name
from hydra_raytrain.data import diabetes, digits
from hydra_raytrain.data.splits import split_indices
from hydra_raytrain.preflight.resolvers import register_resolvers
from hydra_raytrain.sweep.results import rank_configurations
from tests.conftest import compose_config


def test_three_folds_of_the_digits_validate_every_sample_once_and_test_the_same_rows():
    n = 1797
    seen: list[int] = []
    tests = set()
    for fold in range(3):
        train, val, test = split_indices(n, 0.2, 0, test_fraction=0.1, folds=3, fold=fold)
        assert not set(train) & set(val) and not (set(train) | set(val)) & set(test)
        assert len(train) + len(val) + len(test) == n
        seen += val
        tests.add(tuple(test))
        splits = digits(folds=3, fold=fold, test_fraction=0.1)
        assert len(splits.val) == len(val) and len(splits.test) == len(test)  # type: ignore[arg-type]
        assert len(splits.train) + len(splits.val) + len(splits.test) == n  # type: ignore[arg-type]
    assert sorted(seen) == sorted(set(range(n)) - set(next(iter(tests))))  # every other sample validates once
    assert len(tests) == 1 and len(next(iter(tests))) == round(n * 0.1)  # one test split for every fold
    assert list(next(iter(tests))) == split_indices(n, 0.2, 0, test_fraction=0.1)[2]  # the usual split's
    sizes = [len(split_indices(n, 0.2, 0, folds=4, fold=k)[1]) for k in range(4)]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1  # near-equal folds
    assert len(diabetes(folds=5, fold=4).val) in (88, 89)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("folds", "fold", "key", "says"),
    [
        (1, 0, "dataset.folds", "2 to 1797 folds"),
        (True, 0, "dataset.folds", "2 to"),
        (3, 3, "dataset.fold", "0 to 2"),
        (3, -1, "dataset.fold", "0 to 2"),
        (None, 2, "dataset.fold", "dataset.folds, which is not set"),
    ],
)
def test_bad_folds_are_refused_by_name(folds, fold, key, says):
    with pytest.raises(ConfigError) as raised:
        digits(folds=folds, fold=fold)
    assert key in str(raised.value) and says in str(raised.value)


def test_cross_validation_is_part_of_the_run_name_only_when_asked_for():
    register_resolvers()
    names = {}
    for extra in (
        [],
        ["dataset.folds=null", "dataset.fold=0"],
        ["dataset.folds=3"],
        ["dataset.folds=3", "dataset.fold=1"],
    ):
        cfg = compose_config("storage.name=null", *extra)
        names[tuple(extra)] = run_name(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    assert names[()] == names[("dataset.folds=null", "dataset.fold=0")]
    assert len(set(names.values())) == 3  # each fold its own run


def row(index, configuration, best):
    return {"index": index, "configuration": configuration, "best": best}


def test_configurations_rank_by_their_mean_over_the_folds():
    rows = [
        row(0, "optimizer.lr=0.1", 0.90),
        row(1, "optimizer.lr=0.1", 0.70),
        row(2, "optimizer.lr=0.01", 0.85),
        row(3, "optimizer.lr=0.01", 0.84),
        row(4, "optimizer.lr=1.0", 0.99),
        row(5, "optimizer.lr=1.0", None),  # a fold that failed: ranked after the complete configurations
    ]
    ranked = rank_configurations(rows, "max")
    assert [c["configuration"] for c in ranked] == ["optimizer.lr=0.01", "optimizer.lr=0.1", "optimizer.lr=1.0"]
    assert ranked[0]["mean"] == pytest.approx(0.845) and ranked[0]["std"] == pytest.approx(0.005)
    assert ranked[1]["std"] == pytest.approx(statistics.pstdev([0.9, 0.7]))
    assert (ranked[2]["folds"], ranked[2]["scored"], ranked[2]["trials"]) == (2, 1, [4, 5])
    assert [c["configuration"] for c in rank_configurations(rows[:4], "min")] == [
        "optimizer.lr=0.1",
        "optimizer.lr=0.01",
    ]


def test_an_image_folder_cross_validates_its_images_unless_it_has_a_val_folder(tmp_path):
    from hydra_raytrain.data import imagefolder
    from tests.helpers.data import write_images

    write_images(tmp_path / "b", ["cat", "dog"], 6)  # root/<class>/*: 12 images
    paths = []
    for fold in range(3):
        splits = imagefolder(str(tmp_path / "b"), input_shape=(1, 8, 8), num_outputs=2, folds=3, fold=fold)
        assert (len(splits.train), len(splits.val)) == (8, 4)  # type: ignore[arg-type]
        paths += [splits.val.dataset.samples[i][0] for i in splits.val.indices]  # type: ignore[attr-defined]
    assert len(paths) == len(set(paths)) == 12  # every image validates once
    write_images(tmp_path / "a" / "train", ["cat", "dog"], 5)
    write_images(tmp_path / "a" / "val", ["cat", "dog"], 1)
    with pytest.raises(ConfigError, match="dataset.folds=3: .*/val holds the validation images"):
        imagefolder(str(tmp_path / "a"), input_shape=(1, 8, 8), num_outputs=2, folds=3)


def test_three_folds_of_a_table_partition_its_rows_alike_on_both_roads(tmp_path):
    """``dataset=table``: the rows outside the usual test split, in key order, cut into 3 folds; read whole or
    streamed by Ray Data's units (4 row groups), each fold validates the same rows, every row in one fold."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hydra_raytrain.data import tables
    from hydra_raytrain.data.rowsplit import row_split

    rows = 203
    ids = np.arange(rows, dtype=np.float32)  # a feature that names the row
    pq.write_table(pa.table({"id": ids, "x": ids % 7, "label": np.arange(rows) % 3}), tmp_path / "t.parquet", 60)
    path, args = str(tmp_path / "t.parquet"), ([2], 3, ["id", "x"], "label")
    usual = tables.table(path, *args, read="memory", test_fraction=0.1)
    seen: list[float] = []
    for fold in range(3):
        whole = tables.table(path, *args, read="memory", test_fraction=0.1, folds=3, fold=fold)
        stream = tables.table(path, *args, read="stream", test_fraction=0.1, folds=3, fold=fold)
        assert torch.equal(whole.test.tensors[0], usual.test.tensors[0])  # the usual split's test rows
        assert stream.rows == {split: len(getattr(whole, split)) for split in ("train", "val", "test")}
        for split in ("train", "val", "test"):
            x, _ = (torch.cat(parts) for parts in zip(*stream.read(split, batch_size=16), strict=True))
            assert torch.equal(x, getattr(whole, split).tensors[0])
        every = torch.cat([whole.train.tensors[0], whole.val.tensors[0], whole.test.tensors[0]])[:, 0]
        assert sorted(every.tolist()) == ids.tolist()  # train, val and test: the table's rows, once each
        seen += whole.val.tensors[0][:, 0].tolist()
    tested = set(usual.test.tensors[0][:, 0].tolist())
    assert sorted(seen) == sorted(set(ids.tolist()) - tested) and len(tested) == 20  # each other row validates once
    sizes = [row_split(rows, 0.2, 0.1, 0, folds=3, fold=k).counts["val"] for k in range(3)]
    assert sizes == [61, 61, 61]  # 183 rows outside the test split
    with pytest.raises(ConfigError, match=re.escape("dataset.folds=204: cross-validation needs 2 to 203 folds")):
        row_split(rows, 0.2, 0.0, 0, folds=204)
    with pytest.raises(ConfigError, match="dataset.fold=1: picks a fold of dataset.folds, which is not set"):
        tables.table(path, *args, read="memory", fold=1)


def test_streamed_files_cross_validate_as_whole_files(tmp_path):
    """``dataset=parquet`` and ``dataset=images``: the files outside the usual test split cut into folds."""
    from hydra_raytrain.data import streamed
    from hydra_raytrain.data.files import row_counts
    from tests.helpers.data import write_digits_parquet, write_images

    write_digits_parquet(tmp_path / "p", files=7)
    usual = streamed.parquet(str(tmp_path / "p"), input_shape=[1, 8, 8], num_outputs=10, test_fraction=0.2)
    seen: list[str] = []
    for fold in range(3):
        stream = streamed.parquet(
            str(tmp_path / "p"), input_shape=[1, 8, 8], num_outputs=10, test_fraction=0.2, folds=3, fold=fold
        )
        assert stream.test_files == usual.test_files and not set(stream.val_files) & set(stream.train_files)
        assert sorted(stream.train_files + stream.val_files + stream.test_files) == sorted(
            usual.train_files + usual.val_files + usual.test_files
        )
        assert stream.rows["val"] == sum(row_counts(stream.val_files))
        seen += stream.val_files
    assert sorted(seen) == sorted(usual.train_files + usual.val_files)  # each other file validates once
    write_images(tmp_path / "i", ["cat", "dog"], 4)
    images = [streamed.images(str(tmp_path / "i"), [1, 8, 8], 2, folds=4, fold=k).val_files for k in range(4)]
    assert sorted(sum(images, [])) == sorted(map(str, (tmp_path / "i").glob("*/*.png"))) and {
        len(v) for v in images
    } == {2}
    with pytest.raises(ConfigError, match="dataset.folds=3: dataset.val_path .* holds the validation files"):
        streamed.images(str(tmp_path / "i"), [1, 8, 8], 2, val_path=str(tmp_path / "i"), folds=3)
