"""TensorBoard event files in ``<run dir>/tensorboard`` from rank 0 (tensorboardX, which Ray ships): the epochs'
scalars, the provenance as text, and the run as a session of TensorBoard's HParams plugin (its settings when it
starts, its status when it ends), so ``tensorboard --logdir <sweep dir>`` lines a sweep's trials up in one HParams
table against their metrics (the plugin takes the runs' scalars as the metrics)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from hydra_raytrain.loggers.base import flat_settings
from hydra_raytrain.messages.outcome import RunStatus

HPARAMS_PLUGIN, START_TAG, END_TAG = "hparams", "_hparams_/session_start_info", "_hparams_/session_end_info"
STATUSES = {"completed": "STATUS_SUCCESS", "failed": "STATUS_FAILURE", "preempted": "STATUS_UNKNOWN"}


class TensorBoardLogger:
    def __init__(self, subdir: str = "tensorboard"):
        self.subdir = subdir
        self.writer: Any = None  # tensorboardX.SummaryWriter once started

    def start(self, config: dict[str, Any], run_dir: str, run_id: str | None) -> str:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(os.path.join(run_dir, self.subdir))
        if config.get("provenance"):  # where the run came from: the command, git commit, versions, host
            self.writer.add_text("provenance", f"```\n{json.dumps(config['provenance'], indent=2)}\n```")
        self.writer.file_writer.add_summary(session_start(config.get("cfg") or {}))
        return run_id or config["run_name"]

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        assert self.writer is not None, "start() first"
        for name, value in metrics.items():
            if name != "epoch":
                self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def finish(self, status: RunStatus) -> None:
        if self.writer is not None:
            self.writer.file_writer.add_summary(session_end(status))
            self.writer.close()
            self.writer = None


def hparams(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The run's settings as HParams values: every leaf of the config by dotted name, numbers, booleans and text as
    they are, lists as JSON; unset ones left out."""
    return {
        name: value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
        for name, value in flat_settings(cfg).items()
        if value is not None and value != {}
    }


def session_start(cfg: Mapping[str, Any]) -> Any:
    """The HParams plugin's session start summary: the run's settings (``hparams``)."""
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData, SessionStartInfo

    info = SessionStartInfo(start_time_secs=time.time())
    for name, value in hparams(cfg).items():
        if isinstance(value, bool):
            info.hparams[name].bool_value = value
        elif isinstance(value, (int, float)):
            info.hparams[name].number_value = float(value)
        else:
            info.hparams[name].string_value = value
    return _plugin_summary(START_TAG, HParamsPluginData(session_start_info=info, version=0))


def session_end(status: RunStatus) -> Any:
    from tensorboardX.proto.api_pb2 import Status
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData, SessionEndInfo

    info = SessionEndInfo(status=Status.Value(STATUSES[status]), end_time_secs=time.time())
    return _plugin_summary(END_TAG, HParamsPluginData(session_end_info=info, version=0))


def _plugin_summary(tag: str, content: Any) -> Any:
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata

    plugin = SummaryMetadata.PluginData(plugin_name=HPARAMS_PLUGIN, content=content.SerializeToString())
    return Summary(value=[Summary.Value(tag=tag, metadata=SummaryMetadata(plugin_data=plugin))])
