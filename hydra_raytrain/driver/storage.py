"""Where Ray keeps a run's checkpoints: checked before any worker starts.

A local path, a shared filesystem path, or a URI that pyarrow understands (``s3://bucket/prefix``, ``gs://...``;
credentials and endpoint from the usual environment, e.g. ``AWS_ACCESS_KEY_ID`` / ``AWS_ENDPOINT_URL``).
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs

from hydra_raytrain.config.errors import ConfigError


def is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def filesystem(path: str) -> tuple[pyarrow.fs.FileSystem, str]:
    return pyarrow.fs.FileSystem.from_uri(path if "://" in path else f"file://{path}")


def check_storage(path: str, nodes: int, shared_filesystem: bool) -> None:
    """Refuse storage that cannot work: one node's local disk for a multi-node cluster (Ray needs every
    worker to reach the checkpoints), or a location that cannot be written (a missing bucket, no credentials)."""
    if nodes > 1 and not is_uri(path) and not shared_filesystem:
        raise ConfigError(
            "storage.path",
            path,
            f"the cluster has {nodes} nodes, and Ray Train needs storage every node reaches; this is a local path.",
            "a URI such as s3://bucket/prefix, or a path on a filesystem mounted on every node with "
            "storage.shared_filesystem=true.",
        )
    try:
        fs, location = filesystem(path)
        fs.create_dir(location, recursive=True)
    except Exception as error:
        reason = " ".join(str(error).split())
        raise ConfigError(
            "storage.path",
            path,
            f"cannot be written: {reason}",
            "a writable folder, or a URI whose bucket exists, with credentials in the environment.",
        ) from None


def delete(path: str) -> bool:
    """Remove a folder (local or URI) if it exists; True when something was removed."""
    fs, location = filesystem(path)
    if fs.get_file_info(location).type == pyarrow.fs.FileType.NotFound:
        return False
    fs.delete_dir(location)
    return True


def checkpoint_uri(checkpoint: Any) -> str:
    """A checkpoint's place as a user names it: a local path, or a URI (``s3://bucket/...``, ``gs://...``)."""
    scheme = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs"}.get(getattr(checkpoint.filesystem, "type_name", "local"))
    return f"{scheme}://{checkpoint.path}" if scheme else checkpoint.path
