"""serve's request contract: what a body must hold, what each wrong one is told, and the answer's shape."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.inference.serve import BadRequest, answer, parse_inputs, served

SHAPE = (1, 2, 2)
SAMPLE = [[[0.0, 1.0], [2.0, 3.0]]]


def test_a_body_of_samples_in_the_input_shape_is_one_float32_batch():
    x = parse_inputs(json.dumps({"inputs": [SAMPLE, SAMPLE]}).encode(), SHAPE, 8)
    assert x.dtype == np.float32 and x.shape == (2, *SHAPE) and x[1, 0, 1, 1] == 3.0


@pytest.mark.parametrize(
    "body, status, reason",
    [
        (b"{not json", 400, "the body is not JSON"),
        (b"\xff\xfe", 400, "the body is not JSON"),
        (b"[1, 2]", 422, 'the body must be a JSON object {"inputs": [<sample>, ...]}'),
        (b'{"input": []}', 422, "the body must be a JSON object"),
        (b'{"inputs": []}', 422, '"inputs" must be a non-empty list of samples'),
        (b'{"inputs": 3}', 422, '"inputs" must be a non-empty list of samples'),
        (json.dumps({"inputs": [SAMPLE] * 9}).encode(), 413, "holds 9 samples; at most 8 per request"),
        (json.dumps({"inputs": [[[["a", 1], [2, 3]]]]}).encode(), 422, '"inputs" must hold numbers only'),
        (json.dumps({"inputs": [[1, 2, 3, 4]]}).encode(), 422, "each sample must have shape [1, 2, 2] (the run's"),
        (json.dumps({"inputs": [SAMPLE, [[[0, 1], [2]]]]}).encode(), 422, "lists of equal lengths"),
        (json.dumps({"inputs": [[[["1.5", "1"], ["2", "3"]]]]}).encode(), 422, "no text, booleans or nulls"),
        (json.dumps({"inputs": [[[[True, 1], [2, None]]]]}).encode(), 422, "no text, booleans or nulls"),
        (b'{"inputs": [[[[NaN, 1], [2, 3]]]]}', 422, "NaN or infinite"),
        (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "the body nests too deep to parse"),
        (b'{"inputs": [' + b"[" * 40 + b"1" + b"]" * 40 + b"]}", 422, "each sample must have shape [1, 2, 2]"),
    ],
)
def test_each_malformed_body_gets_a_4xx_and_a_one_line_reason(body, status, reason):
    with pytest.raises(BadRequest) as raised:
        parse_inputs(body, SHAPE, 8)
    assert raised.value.status == status and reason in raised.value.reason and "\n" not in raised.value.reason


def test_the_answer_has_probabilities_for_classification_only_and_a_non_finite_output_is_a_422():
    probabilities = np.array([[0.25, 0.75]], dtype=np.float32)
    assert answer(["dog"], probabilities) == {"predictions": ["dog"], "probabilities": [[0.25, 0.75]]}
    assert answer(np.array([1.5], dtype=np.float32), None) == {"predictions": [1.5]}
    for refused in (answer([0], np.array([[np.nan, np.nan]])), answer(np.array([np.inf], dtype=np.float32), None)):
        assert isinstance(refused, BadRequest) and refused.status == 422 and "is not finite" in refused.reason


def test_a_run_with_several_models_is_refused_by_name():
    gan = {"model": {"generator": {"_target_": "g"}, "discriminator": {"_target_": "d"}}, "dataset": {}}
    with pytest.raises(ConfigError, match="holds several models \\(discriminator, generator\\)"):
        served(gan, "runs/gan")
    one = {"model": {"_target_": "m"}, "dataset": {"input_shape": [3], "num_outputs": 2, "classes": ["a", "b"]}}
    assert served(one, "runs/x/") == {"run": "x", "input_shape": [3], "num_outputs": 2, "classes": ["a", "b"]}


def test_a_prompt_the_model_refuses_fails_its_own_request_not_the_batch():
    from hydra_raytrain.inference.serve import answer_prompts, parse_prompts

    def complete(prompts):
        if "too long" in prompts:
            raise IndexError("index out of range in self")
        return [prompt.upper() for prompt in prompts]

    answers = answer_prompts(complete, [["a", "b"], ["too long"], ["c"]])
    assert answers[0] == {"predictions": ["A", "B"]} and answers[2] == {"predictions": ["C"]}
    assert isinstance(answers[1], BadRequest) and answers[1].status == 422 and "index out of range" in answers[1].reason
    assert parse_prompts(b'{"inputs": ["x", "y"]}', 4) == ["x", "y"]
    for body, status in ((b'{"inputs": [""]}', 422), (b'{"inputs": ["a", "b", "c"]}', 413), (b"{", 400)):
        with pytest.raises(BadRequest) as refused:
            parse_prompts(body, 2)
        assert refused.value.status == status
