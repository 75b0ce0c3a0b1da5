"""MLflow, from rank 0. MLflow's own conventions hold: a setting left null here is MLflow's, so
``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME`` (or ``MLFLOW_EXPERIMENT_ID``) and ``MLFLOW_RUN_ID`` work as with
``mlflow.start_run``; with neither, runs go to a local sqlite store, ``outputs/mlflow.db`` beside the run dirs
(``mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db`` shows them).

The run's identity is the MLflow run: tagged with the run's name and run dir, a resumed, restarted or re-run run
continues the same MLflow run (each epoch logged once), a sweep is a parent run with each trial nested under it.
The driver prepares it (``plan``) before the workers start: an MLflow that cannot be reached is not a reason to fail
or stall training; the run goes on without it, with one warning, and the same command run again once MLflow answers
logs the finished run to it. The files (``model.pt``, ``curves.png``, ``config.json``, ``summary.json``) are logged
by the driver when the run ends (``log_artifacts``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar
from urllib.parse import urlparse

from hydra_raytrain.config.errors import one_line, redacted
from hydra_raytrain.loggers.base import DriverSide, Ending, flat_settings, replay, server_problem, warn
from hydra_raytrain.messages.outcome import RunStatus

ARTIFACTS = ("none", "best", "last")  # log_artifacts: no files, the best checkpoint's model, the final model
DEFAULT_EXPERIMENT = "hydra_raytrain"
DEFAULT_STORE = "mlflow.db"  # in outputs/, beside runs/ and multirun/
RUN_NAME_TAG, RUN_DIR_TAG, SWEEP_TAG = "hydra_raytrain.run_name", "hydra_raytrain.run_dir", "hydra_raytrain.sweep_dir"
PARENT_TAG = "mlflow.parentRunId"
MODEL_NAME, MODEL_TAG = "model", "hydra_raytrain.model"  # the run's MLflow Model: runs:/<run id>/model
STATUSES = {"completed": "FINISHED", "failed": "FAILED", "preempted": "KILLED"}
# The credentials stay out of Ray (its dashboard shows a job's environment): workers read their own. The run id is
# resolved by the driver into the config (a sweep's trials must not all take it).
NOT_FORWARDED = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_RUN_ID")
# MLflow retries a failed request 7 times over ~2 minutes by default: a tracker must not stall training
QUICK_FAILURE = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
EXTRA = "pip install 'hydra_raytrain[mlflow]'"


class MlflowLogger:
    driver_side: ClassVar[DriverSide]  # MlflowDriverSide, below

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        experiment_id: str | None = None,
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
        log_artifacts: str = "last",
        run_id: str | None = None,
        sweep_dir: str | None = None,
        registered_model_name: str | None = None,  # the driver's (log_run_model): the workers log no model
    ):
        from hydra_raytrain.config.errors import ConfigError

        if log_artifacts not in ARTIFACTS:
            raise ConfigError("logger.mlflow.log_artifacts", log_artifacts, "unknown choice.", ", ".join(ARTIFACTS))
        if importlib.util.find_spec("mlflow") is None:
            raise ConfigError("logger", "mlflow", "needs MLflow, which is not installed.", EXTRA)
        self.settings = resolve(
            dict(
                tracking_uri=tracking_uri,
                experiment_name=experiment_name,
                experiment_id=experiment_id,
                run_id=run_id,
                sweep_dir=sweep_dir,
            ),
            os.environ,
            os.getcwd(),
        )
        if tags is not None and not isinstance(tags, Mapping):
            raise ConfigError("logger.mlflow.tags", tags, "MLflow's tags are names and values.", "e.g. {team: vision}")
        self.run_name, self.tags = run_name, {str(k): str(v) for k, v in (tags or {}).items()}
        self.log_artifacts = log_artifacts
        self.client: Any = None
        self.run_id: str | None = None
        self.logged: set[tuple[str, int]] = set()  # (metric, step) already in the run: a restart logs them once

    def start(self, config: dict[str, Any], run_dir: str, run_id: str | None) -> str:
        with quick_failure():
            self.client = client = _client(self.settings["tracking_uri"])
            experiment_id = experiment(client, self.settings)
            name = config["run_name"]
            # A checkpoint's id (a restart, a resume), MLFLOW_RUN_ID, else the run of this name and run dir, if any
            run_id = _existing(client, run_id or self.settings.get("run_id"))
            run_id = run_id or find_run(client, experiment_id, name, run_dir)
            identity = {RUN_NAME_TAG: name, RUN_DIR_TAG: run_dir}
            if run_id is None:
                tags = {**self.tags, **identity}
                sweep_dir = self.settings.get("sweep_dir")
                parent = sweep_dir and find_sweep_run(client, experiment_id, sweep_dir)
                if parent:
                    tags[PARENT_TAG] = parent
                run_id = client.create_run(experiment_id, run_name=self.run_name or name, tags=tags).info.run_id
            else:
                client.update_run(run_id, status="RUNNING")
            self.run_id = run_id  # from here on finish() ends it, whatever fails below
            data = client.get_run(run_id).data
            self.logged = {(key, m.step) for key in data.metrics for m in client.get_metric_history(run_id, key)}
            params = {key: value for key, value in flat_params(config["cfg"]).items() if key not in data.params}
            provenance = flat_params(config.get("provenance") or {})
            _log_batch(client, run_id, params, {**identity, **{f"provenance.{k}": v for k, v in provenance.items()}})
        return run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        named = {metric_key(key): value for key, value in metrics.items()}
        batch = [
            Metric(key, float(value), now, step)
            for key, value in named.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and (key, step) not in self.logged
        ]
        if batch:
            with quick_failure():
                self.client.log_batch(self.run_id, metrics=batch)
            self.logged.update((metric.key, step) for metric in batch)

    def log_files(self, paths: list[str]) -> None:
        """Files as the run's artifacts (on the driver, after training), unless ``log_artifacts`` is none."""
        if self.log_artifacts == "none":
            return
        with quick_failure(timeout=300):  # an upload of a large model.pt through a tracking server takes time
            for path in paths:
                self.client.log_artifact(self.run_id, path)

    def finish(self, status: RunStatus) -> None:
        if self.run_id is not None:
            run_id, self.run_id = self.run_id, None
            with quick_failure():
                self.client.set_terminated(run_id, STATUSES[status])


