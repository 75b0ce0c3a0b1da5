"""``python -m hydra_raytrain.check``: configs checked for CI without Ray or training, through the real CLI."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def run_check(args, cwd, **environ):
    """The check CLI in a fresh process; the timeout guards against a hang (its speed is a benchmark figure)."""
    env_args = dict(cwd=str(cwd), capture_output=True, text=True, timeout=60)
    env = {**os.environ, "PYTHONPATH": ROOT, **environ}
    return subprocess.run([sys.executable, "-m", "hydra_raytrain.check", *args], **env_args, env=env)


@pytest.mark.slow
def test_every_shipped_experiment_checks_in_one_command_and_leaves_nothing(tmp_path):
    done = run_check(["-m", "experiment=glob(*)"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "ok   experiment=diabetes_regression",
        "ok   experiment=digits_gan",
        "ok   experiment=digits_lightning",
        "ok   experiment=digits_resnet18",
    ]
    assert list(tmp_path.iterdir()) == []  # no run dir, no outputs/, no multirun/


@pytest.mark.slow
def test_a_sweep_with_a_bad_config_exits_2_naming_it_and_its_problems(tmp_path):
    done = run_check(["-m", "optimizer.lr=0.01,abc", "trainer.monitor=val_bogus,val_loss"], tmp_path)
    assert done.returncode == 2
    assert done.stdout.splitlines() == ["ok   optimizer.lr=0.01 trainer.monitor=val_loss"]
    assert "FAIL optimizer.lr=abc trainer.monitor=val_bogus\nInvalid config: 2 problems" in done.stderr
    assert "3 config(s) invalid." in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_resources_are_checked_without_starting_ray(tmp_path):
    done = run_check(["scaling.num_workers=64"], tmp_path)
    assert done.returncode == 2 and "scaling.num_workers=64" in done.stderr and "this machine has" in done.stderr
    done = run_check(["ray.address=127.0.0.1:1"], tmp_path)
    assert done.returncode == 2 and "no Ray cluster answers there" in done.stderr
    # Ray's convention: RAY_ADDRESS (set in every `ray job submit` job) names the cluster when ray.address is unset
    done = run_check([], tmp_path, RAY_ADDRESS="127.0.0.1:1")
    assert done.returncode == 2 and "RAY_ADDRESS='127.0.0.1:1': no Ray cluster answers there" in done.stderr
    done = run_check(["ray.address=local"], tmp_path, RAY_ADDRESS="127.0.0.1:1")
    assert done.returncode == 0 and done.stdout == "ok   ray.address=local\n", done.stderr[-2000:]
    probe = (
        "from tests.conftest import compose_config; from hydra_raytrain.check import check; import ray; "
        "check(compose_config('scaling.num_workers=2')); print(ray.is_initialized())"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr[-2000:]
