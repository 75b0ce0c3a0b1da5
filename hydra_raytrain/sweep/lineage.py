"""A PBT trial's history: its exploits, one JSON line each in ``<trial run dir>/pbt.jsonl`` (sweep/pbt.py writes
them; the sweep's results read them). Import-light: no Ray."""

from __future__ import annotations

import json
import os
from typing import Any

LINEAGE_FILE = "pbt.jsonl"


def read_lineage(run_dir: str) -> list[dict[str, Any]]:
    """The trial's exploits, oldest first (``pbt.jsonl``)."""
    path = os.path.join(run_dir, LINEAGE_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as file:
        return [json.loads(line) for line in file if line.strip()]


def append_lineage(run_dir: str, record: dict[str, Any]) -> None:
    with open(os.path.join(run_dir, LINEAGE_FILE), "a") as file:
        file.write(json.dumps(record) + "\n")
        file.flush()
        os.fsync(file.fileno())


def describe(record: dict[str, Any]) -> str:
    """One exploit in a line: the generation, the donor's epoch, trial and step, and each swept key from the
    trial's value before, through the donor's (which the explore step perturbed), to the new one:
    ``g1 epoch 2: #3 step 20, optimizer.lr 1e-06 (#3: 0.003) -> 0.0036``."""
    donor = record.get("donor_values") or {}
    changes = ", ".join(
        f"{key} {record['before'].get(key)}"
        + (f" (#{record['donor']}: {donor[key]})" if key in donor and donor[key] != record["before"].get(key) else "")
        + f" -> {value}"
        for key, value in record["after"].items()
    )
    return f"g{record['generation']} epoch {record['epoch']}: #{record['donor']} step {record['step']}" + (
        f", {changes}" if changes else ""
    )


def bare(key: str) -> str:
    """A swept key without Hydra's ``+`` / ``~`` prefix."""
    return key.lstrip("+~")


def typed(key: str, value: Any) -> Any:
    """A choice's value string as Hydra reads it on the command line (``1e-3`` a float, ``[0.9,0.99]`` a list)."""
    if not isinstance(value, str):
        return value
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(f"{bare(key)}={value}").value()


def final_values(lineage: list[dict[str, Any]]) -> dict[str, Any]:
    """The swept keys' values the trial ended with (its last exploit's); {} when it was never exploited."""
    return dict(lineage[-1]["after"]) if lineage else {}