def resolve(settings: dict[str, Any], environ: Mapping[str, str], cwd: str) -> dict[str, Any]:
    """The config's settings, with MLflow's environment where they are null: the tracking URI
    (``MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/outputs/mlflow.db``), the experiment (``MLFLOW_EXPERIMENT_NAME``,
    else ``MLFLOW_EXPERIMENT_ID``, else hydra_raytrain) and, outside a sweep, ``MLFLOW_RUN_ID``."""
    resolved = dict(settings)
    if not resolved.get("tracking_uri"):
        uri = environ.get("MLFLOW_TRACKING_URI")
        resolved["tracking_uri"] = uri or "sqlite:///" + os.path.join(os.path.abspath(cwd), "outputs", DEFAULT_STORE)
    resolved["tracking_uri"] = absolute_store(resolved["tracking_uri"], cwd)
    if not resolved.get("experiment_name") and not resolved.get("experiment_id"):
        resolved["experiment_name"] = environ.get("MLFLOW_EXPERIMENT_NAME")
        resolved["experiment_id"] = None if resolved["experiment_name"] else environ.get("MLFLOW_EXPERIMENT_ID")
        resolved["experiment_name"] = resolved["experiment_name"] or (
            None if resolved["experiment_id"] else DEFAULT_EXPERIMENT
        )
    if not resolved.get("run_id") and not resolved.get("sweep_dir"):  # a sweep's MLFLOW_RUN_ID is its parent
        resolved["run_id"] = environ.get("MLFLOW_RUN_ID")
    return resolved


def absolute_store(uri: str, cwd: str) -> str:
    """A local store's path made absolute (``sqlite:///mlflow.db``, ``./mlruns``, ``file:mlruns``): the workers and
    a sweep's trials run in other folders than the driver."""
    for scheme, root in (("sqlite:///", "sqlite:///"), ("file://", "file://"), ("file:", "file://")):
        rest = uri[len(scheme) :]
        if uri.startswith(scheme) and not rest.startswith("/"):
            return root + os.path.normpath(os.path.join(cwd, rest))
    if uri.startswith("databricks") or "://" in uri or ":" in uri.split("/")[0]:
        return uri  # a server, Databricks (databricks, databricks-uc, databricks://profile), another scheme
    return os.path.normpath(os.path.join(cwd, uri))


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: ``optimizer.lr`` -> ``"0.001"``; lists as JSON; a URI's credentials
    hidden; names and values within MLflow's rules and limits."""
    flat: dict[str, str] = {}
    for name, value in flat_settings(tree, prefix).items():
        text = redacted(json.dumps(value) if isinstance(value, (list, tuple, Mapping)) else str(value))
        flat[metric_key(name)[:250]] = text if len(text) <= 6000 else text[:5997] + "..."
    return flat


