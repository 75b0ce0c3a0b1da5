"""Storage that fails for a while: a URI storage (``s3://``, ``gs://``) whose every call retries a transient error.

Ray Train uses a run's storage from three places: each worker uploads its checkpoints (synchronously, or in a
background thread) and downloads one to resume, the controller writes and reads its checkpoint list
(``checkpoint_manager_snapshot.json``), and the driver checks the location and reads the best checkpoint. Ray
retries only the workers' uploads, three times; a failed snapshot write ends the run. So the driver hands Ray the
storage as a filesystem of its own (``RunConfig(storage_filesystem=...)``, pickled to the controller and every
worker): pyarrow's filesystem of the URI wrapped in a ``pyarrow.fs.PyFileSystem`` whose every call retries a
transient error (connection refused or reset, a timeout, an HTTP 5xx, throttling) with exponential backoff, for up
to ``storage.retry_window_s`` from the outage's first failure in that process. A file is written and read whole:
buffered (in memory, then on local disk), and sent or read again from its start after a failure. Checkpoints are
stored by ``upload`` (``ray.train.report(checkpoint_upload_fn=...)``), file by file.

A permanent error (no such bucket, access denied, a missing file) is raised at once. Past the window the call
raises ``StorageUnavailable``, naming the storage, the last error and how long it retried; the failure policy never
retries it (the window did). Each process prints one line when an outage starts and one when it ends, and records
each outage it survived in the run's storage folder (``storage_outages/``), which the driver adds to the summary.

The layers under it: pyarrow's S3 client retries each request a few times within a few seconds
(``AwsStandardS3RetryStrategy``); above it, Ray retries a worker's checkpoint upload three times.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow
import pyarrow.fs

from hydra_raytrain.config.errors import redacted

T = TypeVar("T")
OUTAGES_FOLDER = "storage_outages"
BUFFER_IN_MEMORY = 16 * 1024 * 1024  # a file larger than this is buffered on local disk
CHUNK = 8 * 1024 * 1024
FIRST_DELAY_S, MAX_DELAY_S = 1.0, 30.0

# The errors that pass: pyarrow's AWS error codes (Ray Train's AWS_RETRYABLE_TOKENS among them), Google Cloud's,
# HTTP 5xx, 408 and 429, and the socket's words for a network that is away.
TRANSIENT = re.compile(
    r"AWS Error (NETWORK_CONNECTION|SLOW_DOWN|SERVICE_UNAVAILABLE|INTERNAL_FAILURE|THROTTLING|REQUEST_TIMEOUT)"
    r"|\b(UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED)\b"  # Google Cloud Storage's (gs://)
    r"|HTTP status (5\d\d|408|429)|SlowDown|Throttl|Too Many Requests|Service ?Unavailable|RequestTimeout"
    r"|Connection (refused|reset|aborted)|Could not connect|Couldn't connect|Broken pipe|[Tt]imed? ?out"
    r"|Could not resolve|Temporary failure in name resolution|Name or service not known|Network is unreachable"
)
# What another try cannot mend, even when the message also holds a transient word.
PERMANENT = re.compile(
    r"NO_SUCH_BUCKET|NoSuchBucket|ACCESS_DENIED|AccessDenied|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH"
    r"|HTTP status 4(0[0-79]|1\d|2[0-8]|[3-9]\d)|No space left|Read-only file system"
)


class StorageUnavailable(RuntimeError):
    """The storage did not answer within ``storage.retry_window_s``. Its message avoids the AWS error codes Ray
    Train retries an upload on: that retry would wait the whole window again."""


def transient(error: BaseException) -> bool:
    """An error that another try may not meet: a network that is away, a server overloaded or failing (5xx)."""
    if isinstance(error, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if not isinstance(error, (OSError, ConnectionError, TimeoutError)):
        return False
    text = str(error)
    return bool(TRANSIENT.search(text)) and not PERMANENT.search(text)


def short(error: BaseException) -> str:
    """The error on one line, without the codes Ray Train's upload retry matches ("AWS Error NETWORK_...")."""
    text = " ".join(str(error).split()).replace("AWS Error ", "")
    text = re.sub(r"^When [^:]*: ", "", text) if " operation: " in text else text  # the operation names the call
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass
class Outage:
    started: float  # time.time(), for the record
    since: float  # time.monotonic(), for the window
    first_error: str
    calls: int = 0  # calls that failed and were tried again


