"""``python -m hydra_raytrain.predict``'s pure parts: which input columns feed the model, as training chose them,
and the runs and inputs it refuses by name."""

import functools
import re

import numpy as np
import pyarrow as pa
import pytest

from hydra_raytrain.config import ConfigError
from hydra_raytrain.data.streamed import normalize
from hydra_raytrain.predict import Predictor, input_columns

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


def test_a_parquet_runs_column_must_be_there_and_other_runs_are_refused_by_name():
    parquet = {"_target_": "hydra_raytrain.data.parquet", "features": "pixels", "input_shape": [1, 2, 2]}
    assert input_columns(parquet, ["pixels", "label"], {}) == ["pixels"]
    with pytest.raises(ConfigError, match=re.escape("INPUT=['pixels']: the input lacks these feature columns")):
        input_columns(parquet, ["image", "label"], {})
    with pytest.raises(ConfigError, match="predict reads the inputs of runs trained on tables"):
        input_columns({"_target_": "hydra_raytrain.data.digits"}, NAMES, NUMBERS)


def test_a_column_of_arrays_is_decoded_to_the_runs_input_shape():
    predictor = Predictor.__new__(Predictor)  # decode only: no model
    predictor.features, predictor.shape, predictor.transform = ["pixels"], (1, 2, 2), None
    batch = pa.table({"pixels": [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]})
    assert predictor.decode(batch).shape == (2, 1, 2, 2)
    predictor.features, predictor.shape = ["a", "b"], (2,)
    decoded = predictor.decode(pa.table({"a": [1, 2], "b": [3.0, 4.0]}))
    assert decoded.dtype == np.float32 and decoded.tolist() == [[1.0, 3.0], [2.0, 4.0]]
    predictor.transform = functools.partial(normalize, mean=[1.0], std=[2.0])  # a Parquet run's, as in training
    prepared = predictor.prepare(predictor.decode(pa.table({"a": [1, 2], "b": [3.0, 4.0]})))
    assert prepared.tolist() == [[0.0, 1.0], [0.5, 1.5]]