def metric_key(name: str) -> str:
    """A name MLflow takes (letters, digits, ``_ - . / :`` and spaces; no ``..``, no leading ``/``): others become
    ``_`` (``acc@1`` -> ``acc_1``)."""
    key = re.sub(r"[^\w\-. /:]", "_", name).replace("..", "._")
    return key.lstrip("/") or "_"


def local_store(uri: str) -> str | None:
    """The folder of a local sqlite store, else None."""
    return os.path.dirname(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def experiment(client: Any, settings: Mapping[str, Any]) -> str:
    """The experiment's id, the experiment created if it does not exist (in a local sqlite store, its artifacts in
    ``mlartifacts/`` beside the database)."""
    if settings.get("experiment_id"):
        found = client.get_experiment(str(settings["experiment_id"]))  # raises when there is none
    else:
        found = client.get_experiment_by_name(settings["experiment_name"])
    if found is not None:
        if found.lifecycle_stage != "active":
            raise LookupError(
                f"the experiment {found.name} ({found.experiment_id}) is deleted: restore it or name another"
            )
        return str(found.experiment_id)
    folder = local_store(settings["tracking_uri"])
    location = "file://" + os.path.join(folder, "mlartifacts") if folder else None
    try:
        return str(client.create_experiment(settings["experiment_name"], artifact_location=location))
    except Exception:  # created meanwhile by another process (two trials of a sweep)
        found = client.get_experiment_by_name(settings["experiment_name"])
        if found is None:
            raise
        return str(found.experiment_id)


def find_run(client: Any, experiment_id: str, run_name: str, run_dir: str) -> str | None:
    """The run of this name and run dir (the run dir compared here: a path may hold any character)."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = {_quoted(run_name)}")
    return next((run.info.run_id for run in runs if run.data.tags.get(RUN_DIR_TAG) == run_dir), None)


def find_sweep_run(client: Any, experiment_id: str, sweep_dir: str) -> str | None:
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`{SWEEP_TAG}` = {_quoted(sweep_dir)}", max_results=1
    )
    return runs[0].info.run_id if runs else None


def retire(node: Mapping[str, Any], run_name: str, run_dir: str) -> None:
    """``run.resume=never``: the run dir's earlier MLflow run keeps its figures but is no longer this run's (its run
    dir tag gains ``(replaced)``), so the new run starts a new MLflow run."""
    with quick_failure():
        client = _client(node["tracking_uri"])
        found = find_run(client, experiment(client, node), run_name, run_dir)
        if found is not None:
            client.set_tag(found, RUN_DIR_TAG, f"{run_dir} (replaced {time.strftime('%Y-%m-%d %H:%M:%S')})")


def plan(node: dict[str, Any], environ: Mapping[str, str], cwd: str, warn: Callable[[str], None]) -> bool:
    """On the driver, before the workers start: the node's settings resolved (``resolve``: the workers see the
    driver's store, experiment and run id, not their own cwd's or environment's), the store and experiment created,
    and MLflow's answer checked in seconds. False, after one warning, when MLflow cannot be reached: the run goes on
    without it."""
    node.update(resolve(node, environ, cwd))
    uri = node["tracking_uri"]
    problem = server_problem(uri) if urlparse(uri).scheme in ("http", "https") else None
    if problem is None:
        try:
            with quick_failure():
                node["experiment_id"] = experiment(_client(uri), node)
        except Exception as error:  # noqa: BLE001  (whatever MLflow raises, the run goes on)
            problem = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
    if problem is None:
        return True
    warn(
        f"logger.mlflow: MLflow at {redacted(uri)} cannot be used ({problem}); this run is not logged to MLflow. Run "
        f"the same command again once MLflow answers: it logs the finished run's epochs and files to it."
    )
    return False


QUIET_URL = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """MLflow's variables from the driver's environment, for the workers (on a joined cluster they do not inherit
    it), with short HTTP retries unless the user set their own."""
    forwarded = {k: v for k, v in environ.items() if k.startswith("MLFLOW_") and k not in NOT_FORWARDED}
    return {**QUICK_FAILURE, **forwarded}


def open_sweep(node: dict[str, Any], sweep_dir: str, environ: Mapping[str, str], cwd: str) -> str | None:
    """The sweep's parent run (``MLFLOW_RUN_ID``, else the one of this sweep dir, else a new one), marked running,
    before its trials start; None, after a warning, when MLflow cannot be reached."""
    parent_id = resolve({**node, "sweep_dir": None}, environ, cwd).get("run_id")
    node["sweep_dir"] = sweep_dir
    if not plan(node, environ, cwd, warn=warn):
        return None
    try:
        with quick_failure():
            client = _client(node["tracking_uri"])
            found = parent_id or find_sweep_run(client, node["experiment_id"], sweep_dir)
            if found is None:
                tags = {SWEEP_TAG: sweep_dir}
                return str(
                    client.create_run(
                        node["experiment_id"], run_name=os.path.basename(sweep_dir), tags=tags
                    ).info.run_id
                )
            client.set_tag(found, SWEEP_TAG, sweep_dir)
            client.update_run(found, status="RUNNING")
            return str(found)
    except Exception as error:  # noqa: BLE001  (the trials log their own runs regardless)
        warn(f"logger.mlflow: the sweep's MLflow run was not started ({type(error).__name__}: {error})")
        return None


def close_sweep(node: Mapping[str, Any], parent_id: str, figures: Mapping[str, float], failed: bool) -> None:
    """The sweep's parent run ended, with its figures (the best trial's)."""
    try:
        with quick_failure():
            client = _client(node["tracking_uri"])
            for key, value in figures.items():
                client.log_metric(parent_id, key, float(value))
            client.set_terminated(parent_id, "FAILED" if failed else "FINISHED")
    except Exception as error:  # noqa: BLE001  (the sweep's own results stand)
        warn(f"logger.mlflow: the sweep's MLflow run {parent_id} was not ended ({type(error).__name__}: {error})")


class MlflowDriverSide(DriverSide):
    """MLflow on the driver: the store, experiment and run resolved and checked before the workers start (dropped,
    with a warning, when MLflow cannot be reached); a sweep's parent run with its trials nested; ``run.resume=never``
    sets the earlier run aside; a completed run's missing epochs, test figures and files logged at its end."""

    test_with_completion = True

    def prepare(self, node: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]] | None:
        if not plan(node, os.environ, os.getcwd(), warn=warn):
            return None  # summary.json does not list it: the same command later logs the run
        env = forwarded_env(os.environ)
        if redacted(str(node.get("tracking_uri") or "")) != str(node.get("tracking_uri") or ""):
            # MLflow prints each run's URL, credentials and all, where a run ends: not with a password in it
            os.environ.setdefault(QUIET_URL, "true")
            env.setdefault(QUIET_URL, "true")
        return node, env

    def for_trial(self, node: dict[str, Any], sweep_dir: str) -> dict[str, Any]:
        return resolve({**node, "sweep_dir": sweep_dir}, os.environ, os.getcwd())  # nested in the sweep's run

    def in_sweep(self, node: dict[str, Any]) -> bool:
        return bool(node.get("sweep_dir"))

    def open_sweep(self, node: dict[str, Any], sweep_dir: str) -> tuple[dict[str, Any], Any] | None:
        parent = open_sweep(node, sweep_dir, os.environ, os.getcwd())
        return None if parent is None else (node, parent)

    def close_sweep(self, node: dict[str, Any], handle: Any, figures: Mapping[str, float], failed: bool) -> None:
        close_sweep(node, handle, figures, failed)

    def restart(self, node: dict[str, Any], run_name: str, run_dir: str) -> None:
        try:
            retire(resolve(node, os.environ, os.getcwd()), run_name, run_dir)
        except Exception as error:  # noqa: BLE001  (plan() says so if MLflow cannot be used)
            warn(f"logger.mlflow: the run dir's earlier MLflow run was not set aside ({type(error).__name__}: {error})")

    def complete(self, node: dict[str, Any], ending: Ending) -> None:
        """Into the run's MLflow run (``replay``): the epochs it lacks (rank 0 logged them as they came, unless MLflow
        was away for some), the test split's figures, and the run's files (with ``log_artifacts: best``, the model
        of the best checkpoint Ray kept). A failure warns; the run stands."""
        with ending.kept_model("best" if node.get("log_artifacts") == "best" else "last", "logger.mlflow") as model:
            replay({"mlflow": node}, ending.config, ending.run_dir, ending.logs, ending.files(model))
            if node.get("log_artifacts") != "none":
                log_run_model(node, ending, os.path.dirname(model) if model else None)


