"""``python -m hydra_raytrain.predict``'s pure parts: which input columns feed the model, as training chose them,
and the runs and inputs it refuses by name."""

import functools
import os
import re

import numpy as np
import pyarrow as pa
import pytest

from hydra_raytrain.config import ConfigError
from hydra_raytrain.data.streamed import normalize
from hydra_raytrain.inference.predict import Predictor, check_arrays, input_columns

TABLE = {"_target_": "hydra_raytrain.data.table", "features": ["f*", "size"], "label": "kind", "input_shape": [3]}
NAMES = ["key", "f1", "size", "f0", "kind", "note"]
NUMBERS = {"key": False, "f1": True, "size": True, "f0": True, "kind": False, "note": False}


def test_a_table_run_reads_its_training_columns_by_name_in_training_order():
    trained = {**TABLE, "columns": ["f0", "f1", "size"]}
    assert input_columns(trained, NAMES, NUMBERS) == ["f0", "f1", "size"]  # the input's order does not matter
    with pytest.raises(ConfigError, match=re.escape("INPUT=['size']: the input lacks these feature columns")):
        input_columns(trained, ["f0", "f1", "kind"], NUMBERS)


def test_an_older_table_runs_patterns_pick_the_inputs_number_columns_without_the_label():
    assert input_columns(TABLE, NAMES, NUMBERS) == ["f1", "size", "f0"]
    assert input_columns(TABLE, [n for n in NAMES if n != "kind"], NUMBERS) == ["f1", "size", "f0"]  # no label
    with pytest.raises(ConfigError, match=re.escape("the run trained on 3 feature columns (['f*', 'size'])")):
        input_columns(TABLE, ["f1", "size", "kind"], NUMBERS)


def test_a_parquet_runs_column_must_be_there():
    parquet = {"_target_": "hydra_raytrain.data.parquet", "features": "pixels", "input_shape": [1, 2, 2]}
    assert input_columns(parquet, ["pixels", "label"], {}) == ["pixels"]
    with pytest.raises(ConfigError, match=re.escape("INPUT=['pixels']: the input lacks these feature columns")):
        input_columns(parquet, ["image", "label"], {})


def test_another_array_runs_input_is_its_features_column_else_its_number_columns_or_those_named():
    """A run on the bundled digits (or any dataset of arrays): the input's ``features`` column, else every column
    of numbers but ``label``; ``--features`` names them (for any run)."""
    digits = {"_target_": "hydra_raytrain.data.digits", "input_shape": [1, 8, 8]}
    numbers = {**NUMBERS, "features": True, "label": True}
    assert input_columns(digits, [*NAMES, "features", "label"], numbers) == ["features"]
    assert input_columns(digits, [*NAMES, "label"], numbers) == ["f1", "size", "f0"]  # the label left out
    assert input_columns(digits, NAMES, NUMBERS, ["f0", "s*"]) == ["size", "f0"]  # the input's order
    assert input_columns(TABLE, NAMES, NUMBERS, ["f0"]) == ["f0"]  # a table run's, named otherwise
    with pytest.raises(ConfigError, match=re.escape("--features=['k*']: picks no column of numbers of the input")):
        input_columns(digits, NAMES, NUMBERS, ["k*"])
    with pytest.raises(ConfigError, match=re.escape("'sise' names no column of the input (did you mean 'size'?)")):
        input_columns(digits, NAMES, NUMBERS, ["f0", "sise"])  # a typo is not dropped silently


@pytest.mark.parametrize(
    "config, reason",
    [
        ({"model": {"generator": {}, "discriminator": {}}, "dataset": {"input_shape": [64]}}, "holds several models"),
        ({"model": {"_target_": "m.Lit"}, "dataset": {"_target_": "hydra_raytrain.data.module_loaders"}}, "no input"),
    ],
)
def test_a_run_that_does_not_feed_one_model_arrays_is_refused_saying_which_runs_predict_reads(config, reason):
    with pytest.raises(ConfigError) as caught:
        check_arrays(config, "runs/x")
    message = str(caught.value)
    assert message.startswith("Invalid config: RUN_DIR='runs/x': predict feeds one model samples") and reason in message
    assert "a run of one model on arrays" in message and "or on images (INPUT: image files)" in message


