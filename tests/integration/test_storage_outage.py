"""Storage that fails for a while: the network to the loopback S3 server cut (the session's TCP proxy in front of
it, ``CuttableProxy``) while a run trains on it, on the session's Ray cluster."""

import json
import threading
import time

import pyarrow.fs
import pytest

from hydra_raytrain import train
from hydra_raytrain.driver.run import TrainingFailed
from hydra_raytrain.storage import retry
from tests.conftest import compose_config

pytestmark = pytest.mark.integration

BUCKET = "outage-bucket"
# One worker: what meets the outage is the storage, whichever rank's call it is.
RUN = (
    "scaling.num_workers=1",
    "trainer.max_epochs=12",
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=2",
    "logger=none",
)


@pytest.fixture(scope="module")
def bucket(s3_endpoint):
    pyarrow.fs.S3FileSystem(endpoint_override=s3_endpoint, allow_bucket_creation=True).create_dir(BUCKET)
    return f"s3://{BUCKET}"


@pytest.fixture(scope="module")
def uninterrupted(ray_address, tmp_path_factory):
    """The same run on local storage: what every run here must end with."""
    return train(compose_config(*RUN), run_dir=str(tmp_path_factory.mktemp("local") / "run"))


def epochs(run_dir):
    with open(f"{run_dir}/metrics.jsonl") as file:
        return [json.loads(line)["epoch"] for line in file]


def cut_after_epoch(network, run_dir, epoch, seconds=None):
    """A thread that cuts the network once ``epoch`` is in the run's metrics.jsonl, and brings it back ``seconds``
    later (never, when None). Returns the thread, the time of the cut (a list, filled then), and an event that stops
    a thread that has not cut yet."""
    cut_at, stop = [], threading.Event()

    def watch():
        while not stop.wait(0.05):
            try:
                if len(epochs(run_dir)) >= epoch:
                    break
            except (OSError, ValueError):
                pass
        else:
            return
        network.cut()
        cut_at.append(time.monotonic())
        if seconds is not None:
            time.sleep(seconds)
            network.restore()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, cut_at, stop


def same_end(summary, uninterrupted):
    for key in ("train_loss", "val_loss", "val_accuracy"):
        assert abs(summary["final"][key] - uninterrupted["final"][key]) <= 1e-6, key


@pytest.mark.long("the outage matrix (with the fixture's uninterrupted run): the gate's budget")
@pytest.mark.workers
def test_a_run_survives_twenty_seconds_without_its_storage(bucket, s3_network, uninterrupted, tmp_path):
    run_dir = str(tmp_path / "run")
    watcher, cut_at, stop = cut_after_epoch(s3_network, run_dir, epoch=2, seconds=20)
    try:
        summary = train(compose_config(*RUN, f"storage.path={bucket}/blip"), run_dir=run_dir)
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert cut_at, "the run ended before the network was cut"
    assert summary["status"] == "completed" and epochs(run_dir) == list(range(1, 13))
    same_end(summary, uninterrupted)
    # The processes that met the outage said so, and recorded it in the run's storage for the summary.
    log = (tmp_path / "run" / "driver.log").read_text()
    assert f"Storage {bucket}/blip is not answering" in log and f"Storage {bucket}/blip is answering again" in log
    outages = summary["storage_outages"]
    assert outages and all(outage["storage"] == f"{bucket}/blip" and outage["seconds"] <= 60 for outage in outages)
    assert max(outage["seconds"] for outage in outages) >= 15, outages
    assert summary["failures"] == []  # nothing was restarted


@pytest.mark.long("the outage matrix: the 20 s outage is in the gate")
@pytest.mark.workers
def test_storage_away_past_the_window_ends_the_run_clearly_and_the_same_command_resumes(
    bucket, s3_network, uninterrupted, tmp_path
):
    run_dir = str(tmp_path / "run")
    overrides = (*RUN, f"storage.path={bucket}/away", "storage.retry_window_s=8", "failure.max_failures=3")
    watcher, cut_at, stop = cut_after_epoch(s3_network, run_dir, epoch=2)
    try:
        with pytest.raises(TrainingFailed) as failed:
            train(compose_config(*overrides), run_dir=run_dir)
    finally:
        stop.set()
        watcher.join(timeout=60)
        if cut_at:
            s3_network.restore()
    message = str(failed.value)
    assert f"storage {bucket}/away did not answer for" in message and "storage.retry_window_s=8" in message, message
    assert "Could not connect to server" in message, message  # the last error
    # The call that gave up had retried for the window, once: not the window again after each of Ray's restarts.
    lasted = int(message.split(f"storage {bucket}/away did not answer for ")[1].split(" s ")[0])
    assert 8 <= lasted < 2 * 8, message
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and f"storage {bucket}/away did not answer for" in summary["error"]
    # The window was the retry, not Ray's three restarts too. A worker's call or the controller's (writing its
    # checkpoint list: not a worker failure) may be the one whose window ran out first.
    assert len(summary["failures"]) <= 1, summary["failures"]
    assert all(not f["retried"] and "storage.retry_window_s" in f["why"] for f in summary["failures"])
    # Storage back: the same command resumes from the last checkpoint completed before the outage.
    resumed = train(compose_config(*overrides), run_dir=run_dir)
    log = (tmp_path / "run" / "driver.log").read_text()
    assert "Resuming from checkpoint epoch_000" in log
    assert resumed["status"] == "completed" and epochs(run_dir) == list(range(1, 13))
    same_end(resumed, uninterrupted)


@pytest.mark.long("the outage matrix: the 20 s outage is in the gate")
@pytest.mark.parametrize(
    "status, code, reported, waits",
    [
        ("503 Slow Down", "SlowDown", "SLOW_DOWN", True),
        ("500 Internal Server Error", "InternalError", "INTERNAL_FAILURE", True),
        ("403 Forbidden", "AccessDenied", "ACCESS_DENIED", False),
    ],  # fmt: skip
)
def test_a_throttling_or_failing_server_is_waited_for_and_a_refusal_is_not(
    bucket, s3_network, status, code, reported, waits
):
    """The S3 server's own answers, as pyarrow reports them (``reported``): every request answered ``status`` for
    10 s, longer than pyarrow's S3 client retries a request by itself (a 5 s throttle it can ride out alone)."""
    fs, path = retry.retrying(f"{bucket}/answers", 60, run_name=code)
    data = bytes(range(256)) * 1000
    s3_network.throttle(status, code)
    back = threading.Timer(10, s3_network.restore)
    back.start()
    try:
        if not waits:
            with pytest.raises(OSError, match=reported):
                with fs.open_output_stream(f"{path}/{code}/file.bin") as out:
                    out.write(data)
            assert s3_network.refused_once_seen() == 1  # asked once: not retried
            back.cancel()
            s3_network.restore()
            return
        with fs.open_output_stream(f"{path}/{code}/file.bin") as out:
            out.write(data)
        # Every request was answered with the error until the server came back: the write is stored (read back
        # below), so it was sent again after several refusals.
        assert s3_network.refused >= 2, s3_network.refused
    finally:
        back.join()
    with fs.open_input_stream(f"{path}/{code}/file.bin") as stream:
        assert stream.read() == data
    [outage] = retry.read_outages(fs, f"{path}/{code}")
    assert outage["calls_retried"] >= 1 and outage["seconds"] >= 3 and reported in outage["error"], outage
