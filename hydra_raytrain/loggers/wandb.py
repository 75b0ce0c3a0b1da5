"""Weights & Biases, from rank 0. ``mode: offline`` needs no account and no network (files under
``<run dir>/wandb/``; ``wandb sync`` uploads them later). The API key is read by wandb from its own
environment or netrc and never passes through our config, checkpoints or run dir files."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional


class WandbLogger:
    def __init__(self, project: str = "hydra_raytrain", entity: Optional[str] = None, group: Optional[str] = None,
                 tags: Optional[List[str]] = None, name: Optional[str] = None, mode: str = "online"):
        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logger.wandb.mode={mode!r}: must be online, offline or disabled")
        self.settings = dict(project=project, entity=entity, group=group, tags=tags, name=name, mode=mode)
        self.run = None

    def start(self, config: Dict[str, Any], run_dir: str, run_id: Optional[str]) -> str:
        import wandb

        # The run id is the run's identity (or what a checkpoint stored), so a resumed run continues the same W&B run.
        run_id = run_id or _wandb_id(config["run_name"])
        self.run = wandb.init(id=run_id, resume="allow", dir=run_dir, config=config["cfg"], reinit="create_new", **self.settings)
        self.run.define_metric("epoch")
        self.run.define_metric("*", step_metric="epoch")
        return run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics))

    def finish(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "completed" else 1)
            self.run = None


def _wandb_id(run_name: str) -> str:
    # W&B ids allow letters, digits, '-' and '_' (at most 128 characters).
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in run_name)[:128]
