"""Plainly wrong types are refused; what the callable would accept is not."""

import inspect
import typing
from collections.abc import Sequence
from typing import Optional

import pytest

from hydra_raytrain.preflight.typecheck import wrong_type

EMPTY = inspect.Parameter.empty


@pytest.mark.parametrize(
    "value, hint, default, expected",
    [
        ("abc", float, EMPTY, "a number"),
        (True, float, EMPTY, "a number"),  # a bool is not a learning rate
        (1, float, EMPTY, None),
        (1e4, int, EMPTY, None),  # an int written as a float (CosineAnnealingLR's T_max=1e4)
        (1.5, int, EMPTY, "an integer"),
        (1, bool, EMPTY, "true or false"),
        (None, int, None, None),  # `x: int = None`, an implicit Optional
        (None, Optional[int], EMPTY, None),  # noqa: UP045 (typing.Optional as older code writes it)
        (None, int | None, EMPTY, None),
        ([0.9], tuple[float, float], EMPTY, "a list of 2: [a number, a number]"),
        ([1, 2], Sequence[int], EMPTY, None),
        (["a"], list[int], EMPTY, "a list of integers"),
        ({"_target_": "torch.nn.ReLU"}, int, EMPTY, None),  # Hydra instantiates a nested node first
        ("x", typing.Any, EMPTY, None),
        ("x", object, EMPTY, None),  # a type we do not know: cannot tell
    ],
)
def test_by_annotation(value, hint, default, expected):
    assert wrong_type(value, hint, default) == expected


@pytest.mark.parametrize(
    "value, default, expected",
    [
        ("many", 64, "a number"),
        ({"a": 1}, 0.5, "a number"),
        ("yes", False, "true or false"),
        ([64, 32], 64, None),  # a per-group list (CyclicLR's base_momentum) or a user's own convention
        (3, False, None),
        ("relu", "tanh", None),
    ],
)
def test_without_annotation_by_default(value, default, expected):
    assert wrong_type(value, None, default) == expected
