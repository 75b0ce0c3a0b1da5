"""Fixtures the unit tests of text share: a byte-level BPE tokenizer written once per module, and it loaded."""

import pytest

from hydra_raytrain.models.text import load_tokenizer
from tests.helpers.text import write_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(str(tokenizer_dir))
