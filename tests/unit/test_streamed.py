"""The Parquet dataset on the driver (no Ray): what it finds in the files, how it decodes, what it refuses."""

import numpy as np
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq
import pytest

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.schema import RayConfig
from hydra_raytrain.data import streamed, tables
from hydra_raytrain.data.decode import Decode, numpy_column
from hydra_raytrain.data.files import class_of, image_files, parquet_files
from hydra_raytrain.data.sizing import parquet_outputs
from hydra_raytrain.driver.cluster import ResourceRequest, plan_local_cpus
from hydra_raytrain.preflight.rehearsal import build_dataset
from hydra_raytrain.preflight.validate import validate
from tests.conftest import compose_config
from tests.helpers.data import write_digits_parquet, write_images


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parquet") / "digits"
    write_digits_parquet(folder, files=5)
    return folder


def test_the_shape_and_the_classes_are_read_from_the_files_so_a_path_is_all_it_needs(digits_folder, tmp_path):
    resolved = validate(compose_config("dataset=parquet", f"dataset.path={digits_folder}", "model=mlp"), str(tmp_path))
    assert resolved.dataset["input_shape"] == [64] and resolved.dataset["num_outputs"] == 10
    stream = build_dataset(resolved.dataset)
    assert len(stream.train_files) == 4 and len(stream.val_files) == 1
    assert stream.rows["train"] + stream.rows["val"] == 1797
    x, y = stream.sample(16)
    assert x.shape == (16, 64) and x.dtype.is_floating_point and y.dtype.is_signed and 0 <= x.min() <= x.max() <= 1


def test_a_shape_given_reshapes_the_samples_and_a_wrong_one_is_refused(digits_folder):
    stream = streamed.parquet(str(digits_folder), input_shape=[1, 8, 8], num_outputs=10)
    assert stream.sample(4)[0].shape == (4, 1, 8, 8)
    with pytest.raises(ConfigError, match=r"dataset.input_shape=\[3, 8, 8\].*holds 64 values") as caught:
        streamed.parquet(str(digits_folder), input_shape=[3, 8, 8], num_outputs=10)
    assert caught.value.key == "dataset.input_shape"


def test_a_bad_path_or_column_is_one_clear_error_before_anything_starts(digits_folder, tmp_path):
    with pytest.raises(ConfigError, match="no such file or folder") as caught:
        validate(compose_config("dataset=parquet", f"dataset.path={tmp_path / 'nope'}"), str(tmp_path))
    assert caught.value.key == "dataset.path"
    with pytest.raises(ConfigError, match="has no such column.*did you mean 'label'") as caught:
        validate(compose_config("dataset=parquet", f"dataset.path={digits_folder}", "dataset.label=labl"), ".")
    assert caught.value.key == "dataset.label" and "one of its columns: features, label" in str(caught.value)
    with pytest.raises(ConfigError, match="is no way to shuffle") as caught:
        streamed.parquet(str(digits_folder), input_shape=[64], num_outputs=10, shuffle="rows")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no .parquet file"):
        parquet_files(str(tmp_path / "empty"))


def test_one_file_is_split_only_by_a_validation_path_and_the_refusal_names_a_table_road_that_reads_it(tmp_path):
    write_digits_parquet(tmp_path / "one", files=1, features="pixels", label="digit")
    with pytest.raises(ConfigError, match="a streamed split takes whole files") as caught:
        streamed.parquet(str(tmp_path / "one"), input_shape=[64], num_outputs=10, features="pixels", label="digit")
    assert caught.value.key == "dataset.val_fraction" and "dataset.val_path" in str(caught.value)
    file = str(tmp_path / "one" / "part-000.parquet")
    by_rows = f"dataset=table dataset.path={file} 'dataset.features=[pixels]' dataset.label=digit"
    assert str(caught.value).split("Valid: ")[1].startswith(by_rows)
    splits = tables.table(file, tables.table_shape(file, ["pixels"], "digit"), 10, ["pixels"], "digit")
    assert (len(splits.train), len(splits.val), splits.val.tensors[0].shape[1:]) == (1438, 359, (64,))
    write_digits_parquet(tmp_path / "one", files=1)
    write_digits_parquet(tmp_path / "val", files=1)
    stream = streamed.parquet(str(tmp_path / "one"), input_shape=[64], num_outputs=10, val_path=str(tmp_path / "val"))
    assert stream.rows == {"train": 1797, "val": 1797}


