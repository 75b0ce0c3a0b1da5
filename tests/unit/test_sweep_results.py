"""Sweeps without a Ray cluster: Hydra's grammar as trials, trial status, the summary files."""

import dataclasses
import functools
import json
import math
import os
import sys

import pytest
from omegaconf import OmegaConf

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.resolved import Resolved
from hydra_raytrain.config.sweeper import SweepSettings
from hydra_raytrain.sweep import results, search, tuner
from hydra_raytrain.sweep.job import Job
from hydra_raytrain.sweep.space import Parameter, parameter_space, start_order, trial_overrides
from tests.conftest import compose_config


@functools.cache
def default_config() -> Resolved:
    return Resolved.from_dict(OmegaConf.to_container(compose_config(), resolve=True))


def config(**sections) -> Resolved:
    """The default config with some component sections replaced (a job's config, without validating it)."""
    return dataclasses.replace(default_config(), **sections)


def test_comma_lists_choice_and_range_make_a_grid():
    trials = trial_overrides(
        ["optimizer.lr=1e-3,1e-2", "model=choice(mlp,simple_cnn)", "trainer.seed=range(0,2)", "trainer.max_epochs=3"]
    )
    assert len(trials) == 8
    assert trials[0] == ["optimizer.lr=0.001", "model=mlp", "trainer.seed=0", "trainer.max_epochs=3"]
    assert len({tuple(t) for t in trials}) == 8


def test_intervals_are_sampled_num_samples_times_per_grid_point_and_reproducibly():
    arguments = [
        "model=mlp,simple_cnn",
        "optimizer.lr=tag(log,interval(1e-4,1e-1))",
        "optimizer.weight_decay=interval(0,0.1)",
    ]
    trials = trial_overrides(arguments, num_samples=3, seed=7)
    assert len(trials) == 6 and trials == trial_overrides(arguments, num_samples=3, seed=7)
    lrs = [float(t[1].split("=")[1]) for t in trials]
    assert all(1e-4 <= lr <= 1e-1 for lr in lrs) and len(set(lrs)) == 3  # one draw per sample, shared by the grid
    decays = [float(t[2].split("=")[1]) for t in trials]
    assert all(0 <= d <= 0.1 for d in decays)
    logs = sorted(math.log10(lr) for lr in set(lrs))
    assert trial_overrides(arguments, num_samples=3, seed=8) != trials and logs[0] < logs[-1]


@pytest.mark.parametrize(
    "summary, history, error, status",
    [
        ({"status": "completed"}, [{}] * 4, None, "completed"),
        (None, [{}] * 2, None, "stopped"),
        (None, [{}] * 4, None, "stopped"),  # stopped at a rung on its last epoch
        (None, [{}] * 2, "boom", "failed"),
        (None, [], None, "not run"),
    ],
)
def test_trial_status(summary, history, error, status):
    assert results.trial_status(summary, history, error) == status


def test_a_trial_the_sweeps_end_left_running_or_paused_is_interrupted_not_stopped():
    """Ctrl-C ends a sweep while HyperBand has trials paused (or any scheduler has trials running): those have a
    history and no summary as a trial the scheduler stopped has, but Tune did not end them: a re-run continues."""
    assert results.trial_status(None, [{}] * 2, None, ended=False) == "interrupted"
    assert results.trial_status(None, [], None, ended=False) == "not run"
    assert results.trial_status({"status": "completed"}, [{}] * 2, None, ended=False) == "completed"
    from hydra_raytrain.sweep.tuner import _finished

    done, todo = _finished(["a", "b", "c"], {"a": "stopped", "b": "interrupted", "c": "completed"}.get)
    assert (done, todo) == (["a", "c"], ["b"])


