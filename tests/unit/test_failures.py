"""Which worker failures are retried: the patterns of failure.not_retried / retry_on, and process deaths."""

import pytest
import torch

from hydra_raytrain.config.schema import NOT_RETRIED
from hydra_raytrain.driver.failures import classify, describe, process_died


def verdict(error, died=False, retry_on=(), failures=1, max_failures=3):
    return classify({0: describe(error)}, died, NOT_RETRIED, retry_on, failures, max_failures)


def raised(code):
    try:
        code()
    except BaseException as error:
        return error
    raise AssertionError("nothing raised")


@pytest.mark.parametrize(
    "error",
    [
        raised(lambda: torch.zeros(2, 3) @ torch.zeros(2, 3)),
        raised(lambda: torch.nn.Linear(3, 2).load_state_dict({"weight": torch.zeros(5, 5)})),
        raised(lambda: {}["missing"]),
        raised(lambda: int("two")),
        raised(lambda: __import__("no_such_module_here")),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    ],
    ids=["shapes", "state_dict", "key", "value", "import", "cuda-oom"],
)
def test_errors_that_would_repeat_are_not_retried(error):
    result = verdict(error)
    assert not result.retried and "would repeat (matches failure.not_retried" in result.why


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:29500"),
        ConnectionResetError("Connection reset by peer"),
        OSError("s3: slow down"),
        RuntimeError("the loss diverged"),
    ],
)
def test_other_errors_are_retried_within_max_failures(error):
    assert verdict(error) == verdict(error, failures=3)
    assert verdict(error).retried and verdict(error).why == "no failure.not_retried pattern matches"
    assert not verdict(error, failures=4).retried and verdict(error, failures=4).why == "failure.max_failures=3 reached"
    assert verdict(error, failures=100, max_failures=-1).retried


def test_a_dead_worker_process_is_retried_whatever_its_peers_raised():
    from ray.exceptions import ActorDiedError

    assert process_died(ActorDiedError()) and not process_died(ValueError())
    errors = {0: "ValueError: collateral", 1: describe(ActorDiedError())}
    result = classify(errors, True, NOT_RETRIED, (), 1, 3)
    assert result.retried and result.why == "a worker process died"


def test_retry_on_wins_over_not_retried():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert verdict(oom, retry_on=["CUDA out of memory"]).retried


def test_a_callbacks_stop_is_never_retried_even_where_retry_on_matches():
    from hydra_raytrain.callbacks.base import StopTraining

    errors = {0: "RuntimeError: collateral", 1: describe(StopTraining("the training loss is nan at epoch 2"))}
    result = classify(errors, False, NOT_RETRIED, ("loss",), 1, 3)
    assert not result.retried and result.why == "a callback of worker 1 stopped the run"