def test_scalar_columns_and_a_float_label_make_a_regression_table(tmp_path):
    rng = np.random.default_rng(0)
    table = pa.table({"a": rng.normal(size=40), "b": rng.normal(size=40), "target": rng.normal(size=40)})
    tmp_path.joinpath("t").mkdir()
    for i in range(2):
        pq.write_table(table.slice(20 * i, 20), tmp_path / "t" / f"{i}.parquet")
    resolved = validate(
        compose_config(
            "dataset=parquet",
            f"dataset.path={tmp_path / 't'}",
            "dataset.features=[a,b]",
            "dataset.label=target",
            "task=regression",
            "model=mlp",
        ),
        str(tmp_path),
    )
    assert resolved.dataset["input_shape"] == [2] and resolved.dataset["num_outputs"] == 1
    stream = build_dataset(resolved.dataset)
    x, y = stream.sample(5)
    assert x.shape == (5, 2) and y.shape == (5, 1) and y.dtype.is_floating_point
    first = pq.read_table(stream.train_files[0]).slice(0, 5)
    assert np.allclose(x[:, 1].numpy(), first.column("b").to_numpy().astype(np.float32))
    assert np.allclose(y[:, 0].numpy(), first.column("target").to_numpy().astype(np.float32))


def test_decode_applies_the_configured_transform():
    decode = Decode(
        "f",
        "y",
        (2, 1),
        True,
        transform=lambda batch: streamed.normalize(batch, mean=[1.0, 2.0], std=[2.0, 4.0]),
    )
    batch = decode({"f": np.array([[1.0, 2.0], [3.0, 6.0]]), "y": np.array([0, 1])})
    assert batch["x"].shape == (2, 2, 1) and batch["x"].dtype == np.float32 and batch["y"].dtype == np.int64
    assert np.allclose(batch["x"][:, :, 0], [[0.0, 0.0], [1.0, 1.0]])


def test_a_local_cluster_keeps_a_cpu_for_ray_data_beside_the_workers():
    """Ray Data's tasks never get a CPU that Ray Train's workers hold: without a spare one the stream stalls."""
    request = ResourceRequest(1, {"CPU": 2.0}, data_cpus=1)
    assert request.total == {"CPU": 3.0} and "+ 1 CPU for Ray Data" in request.describe()
    assert plan_local_cpus(request, cores=2, free_memory=2**34, ray_cfg=RayConfig()) == 3
    with pytest.raises(ConfigError, match=r"needs 3 CPUs") as caught:
        plan_local_cpus(request, cores=2, free_memory=2**34, ray_cfg=RayConfig(num_cpus=2))
    assert caught.value.key == "ray.num_cpus"


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.parallel_strategy=fsdp", "trainer.parallel_strategy"),
        ("trainer.data_on_device=true", "trainer.data_on_device"),
        ("scaling.num_workers=0", "scaling.num_workers"),
    ],
)
def test_what_a_stream_cannot_do_is_refused_by_name(digits_folder, override, key):
    with pytest.raises(ConfigError, match="is not available with a dataset Ray Data streams") as caught:
        validate(compose_config("dataset=parquet", f"dataset.path={digits_folder}", "model=mlp", override), ".", False)
    assert caught.value.key == key


def test_reading_a_split_on_the_driver_returns_each_of_its_rows_once(digits_folder):
    """What ``hydra_raytrain.evaluate`` scores a streamed run on."""
    stream = streamed.parquet(str(digits_folder), input_shape=[1, 8, 8], num_outputs=10)
    batches = list(stream.read("val", 64))
    assert sum(len(y) for _, y in batches) == stream.rows["val"] and batches[0][0].shape[1:] == (1, 8, 8)
    expected = sum(pq.read_table(f).column("label").to_numpy().sum() for f in stream.val_files)
    assert sum(int(y.sum()) for _, y in batches) == expected


def test_images_in_class_folders_are_found_labelled_and_decoded_as_read_images_decodes_them(tmp_path):
    write_images(tmp_path / "pets", ["cat", "dog", "emu"], 4, size=(10, 12))
    resolved = validate(compose_config("dataset=images", f"dataset.path={tmp_path / 'pets'}", "model=mlp"), ".")
    assert resolved.dataset["input_shape"] == [3, 10, 12] and resolved.dataset["num_outputs"] == 3
    stream = build_dataset(resolved.dataset)
    assert stream.rows == {"train": 10, "val": 2} and not set(stream.train_files) & set(stream.val_files)
    x, y = stream.sample(16)  # every training image once (fewer than 16), spread over the classes
    assert x.shape == (10, 3, 10, 12) and sorted(y.tolist()) == sorted(
        ["cat", "dog", "emu"].index(class_of(f)) for f in stream.train_files
    )
    assert abs(float(x[0].max()) - 40 * int(stream.train_files[0][-5]) / 255) < 1e-6  # write_images' pixel value
    batches = list(streamed.images(str(tmp_path / "pets"), [1, 6, 6], 3).read("val", 8))
    assert [tuple(b[0].shape) for b in batches] == [(2, 1, 6, 6)]  # resized, grayscale


