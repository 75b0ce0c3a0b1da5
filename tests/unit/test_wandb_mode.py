"""W&B's own conventions (pure functions): what the config leaves null is W&B's, and an unreachable server
means offline with one warning, decided on the driver."""

import pytest

from hydra_raytrain.config import ConfigError
from hydra_raytrain.loggers.wandb import WandbLogger, effective_mode, forwarded_env, plan_mode


def test_null_settings_are_left_to_wandb(monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert WandbLogger().settings == {"project": "hydra_raytrain"}  # our default project when W&B has none
    monkeypatch.setenv("WANDB_PROJECT", "theirs")
    assert WandbLogger().settings == {}  # W&B reads WANDB_PROJECT itself
    assert WandbLogger(project="mine", mode="offline", tags=["a"]).settings == {
        "project": "mine",
        "mode": "offline",
        "tags": ["a"],
    }


def test_an_unknown_mode_names_its_key():
    with pytest.raises(ConfigError) as caught:
        WandbLogger(mode="ofline")
    assert caught.value.key == "logger.wandb.mode" and "online, offline, disabled" in str(caught.value)


@pytest.mark.parametrize(
    "node, environ, mode",
    [
        ({}, {}, "online"),
        ({}, {"WANDB_MODE": "offline"}, "offline"),
        ({}, {"WANDB_MODE": "dryrun"}, "offline"),
        ({}, {"WANDB_DISABLED": "true", "WANDB_MODE": "online"}, "disabled"),
        ({"mode": "online"}, {"WANDB_MODE": "offline"}, "online"),  # given explicitly, as wandb.init(mode=...) does
    ],
)
def test_the_effective_mode_follows_wandb(node, environ, mode):
    assert effective_mode(node, environ) == mode


def test_an_unreachable_server_turns_an_online_run_offline_with_one_warning():
    warnings, asked = [], []

    def unreachable(url):
        asked.append(url)
        return "Connection refused"

    node = {}
    plan_mode(node, {"WANDB_BASE_URL": "http://127.0.0.1:1"}, unreachable, warnings.append)
    assert node["mode"] == "offline" and asked == ["http://127.0.0.1:1"]
    assert len(warnings) == 1 and "Connection refused" in warnings[0] and "wandb sync" in warnings[0]
    node = {}
    plan_mode(node, {}, lambda url: None, warnings.append)  # reachable: W&B decides, nothing said
    assert node == {} and len(warnings) == 1
    plan_mode(node, {"WANDB_MODE": "offline"}, unreachable, warnings.append)  # offline asks no server
    assert node == {} and len(asked) == 1


def test_wandb_variables_are_forwarded_except_the_key():
    environ = {
        "WANDB_MODE": "offline",
        "WANDB_PROJECT": "p",
        "WANDB_API_KEY": "secret",
        "WANDB_SERVICE": "driver-socket",
        "HOME": "/root",
    }
    assert forwarded_env(environ) == {"WANDB_MODE": "offline", "WANDB_PROJECT": "p"}
