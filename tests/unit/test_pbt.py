"""Population Based Training without a Ray cluster: the settings in the live optimizer after an exploit, the
mutations from the sweep grammar, the checks, a trial's lineage and its config at a generation."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.config.schema import RunSettings
from hydra_raytrain.config.sweeper import SweepSettings
from hydra_raytrain.recipe.warm_start import carry_over, hyperparameters
from hydra_raytrain.sweep import pbt, results
from hydra_raytrain.sweep.job import Job
from hydra_raytrain.sweep.lineage import LINEAGE_FILE, append_lineage, describe, read_lineage, typed
from hydra_raytrain.sweep.space import parameter_space
from tests.conftest import compose_config
from tests.unit.test_sweep_results import config, default_config


def trained(lr, schedule=None, steps=3, **schedule_args):
    """A model, its optimizer (and schedule) after a few steps at ``lr``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=0.0)
    if schedule is torch.optim.lr_scheduler.OneCycleLR:  # its peak is the configured lr (conf/scheduler/onecycle)
        schedule_args = {**schedule_args, "max_lr": lr}
    scheduler = schedule(optimizer, **schedule_args) if schedule else None
    for _ in range(steps):
        model(torch.ones(4, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler:
            scheduler.step()
    return model, optimizer, scheduler


def continued(donor_lr, new_lr, schedule=None, **schedule_args):
    """A run configured with ``new_lr`` that loads the donor's full state, then carries its settings over."""
    _, donor_optimizer, donor_scheduler = trained(donor_lr, schedule, **schedule_args)
    model, optimizer, scheduler = trained(new_lr, schedule, steps=0, **schedule_args)
    configured = hyperparameters(optimizer)
    optimizer.param_groups[0]["weight_decay"] = 0.5  # configured differently: the configured value must win
    configured[0]["weight_decay"] = 0.5
    optimizer.load_state_dict(donor_optimizer.state_dict())
    if scheduler:
        scheduler.load_state_dict(donor_scheduler.state_dict())
    carry_over(optimizer, [scheduler] if scheduler else [], configured)
    return optimizer, scheduler, donor_optimizer, donor_scheduler


def test_a_constant_lr_takes_the_configured_value_and_keeps_the_donors_state():
    optimizer, _, donor, _ = continued(0.1, 0.01)
    group = optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(0.01) and group["weight_decay"] == 0.5 and group["momentum"] == 0.9
    first = next(iter(donor.state.values()))["momentum_buffer"]
    assert torch.equal(next(iter(optimizer.state.values()))["momentum_buffer"], first)  # the donor's moments


def test_a_cosine_schedule_goes_on_where_it_was_at_the_new_level():
    optimizer, scheduler, donor, donor_scheduler = continued(
        0.1, 0.05, torch.optim.lr_scheduler.CosineAnnealingLR, T_max=10
    )
    assert scheduler.last_epoch == donor_scheduler.last_epoch == 3
    assert optimizer.param_groups[0]["lr"] == pytest.approx(donor.param_groups[0]["lr"] / 2)
    assert scheduler.base_lrs == [pytest.approx(0.05)] and optimizer.param_groups[0]["initial_lr"] == 0.05
    _, fresh, fresh_scheduler = trained(0.05, torch.optim.lr_scheduler.CosineAnnealingLR, steps=5, T_max=10)
    for _ in range(2):  # two more steps: the schedule a run at 0.05 from the start would be at
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(fresh.param_groups[0]["lr"])


def test_one_cycle_scales_its_peak_and_floor_with_the_lr():
    optimizer, _, donor, _ = continued(0.2, 0.1, torch.optim.lr_scheduler.OneCycleLR, total_steps=10)
    group, donor_group = optimizer.param_groups[0], donor.param_groups[0]
    for key in ("lr", "initial_lr", "max_lr", "min_lr"):
        assert group[key] == pytest.approx(donor_group[key] / 2), key


def test_the_sweep_grammar_gives_pbt_its_mutations():
    _, space = parameter_space(["optimizer.lr=3e-3,1e-6,1e-3", "optimizer.weight_decay=interval(0.0,0.1)"])
    mutations = pbt.mutations(space)
    assert mutations["optimizer.lr"] == ["1e-06", "0.001", "0.003"]  # neighbours in numeric order
    assert (mutations["optimizer.weight_decay"].lower, mutations["optimizer.weight_decay"].upper) == (0.0, 0.1)
    assert pbt.ordered(("adam", "sgd", "adamw")) == ["adam", "sgd", "adamw"]
    _, log_space = parameter_space(["optimizer.lr=tag(log,interval(1e-4,1e-1))"])
    assert type(pbt.mutations(log_space)["optimizer.lr"].sampler).__name__ == "_LogUniform"
    assert pbt.within_bounds({"w": (0.0, 0.1)}, {"w": 0.12, "x": 5}) == {"w": 0.1, "x": 5}


def test_an_exploit_copies_the_donors_values_not_its_index():
    _, space = parameter_space(["optimizer.lr=1e-3,1e-2"])
    scheduler = pbt.scheduler(SweepSettings(scheduler="pbt"), space, max_epochs=4)
    donor = SimpleNamespace(config={"index": 0, "optimizer.lr": "0.01"})
    new, _ = scheduler._get_new_config(SimpleNamespace(config={"index": 1, "optimizer.lr": "0.001"}), donor)
    assert new["index"] == 1 and new["optimizer.lr"] in ("0.001", "0.01")


def test_pb2_explores_the_intervals_and_refuses_lists(tmp_path):
    _, space = parameter_space(["optimizer.lr=interval(1e-4,1e-1)"])
    scheduler = pbt.scheduler(SweepSettings(scheduler="pb2"), space, max_epochs=4)
    assert isinstance(scheduler, pbt.SweepPB2) and scheduler._hyperparam_bounds == {"optimizer.lr": [1e-4, 1e-1]}
    with pytest.raises(ConfigError) as error:
        pbt.check(parameter_space(["optimizer.lr=1e-3,1e-2"])[1], [job(tmp_path, -1)], SweepSettings(scheduler="pb2"))
    assert error.value.value == "pb2" and "optimizer.lr=interval(low,high)" in str(error.value)


def test_only_epochs_with_a_checkpoint_and_before_the_last_perturb():
    _, space = parameter_space(["optimizer.lr=1e-3,1e-2"])
    scheduler = pbt.scheduler(SweepSettings(scheduler="pbt"), space, max_epochs=6, every=2)
    trial = SimpleNamespace(config={"index": 0, "optimizer.lr": "0.001"})
    for epoch in (3, 6):  # no checkpoint at 3; 6 is the last: neither reaches Tune's PBT (no controller needed)
        assert scheduler.on_trial_result(None, trial, {"epoch": epoch, "val_accuracy": 0.5}) == "CONTINUE"


def job(tmp_path, index=0, overrides=("optimizer.lr=0.001",), cfg=None):
    run_dir = tmp_path / f"run{index}"
    run_dir.mkdir(exist_ok=True)
    return Job(index, list(overrides), {}, cfg or default_config(), f"run{index}", str(run_dir))


def record(generation=1, before="0.001", after="0.01", donor=2):
    return {
        "generation": generation,
        "donor": donor,
        "checkpoint": f"/storage/donor/epoch_000{generation * 2}",
        "epoch": generation * 2,
        "step": generation * 20,
        "before": {"optimizer.lr": before},
        "after": {"optimizer.lr": after},
        "time": 0.0,
    }


def compose(overrides, index):
    """Hydra's composition of a trial, as the sweep's driver does it."""
    cfg = Resolved.from_dict(OmegaConf.to_container(compose_config(*overrides), resolve=True))
    return Job(index, list(overrides), {}, cfg, cfg.run_name(), "unused")


def test_a_trial_continues_its_latest_generation_composed_with_its_values(tmp_path):
    trial = job(tmp_path, overrides=["scheduler=onecycle", "optimizer.lr=0.001"])
    _, space = parameter_space(["optimizer.lr=0.001,0.01"])
    assert pbt.current_values([trial], space) == {0: {"optimizer.lr": "0.001"}}
    assert pbt._generation_config(trial, [], compose)[1] == "run0"
    append_lineage(trial.run_dir, record())
    append_lineage(trial.run_dir, record(2, "0.01", "0.1", donor=3))
    lineage = read_lineage(trial.run_dir)
    assert [r["generation"] for r in lineage] == [1, 2]
    assert pbt.current_values([trial], space) == {0: {"optimizer.lr": "0.1"}}
    cfg, name = pbt._generation_config(trial, lineage, compose)
    assert name == "run0-g2" and cfg.storage.name == "run0-g2" and cfg.optimizer.lr == 0.1
    assert cfg.scheduler.lr_scheduler.max_lr == 0.1  # ${optimizer.lr}: composed again, not patched
    assert cfg.run.init_from == "/storage/donor/epoch_0004" and cfg.run.init_full_state is True
    assert describe(lineage[1]) == "g2 epoch 4: #3 step 40, optimizer.lr 0.01 -> 0.1"
    explored = {**lineage[1], "donor_values": {"optimizer.lr": "0.1"}, "after": {"optimizer.lr": "0.01"}}
    assert describe(explored) == "g2 epoch 4: #3 step 40, optimizer.lr 0.01 (#3: 0.1) -> 0.01"  # shifted back
    assert typed("optimizer.betas", "[0.9,0.99]") == [0.9, 0.99] and typed("optimizer.lr", 0.5) == 0.5


def test_the_summary_gives_each_trials_exploits_and_best_config_its_final_values(tmp_path):
    trials = [job(tmp_path, 0, ["optimizer.lr=0.001"]), job(tmp_path, 1, ["optimizer.lr=0.01"])]
    for trial, accuracy in zip(trials, (0.9, 0.5), strict=True):
        with open(f"{trial.run_dir}/metrics.jsonl", "w") as file:
            file.write(json.dumps({"epoch": 1, "val_accuracy": accuracy}) + "\n")
    append_lineage(trials[0].run_dir, record(1, "0.001", "0.01", donor=1))
    summary = results.collect(trials, {}, {}, "val_accuracy", "max", str(tmp_path), scheduler="pbt")
    best = summary["best"]
    assert best["index"] == 0 and best["exploits"] == [describe(record(1, "0.001", "0.01", donor=1))]
    assert best["values"] == {"optimizer.lr": "0.01"} and "exploits" not in summary["trials"][1]
    results.write_all(summary, trials, str(tmp_path), None)
    text = (tmp_path / results.BEST_CONFIG_FILE).read_text()
    assert "# The best trial of this PBT sweep" in text and "#   g1 epoch 2: #1 step 20" in text
    import yaml

    assert yaml.safe_load(text)["optimizer"]["lr"] == 0.01  # its final value, not the one it started with
    assert "g1 epoch 2" in (tmp_path / results.CSV_FILE).read_text()
    assert (tmp_path / "run0" / LINEAGE_FILE).exists()


@pytest.mark.parametrize(
    "settings, key",
    [
        (dict(search_alg="optuna"), "hydra.sweeper.search_alg"),
        (dict(quantile_fraction=0.6), "hydra.sweeper.quantile_fraction"),
        (dict(resample_probability=1.5), "hydra.sweeper.resample_probability"),
        (dict(perturbation_interval=0), "hydra.sweeper.perturbation_interval"),
    ],
)
def test_pbt_settings_are_checked(settings, key):
    with pytest.raises(ConfigError) as error:
        SweepSettings(scheduler="pbt", **settings).check()
    assert error.value.key == key


def test_a_population_the_cluster_cannot_hold_alive_together_is_refused_or_warned():
    """4 trials of 2 CPUs: 8 CPUs hold them together; 4 CPUs only 2 at a time (PBT would exploit between 2 of
    them, then between the other 2), 2 CPUs one at a time (no exploit ever)."""
    pbt_settings = SweepSettings(scheduler="pbt")
    assert pbt.check_population(4, 8, 2, pbt_settings) is None
    assert pbt.trials_at_once(8, 2) == 4 and pbt.trials_at_once(2, 2) == 1 and pbt.trials_at_once(1, 2) == 1
    with pytest.raises(ConfigError) as refused:
        pbt.check_population(4, 2, 2, pbt_settings)
    assert (refused.value.key, refused.value.value) == ("hydra.sweeper.scheduler", "pbt")
    assert "its 4 trials exploit one another only while alive together" in str(refused.value)
    assert "the cluster's 2 CPUs hold 1 trial of 2 CPUs at a time" in str(refused.value)
    assert "at most 1 trial (hydra.sweeper.num_samples" in refused.value.valid
    assert "scaling.num_workers" in refused.value.valid and "allow_partial_population=true" in refused.value.valid
    capped = SweepSettings(scheduler="pb2", max_concurrent_trials=2)
    with pytest.raises(ConfigError) as refused:
        pbt.check_population(4, 8, 2, capped)
    assert "hydra.sweeper.max_concurrent_trials=2 runs 2 at a time" in str(refused.value), str(refused.value)
    assert refused.value.value == "pb2" and "at most 2 trials" in refused.value.valid
    anyway = SweepSettings(scheduler="pbt", allow_partial_population=True)
    warning = pbt.check_population(4, 4, 2, anyway)
    assert warning and warning.startswith("Warning: hydra.sweeper.scheduler=pbt (allow_partial_population=true)")
    assert "the cluster's 4 CPUs hold 2 trials of 2 CPUs at a time" in warning


def test_what_pbt_cannot_do_is_refused_by_name(tmp_path):
    settings = SweepSettings(scheduler="pbt", perturbation_interval=2)
    lr_space = parameter_space(["optimizer.lr=0.001,0.01"])[1]
    probes = [job(tmp_path, -1)]
    pbt.check(lr_space, probes, settings)  # the default config: 12 epochs, a checkpoint every epoch
    cases = [
        ({}, probes, settings, "hydra.sweeper.scheduler", "nothing to perturb"),
        (parameter_space(["model=mlp,simple_cnn"])[1], probes, settings, "hydra.sweeper.scheduler", "model"),
        (
            parameter_space(["optimizer._target_=torch.optim.SGD,torch.optim.Adam"])[1],
            probes,
            settings,
            "hydra.sweeper.scheduler",
            "not its _target_",
        ),
        (
            lr_space,
            [job(tmp_path, -1, cfg=config(run=dataclasses.replace(default_config().run, resume="never")))],
            settings,
            "run.resume",
            "discard",
        ),
        (
            lr_space,
            [job(tmp_path, -1, cfg=config(checkpoint=dataclasses.replace(default_config().checkpoint, num_to_keep=2)))],
            settings,
            "checkpoint.num_to_keep",
            "delete",
        ),
        (
            lr_space,
            [
                job(
                    tmp_path,
                    -1,
                    cfg=config(checkpoint=dataclasses.replace(default_config().checkpoint, every_n_epochs=3)),
                )
            ],
            settings,
            "hydra.sweeper.perturbation_interval",
            "every 3 epochs",
        ),
        (
            lr_space,
            probes,
            SweepSettings(scheduler="pbt", perturbation_interval=12),  # the default config trains 12 epochs
            "hydra.sweeper.perturbation_interval",
            "never",
        ),
    ]
    for space, jobs, sweep_settings, key, words in cases:
        with pytest.raises(ConfigError) as error:
            pbt.check(space, jobs, sweep_settings)
        assert error.value.key == key and words in str(error.value), str(error.value)


def test_init_full_state_needs_init_from():
    with pytest.raises(ConfigError) as error:
        RunSettings(init_full_state=True)
    assert error.value.key == "run.init_full_state"