MlflowLogger.driver_side = MlflowDriverSide()


def log_run_model(node: Mapping[str, Any], ending: Ending, folder: str | None) -> None:
    """The completed run's model as an MLflow Model of its MLflow run (``log_model``), once: a run that has one
    (its ``hydra_raytrain.model`` tag) keeps it. ``folder``: the checkpoint whose weights to log (None: the final
    ones). A failure warns; the run and its files stand."""
    try:
        with quick_failure():
            client = _client(node["tracking_uri"])
            run_id = find_run(client, experiment(client, node), ending.config["run_name"], ending.run_dir)
            if run_id is None or MODEL_TAG in client.get_run(run_id).data.tags:
                return
        model, example = ending.model(folder)
        uri = log_model(node, run_id, model, example)
        with quick_failure():
            client.set_tag(run_id, MODEL_TAG, uri)
    except Exception as error:  # noqa: BLE001  (a tracker's helper: the run completed)
        warn(f"logger.mlflow: the run's model was not logged as an MLflow Model ({one_line(error)})")


def log_model(node: Mapping[str, Any], run_id: str, model: Any, example: Any) -> str:
    """``model`` (a torch module) as the MLflow Model ``model`` of the run ``run_id`` (``runs:/<id>/model``): the
    pytorch flavor, with the signature of ``example`` (a few inputs from the data) and its outputs, the example itself,
    torch's and cloudpickle's versions as its requirements (the model's own class must import where it is loaded:
    hydra_raytrain's models do where hydra_raytrain is installed); registered as a new version of
    ``registered_model_name`` where the node names one. Returns the model's URI."""
    import cloudpickle
    import mlflow
    import mlflow.pytorch
    import torch
    from mlflow.models import infer_signature

    with torch.no_grad():
        output = model(torch.from_numpy(example))
    signature = infer_signature(example, getattr(output, "logits", output).numpy())
    requirements = [f"torch=={torch.__version__.split('+')[0]}", f"cloudpickle=={cloudpickle.__version__}"]
    with _tracking_uri(node["tracking_uri"]), quick_failure(timeout=300), mlflow.start_run(run_id=run_id):
        info = mlflow.pytorch.log_model(
            model,
            name=MODEL_NAME,
            signature=signature,
            input_example=example,
            pip_requirements=requirements,
            registered_model_name=node.get("registered_model_name"),
        )
    return str(info.model_uri)


