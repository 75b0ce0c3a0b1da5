"""Where Ray keeps a run's checkpoints: checked before any worker starts.

A local path, a shared filesystem path, or a URI that pyarrow understands (``s3://bucket/prefix``, ``gs://...``;
credentials and endpoint from the usual environment, e.g. ``AWS_ACCESS_KEY_ID`` / ``AWS_ENDPOINT_URL``).
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.storage import retry


def is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def filesystem(path: str, retry_window_s: float = 0) -> tuple[pyarrow.fs.FileSystem, str]:
    """pyarrow's filesystem of ``path`` and the path on it; a URI's calls retried through an outage of up to
    ``retry_window_s`` (``retry.py``). A local path is never retried: a full disk fails at once."""
    if is_uri(path) and retry_window_s > 0:
        return retry.retrying(path, retry_window_s)
    return pyarrow.fs.FileSystem.from_uri(path if "://" in path else f"file://{path}")


def check_storage(path: str, nodes: int, shared_filesystem: bool, retry_window_s: float = 0) -> None:
    """Refuse storage that cannot work: one node's local disk for a multi-node cluster (Ray needs every
    worker to reach the checkpoints), or a location that cannot be written (a missing bucket, no credentials:
    at once; a storage that is not answering is retried for ``retry_window_s``)."""
    if nodes > 1 and not is_uri(path) and not shared_filesystem:
        raise ConfigError(
            "storage.path",
            path,
            f"the cluster has {nodes} nodes, and Ray Train needs storage every node reaches; this is a local path.",
            "a URI such as s3://bucket/prefix, or a path on a filesystem mounted on every node with "
            "storage.shared_filesystem=true.",
        )
    try:
        fs, location = filesystem(path, retry_window_s)
        fs.create_dir(location, recursive=True)
    except Exception as error:
        reason = " ".join(str(error).split())
        raise ConfigError(
            "storage.path",
            path,
            f"cannot be written: {reason}",
            "a writable folder, or a URI whose bucket exists, with credentials in the environment.",
        ) from None


def delete(path: str, retry_window_s: float = 0) -> bool:
    """Remove a folder (local or URI) if it exists; True when something was removed."""
    fs, location = filesystem(path, retry_window_s)
    if fs.get_file_info(location).type == pyarrow.fs.FileType.NotFound:
        return False
    fs.delete_dir(location)
    return True


def checkpoint_uri(checkpoint: Any) -> str:
    """A checkpoint's place as a user names it: a local path, or a URI (``s3://bucket/...``, ``gs://...``)."""
    fs = retry.inner(checkpoint.filesystem)
    scheme = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs"}.get(getattr(fs, "type_name", "local"))
    return f"{scheme}://{checkpoint.path}" if scheme else checkpoint.path


def outages(checkpoints: str) -> list[dict[str, Any]]:
    """The storage outages a run's processes survived, as they recorded them in ``checkpoints`` (the run's folder in
    storage); none where storage is local, and none said when storage cannot be read now (not retried: the run's
    end is not held up)."""
    if not is_uri(checkpoints):
        return []
    try:
        fs, location = filesystem(checkpoints)
        return retry.read_outages(fs, location)
    except Exception:  # noqa: BLE001  (the outages were said on the terminal as they ended)
        return []
