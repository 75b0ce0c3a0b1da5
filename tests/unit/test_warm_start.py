"""run.init_from checked on the driver: the source found, and its weights fitting the model key by key."""

import pytest
import torch
from hydra.utils import instantiate

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.identity import run_name
from hydra_raytrain.preflight.validate import validate
from hydra_raytrain.recipe.warm_start import mismatches
from tests.conftest import compose_config


def default_weights():
    return instantiate(compose_config().model).state_dict()


def source(folder, weights, *files):
    folder.mkdir()
    torch.save(weights, folder / "model.pt")
    for name in files:
        (folder / name).write_text("{}")
    return folder


def test_weights_that_fit_pass_and_name_another_run(tmp_path):
    run_dir = source(tmp_path / "run", default_weights(), "summary.json")
    resolved = validate(compose_config("run.init_from=run"), str(tmp_path))
    assert resolved.run.init_from == str(run_dir)  # absolute: the workers run elsewhere
    assert resolved.run_name() != validate(compose_config(), str(tmp_path)).run_name()


def test_shapes_that_differ_are_named_with_both_shapes(tmp_path):
    weights = default_weights()
    key = next(k for k, v in weights.items() if v.dim() == 2)
    weights[key] = torch.zeros(3, 3)
    source(tmp_path / "run", weights)
    for strict in ("true", "false"):  # shapes must match either way
        with pytest.raises(ConfigError) as caught:
            validate(compose_config("run.init_from=run", f"run.init_from_strict={strict}"), str(tmp_path))
        assert caught.value.key == "run.init_from" and f"shapes differ: {key} (saved [3, 3], model [" in str(
            caught.value
        )


def test_missing_keys_are_refused_unless_not_strict(tmp_path):
    weights = default_weights()
    dropped = list(weights)[-1]
    del weights[dropped]
    source(tmp_path / "run", weights)
    with pytest.raises(ConfigError, match=f"missing: {dropped}.*run.init_from_strict=false"):
        validate(compose_config("run.init_from=run"), str(tmp_path))
    validate(compose_config("run.init_from=run", "run.init_from_strict=false"), str(tmp_path))


def test_another_models_weights_have_no_key_in_common(tmp_path):
    source(tmp_path / "run", torch.nn.Linear(2, 2).state_dict())
    with pytest.raises(ConfigError, match="no key in common"):
        validate(compose_config("run.init_from=run", "run.init_from_strict=false"), str(tmp_path))


def test_a_missing_source_or_optimizer_state_is_named(tmp_path):
    with pytest.raises(ConfigError, match="run.init_from=.*nowhere'?: not found"):
        validate(compose_config("run.init_from=nowhere"), str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no model.pt \(or sharded checkpoint\) there"):
        validate(compose_config("run.init_from=empty"), str(tmp_path))
    source(tmp_path / "run", default_weights(), "summary.json")
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("run.init_from=run", "run.init_optimizer=true"), str(tmp_path))
    assert caught.value.key == "run.init_optimizer" and "is a run dir without one" in str(caught.value)


def test_mismatches_in_a_state_dict():
    expected = {"a": torch.zeros(2), "b": torch.zeros(3)}
    assert mismatches(expected, {"a": torch.zeros(2), "b": torch.zeros(3)}, strict=True) == []
    assert mismatches(expected, {"a": torch.zeros(2), "c": torch.zeros(1)}, strict=True) == [
        "missing: b",
        "unexpected: c",
    ]
    assert mismatches(expected, {"a": torch.zeros(2)}, strict=False) == []


def test_runs_without_a_warm_start_keep_their_names():
    cfg = {"model": {"_target_": "m"}, "dataset": {"_target_": "d"}, "trainer": {}, "storage": {"name": None}}
    cfg["run"] = {"resume": "auto", "init_from": None}
    plain = run_name(cfg)
    cfg["run"]["init_optimizer"] = True  # no init_from: not part of the identity
    assert run_name(cfg) == plain
