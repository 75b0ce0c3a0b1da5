"""One trial of a sweep, as the sweep composes, checks, runs, records and replays it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra_raytrain.config.resolved import Resolved


@dataclass(frozen=True)
class Job:
    index: int  # its place in the sweep; -1 for a probe (checks a search space and sizes the cluster, never runs)
    overrides: list[str]  # the command-line overrides that make its config
    params: dict[str, Any]  # what a search algorithm suggested ({} for the grid)
    cfg: Resolved  # its validated config
    name: str  # its run's identity, and its run dir's name under the sweep dir
    run_dir: str

    def to_dict(self) -> dict[str, Any]:
        """The plain form of ``<run dir>/job.json`` (from which a re-run of the sweep replays it)."""
        return {**self.__dict__, "cfg": self.cfg.to_dict()}

    @classmethod
    def from_dict(cls, plain: dict[str, Any]) -> Job:
        return cls(**{**plain, "cfg": Resolved.from_dict(plain["cfg"])})
