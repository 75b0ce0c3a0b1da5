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

from hydra_raytrain.config.errors import one_line
from hydra_raytrain.loggers.base import DriverSide, Ending, build_loggers, server_problem, warn
from hydra_raytrain.messages.outcome import RunStatus
from hydra_raytrain.storage.rundir import CONFIG_FILE, MODEL_FILE

MODES = ("online", "offline", "disabled")
DEFAULT_PROJECT = "hydra_raytrain"
DEFAULT_BASE_URL = "https://api.wandb.ai"
LOG_MODEL = (None, False, "best", "last")  # log_model: none, the best checkpoint's weights, the final ones
MODEL_ARTIFACT = "model-{id}"  # Lightning's WandbLogger's name for a run's model artifact
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
        log_model: str | bool | None = None,  # the driver's (WandbDriverSide.complete): the workers log no model
    ):
        from hydra_raytrain.config.errors import ConfigError

        if mode is not None and mode not in MODES:
            raise ConfigError(
                "logger.wandb.mode",
                mode,
                "unknown W&B mode.",
                "online, offline, disabled, or null (W&B's WANDB_MODE, else online)",
            )
        if log_model not in LOG_MODEL:
            raise ConfigError("logger.wandb.log_model", log_model, "unknown choice.", "best, last, or false")
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

    def complete(self, node: dict[str, Any], ending: Ending) -> None:
        """With ``log_model`` (best, last): the weights, with the config that builds their model, as the W&B run's
        model artifact ``model-<run id>`` (aliases ``latest``, and ``best`` for the best checkpoint's), logged from
        the driver into the same W&B run (offline: beside rank 0's run files, for ``wandb sync``). A failure warns."""
        if not node.get("log_model"):
            return
        try:
            with ending.kept_model(node["log_model"], "logger.wandb") as kept:
                log_model_artifact(node, ending, kept or os.path.join(ending.run_dir, MODEL_FILE), kept is not None)
        except Exception as error:  # noqa: BLE001  (a tracker's helper: the run completed)
            warn(f"logger.wandb: the run's model was not logged as a W&B artifact ({one_line(error)})")


def log_model_artifact(node: dict[str, Any], ending: Ending, model_file: str, best: bool) -> None:
    """``model_file`` and the run's config.json as the model artifact of the run's W&B run."""
    import wandb

    logger = build_loggers({"wandb": node})["wandb"]
    logger.start(ending.config, ending.run_dir, None)
    try:
        run = logger.run  # type: ignore[attr-defined]
        artifact = wandb.Artifact(
            MODEL_ARTIFACT.format(id=run.id),
            type="model",
            metadata={"weights": "best" if best else "last", "run_name": ending.config["run_name"]},
        )
        artifact.add_file(model_file, name=MODEL_FILE)
        config = os.path.join(ending.run_dir, CONFIG_FILE)
        if os.path.exists(config):
            artifact.add_file(config, name=CONFIG_FILE)
        run.log_artifact(artifact, aliases=["latest", "best"] if best else ["latest"])
    finally:
        logger.finish("completed")


WandbLogger.driver_side = WandbDriverSide()
