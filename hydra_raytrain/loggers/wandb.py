"""Weights & Biases, from rank 0. W&B's own conventions hold: a setting left null here is left to W&B, so
``WANDB_MODE``, ``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_BASE_URL`` ... work as with ``wandb.init``, and the
driver forwards the ``WANDB_*`` variables to the workers (all but ``WANDB_API_KEY``, which W&B reads from the
workers' own environment or netrc and which never passes through our config, checkpoints or run dir files).

Offline (``mode: offline`` or ``WANDB_MODE=offline``) needs no account and no network: files under
``<run dir>/wandb/``, uploaded later by ``wandb sync``. A W&B server that the driver cannot reach is not a reason
to fail or stall a training run: the run logs offline instead, with one warning (``plan_mode``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from hydra_raytrain.loggers.base import DriverSide, server_problem, warn
from hydra_raytrain.outcome import RunStatus

MODES = ("online", "offline", "disabled")
DEFAULT_PROJECT = "hydra_raytrain"
DEFAULT_BASE_URL = "https://api.wandb.ai"
NOT_FORWARDED = ("WANDB_API_KEY", "WANDB_SERVICE")  # the key stays out of Ray; the service is this process's own


class WandbLogger:
    driver_side: ClassVar[DriverSide]  # WandbDriverSide, below

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        name: str | None = None,
        mode: str | None = None,
    ):
        if mode is not None and mode not in MODES:
            from hydra_raytrain.config.errors import ConfigError

            raise ConfigError(
                "logger.wandb.mode",
                mode,
                "unknown W&B mode.",
                "online, offline, disabled, or null (W&B's WANDB_MODE, else online)",
            )
        given = dict(project=project, entity=entity, group=group, tags=tags or None, name=name, mode=mode)
        self.settings: dict[str, Any] = {key: value for key, value in given.items() if value is not None}
        if project is None and not os.environ.get("WANDB_PROJECT"):
            self.settings["project"] = DEFAULT_PROJECT
        self.run: Any = None  # wandb.Run once started

    def start(self, config: dict[str, Any], run_dir: str, run_id: str | None) -> str:
        import wandb

        # The run id is the run's identity (or what a checkpoint stored), so a resumed run continues the same W&B run.
        run_id = run_id or _wandb_id(config["run_name"])
        logged = {**config["cfg"], **({"provenance": config["provenance"]} if config.get("provenance") else {})}
        self.run = wandb.init(
            id=run_id, resume="allow", dir=run_dir, config=logged, reinit="create_new", **self.settings
        )
        self.run.define_metric("epoch")
        self.run.define_metric("*", step_metric="epoch")
        return run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics))

    def finish(self, status: RunStatus) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "completed" else 1)
            self.run = None


def _wandb_id(run_name: str) -> str:
    # W&B ids allow letters, digits, '-' and '_' (at most 128 characters).
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in run_name)[:128]


def effective_mode(node: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    """The mode wandb.init will use: the config's, else W&B's environment variables, else online."""
    if node.get("mode"):
        return node["mode"]
    if environ.get("WANDB_DISABLED", "").lower() in ("true", "1"):
        return "disabled"
    mode = environ.get("WANDB_MODE", "online")
    return {"dryrun": "offline", "run": "online"}.get(mode, mode)


def plan_mode(
    node: dict[str, Any],
    environ: Mapping[str, str],
    reachable: Callable[[str], str | None],
    warn: Callable[[str], None],
) -> None:
    """On the driver, before the workers start: an online run whose W&B server does not answer logs offline
    instead (``node["mode"] = "offline"``), with one warning that says how to upload it later."""
    if effective_mode(node, environ) != "online":
        return
    url = environ.get("WANDB_BASE_URL", DEFAULT_BASE_URL)
    problem = reachable(url)
    if problem is None:
        return
    node["mode"] = "offline"
    warn(
        f"logger.wandb: W&B at {url} cannot be reached ({problem}); this run logs to W&B offline instead, "
        f"into <run dir>/wandb. Upload it later with `wandb sync <run dir>/wandb/offline-run-*`."
    )


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """W&B's variables from the driver's environment, for the workers (on a joined cluster they do not inherit it)."""
    return {name: value for name, value in environ.items() if name.startswith("WANDB_") and name not in NOT_FORWARDED}


class WandbDriverSide(DriverSide):
    """W&B on the driver: an online run whose server does not answer logs offline (``plan_mode``), W&B's variables
    forwarded to the workers; a sweep's trials are W&B runs grouped by the sweep (unless the config names a group)."""

    def prepare(self, node: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]] | None:
        plan_mode(node, os.environ, server_problem, warn=warn)
        return node, forwarded_env(os.environ)

    def for_trial(self, node: dict[str, Any], sweep_dir: str) -> dict[str, Any]:
        return node if node.get("group") else {**node, "group": os.path.basename(sweep_dir)}


WandbLogger.driver_side = WandbDriverSide()
