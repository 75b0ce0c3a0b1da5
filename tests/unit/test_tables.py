"""``dataset=table`` (hydra_raytrain/data/tables.py; the row split: rowsplit.py; the file read: table_files.py):
one Parquet, CSV or JSON-lines file, read whole or streamed (by size), split by rows alike on both roads; columns by
name or pattern; string classes mapped in sorted order; each bad file or column named once."""

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hydra_raytrain.config import ConfigError
from hydra_raytrain.data import rowsplit, tables
from hydra_raytrain.data.roads import streams
from hydra_raytrain.data.streamed import Streamed
from hydra_raytrain.data.table_files import MB, reading_line, streams_table, table_bytes
from hydra_raytrain.data.tables import table, table_classes, table_outputs, table_shape

ROWS = 40


def write_all(folder, rows=ROWS):
    """The same table as .csv, .jsonl and .parquet: two float features, a string label, an int and a float one."""
    rng = np.random.default_rng(0)
    columns = {
        "width": rng.normal(size=rows).round(3),
        "height": rng.normal(size=rows).round(3),
        "kind": [["cat", "ant", "bee"][i % 3] for i in range(rows)],
        "count": [i % 4 for i in range(rows)],
        "price": rng.normal(size=rows).round(3),
    }
    data = pa.table(columns)
    pq.write_table(data, folder / "t.parquet")
    lines = ["width,height,kind,count,price"] + [
        ",".join(str(columns[name][i]) for name in columns) for i in range(rows)
    ]
    (folder / "t.csv").write_text("\n".join(lines) + "\n")
    (folder / "t.jsonl").write_text(
        "".join(json.dumps({name: columns[name][i] for name in columns}, default=float) + "\n" for i in range(rows))
    )
    return columns


def test_the_three_formats_give_the_same_splits_and_string_classes_map_in_sorted_order(tmp_path):
    columns = write_all(tmp_path)
    built = {}
    for suffix in ("parquet", "csv", "jsonl"):
        path = str(tmp_path / f"t.{suffix}")
        classes = table_classes(path, "kind")
        assert classes == ["ant", "bee", "cat"] and table_outputs(path, "kind") == 3
        assert table_shape(path, ["width", "h*"], "kind") == [2]
        built[suffix] = table(path, [2], 3, ["width", "h*"], "kind", classes)
    for suffix in ("csv", "jsonl"):
        for split in ("train", "val"):
            assert all(
                torch.equal(a, b)
                for a, b in zip(
                    getattr(built[suffix], split).tensors, getattr(built["parquet"], split).tensors, strict=True
                )
            )
    x, y = (torch.cat(pair) for pair in zip(built["csv"].train.tensors, built["csv"].val.tensors, strict=True))
    assert len(built["csv"].val) == 8 and len(y) == ROWS  # val_fraction 0.2, every row in one split
    names = [["ant", "bee", "cat"][i] for i in y.tolist()]
    rows = {(round(w, 3), name) for w, name in zip(x[:, 0].tolist(), names, strict=True)}
    assert rows == {(round(float(w), 3), kind) for w, kind in zip(columns["width"], columns["kind"], strict=True)}