def test_bad_image_folders_are_refused_by_name(tmp_path):
    write_images(tmp_path / "pets", ["cat", "dog"], 2)
    write_images(tmp_path / "val", ["cat", "owl"], 1)
    with pytest.raises(ConfigError, match="has class folders that .* has not: owl") as caught:
        streamed.images(str(tmp_path / "pets"), [3, 10, 12], 2, val_path=str(tmp_path / "val"))
    assert caught.value.key == "dataset.val_path"
    with pytest.raises(ConfigError, match="has 2 classes") as caught:
        streamed.images(str(tmp_path / "pets"), [3, 10, 12], 5)
    assert caught.value.key == "dataset.num_outputs"
    with pytest.raises(ConfigError, match="no such file or folder") as caught:
        validate(compose_config("dataset=images", f"dataset.path={tmp_path / 'nope'}"), ".")
    assert caught.value.key == "dataset.path"
    (tmp_path / "flat").mkdir()
    (tmp_path / "pets" / "cat" / "0.png").rename(tmp_path / "flat" / "0.png")
    with pytest.raises(ConfigError, match="holds no images in class folders"):
        image_files(str(tmp_path / "flat"))


def test_decode_takes_columns_as_ray_data_hands_them_over():
    """Ray Data's numpy batches hold lists as object arrays of rows (nested lists: of object arrays), converted
    with ``to_numpy(zero_copy_only=False)``: the driver's decoding of a sample is the tasks' own."""
    nested = pa.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]], pa.list_(pa.list_(pa.float32(), 2), 2))
    flags = pa.array([True, False])
    batch = {"f": nested.to_numpy(zero_copy_only=False), "y": flags.to_numpy(zero_copy_only=False)}
    decoded = Decode("f", "y", (2, 2), True)(batch)
    assert decoded["x"].tolist() == [[[1, 2], [3, 4]], [[5, 6], [7, 8]]] and decoded["y"].tolist() == [1, 0]
    assert numpy_column(flags).tolist() == [True, False]  # a boolean column has no zero-copy view
    tensors = pa.FixedShapeTensorArray.from_numpy_ndarray(np.arange(8, dtype=np.float32).reshape(2, 2, 2))
    assert numpy_column(tensors).shape == (2, 2, 2)


def test_an_integer_label_regresses_with_one_output_and_classes_count_the_validation_files(tmp_path):
    def write(folder, labels):
        folder.mkdir()
        for i, chunk in enumerate(np.array_split(np.array(labels), 2)):
            table = pa.table({"features": np.ones(len(chunk)), "label": pa.array(chunk, pa.int64())})
            pq.write_table(table, folder / f"{i}.parquet")

    write(tmp_path / "train", [0, 1, 2, 3])
    write(tmp_path / "val", [0, 7])
    assert parquet_outputs(str(tmp_path / "train"), "label", str(tmp_path / "val")) == 8
    stream = streamed.parquet(str(tmp_path / "train"), [1], 1, val_path=str(tmp_path / "val"))
    x, y = stream.sample(4)
    assert y.dtype.is_floating_point and y.shape == (4, 1) and y[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_parquet_on_s3_is_listed_counted_inferred_and_sampled_without_ray(s3_endpoint, tmp_path):
    """The driver's side of ``dataset.path=s3://...`` against a real S3 server (moto): what Ray Data's tasks read
    from it is tested on the cluster with images (tests/integration/test_ray_data.py)."""
    write_digits_parquet(tmp_path / "digits", files=5)
    s3 = pyarrow.fs.S3FileSystem(endpoint_override=s3_endpoint, allow_bucket_creation=True)
    s3.create_dir("unit-bucket")
    pyarrow.fs.copy_files(str(tmp_path / "digits"), "unit-bucket/digits", pyarrow.fs.LocalFileSystem(), s3)
    resolved = validate(compose_config("dataset=parquet", "dataset.path=s3://unit-bucket/digits", "model=mlp"), ".")
    assert resolved.dataset["input_shape"] == [64] and resolved.dataset["num_outputs"] == 10
    stream = build_dataset(resolved.dataset)
    assert all(f.startswith("s3://unit-bucket/digits/part-") for f in stream.train_files + stream.val_files)
    assert stream.rows["train"] + stream.rows["val"] == 1797 and stream.sample(16)[0].shape == (16, 64)
    with pytest.raises(ConfigError, match="no such file or folder") as caught:
        parquet_files("s3://unit-bucket/nothing-here")
    assert caught.value.key == "dataset.path"
