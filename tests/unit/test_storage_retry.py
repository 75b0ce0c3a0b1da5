"""Which storage errors are retried, and the retry window, on plain callables and pyarrow's local filesystem."""

import pickle

import pyarrow.fs
import pytest

from hydra_raytrain.storage import retry
from hydra_raytrain.storage.retry import RetryingHandler, StorageUnavailable, Window, short, transient

# Messages as pyarrow's S3 filesystem raises them (taken from runs on the loopback S3 server).
REFUSED = (
    "When getting information for key 'runs/x/.validate_storage_marker' in bucket 'b': AWS Error NETWORK_CONNECTION "
    "during HeadObject operation: curlCode: 7, Could not connect to server; Details: Failed to connect to "
    "127.0.0.1 port 25047 after 0 ms: Could not connect to server"
)
NO_BUCKET = (
    "When initiating multiple part upload for key 'x' in bucket 'nobucket': AWS Error NO_SUCH_BUCKET during "
    "CreateMultipartUpload operation: The specified bucket does not exist"
)


@pytest.mark.parametrize(
    "error, retried",
    [
        (OSError(REFUSED), True),
        (OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate."), True),
        (OSError("AWS Error UNKNOWN (HTTP status 503) during PutObject operation: Service Unavailable"), True),
        (OSError("AWS Error UNKNOWN (HTTP status 500) during UploadPart operation"), True),
        (OSError("AWS Error UNKNOWN (HTTP status 429) during PutObject operation"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (TimeoutError("timed out"), True),
        (OSError(NO_BUCKET), False),
        (OSError("AWS Error ACCESS_DENIED during PutObject operation: Access Denied"), False),
        (OSError("AWS Error UNKNOWN (HTTP status 400) during CreateBucket operation: InvalidBucketName"), False),
        (OSError("AWS Error UNKNOWN (HTTP status 403) during HeadObject operation: Connection refused"), False),
        (OSError(28, "No space left on device"), False),
        (FileNotFoundError("Path does not exist 'b/k'"), False),
        (ValueError("Connection refused"), False),  # not an I/O error
    ],
)
def test_transient_errors_are_the_network_and_overloaded_servers(error, retried):
    assert transient(error) is retried


def test_the_message_leaves_out_the_codes_ray_retries_an_upload_on():
    from ray.train.v2._internal.constants import AWS_RETRYABLE_TOKENS

    text = short(OSError(REFUSED))
    assert not any(token in text for token in AWS_RETRYABLE_TOKENS)
    assert text.startswith("NETWORK_CONNECTION during HeadObject operation") and "Could not connect" in text


def flaky(failures, error=None):
    calls, error = [], error or OSError(REFUSED)

    def call():
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "done"

    return call, calls


@pytest.fixture
def quick(monkeypatch):
    """Short delays, and no outage of another test in this process's record."""
    monkeypatch.setattr(retry, "FIRST_DELAY_S", 0.01)
    monkeypatch.setattr(retry, "MAX_DELAY_S", 0.02)
    monkeypatch.setattr(Window, "_outages", {})


def test_credentials_in_a_storage_uri_are_never_shown():
    assert retry.shown("s3://KEY:SECRET@bucket/runs?secret_key=S&region=x") == "s3://***@bucket/runs"
    assert retry.shown("gs://bucket/a/b") == "gs://bucket/a/b"


def test_a_call_is_retried_through_an_outage_that_is_said_and_recorded(quick, tmp_path, capsys):
    local = pyarrow.fs.LocalFileSystem()
    window = Window("s3://b/runs", 30, str(tmp_path))
    call, calls = flaky(3)
    assert window.call("reading k", call, local) == "done" and len(calls) == 4
    out = capsys.readouterr().out
    assert "Storage s3://b/runs is not answering (reading k: NETWORK_CONNECTION" in out
    assert "Storage s3://b/runs is answering again after" in out and "(3 calls retried)" in out
    [record] = retry.read_outages(local, str(tmp_path))
    assert record["storage"] == "s3://b/runs" and record["calls_retried"] == 3 and record["seconds"] < 30


def test_past_the_window_the_call_raises_storage_unavailable(quick):
    window = Window("s3://b/runs", 0.2, None)
    call, calls = flaky(10**6)
    with pytest.raises(StorageUnavailable, match=r"storage s3://b/runs did not answer for \d+ s .*retry_window_s=0.2"):
        window.call("writing k", call, pyarrow.fs.LocalFileSystem())
    assert len(calls) > 1


def test_a_permanent_error_is_raised_at_once(quick):
    call, calls = flaky(1, OSError(NO_BUCKET))
    with pytest.raises(OSError, match="NO_SUCH_BUCKET"):
        Window("s3://nobucket", 600, None).call("writing x", call, pyarrow.fs.LocalFileSystem())
    assert len(calls) == 1


def test_the_retrying_filesystem_writes_and_reads_whole_files_and_pickles_to_the_workers(tmp_path):
    handler = RetryingHandler(pyarrow.fs.LocalFileSystem(), "file-like", 60)
    fs = pickle.loads(pickle.dumps(pyarrow.fs.PyFileSystem(handler)))
    data = bytes(range(256)) * 80000  # 20 MB: past the in-memory buffer, spooled to disk
    fs.create_dir(str(tmp_path / "a"))
    with fs.open_output_stream(str(tmp_path / "a" / "f.bin")) as out:
        out.write(data[:5])
        out.write(data[5:])
    assert (tmp_path / "a" / "f.bin").read_bytes() == data
    assert retry.inner(fs).type_name == "local" and fs.type_name == "py::retrying+local"
    handler.put_folder(str(tmp_path / "a"), str(tmp_path / "b"))  # a checkpoint's upload (``upload``)
    assert (tmp_path / "b" / "f.bin").read_bytes() == data
    with fs.open_input_file(str(tmp_path / "b" / "f.bin")) as file:  # read whole, then served from the buffer
        assert file.size() == len(data) and file.read_at(3, 5) == data[5:8]
    (tmp_path / "c").mkdir()
    pyarrow.fs.copy_files(str(tmp_path / "b"), str(tmp_path / "c"), source_filesystem=fs)  # a checkpoint's download
    assert (tmp_path / "c" / "f.bin").read_bytes() == data


def test_a_read_cut_mid_file_is_read_again_from_its_start(quick, tmp_path):
    """The connection dropped after the first chunk of a download: the file is read again, whole."""
    (tmp_path / "f.bin").write_bytes(b"abcdef" * 1000)
    local, opened = pyarrow.fs.LocalFileSystem(), []

    class Dropping:
        def __init__(self, stream):
            self.stream, self.read_bytes = stream, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.stream.close()

        def read(self, size):
            if len(opened) == 1 and self.read_bytes > 0:
                raise OSError(REFUSED)
            chunk = self.stream.read(100)
            self.read_bytes += len(chunk)
            return chunk

    class Flaky:  # a filesystem whose first download drops after 100 bytes
        def open_input_stream(self, path):
            opened.append(path)
            return Dropping(local.open_input_stream(path))

    handler = RetryingHandler(Flaky(), "s3://b/runs", 30)
    with pyarrow.fs.PyFileSystem(handler).open_input_stream(str(tmp_path / "f.bin")) as stream:
        assert stream.read() == b"abcdef" * 1000
    assert len(opened) == 2
