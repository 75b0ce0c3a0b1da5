"""A run's identity: a name derived from the composed config, used for Ray's ``RunConfig.name`` and the
default run dir (``outputs/runs/<name>``). The same config always gives the same name, so re-running a
command finds its run again (and resumes it); a change that can alter the result gives a new name.

A pure function of the resolved config (``Resolved.to_dict()``): the driver, a sweep and the workers name a run
alike. The name of a *composed* config as the driver will run it (``${run_name:}`` in ``hydra.run.dir``) applies
the command line's replaced targets and absolute paths first: ``preflight/resolvers.py``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

# Keys that cannot change what is learned: how Ray is reached, where results go, what is logged or watched
# (callbacks: adding a guard to a run's command continues the same run), when and
# which checkpoints are kept, whether to resume, which failures are retried (a retry resumes exactly), how FSDP
# groups and places the shards (each element's reduction is the same).
NON_RESULT_KEYS = ("hydra", "logger", "callbacks", "ray", "storage", "run", "checkpoint", "failure", "fsdp")
# Trainer settings that only change what is shown or measured, the memory it takes (activation checkpointing
# recomputes the same activations), or how fast (threads; the device-resident path slices the same batches): a run
# that ran out of memory or time resumes with them changed. But ``data_on_device=true`` holds a dataset's
# per-sample transforms as they were drawn once: it names another run.
NON_RESULT_TRAINER_KEYS = (
    "progress_bar",
    "profile",
    "profiler_steps",
    "sync_debug_mode",
    "num_threads",
    "data_on_device",
    "activation_checkpointing",
    "activation_checkpointing_modules",
)


def run_name(cfg: Mapping[str, Any]) -> str:
    if cfg["storage"]["name"]:
        return cfg["storage"]["name"]
    identity = {key: value for key, value in cfg.items() if key not in NON_RESULT_KEYS}
    identity["trainer"] = {k: v for k, v in identity["trainer"].items() if k not in NON_RESULT_TRAINER_KEYS}
    # Settings added since runs were first named count only when set: an earlier run keeps its name.
    for section, key in (("trainer", "lightning_kwargs"), (None, "datamodule")):
        node = identity[section] if section else identity
        if not node.get(key):
            node.pop(key, None)
    if not (identity["trainer"].get("ema") or {}).get("decay"):  # weight averaging, when asked for
        identity["trainer"].pop("ema", None)
    identity["dataset"] = _split_identity(identity["dataset"])
    if not any((identity.get("finetune") or {}).values()):
        identity.pop("finetune", None)
    if (identity.get("peft") or {}).get("method", "none") == "none":  # adapters, when asked for
        identity.pop("peft", None)
    if cfg["trainer"].get("data_on_device") is True:
        identity["trainer"]["data_on_device"] = True
    if (cfg.get("run") or {}).get("init_from"):  # a warm start: another starting point, another run
        identity["init_from"] = {k: v for k, v in cfg["run"].items() if k.startswith("init_")}
        if not identity["init_from"].get("init_full_state"):  # added since: counts only when set
            identity["init_from"].pop("init_full_state", None)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:10]
    model = (
        _label(cfg["model"]) if "_target_" in cfg["model"] else _label(cfg["task"])
    )  # several models: the task (gan)

    dataset = str(cfg["dataset"].get("name") or cfg["dataset"]["_target_"].rsplit(".", 1)[-1]).lower()
    return f"{model}-{dataset}-{digest}"


def _split_identity(dataset: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset node as run names count it: split settings added since runs were first named only when set."""
    split: dict[str, Any] = dict(dataset)
    for key in ("test_fraction", "test_path", "test_size"):  # a test split, when asked for
        if not split.get(key):
            split.pop(key, None)
    if split.get("folds") is None:  # cross-validation, when asked for
        split.pop("folds", None)
        split.pop("fold", None)
    if str(split.get("_target_")).endswith(".torchvision_builtin") and "test_fraction" not in split:
        split.pop("split_seed", None)  # added with test_fraction, which it draws
    return split


def _label(node: Mapping[str, Any]) -> str:
    zoo = node.get("arch") or node.get("name") or node.get("model_type")  # a zoo model's own name
    return str(zoo or node["_target_"].rsplit(".", 1)[-1]).lower()


def sweep_name(*argument_lists: Any) -> str:
    """``${sweep_name:${hydra.overrides.task},${hydra.overrides.hydra}}`` in ``hydra.sweep.dir``: the same sweep
    command (its arguments in any order) finds the same sweep dir again, which is how a sweep resumes."""
    listed = sorted(str(argument) for arguments in argument_lists for argument in (arguments or []))
    return "sweep-" + hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:10]