@contextlib.contextmanager
def _tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's fluent API (``log_model`` has no client form) pointed at ``uri`` for a block, then left as it was:
    its process-wide URI (unset unless someone set it) and ``MLFLOW_TRACKING_URI``, which ``set_tracking_uri`` also
    writes (and unsets when given None)."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    saved, variable = getattr(utils, "_tracking_uri", None), os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved)  # type: ignore[arg-type]  # None unsets it, as MLflow's _use_tracking_uri does
        if variable is not None:
            os.environ["MLFLOW_TRACKING_URI"] = variable


class quick_failure:
    """MLflow's HTTP retries shortened for a block (unless the user set their own); ``timeout``: seconds per
    request (an artifact upload needs more)."""

    def __init__(self, timeout: int | None = None):
        self.values = {**QUICK_FAILURE, **({"MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout)} if timeout else {})}

    def __enter__(self) -> None:
        self.saved = {name: os.environ.get(name) for name in self.values}
        for name, value in self.values.items():
            os.environ.setdefault(name, value)

    def __exit__(self, *exc: object) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    folder = local_store(uri)
    if folder:
        os.makedirs(folder, exist_ok=True)
    return MlflowClient(tracking_uri=uri)


def _log_batch(client: Any, run_id: str, params: Mapping[str, str], tags: Mapping[str, Any]) -> None:
    from mlflow.entities import Param, RunTag

    entities = [Param(k, v) for k, v in params.items()] + [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
    for chunk in _chunks(entities, 100):  # MLflow takes at most 100 params and tags per request
        client.log_batch(
            run_id,
            params=[e for e in chunk if isinstance(e, Param)],
            tags=[e for e in chunk if isinstance(e, RunTag)],
        )


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _quoted(value: str) -> str:
    """A string in MLflow's search syntax, which has no escapes: in double quotes where it holds a single one."""
    return f'"{value}"' if "'" in value else f"'{value}'"


def _existing(client: Any, run_id: str | None) -> str | None:
    """``run_id`` if MLflow still has it (a checkpoint may outlive a deleted run, or name another store's)."""
    if run_id is None:
        return None
    try:
        return str(client.get_run(run_id).info.run_id)
    except Exception:  # noqa: BLE001  (MLflow raises its own for a missing run)
        return None