def test_vector_and_scalar_columns_are_decoded_as_training_reads_them():
    """Each row's values flattened, the columns joined in order, reshaped to the run's input_shape: a nested-list
    column, a fixed-size list beside a scalar column, as ``vectors.features_of`` reads them in training."""
    predictor = Predictor.__new__(Predictor)  # decode only: no model
    predictor.transform, predictor.images = None, None
    predictor.features, predictor.shape = ["pixels"], (4,)
    assert predictor.decode(pa.table({"pixels": [[[0, 1], [2, 3]]]})).tolist() == [[0.0, 1.0, 2.0, 3.0]]
    predictor.features, predictor.shape = ["v", "s"], (1, 3)
    vector = pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 3.0, 4.0]), 2)
    decoded = predictor.decode(pa.table({"s": [9, 8], "v": vector}))
    assert decoded.tolist() == [[[1.0, 2.0, 9.0]], [[3.0, 4.0, 8.0]]]
    empty = predictor.decode(pa.table({"s": pa.array([], pa.int64()), "v": pa.array([], pa.list_(pa.float64()))}))
    assert empty.shape == (0, 1, 3)


def test_a_column_of_arrays_is_decoded_to_the_runs_input_shape():
    predictor = Predictor.__new__(Predictor)  # decode only: no model
    predictor.features, predictor.shape, predictor.transform, predictor.images = ["pixels"], (1, 2, 2), None, None
    batch = pa.table({"pixels": [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]})
    assert predictor.decode(batch).shape == (2, 1, 2, 2)
    predictor.features, predictor.shape = ["a", "b"], (2,)
    decoded = predictor.decode(pa.table({"a": [1, 2], "b": [3.0, 4.0]}))
    assert decoded.dtype == np.float32 and decoded.tolist() == [[1.0, 3.0], [2.0, 4.0]]
    predictor.transform = functools.partial(normalize, mean=[1.0], std=[2.0])  # a Parquet run's, as in training
    prepared = predictor.prepare(predictor.decode(pa.table({"a": [1, 2], "b": [3.0, 4.0]})))
    assert prepared.tolist() == [[0.0, 1.0], [0.5, 1.5]]


def test_an_image_is_decoded_as_the_runs_dataset_decoded_it_in_training(tmp_path):
    """The bytes of a training image, decoded for predict, equal the sample training read: an image folder's
    (torchvision transforms, normalized), a streamed images run's (read_images' resize, then its transform)."""
    from hydra_raytrain.data import imagefolder, images
    from hydra_raytrain.inference.predict import ImageDecoder, class_names, image_builder
    from tests.helpers.data import write_images

    write_images(tmp_path / "pets", ["cat", "dog"], 3, size=(11, 13))
    node = {"_target_": "hydra_raytrain.data.imagefolder", "root": str(tmp_path / "pets"), "input_shape": [1, 8, 8]}
    splits = imagefolder(str(tmp_path / "pets"), (1, 8, 8), 2, mean=[0.5], std=[0.25])
    path, _ = splits.train.dataset.samples[splits.train.indices[0]]
    decoded = ImageDecoder({**node, "mean": [0.5], "std": [0.25]})([open(path, "rb").read()])
    assert decoded.shape == (1, 1, 8, 8) and np.allclose(decoded[0], splits.train[0][0].numpy())
    assert image_builder(node) == "imagefolder" and class_names(node) == ["cat", "dog"]
    assert image_builder({"_target_": "hydra_raytrain.data.digits"}) is None

    transform = {"_target_": "hydra_raytrain.data.streamed.normalize", "_partial_": True, "mean": [0.5], "std": [0.5]}
    stream = images(str(tmp_path / "pets"), (3, 6, 6), 2, transform=functools.partial(normalize, mean=[0.5], std=[0.5]))
    x, _ = next(stream.read("train", batch_size=1))
    streamed_node = {"_target_": "hydra_raytrain.data.images", "path": str(tmp_path / "pets"), "input_shape": [3, 6, 6]}
    decoded = ImageDecoder({**streamed_node, "transform": transform})([open(stream.train_files[0], "rb").read()])
    assert np.allclose(decoded, x.numpy()) and class_names(streamed_node) == ["cat", "dog"]


def test_an_output_that_exists_is_refused(tmp_path):
    from hydra_raytrain.inference.predict import check_output

    assert check_output(str(tmp_path / "new")) == str(tmp_path / "new")
    (tmp_path / "old").mkdir()
    with pytest.raises(ConfigError, match=r"--output='.*old': exists: predictions go to a new folder"):
        check_output(str(tmp_path / "old"))