def test_summary_csv_best_config_and_plot(tmp_path):
    jobs, errors = [], {}
    for index, lr in enumerate((0.1, 0.01, 0.5)):
        run_dir = tmp_path / f"run{index}"
        run_dir.mkdir()
        history = [{"epoch": e, "val_accuracy": lr * e} for e in (1, 2)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in history))
        if index < 2:
            (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "wall_seconds": 3.0}))
        cfg = config(optimizer={"_target_": "torch.optim.Adam", "_partial_": True, "lr": lr})
        jobs.append(Job(index, [f"optimizer.lr={lr}"], {}, cfg, f"run{index}", str(run_dir)))
    errors[1] = RuntimeError(
        'Traceback ...\n  raise TrainingFailed(f"Training failed: {_first_cause(error)}")\n'
        "hydra_raytrain.driver.run.TrainingFailed: Training failed: worker 0: ValueError: bad\nRun dir: /x"
    )
    summary = results.collect(jobs, errors, {}, "val_accuracy", "max", str(tmp_path), "asha")
    assert [row["status"] for row in summary["trials"]] == ["completed", "failed", "stopped"]
    assert summary["trials"][1]["error"] == "worker 0: ValueError: bad"  # our cause line, not the traceback
    assert summary["best"]["index"] == 2 and summary["best"]["best"] == 1.0
    results.write_all(summary, jobs, str(tmp_path), keep_checkpoints=None)
    assert json.loads((tmp_path / "sweep_summary.json").read_text())["best"]["index"] == 2
    rows = (tmp_path / "sweep_summary.csv").read_text().splitlines()
    assert rows[0].startswith("index,overrides,status,final,best,epochs") and len(rows) == 4
    best_config = (tmp_path / "best_config.yaml").read_text()
    assert "lr: 0.5" in best_config and "train_schema" in best_config and "--config-name best_config" in best_config
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert set(results.read_previous(str(tmp_path))) == {"run0", "run1", "run2"}


def test_the_table_keeps_every_override_on_an_80_column_console():
    from rich.console import Console

    overrides = [
        "model=simple_cnn optimizer.lr=0.0003 trainer.batch_size=128",
        "model=mlp optimizer.lr=0.01 trainer.batch_size=32",
    ]
    rows = [
        {
            "index": i,
            "overrides": o,
            "status": "completed",
            "epochs": 12,
            "final": 0.97,
            "best": 0.98,
            "wall_seconds": 123.4,
        }
        for i, o in enumerate(overrides)
    ]
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(
        results.table(
            {
                "metric": "val_accuracy",
                "mode": "max",
                "scheduler": "fifo",
                "sweep_dir": "/s",
                "best": rows[0],
                "trials": rows,
            }
        )
    )
    text = "".join(line.strip("│┃ ") for line in console.export_text().splitlines())  # folded cells joined again
    for override in overrides:
        assert all(part in text for part in override.split()), (override, console.export_text())
    assert "…" not in console.export_text() and "val_accuracy (max)" in text


def test_asha_start_order_is_a_seeded_shuffle_and_fifo_keeps_the_given_order():
    assert start_order(range(8), shuffle=False, seed=3) == list(range(8))
    shuffled = start_order(range(8), shuffle=True, seed=0)
    assert sorted(shuffled) == list(range(8)) and shuffled != list(range(8))
    assert start_order(range(8), shuffle=True, seed=0) == shuffled  # a re-run starts them in the same order
    assert start_order(range(8), shuffle=True, seed=1) != shuffled


def test_a_search_algorithm_sees_one_parameter_per_swept_key():
    fixed, space = parameter_space(
        [
            "model=mlp,simple_cnn",
            "optimizer.lr=tag(log,interval(1e-4,1e-1))",
            "trainer.seed=range(0,3)",
            "optimizer.weight_decay=interval(0,0.1)",
            "trainer.max_epochs=3",
        ]
    )
    assert fixed == ["trainer.max_epochs=3"]
    assert space["model"] == Parameter(choices=("mlp", "simple_cnn")) and space["trainer.seed"].choices == (
        "0",
        "1",
        "2",
    )
    assert space["optimizer.lr"] == Parameter(low=1e-4, high=1e-1, log=True)
    assert space["optimizer.weight_decay"] == Parameter(low=0.0, high=0.1, log=False)
    assert space["optimizer.lr"].override("optimizer.lr", 0.003) == "optimizer.lr=0.003"
    assert space["model"].override("model", "mlp") == "model=mlp"