def test_integer_labels_are_classes_and_float_labels_a_value(tmp_path):
    write_all(tmp_path)
    path = str(tmp_path / "t.csv")
    assert table_classes(path, "count") is None and table_outputs(path, "count") == 4
    assert table(path, [2], 4, ["width", "height"], "count").train.tensors[1].dtype == torch.long
    # a pattern takes the number columns it matches: kind (text) is left out of "*"
    assert table_outputs(path, "price") == 1 and table_shape(path, ["*"], "price") == [3]
    splits = table(path, [2], 1, ["width", "height"], "price")
    assert splits.train.tensors[1].dtype == torch.float32 and splits.train.tensors[1].shape[1:] == (1,)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: table_shape(p, ["width", "heigth"], "kind"), "'heigth' names no column of the table (did you mean"),
        (lambda p: table_classes(p, "knd"), "dataset.label='knd': the table has no such column (did you mean 'kind'?)"),
        (lambda p: table_shape(p, ["width", "kind"], "count"), "the column 'kind' holds string, not numbers"),
        (lambda p: table(p, [2], 2, ["width", "height"], "kind", ["ant", "bee"]), "values it lacks: cat"),
    ],
)
def test_a_missing_or_unfit_column_is_named(tmp_path, call, message):
    write_all(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        call(str(tmp_path / "t.csv"))


def test_a_file_that_does_not_parse_is_named_with_its_line(tmp_path):
    (tmp_path / "bad.csv").write_text("a,b,label\n1,2,x\n3,4,y\n5,6\n7,8,z\n")
    with pytest.raises(ConfigError) as caught:
        table_classes(str(tmp_path / "bad.csv"))
    assert "does not parse as CSV: line 4 has 2 columns, the header 3: '5,6'" in str(caught.value)
    (tmp_path / "t.txt").write_text("a\n")
    with pytest.raises(ConfigError, match=r"has the suffix '.txt'. Valid: a .parquet, .csv or .jsonl"):
        table_classes(str(tmp_path / "t.txt"))
    with pytest.raises(ConfigError, match="no such file"):
        table_classes(str(tmp_path / "missing.csv"))


def test_both_roads_keep_the_same_rows_in_the_same_order_and_count_them_before_reading(tmp_path, monkeypatch):
    """Read whole (tensors) or streamed (read units of whole row groups, here 4 units of a 7-row-group file):
    the same rows train and validate, in file order; the stream's counts come from the footer alone."""
    columns = write_all(tmp_path)
    pq.write_table(pa.table(columns), tmp_path / "t.parquet", row_group_size=6)
    monkeypatch.setattr(tables, "ROWS_PER_UNIT", 12)
    args = ([2], 3, ["width", "h*"], "kind", ["ant", "bee", "cat"])
    whole = table(str(tmp_path / "t.csv"), *args, read="memory")
    for suffix in ("parquet", "csv", "jsonl"):
        stream = table(str(tmp_path / f"t.{suffix}"), *args, read="stream")
        assert isinstance(stream, Streamed) and stream.rows == {"train": 32, "val": 8}
        if suffix == "parquet":
            assert [groups for _, groups in stream.table.units] == [(0, 1), (2, 3), (4, 5), (6,)]
        for split in ("train", "val"):
            x, y = (torch.cat(parts) for parts in zip(*stream.read(split, batch_size=5), strict=True))
            assert torch.equal(x, getattr(whole, split).tensors[0]) and torch.equal(y, getattr(whole, split).tensors[1])
        x, y = stream.sample(3)
        assert torch.equal(x, whole.train.tensors[0][:3]) and torch.equal(y, whole.train.tensors[1][:3])
    # A test split: validation as it was, the test rows taken from training, the same on both roads
    whole_test = table(str(tmp_path / "t.csv"), *args, read="memory", test_fraction=0.25)
    assert torch.equal(whole_test.val.tensors[0], whole.val.tensors[0]) and len(whole_test.test) == 10
    assert len(whole_test.train) == 22 and whole.test is None
    stream = table(str(tmp_path / "t.parquet"), *args, read="stream", test_fraction=0.25)
    assert stream.rows == {"train": 22, "val": 8, "test": 10}
    for split in ("train", "val", "test"):
        x, _ = (torch.cat(parts) for parts in zip(*stream.read(split, batch_size=5), strict=True))
        assert torch.equal(x, getattr(whole_test, split).tensors[0])
    every = torch.cat([whole_test.train.tensors[0], whole_test.val.tensors[0], whole_test.test.tensors[0]])
    assert sorted(map(tuple, every.tolist())) == sorted(
        map(tuple, torch.cat([whole.train.tensors[0], whole.val.tensors[0]]).tolist())
    )
    path = str(tmp_path / "t.parquet")
    kept = table(path, *args, read="stream", local_shuffle_buffer_size=64, columns=["width", "height"])
    assert kept.local_shuffle_buffer_size == 64  # the streamed road's row mixing, as dataset=parquet's
    with pytest.raises(ConfigError, match=re.escape("dataset.columns=['height']: the file's columns that")):
        table(str(tmp_path / "t.csv"), *args, read="memory", columns=["height"])


def test_the_split_takes_exactly_its_fraction_and_the_chunked_threshold_equals_the_direct_one(monkeypatch):
    rows = 10_000
    direct = rowsplit.val_threshold(rows, 0.2, 7)
    monkeypatch.setattr(rowsplit, "_SPLIT_CHUNK", 999)  # 11 chunks: the histogram's road
    assert rowsplit.val_threshold(rows, 0.2, 7) == direct
    val = rowsplit.val_mask(np.arange(rows), direct, 7)
    assert val.sum() == 2000 and not np.array_equal(val, rowsplit.val_mask(np.arange(rows), direct, 8))
    assert 0.15 < val[:1000].mean() < 0.25  # spread over the file, not a block of it
    with pytest.raises(ConfigError, match=re.escape("dataset.val_fraction=1.5: must be between 0 and 1")):
        rowsplit.val_threshold(rows, 1.5, 0)


def test_auto_reads_a_table_whole_up_to_its_limit_and_says_which_road(tmp_path):
    write_all(tmp_path)
    path = str(tmp_path / "t.parquet")
    size = table_bytes(path)
    assert 0 < size < 10_000
    assert not streams_table(path, "auto", 1) and streams_table(path, "auto", size / 2 / MB)
    assert streams_table(path, "stream", 1024) and not streams_table(path, "memory", 0)
    with pytest.raises(ConfigError, match=re.escape("dataset.read='sideways': is no way to read a table. Valid: auto")):
        streams_table(path, "sideways")
    node = {"_target_": "hydra_raytrain.data.table", "path": path, "read": "auto", "memory_limit_mb": 0.001}
    line = reading_line(node)
    assert line.startswith(f"Data: {path} (0.0 MB in memory): streamed through Ray Data") and "limit_mb=0.001" in line
    assert streams(node) and not streams({**node, "read": "memory"})


def write_vectors(folder):
    """The same 8-value rows as every kind of vector column: a list, a fixed-size list, pyarrow's fixed-shape
    tensor, Ray Data's tensor column as its write_parquet stores it (a large list, its shape in the field's
    metadata), nested lists in JSON lines, and split over a vector, a scalar and another vector column."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 8)).astype(np.float32)
    label = np.arange(ROWS) % 3
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 8)
    ray_field = pa.field(
        "features",
        pa.large_list(pa.float32()),
        metadata={b"ARROW:extension:name": b"ray.data.arrow_tensor_v2", b"ARROW:extension:metadata": b"[2, 4]"},
    )
    written = {
        "list": pa.table({"features": list(x), "label": label}),
        "fixed": pa.table({"features": fixed, "label": label, "note": ["n"] * ROWS}),
        "tensor": pa.table(
            {"features": pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [2, 4]), fixed)}
        ).append_column("label", pa.array(label)),
        "ray": pa.Table.from_arrays(
            [pa.array(list(x), pa.large_list(pa.float32())), pa.array(label)],
            schema=pa.schema([ray_field, pa.field("label", pa.int64())]),
        ),
        "several": pa.table({"a": list(x[:, :3]), "b": x[:, 3], "c": list(x[:, 4:]), "label": label}),
    }
    for name, data in written.items():
        pq.write_table(data, folder / f"{name}.parquet", row_group_size=7)
    lines = [
        json.dumps({"features": row.reshape(2, 4).tolist(), "label": int(k)}) for row, k in zip(x, label, strict=True)
    ]
    (folder / "nested.jsonl").write_text("\n".join(lines) + "\n")
    return x, label


@pytest.mark.parametrize(
    "name, shape",
    [
        ("list.parquet", [8]),
        ("fixed.parquet", [8]),
        ("tensor.parquet", [2, 4]),
        ("ray.parquet", [2, 4]),
        ("several.parquet", [8]),
        ("nested.jsonl", [2, 4]),
    ],
)
def test_vector_columns_train_as_one_sample_of_their_values_on_both_roads(tmp_path, monkeypatch, name, shape):
    """A vector column's rows, flattened (several columns joined in the table's order), are the samples; the
    shape comes from the data (a tensor's own, a list's length) or dataset.input_shape reshapes them; read whole
    or streamed, the same rows validate with the same values."""
    x, label = write_vectors(tmp_path)
    monkeypatch.setattr(tables, "ROWS_PER_UNIT", 14)  # several read units
    path = str(tmp_path / name)
    assert table_shape(path, ["*"], "label") == shape and table_outputs(path, "label") == 3
    val, _ = rowsplit.row_split(ROWS, 0.2, 0.0, 0).masks(np.arange(ROWS), 0)
    for input_shape in (shape, [1, 2, 4]):
        whole = table(path, input_shape, 3, ["*"], "label", read="memory")
        expected = torch.from_numpy(x[val]).reshape(-1, *input_shape)
        assert torch.equal(whole.val.tensors[0], expected) and torch.equal(
            whole.val.tensors[1], torch.tensor(label[val])
        )
        stream = table(path, input_shape, 3, ["*"], "label", read="stream")
        for split in ("train", "val"):
            streamed_x, streamed_y = (torch.cat(parts) for parts in zip(*stream.read(split, batch_size=5), strict=True))
            assert torch.equal(streamed_x, getattr(whole, split).tensors[0])
            assert torch.equal(streamed_y, getattr(whole, split).tensors[1])
    with pytest.raises(ConfigError, match=re.escape("dataset.input_shape=[3]: a sample of the columns")):
        table(path, [3], 3, ["*"], "label", read="memory")


def test_features_that_are_empty_or_not_numbers_are_refused_with_the_columns_and_their_types(tmp_path):
    pq.write_table(
        pa.table({"name": ["a", "b"] * 5, "tags": [["x"], ["y", "z"]] * 5, "label": [0, 1] * 5}), tmp_path / "t.parquet"
    )
    path = str(tmp_path / "t.parquet")
    with pytest.raises(ConfigError) as caught:
        table_shape(path, ["*"], "label")
    assert str(caught.value).startswith(
        "Invalid config: dataset.features=['*']: picks no column of numbers; the table's columns: name (string), "
        "tags (list<element: string>). Valid: columns of numbers, or of lists"
    )
    with pytest.raises(ConfigError, match=re.escape("the column 'tags' holds list<element: string>, not numbers")):
        table_shape(path, ["tags"], "label")
    pq.write_table(pa.table({"f": [[1.0, 2.0], [3.0]] * 5, "label": [0, 1] * 5}), tmp_path / "ragged.parquet")
    with pytest.raises(ConfigError, match=re.escape("the column 'f' holds lists of 1 to 2 values")):
        table(str(tmp_path / "ragged.parquet"), [2], 2, ["*"], "label", read="memory")
