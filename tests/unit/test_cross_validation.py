"""Cross-validation: ``dataset.folds=K`` and ``dataset.fold`` cut the data into K disjoint validation folds; the
sweep ranks configurations by their mean over the folds."""

from __future__ import annotations

import statistics

import pytest
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