def fake_compose(tmp_path):
    """A job as tuner.compose_job makes it, without Hydra: the run name follows the overrides."""

    def compose(overrides, index, params=None):
        name = "run-" + "-".join(o.replace("=", "_") for o in overrides)
        return Job(index, list(overrides), params or {}, config(), name, str(tmp_path / name))

    return compose


def test_probe_jobs_cross_the_scaling_choices_and_pin_the_rest(tmp_path):
    _, space = parameter_space(
        ["scaling.num_workers=1,2", "model=mlp,simple_cnn", "optimizer.lr=tag(log,interval(1e-4,1e-2))"]
    )
    probes = tuner.probe_jobs(fake_compose(tmp_path), ["trainer.max_epochs=2"], space)
    assert [p.overrides for p in probes] == [
        ["trainer.max_epochs=2", "model=mlp", "optimizer.lr=0.001", "scaling.num_workers=1"],
        ["trainer.max_epochs=2", "model=mlp", "optimizer.lr=0.001", "scaling.num_workers=2"],
    ]  # the log range's middle is its geometric mean


def test_optuna_suggestions_become_jobs_and_earlier_trials_are_replayed_first(tmp_path):
    from ray.tune.search.optuna import OptunaSearch

    fixed, space = parameter_space(
        ["optimizer.lr=tag(log,interval(1e-4,1e-1))", "model=mlp,simple_cnn", "trainer.max_epochs=2"]
    )
    optuna = OptunaSearch(space=search.optuna_distributions(space), metric="val_accuracy", mode="max", seed=0)
    compose = fake_compose(tmp_path)
    interrupted = compose(
        ["trainer.max_epochs=2", "optimizer.lr=0.01", "model=mlp"], 4, {"optimizer.lr": 0.01, "model": "mlp"}
    )
    wrapper = search.HydraSearch(
        optuna, space, fixed, compose, known=[interrupted], replay=[interrupted], budget=3, hidden={}
    )
    assert wrapper.suggest("t0") == {"index": 4, "name": interrupted.name}  # the interrupted trial first, as it was
    second = wrapper.suggest("t1")
    job = search.read_job(str(tmp_path / second["name"]))  # what the trial reads
    assert second["index"] == 5 and job.overrides[0] == "trainer.max_epochs=2"
    lr = job.params["optimizer.lr"]
    assert (
        1e-4 <= lr <= 1e-1 and f"optimizer.lr={lr!r}" in job.overrides and job.params["model"] in ("mlp", "simple_cnn")
    )
    wrapper.on_trial_complete("t0", {"val_accuracy": 0.9, "training_iteration": 2})  # a replayed trial: told as a point
    wrapper.on_trial_complete("t1", {"val_accuracy": 0.5, "training_iteration": 2})
    values = sorted(t.value for t in optuna._ot_study.trials if t.value is not None)
    assert values == [0.5, 0.9]
    assert wrapper.suggest("t2")["index"] == 6 and wrapper.suggest("t3") == search.Searcher.FINISHED  # budget: 3
    assert [j.index for j in search.earlier_jobs(str(tmp_path))] == [4, 5, 6]  # a re-run finds them on disk