def test_an_actor_is_handed_whole_batches_up_to_a_size_and_the_model_sees_batch_size_rows_at_a_time():
    import torch

    from hydra_raytrain.inference.predict import CALL_BATCHES, CALL_BYTES, call_rows

    assert (CALL_BYTES, CALL_BATCHES) == (2**20, 16)
    assert call_rows(1024, {**TABLE, "input_shape": [64]}) == 4096  # 4 batches of 256 KiB in one call
    assert call_rows(100, TABLE) == 1600  # narrow rows: at most 16 batches
    assert call_rows(256, {**TABLE, "input_shape": [3, 224, 224]}) == 256  # a batch over the size: one a call
    images = {"_target_": "hydra_raytrain.data.imagefolder", "input_shape": [1, 8, 8]}
    assert call_rows(8, images) == 8  # images: one batch a call, whatever their size
    seen: list[int] = []

    def model(x: torch.Tensor) -> torch.Tensor:
        seen.append(len(x))
        return x.sum(dim=1, keepdim=True) * 2

    predictor = Predictor.__new__(Predictor)  # forward only: a model that counts its rows
    predictor.torch, predictor.device, predictor.model, predictor.transform = torch, torch.device("cpu"), model, None
    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    for batch_size, calls in ((3, [3, 3, 1]), (None, [7]), (10, [7])):
        predictor.batch_size, seen[:] = batch_size, []
        assert predictor.forward(x).tolist() == [[2.0 * (4 * i + 1)] for i in range(7)] and seen == calls
    predictor.batch_size, seen[:] = 3, []
    assert predictor.forward(x[:0]).shape == (0, 1) and seen == [0]  # an empty batch, as the model answers it


def test_actors_share_a_local_clusters_cpus_less_the_reads_one_and_take_rays_one_elsewhere():
    from hydra_raytrain.inference.predict import actor_cpus

    assert actor_cpus(16, 1, 0, local=True) == 15  # one actor: the machine, but a CPU for Ray Data's reads
    assert actor_cpus(16, 2, 0, local=True) == 7 and actor_cpus(16, 4, 0, local=True) == 3
    assert actor_cpus(2, 1, 0, local=True) == 1 and actor_cpus(3, 4, 0, local=True) == 1  # at least one
    assert actor_cpus(16, 1, 0, local=False) == 1  # a joined cluster: Ray's one, other jobs may share it
    assert actor_cpus(16, 1, 1, local=True) == 1  # on a GPU the GPU computes; the CPUs go to the reads


def test_model_actors_run_on_rays_jemalloc_unless_the_environment_names_an_allocator(monkeypatch, tmp_path):
    from hydra_raytrain.inference.actors import JEMALLOC_CONF, model_actor_env

    for name in ("LD_PRELOAD", "MALLOC_CONF", "RAY_JEMALLOC_LIB_PATH"):
        monkeypatch.delenv(name, raising=False)
    env = model_actor_env("/the/import/path")
    assert env["PYTHONPATH"] == "/the/import/path"
    assert env["LD_PRELOAD"].endswith(os.path.join("ray", "core", "libjemalloc.so"))  # the one in Ray's wheel
    assert os.path.isfile(env["LD_PRELOAD"]) and env["MALLOC_CONF"] == JEMALLOC_CONF
    with monkeypatch.context() as inside:  # a jemalloc setting of the user's own: on Ray's jemalloc
        inside.setenv("MALLOC_CONF", "narenas:2")
        assert model_actor_env("/p") == {
            "PYTHONPATH": "/p",
            "LD_PRELOAD": env["LD_PRELOAD"],
            "MALLOC_CONF": "narenas:2",
        }
    for value in ("", "/opt/libtcmalloc.so"):  # the user's (empty: the C library's), passed on to a joined cluster
        with monkeypatch.context() as inside:
            inside.setenv("LD_PRELOAD", value)
            assert model_actor_env("/p") == {"PYTHONPATH": "/p", "LD_PRELOAD": value}
    with monkeypatch.context() as inside:  # Ray's own variable for its jemalloc: a file that is not there, no preload
        inside.setenv("RAY_JEMALLOC_LIB_PATH", str(tmp_path / "libjemalloc.so"))
        assert model_actor_env("/p") == {"PYTHONPATH": "/p"}


def test_an_actor_says_its_allocator_and_a_preloaded_one_missing_on_its_node(monkeypatch):
    from hydra_raytrain.inference.actors import allocator

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert allocator() == "malloc"
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libgomp.so.1")  # preloaded, but no allocator
    assert allocator() == "malloc"
    monkeypatch.setenv("LD_PRELOAD", "/elsewhere/ray/core/libjemalloc.so")
    assert allocator() == "malloc (/elsewhere/ray/core/libjemalloc.so: not found on this node)"
