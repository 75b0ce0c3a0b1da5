"""The one rule for the metric that picks the best epoch, and its direction."""

from hydra_raytrain.config.monitor import monitored
from hydra_raytrain.tasks.classification import Classification
from hydra_raytrain.tasks.regression import Regression

UNSET = (None, None)


def test_the_tasks_defaults_when_nothing_is_set():
    assert monitored(Classification, UNSET) == ("val_accuracy", "max")
    assert monitored(Regression(), UNSET, UNSET) == ("val_loss", "min")


def test_the_trainers_settings_over_the_tasks_each_on_its_own():
    assert monitored(Classification, ("val_loss", "min")) == ("val_loss", "min")
    assert monitored(Classification, ("val_top2", None)) == ("val_top2", "max")


def test_the_most_specific_setting_first():
    trainer = ("val_loss", "min")
    assert monitored(Classification, ("val_accuracy", "max"), trainer) == ("val_accuracy", "max")
    assert monitored(Classification, ("train_loss", None), trainer) == ("train_loss", "min")
    assert monitored(Classification, UNSET, trainer) == ("val_loss", "min")
