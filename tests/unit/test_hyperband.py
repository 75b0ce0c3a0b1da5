"""HyperBand and BOHB's settings: checked up front, each refusal naming the key, the value and what works."""

import importlib.util

import pytest
from ray.tune.schedulers import HyperBandForBOHB, HyperBandScheduler

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.sweeper import SweepSettings
from hydra_raytrain.sweep import tuner
from hydra_raytrain.sweep.space import parameter_space


@pytest.mark.parametrize(
    ("settings", "key", "says"),
    [
        (dict(scheduler="hyperband", reduction_factor=1), "hydra.sweeper.reduction_factor=1", "must be > 1"),
        (dict(scheduler="hyperband", search_alg="optuna"), "search_alg='optuna'", "search_alg=bohb"),
        (dict(search_alg="bohb"), "search_alg='bohb'", "scheduler=hyperband hydra.sweeper.search_alg=bohb"),
        (dict(scheduler="pbt", search_alg="bohb"), "search_alg='bohb'", "not under scheduler=pbt"),
    ],
)
def test_bad_hyperband_settings_are_refused_by_name(settings, key, says):
    with pytest.raises(ConfigError) as raised:
        SweepSettings(**settings).check()
    assert key in str(raised.value) and says in str(raised.value)


def test_bohb_without_its_packages_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "hpbandster" else real(name))
    with pytest.raises(ConfigError, match=r"needs hpbandster, which is not installed.*hydra_raytrain\[bohb\]"):
        SweepSettings(scheduler="hyperband", search_alg="bohb").check()


def test_hyperband_runs_on_epochs_and_lets_the_last_rung_finish_by_itself():
    plain = tuner.hyperband_scheduler(SweepSettings(scheduler="hyperband", reduction_factor=2), max_epochs=8)
    assert type(plain) is HyperBandScheduler and plain._time_attr == "epoch" and plain._max_t_attr == 8
    assert not plain._stop_last_trials  # a trial at max_t ends by itself and writes its summary
    bohb = tuner.hyperband_scheduler(SweepSettings(scheduler="hyperband", search_alg="bohb"), max_epochs=2)
    assert isinstance(bohb, HyperBandForBOHB)


class Trial:  # what the scheduler reads of a Tune trial: its status (and its identity)
    status = "RUNNING"


def test_bohb_learns_from_the_results_at_the_full_budget_too():
    """A trial on the last rung runs to its end by itself; its result at max_t still reaches BOHB's model."""
    settings = SweepSettings(scheduler="hyperband", search_alg="bohb", reduction_factor=2)
    bohb = tuner.hyperband_scheduler(settings, max_epochs=2)
    bohb.set_search_properties("val_accuracy", "max")
    trials = [Trial() for _ in range(4)]
    for trial in trials:  # largest bracket first: 2 trials from 1 epoch, then 2 trials on 2 epochs
        bohb.on_trial_add(None, trial)
    last = {"epoch": 1, "val_accuracy": 0.5}
    bohb.on_trial_result(None, trials[2], last)
    assert "budget" not in last["hyperband_info"]  # epoch 1 of a 2-epoch bracket: no budget reached yet
    full = {"epoch": 2, "val_accuracy": 0.6}
    assert bohb.on_trial_result(None, trials[2], full) == "CONTINUE" and full["hyperband_info"]["budget"] == 2


def test_bohbs_space_is_the_sweep_grammar_as_a_configspace():
    _, space = parameter_space(["optimizer.lr=tag(log,interval(1e-5,1e-1))", "model=mlp,simple_cnn"])
    search = tuner._bohb_search(space, "val_accuracy", "max", seed=3, concurrent=2)
    lr, model = search._space["optimizer.lr"], search._space["model"]
    assert (lr.lower, lr.upper, lr.log) == (1e-5, 1e-1, True) and list(model.choices) == ["mlp", "simple_cnn"]
    drawn = [search.suggest(f"t{i}") for i in range(3)]
    assert drawn[2] is None  # at most 2 trials at once that are not paused
    assert all(1e-5 <= d["optimizer.lr"] <= 1e-1 and d["model"] in ("mlp", "simple_cnn") for d in drawn[:2])
    search.on_pause("t0")
    assert search.suggest("t3") is not None  # a paused trial frees its place
