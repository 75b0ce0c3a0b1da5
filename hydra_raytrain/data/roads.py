"""Which road a dataset node's data takes: built in each worker (``Splits``), or streamed by Ray Data
(``data/streamed.py``'s builders, and a table its size or ``dataset.read`` sends there: ``data/tables.py``'s
builder, ``data/table_files.py``'s ``streams_table``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra_raytrain.data import streamed, table_files, tables


def streams(node: Mapping[str, Any]) -> bool:
    """Whether Ray Data streams the data of a dataset node (its ``_target_`` and settings)."""
    from hydra.utils import get_object

    builder = get_object(node["_target_"])
    if getattr(builder, "__module__", None) == streamed.__name__:
        return True
    return builder is tables.table and table_files.streams_table(
        node["path"], node.get("read", "auto"), node.get("memory_limit_mb", 1024)
    )
