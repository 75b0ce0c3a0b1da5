"""One trial of a sweep, as the sweep composes, checks, runs, records and replays it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydra_raytrain.config.redact import masked, redact_text, redact_tree, unmasked
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

    def saved(self) -> dict[str, Any]:
        """``to_dict`` as ``job.json`` holds it: its config and overrides with their secrets ``***``
        (config/redact.py); ``hidden`` are the values that hides, which the trial gets in memory."""
        return {
            **self.to_dict(),
            "cfg": redact_tree(self.cfg.to_dict()),
            "overrides": [redact_text(override) for override in self.overrides],
        }

    def hidden(self) -> dict[tuple[Any, ...], Any]:
        """The values of its config that ``saved`` writes ``***``, by their paths."""
        plain = self.cfg.to_dict()
        return masked(plain, redact_tree(plain))

    @classmethod
    def from_dict(cls, plain: dict[str, Any], hidden: Mapping[tuple[Any, ...], Any] | None = None) -> Job:
        """A job from its plain form; ``hidden``: the values its saved config hides, put back."""
        cfg = unmasked(plain["cfg"], hidden) if hidden else plain["cfg"]
        return cls(**{**plain, "cfg": Resolved.from_dict(cfg)})
