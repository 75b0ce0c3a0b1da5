"""trainer.ema: the moving average itself, its settings, and run names that do not change when it is off."""

import pytest
import torch
from omegaconf import OmegaConf

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.identity import run_name
from hydra_raytrain.config.schema import EmaConfig
from hydra_raytrain.recipe import ema
from tests.conftest import compose_config


def test_the_average_starts_at_the_weights_and_follows_them_at_the_decay():
    model = torch.nn.Linear(2, 1)
    averages = ema.averaged({"model": model}, 0.5)
    start = model.weight.detach().clone()
    ema.update(averages, {"model": model})  # the first update copies the weights in
    assert torch.equal(averages["model"].module.weight, start)
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(averages, {"model": model})
    assert torch.allclose(averages["model"].module.weight, start + 0.5) and ema.counts(averages) == {"model": 2}
    saved, taken = ema.states(averages), ema.counts(averages)
    again = ema.averaged({"model": torch.nn.Linear(2, 1)}, 0.5)
    ema.load(again, saved, taken)
    assert torch.equal(again["model"].module.weight, averages["model"].module.weight) and ema.counts(again) == taken


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5])
def test_a_decay_outside_0_1_is_refused(decay):
    with pytest.raises(ConfigError) as error:
        EmaConfig(decay=decay)
    assert error.value.key == "trainer.ema.decay"


def test_ema_with_fsdp_is_refused():
    with pytest.raises(Exception) as error:
        OmegaConf.to_object(compose_config("trainer.ema.decay=0.9", "trainer.parallel_strategy=fsdp").trainer)
    assert "trainer.ema.decay" in str(error.value) and "fsdp" in str(error.value)


def test_settings_added_since_runs_were_named_count_only_when_set():
    plain = OmegaConf.to_container(compose_config("run.init_from=x", "run.init_optimizer=true"), resolve=True)
    before = {**plain, "trainer": {k: v for k, v in plain["trainer"].items() if k != "ema"}}
    before["run"] = {k: v for k, v in plain["run"].items() if k != "init_full_state"}
    assert run_name(plain) == run_name(before)  # ema off, init_full_state false: the names of earlier runs
    on = {**plain, "trainer": {**plain["trainer"], "ema": {"decay": 0.9}}}
    full = {**plain, "run": {**plain["run"], "init_full_state": True}}
    assert len({run_name(plain), run_name(on), run_name(full)}) == 3


def test_whole_number_buffers_are_copied_not_averaged():
    model = torch.nn.BatchNorm1d(2)
    averages = ema.averaged({"model": model}, 0.9)
    for _ in range(5):
        model(torch.randn(8, 2))  # counts a batch, moves the running stats
        ema.update(averages, {"model": model})
    average = averages["model"].module
    assert average.num_batches_tracked.item() == model.num_batches_tracked.item() == 5
    assert not torch.equal(average.running_mean, model.running_mean)  # the floats are averaged
    assert not any(p.requires_grad for p in average.parameters())