class Window:
    """This process's view of one storage: whether it is in an outage, since when, and for how long to retry."""

    _lock = threading.Lock()
    _outages: dict[str, Outage] = {}  # per storage URI, per process

    def __init__(self, uri: str, seconds: float, record_dir: str | None):
        self.uri, self.seconds, self.record_dir = uri, seconds, record_dir

    def failed(self, error: BaseException, what: str) -> float:
        """Count a transient failure; the seconds the outage has lasted so far."""
        with self._lock:
            outage = self._outages.get(self.uri)
            if outage is None:
                outage = self._outages[self.uri] = Outage(time.time(), time.monotonic(), short(error))
                _say(
                    f"Storage {self.uri} is not answering ({what}: {short(error)}); retrying for up to "
                    f"{self.seconds:g} s (storage.retry_window_s)"
                )
            outage.calls += 1
            return time.monotonic() - outage.since

    def given_up(self) -> None:
        """The window ran out: the outage is not one survived (a later call in this process starts another)."""
        with self._lock:
            self._outages.pop(self.uri, None)

    def answered(self, inner: pyarrow.fs.FileSystem | None) -> None:
        """A call succeeded: an outage in progress ended. Said, and recorded in storage (a record that cannot be
        written is only said)."""
        if self.uri not in self._outages:  # the common case, without the lock
            return
        with self._lock:
            outage = self._outages.pop(self.uri, None)
        if outage is None:
            return
        lasted = time.monotonic() - outage.since
        _say(f"Storage {self.uri} is answering again after {lasted:.1f} s ({outage.calls} calls retried)")
        if self.record_dir and inner is not None:
            record = {"storage": self.uri, "started": outage.started, "seconds": round(lasted, 3),
                      "calls_retried": outage.calls, "error": outage.first_error, "host": socket.gethostname(),
                      "pid": os.getpid()}  # fmt: skip
            name = f"{int(outage.started * 1000)}-{socket.gethostname()}-{os.getpid()}.json"
            path = f"{self.record_dir}/{OUTAGES_FOLDER}/{name}"
            try:
                inner.create_dir(os.path.dirname(path), recursive=True)
                with inner.open_output_stream(path) as out:
                    out.write(json.dumps(record).encode())
            except Exception as error:  # noqa: BLE001  (the line above said it)
                _say(f"Storage {self.uri}: the outage's record was not written ({short(error)})")

    def call(self, what: str, function: Callable[[], T], inner: pyarrow.fs.FileSystem | None) -> T:
        delay = FIRST_DELAY_S
        while True:
            try:
                result = function()
            except Exception as error:
                if not transient(error):
                    raise
                lasted = self.failed(error, what)
                if lasted >= self.seconds:
                    self.given_up()
                    raise StorageUnavailable(
                        f"storage {self.uri} did not answer for {lasted:.0f} s (storage.retry_window_s="
                        f"{self.seconds:g}); last error ({what}): {short(error)}"
                    ) from None
                time.sleep(min(delay * random.uniform(0.75, 1.25), self.seconds - lasted))
                delay = min(delay * 2, MAX_DELAY_S)
                continue
            self.answered(inner)
            return result


def _say(line: str) -> None:
    print(line, flush=True)


