"""A ``_target_`` set on the command line starts its node afresh (hydra_raytrain/preflight/replaced.py)."""

from hydra_raytrain.preflight.replaced import apply_overrides, replaced_targets
from tests.conftest import compose_config


def dropped(*overrides):
    cfg = compose_config(*overrides)
    notes = apply_overrides(cfg, list(overrides))
    return cfg, notes


def test_the_overrides_that_replace_targets_and_the_arguments_they_set():
    overrides = [
        "model._target_=my.Net",
        "model.hidden=3",
        "+model.depth=2",
        "~model.channels",
        "optimizer.lr=1",
        "model.generator._target_=my.G",
        "dataset=digits",
    ]
    assert replaced_targets(overrides) == {
        "model": ["_target_", "depth", "generator", "hidden"],
        "model.generator": ["_target_"],
    }


def test_the_replaced_options_literal_arguments_go_and_the_note_names_them():
    cfg, notes = dropped("model._target_=hydra_raytrain.models.MLP")
    # SimpleCNN's channels and hidden go; the dataset wiring stays, since MLP takes input_shape and num_outputs.
    assert sorted(cfg.model) == ["_target_", "input_shape", "num_outputs"]
    assert cfg.model.num_outputs == 10
    (note,) = notes
    assert note.startswith("Note: model._target_=hydra_raytrain.models.MLP starts model afresh")
    assert "channels=[32, 64], hidden=128 were dropped" in note and "model.channels=..." in note


def test_what_the_command_line_sets_in_the_node_stays():
    cfg, _ = dropped("model._target_=hydra_raytrain.models.MLP", "model.hidden=7", "+model.dropout=0.5")
    assert cfg.model.hidden == 7 and cfg.model.dropout == 0.5 and "channels" not in cfg.model


def test_wiring_the_new_target_does_not_take_goes_too():
    cfg, notes = dropped("task._target_=hydra_raytrain.tasks.base.Task", "model._target_=torch.nn.Flatten")
    assert sorted(cfg.task) == ["_target_"] and sorted(cfg.model) == ["_target_"]  # Flatten takes neither
    assert any("label_smoothing=0.0" in note for note in notes)


def test_a_kwargs_target_gets_only_the_wiring_it_names_and_the_note_says_what_to_set_instead():
    # shufflenet_v2_x0_5(*, weights, progress, **kwargs) passes **kwargs to ShuffleNetV2, which refuses input_shape
    cfg, notes = dropped("model._target_=torchvision.models.shufflenet_v2_x0_5", "+model.num_classes=10")
    assert sorted(cfg.model) == ["_target_", "num_classes"]
    (_, note) = notes
    assert note.startswith(
        "Note: model._target_=torchvision.models.shufflenet_v2_x0_5 takes **kwargs without naming input_shape, "
        "num_outputs: whether it consumes them cannot be told"
    )
    assert "e.g. +model.num_classes=${dataset.num_outputs}" in note
    # hydra_raytrain's zoo builders name the wiring and pass the rest on: it stays
    cfg, notes = dropped("model._target_=hydra_raytrain.models.torchvision_model", "+model.name=mobilenet_v3_small")
    assert sorted(cfg.model) == ["_target_", "input_shape", "name", "num_outputs"]


def test_hydras_own_keys_stay_and_a_group_choice_changes_nothing():
    cfg, notes = dropped("optimizer._target_=torch.optim.SGD")
    assert cfg.optimizer._partial_ is True and sorted(cfg.optimizer) == ["_partial_", "_target_"]
    assert "lr=0.002, weight_decay=0.0 were dropped" in notes[0]
    cfg, notes = dropped("model=mlp", "optimizer=sgd")
    assert notes == [] and "hidden_sizes" in cfg.model


def test_a_target_that_does_not_import_loses_its_literal_arguments_and_keeps_its_wiring(caplog):
    cfg, _ = dropped("model._target_=no_such_module.Net")
    assert sorted(cfg.model) == ["_target_", "input_shape", "num_outputs"]
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # validation reports it, once, as a ConfigError


def test_a_finished_run_from_before_summaries_named_their_loggers_is_not_logged_again(tmp_path):
    from hydra_raytrain.driver.run import _log_finished_run

    summary = {"status": "completed", "epochs_completed": 1}
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1, "val_loss": 0.5}\n')
    resolved = {"logger": {"tensorboard": {"_target_": "hydra_raytrain.loggers.tensorboard.TensorBoardLogger"}}}
    assert _log_finished_run(resolved, str(tmp_path), "run", summary) == summary
    assert not (tmp_path / "tensorboard").exists()


BORING = "lightning.pytorch.demos.boring_classes.BoringModel"  # Lightning's demo: its own loaders, no arguments


def test_a_lightning_module_with_its_own_loaders_is_fed_by_them_unless_the_command_line_picks_a_dataset():
    cfg, notes = dropped("task=lightning", f"model._target_={BORING}")
    assert dict(cfg.dataset) == {"_target_": "hydra_raytrain.data.module_loaders", "name": "module"}
    assert notes[-1].startswith(f"Note: model._target_={BORING} brings its own train_dataloader: it feeds the run")
    for picked in ("dataset=digits", "dataset.val_fraction=0.3", "+dataset.extra=1"):
        cfg, notes = dropped("task=lightning", f"model._target_={BORING}", picked)
        assert cfg.dataset._target_ == "hydra_raytrain.data.digits" and "brings its own" not in " ".join(notes)
    for others in (
        ["task=lightning", "model=lit_classifier"],
        [f"model._target_={BORING}"],
    ):  # no loaders; no Lightning
        cfg, _ = dropped(*others)
        assert cfg.dataset._target_ == "hydra_raytrain.data.digits", others
    cfg, _ = dropped(
        "task=lightning", f"model._target_={BORING}", "+datamodule._target_=tests.helpers.lit.DigitsDataModule"
    )
    assert cfg.dataset._target_ == "hydra_raytrain.data.digits"