def test_a_suggestion_that_repeats_a_finished_trial_is_told_its_result_and_asked_again(tmp_path):
    from ray.tune.search.optuna import OptunaSearch

    fixed, space = parameter_space(["model=mlp,simple_cnn"])
    # points_to_evaluate: Optuna's first suggestion is mlp, the trial the sweep already finished
    optuna = OptunaSearch(
        space=search.optuna_distributions(space),
        metric="val_accuracy",
        mode="max",
        seed=0,
        points_to_evaluate=[{"model": "mlp"}],
    )
    compose = fake_compose(tmp_path)
    finished = compose(["model=mlp"], 0, {"model": "mlp"})
    (tmp_path / finished.name).mkdir()
    (tmp_path / finished.name / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "val_accuracy": 0.7}) + "\n")
    wrapper = search.HydraSearch(optuna, space, fixed, compose, known=[finished], replay=[], budget=1, hidden={})
    suggestion = wrapper.suggest("t0")
    assert suggestion == {"index": 1, "name": "run-model_simple_cnn"}  # never the finished mlp trial again
    told = [t for t in optuna._ot_study.trials if t.value is not None]
    assert told and all(t.params == {"model": "mlp"} and t.value == 0.7 for t in told)
    wrapper.on_trial_complete("t0", {"val_accuracy": 0.8})  # reaches Optuna under the id it asked with
    assert sorted(t.value for t in optuna._ot_study.trials if t.value is not None)[-1] == 0.8


def test_optuna_is_named_when_it_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed: `import optuna` raises ImportError
    with pytest.raises(ConfigError) as error:
        SweepSettings(search_alg="optuna").check()
    assert "hydra.sweeper.search_alg" in str(error.value) and "hydra_raytrain[optuna]" in str(error.value)
    with pytest.raises(ConfigError, match="unknown search algorithm"):
        SweepSettings(search_alg="hyperopt").check()
    with pytest.raises(ConfigError, match="hydra.sweeper.reduction_factor=1.0: asha keeps 1/reduction_factor"):
        SweepSettings(scheduler="asha", reduction_factor=1.0).check()
    SweepSettings(scheduler="fifo", reduction_factor=1.0).check()  # not used without ASHA
    probes = [
        Job(-1, [], {}, config(trainer=dataclasses.replace(default_config().trainer, max_epochs=e)), "x", "x")
        for e in (2, 4)
    ]
    with pytest.raises(ConfigError, match="hydra.sweeper.grace_period=5: .* the trials train 4"):
        tuner._check_asha(5, probes)
    tuner._check_asha(4, probes)  # the longest trials can be stopped
    folds = config(dataset={**default_config().dataset, "folds": 3})
    with pytest.raises(ConfigError, match="hydra.sweeper.scheduler='?asha'?: would stop a configuration's folds"):
        tuner._check_asha(1, [Job(-1, [], {}, folds, "x", "x")])


def test_the_plugin_node_is_sweep_settings_and_loads_light():
    """hydra/sweeper=ray_tune's node holds SweepSettings' own fields and defaults (one place to change them), and
    Hydra imports the plugin on every start-up of any app: it must not pull in Ray or torch."""
    import dataclasses
    import subprocess

    code = (
        "import sys, dataclasses; from hydra_plugins.hydra_raytrain_sweeper import ray_tune_sweeper as p; "
        "heavy = [m for m in ('ray', 'torch', 'optuna') if m in sys.modules]; assert not heavy, heavy; "
        "print(sorted((f.name, repr(f.default)) for f in dataclasses.fields(p.RayTuneSweeperConf)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = sorted(
        [(f.name, repr(f.default)) for f in dataclasses.fields(SweepSettings)]
        + [
            ("_target_", repr("hydra_plugins.hydra_raytrain_sweeper.ray_tune_sweeper.RayTuneSweeper")),
            ("params", "None"),
        ]
    )
    assert done.stdout.strip() == str(expected)