class RetryingHandler(pyarrow.fs.FileSystemHandler):
    """``pyarrow.fs.PyFileSystem(RetryingHandler(...))``: ``inner``'s calls through ``Window.call``."""

    def __init__(self, inner: pyarrow.fs.FileSystem, uri: str, window_s: float, record_dir: str | None = None):
        self.inner, self.window = inner, Window(uri, window_s, record_dir)

    def __reduce__(self) -> tuple[Any, ...]:  # to the controller and the workers: the outage state stays here
        window = self.window
        return RetryingHandler, (self.inner, window.uri, window.seconds, window.record_dir)

    def _call(self, what: str, function: Callable[[], T]) -> T:
        return self.window.call(what, function, self.inner)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetryingHandler) and self.inner.equals(other.inner)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return f"retrying+{self.inner.type_name}"

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pyarrow.fs.FileInfo]:
        return self._call(f"reading {paths[0] if paths else ''}", lambda: self.inner.get_file_info(paths))

    def get_file_info_selector(self, selector: pyarrow.fs.FileSelector) -> list[pyarrow.fs.FileInfo]:
        return self._call(f"listing {selector.base_dir}", lambda: self.inner.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self._call(f"creating {path}", lambda: self.inner.create_dir(path, recursive=recursive))

    def delete_dir(self, path: str) -> None:
        self._call(f"deleting {path}", lambda: self.inner.delete_dir(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._call(f"deleting {path}", lambda: self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok))

    def delete_root_dir_contents(self) -> None:
        self._call("deleting /", lambda: self.inner.delete_dir_contents("/", accept_root_dir=True))

    def delete_file(self, path: str) -> None:
        self._call(f"deleting {path}", lambda: self.inner.delete_file(path))

    def move(self, src: str, dest: str) -> None:
        self._call(f"moving {src}", lambda: self.inner.move(src, dest))

    def copy_file(self, src: str, dest: str) -> None:
        self._call(f"copying {src}", lambda: self.inner.copy_file(src, dest))

    def open_input_stream(self, path: str) -> pyarrow.NativeFile:
        return pyarrow.PythonFile(self._call(f"reading {path}", lambda: self._fetch(path)), mode="r")

    def open_input_file(self, path: str) -> pyarrow.NativeFile:
        return pyarrow.PythonFile(self._call(f"reading {path}", lambda: self._fetch(path)), mode="r")

    def _fetch(self, path: str) -> Any:
        """The whole file, read again from its start after a failure: buffered (in memory, then on local disk)."""
        buffer = tempfile.SpooledTemporaryFile(max_size=BUFFER_IN_MEMORY)
        try:
            with self.inner.open_input_stream(path) as stream:
                for chunk in iter(lambda: stream.read(CHUNK), b""):
                    buffer.write(chunk)
        except BaseException:
            buffer.close()
            raise
        buffer.seek(0)
        return buffer

    def open_output_stream(self, path: str, metadata: dict[str, str] | None) -> pyarrow.NativeFile:
        return pyarrow.PythonFile(WholeWrite(self, path, metadata), mode="w")

    def put_folder(self, local: str, destination: str) -> None:
        """Store a local folder's files under ``destination``, each whole and retried (``upload``)."""
        for root, _, names in os.walk(local):
            folder = f"{destination}/{os.path.relpath(root, local).replace(os.sep, '/')}".removesuffix("/.")
            self.create_dir(folder, recursive=True)  # as Ray's upload does (on S3, a marker)
            for name in sorted(names):
                source = os.path.join(root, name)
                target = f"{destination}/{os.path.relpath(source, local).replace(os.sep, '/')}"
                self._call(f"writing {target}", functools.partial(self._put, source, target))

    def _put(self, source: str, target: str) -> None:
        with open(source, "rb") as file:
            send(file, self.inner, target, None)

    def open_append_stream(self, path: str, metadata: dict[str, str] | None) -> pyarrow.NativeFile:
        return self._call(f"appending to {path}", lambda: self.inner.open_append_stream(path, metadata=metadata))


class WholeWrite:
    """A file written to storage whole: buffered until closed, then sent (and sent again from its start after a
    transient failure, within the window). The error of a send that fails reaches a caller that closes the stream
    from Python (Ray's controller writing its checkpoint list); ``pyarrow.fs.copy_files`` drops it, so checkpoints
    are stored by ``upload``."""

    def __init__(self, handler: RetryingHandler, path: str, metadata: dict[str, str] | None):
        self.handler, self.path, self.metadata = handler, path, metadata
        self.buffer = tempfile.SpooledTemporaryFile(max_size=BUFFER_IN_MEMORY)
        self.closed = False

    def write(self, data: Any) -> int:
        return self.buffer.write(data)

    def tell(self) -> int:
        return self.buffer.tell()

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.handler._call(f"writing {self.path}", self._send)
        finally:
            self.buffer.close()

    def _send(self) -> None:
        self.buffer.seek(0)
        send(self.buffer, self.handler.inner, self.path, self.metadata)


def send(file: Any, fs: pyarrow.fs.FileSystem, path: str, metadata: dict[str, str] | None) -> None:
    """``file``'s bytes from its position to its end, as the file at ``path`` on ``fs``."""
    with fs.open_output_stream(path, metadata=metadata) as out:
        for chunk in iter(lambda: file.read(CHUNK), b""):
            out.write(chunk)


def upload(checkpoint: Any, checkpoint_dir_name: str) -> Any:
    """``ray.train.report(checkpoint_upload_fn=upload)``: a worker's checkpoint stored in the run's storage folder as
    Ray stores it (``StorageContext.persist_current_checkpoint``), each file retried whole through an outage when the
    storage is a retrying one. Ray's own upload goes through ``pyarrow.fs.copy_files``, which drops an error that a
    Python stream raises when it is closed: a file sent on close could fail unseen."""
    import ray.train

    storage = ray.train.get_context().get_storage()
    handler = getattr(storage.storage_filesystem, "handler", None)
    if not isinstance(handler, RetryingHandler):
        return storage.persist_current_checkpoint(checkpoint, checkpoint_dir_name)
    destination = f"{storage.experiment_fs_path}/{checkpoint_dir_name}"
    handler.put_folder(checkpoint.path, destination)
    return ray.train.Checkpoint(destination, filesystem=storage.storage_filesystem)


def retrying(uri: str, window_s: float, run_name: str | None = None) -> tuple[pyarrow.fs.FileSystem, str]:
    """The filesystem and path of a storage URI, its calls retried for ``window_s``; with ``run_name``, the outages
    a process survives are recorded in that run's folder (``<uri>/<run_name>/storage_outages``). Building it is
    retried too: on S3 without an endpoint, pyarrow asks the bucket's region."""
    name = shown(uri)
    inner, path = Window(name, window_s, None).call("connecting", lambda: pyarrow.fs.FileSystem.from_uri(uri), None)
    record_dir = f"{path.rstrip('/')}/{run_name}" if run_name else None
    return pyarrow.fs.PyFileSystem(RetryingHandler(inner, name, window_s, record_dir)), path


def shown(uri: str) -> str:
    """A URI as it is shown and recorded: its credentials starred (``config.errors.redacted``), its options
    (``?secret_key=...``) left out."""
    return redacted(uri.split("?", 1)[0])


def inner(fs: pyarrow.fs.FileSystem) -> pyarrow.fs.FileSystem:
    """The filesystem under a retrying one (``fs`` itself otherwise)."""
    handler = getattr(fs, "handler", None)
    return handler.inner if isinstance(handler, RetryingHandler) else fs


def read_outages(fs: pyarrow.fs.FileSystem, run_path: str) -> list[dict[str, Any]]:
    """The outages the run's processes recorded under ``<run_path>/storage_outages``, oldest first."""
    selector = pyarrow.fs.FileSelector(f"{run_path}/{OUTAGES_FOLDER}", allow_not_found=True)
    records = []
    for info in fs.get_file_info(selector):
        if info.type == pyarrow.fs.FileType.File and info.path.endswith(".json"):
            with fs.open_input_stream(info.path) as stream:
                records.append(json.loads(stream.read()))
    return sorted(records, key=lambda record: record["started"])
