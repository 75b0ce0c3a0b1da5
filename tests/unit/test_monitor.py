"""The one rule for the metric that picks the best epoch, and its direction."""

from hydra_raytrain.config.monitor import monitored
from hydra_raytrain.tasks.classification import Classification
from hydra_raytrain.tasks.regression import Regression

TRAINER = {"monitor": None, "monitor_mode": None}


def test_the_tasks_defaults_when_nothing_is_set():
    assert monitored(TRAINER, Classification) == ("val_accuracy", "max")
    assert monitored(TRAINER, Regression()) == ("val_loss", "min")


def test_the_trainers_settings_over_the_tasks_each_on_its_own():
    assert monitored({"monitor": "val_loss", "monitor_mode": "min"}, Classification) == ("val_loss", "min")
    assert monitored({"monitor": "val_top2", "monitor_mode": None}, Classification) == ("val_top2", "max")


def test_early_stoppings_or_a_sweeps_own_over_the_trainers():
    trainer = {"monitor": "val_loss", "monitor_mode": "min"}
    assert monitored(trainer, Classification, "val_accuracy", "max") == ("val_accuracy", "max")
    assert monitored(trainer, Classification, "train_loss", None) == ("train_loss", "min")