def test_a_64_trial_table_shows_the_20_best_and_counts_the_rest():
    from rich.console import Console

    rows = [
        {
            "index": i,
            "overrides": f"optimizer.lr={i}",
            "status": "failed" if i == 7 else "completed",
            "epochs": 1,
            "final": i / 100,
            "best": None if i == 7 else i / 100,
            "wall_seconds": 20.0,
        }
        for i in range(64)
    ]
    summary = {"metric": "val_loss", "mode": "min", "scheduler": "fifo", "sweep_dir": "/s", "best": rows[0]}
    shown = results.shown_rows({**summary, "trials": rows})
    assert [row["index"] for row in shown] == [i for i in range(21) if i != 7]  # the 20 lowest losses, in order
    console = Console(width=100, record=True, file=open(os.devnull, "w"))
    console.print(results.table({**summary, "trials": rows}))
    text = console.export_text()
    assert "The 20 best of 64 (63 completed, 1 failed); all in sweep_summary.csv" in " ".join(text.split())
    assert text.count("optimizer.lr=") == 20
    assert len(results.shown_rows({**summary, "trials": rows[:20]})) == 20  # a sweep of up to 20: every trial


def test_a_rerun_cross_validated_sweep_ranks_the_stopped_trials_it_keeps(tmp_path):
    """A trial ASHA stopped in an earlier run is not run again: its row comes from the earlier summary (one written
    before rows had a configuration, here) and still counts in its configuration's fold mean."""
    jobs = []
    for index, (lr, fold) in enumerate([(0.1, 0), (0.1, 1), (0.01, 0), (0.01, 1)]):
        run_dir = tmp_path / f"run{index}"
        run_dir.mkdir()
        history = [{"epoch": 1, "val_accuracy": lr + fold / 100}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in history))
        (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "wall_seconds": 3.0}))
        dataset = {**default_config().dataset, "folds": 2, "fold": fold}
        cfg = config(dataset=dataset, optimizer={"_target_": "torch.optim.Adam", "_partial_": True, "lr": lr})
        overrides = [f"optimizer.lr={lr}", "dataset.folds=2", f"dataset.fold={fold}"]
        jobs.append(Job(index, overrides, {}, cfg, f"run{index}", str(run_dir)))
    stopped = {"index": 9, "overrides": "optimizer.lr=0.01 dataset.fold=1", "status": "stopped", "best": 0.005}
    summary = results.collect(jobs, {}, {"run3": stopped}, "val_accuracy", "max", str(tmp_path), "asha")
    ranked = {c["configuration"]: (c["folds"], c["mean"]) for c in summary["configurations"]}
    assert ranked == {"optimizer.lr=0.1": (2, pytest.approx(0.105)), "optimizer.lr=0.01": (2, pytest.approx(0.0075))}
    assert summary["best_configuration"]["configuration"] == "optimizer.lr=0.1"
    assert summary["trials"][3]["status"] == "stopped" and summary["trials"][3]["index"] == 3


def test_keep_checkpoints_removes_the_other_trials_ray_storage_and_names_storage_elsewhere_it_keeps(
    tmp_path, s3_endpoint, capsys
):
    import pyarrow.fs

    s3 = pyarrow.fs.S3FileSystem(endpoint_override=s3_endpoint, allow_bucket_creation=True)
    s3.create_dir("sweep-bucket")
    places = {  # a trial's Ray storage: the run dir's (the default), a path elsewhere, a prefix on S3
        "run0": str(tmp_path / "run0" / "ray_storage" / "run0"),
        "run1": str(tmp_path / "shared" / "run1"),
        "run2": "s3://sweep-bucket/sweeps/run2",
        "run3": "s3://sweep-bucket/sweeps/run3",
    }
    rows = []
    for index, (name, place) in enumerate(places.items()):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"status": "completed", "storage": place}))
        if place.startswith("s3://"):
            with s3.open_output_stream(place[5:] + "/checkpoint_000/model.pt") as out:
                out.write(b"weights")
        else:
            os.makedirs(os.path.join(place, "checkpoint_000"))
        rows.append({"run_dir": str(tmp_path / name), "best": [0.5, 0.7, 0.9, 0.6][index]})
    results.drop_checkpoints({"trials": rows, "mode": "max"}, keep=1)  # run2 is the best
    assert not (tmp_path / "run0" / "ray_storage").exists()  # the run dir's own storage goes
    # A storage.path folder is the config's, which other runs of the same config share: kept, and named.
    assert (tmp_path / "shared" / "run1" / "checkpoint_000").is_dir()
    assert s3.get_file_info("sweep-bucket/sweeps/run3/checkpoint_000/model.pt").type == pyarrow.fs.FileType.File
    said = capsys.readouterr().err
    assert "keep_checkpoints=1: 2 trials stored elsewhere keep their checkpoints" in said
    assert str(tmp_path / "shared" / "run1") in said and "s3://sweep-bucket/sweeps/run3" in said
    assert "run0" not in said.split(": ", 2)[-1] and "sweeps/run2" not in said


def test_a_trials_job_file_holds_no_secret_and_the_trial_gets_it_back_in_memory(tmp_path):
    """job.json (what a search algorithm's trial reads) is written with the sweep's secrets ``***``; the trial puts
    back the values the driver hands it in memory. A swept value that is a secret is refused by name."""
    base = config()
    secret = dataclasses.replace(base, scaling=dataclasses.replace(base.scaling, worker_env={"API_KEY": "s3cr3t"}))
    job = Job(0, ["scaling.worker_env.API_KEY=s3cr3t", "optimizer.lr=0.1"], {"optimizer.lr": 0.1}, secret, "r0", "")
    job = dataclasses.replace(job, run_dir=str(tmp_path / "r0"))
    hidden = job.hidden()
    assert hidden == {("scaling", "worker_env", "API_KEY"): "s3cr3t"}
    search.write_job(job, hidden)
    written = (tmp_path / "r0" / search.JOB_FILE).read_text()
    assert "s3cr3t" not in written and "API_KEY=***" in written
    assert search.read_job(str(tmp_path / "r0"), hidden).cfg.scaling.worker_env == {"API_KEY": "s3cr3t"}
    assert search.read_job(str(tmp_path / "r0")).cfg.scaling.worker_env == {"API_KEY": "***"}
    with pytest.raises(ConfigError) as refused:  # this trial's secret differs from the sweep's: a swept secret
        search.write_job(dataclasses.replace(job, run_dir=str(tmp_path / "r1")), {})
    assert refused.value.key == "hydra.sweeper.params" and "scaling.worker_env.API_KEY" in str(refused.value)
    assert not (tmp_path / "r1").exists()


def test_the_search_wrapper_pickles_without_the_sweeps_secrets(tmp_path):
    """Tune pickles its searcher into the sweep's tuner.pkl: what holds the secrets (the fixed overrides, the jobs'
    configs) stays in this process; a copy here still reads it."""
    import copy
    import pickle

    from ray.tune.search.optuna import OptunaSearch

    fixed, space = parameter_space(["optimizer.lr=tag(log,interval(1e-4,1e-1))", "+scaling.worker_env.API_KEY=k3y"])
    optuna = OptunaSearch(space=search.optuna_distributions(space), metric="val_accuracy", mode="max", seed=0)
    wrapper = search.HydraSearch(optuna, space, fixed, fake_compose(tmp_path), known=[], replay=[], budget=2, hidden={})
    assert b"k3y" not in pickle.dumps(wrapper)
    assert copy.deepcopy(wrapper).held.value.fixed == ["+scaling.worker_env.API_KEY=k3y"]
    assert wrapper.suggest("t0")["index"] == 0 and b"k3y" not in pickle.dumps(wrapper)  # with a job in it too


def test_a_local_mode_trial_reserves_the_cpu_it_trains_on_and_a_worker_trials_next_to_nothing():
    """In Ray Train's local mode (scaling.num_workers=0) the trial's own process trains; otherwise its workers hold
    the CPUs and the trial only waits on them. Both on the driver's node."""
    local = tuner._trainable([], "sweep", None, local=True)._resources.required_resources
    waiting = tuner._trainable([], "sweep", None)._resources.required_resources
    assert local["CPU"] == 1 and waiting.get("CPU", 0) == 0, (local, waiting)
    assert any(key.startswith("node:") for key in local) and any(key.startswith("node:") for key in waiting)
