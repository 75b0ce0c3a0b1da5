"""A cluster as users have it: `ray start --head` (its dashboard on 127.0.0.1), and a run submitted to it with
Ray's job SDK without ``ray.address``. Ray sets ``RAY_ADDRESS`` for every job; the run must train on that
cluster, not on a local one of its own."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import unused_port

pytestmark = [pytest.mark.integration, pytest.mark.workers]


@pytest.fixture
def head_node(ray_address, tmp_path, monkeypatch):
    """``ray start --head --block``, in a process group of its own (ended as a group: ``ray stop``
    would end the session's cluster too); the dashboard's URL, once its job API answers. With Ray's default
    token authentication, as the session's cluster (``ray_address``), whose start turned it on in this process."""
    from ray.job_submission import JobSubmissionClient

    gcs, dashboard = unused_port(), unused_port()
    url = f"http://127.0.0.1:{dashboard}"
    # Two clusters on this machine (the session's is the other): this one's processes ask their own state API.
    env = {**os.environ, "RAY_API_SERVER_ADDRESS": url, "RAY_AUTH_MODE": "token"}
    # The job SDK and the state API of this process too: RAY_API_SERVER_ADDRESS wins over their address argument.
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", url)
    command = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--block"]
    options = [f"--port={gcs}", f"--dashboard-port={dashboard}", "--num-cpus=3"]
    # The agent that runs jobs: Ray's port 52365 is the session cluster's
    options.append(f"--dashboard-agent-listen-port={unused_port()}")
    with open(tmp_path / "ray-start.log", "w") as log:
        head = subprocess.Popen(
            [*command, *options, "--dashboard-host=127.0.0.1", "--disable-usage-stats"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                JobSubmissionClient(url).list_jobs()
                break
            except Exception:
                assert head.poll() is None, (tmp_path / "ray-start.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the head node's job API did not answer in 90 s"
                time.sleep(1)
        yield url
    finally:  # SIGKILL: on SIGTERM the head drains for 30 s before it ends its processes
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()


@pytest.mark.long("joining a cluster in the gate: every test given ray.address; ray job submit is this one")
def test_a_submitted_job_trains_on_the_cluster_it_was_submitted_to(head_node, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient
    from ray.util.state import list_actors

    client = JobSubmissionClient(head_node)
    run_dir = tmp_path / "run"
    overrides = f"scaling.num_workers=1 trainer.max_epochs=1 hydra.run.dir={run_dir}"  # DDP across workers: elsewhere
    entrypoint = f"cd {tmp_path} && {sys.executable} -m hydra_raytrain {overrides}"
    deadline = time.monotonic() + 60
    while True:  # the job API answers a few seconds before the head's agent takes jobs
        try:
            job = client.submit_job(entrypoint=entrypoint)
            break
        except RuntimeError as error:
            assert "No available agent" in str(error) and time.monotonic() < deadline, error
            time.sleep(1)
    deadline = time.monotonic() + 240
    while (status := client.get_job_status(job)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert time.monotonic() < deadline, client.get_job_logs(job)[-3000:]
        time.sleep(2)
    logs = client.get_job_logs(job)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    assert "Ray: joined the cluster at RAY_ADDRESS=" in logs and ": 1 node, 3 CPUs" in logs, logs[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    # The run's Train workers were actors of this cluster, started by this job's driver.
    driver = client.get_job_info(job).driver_info
    workers = list_actors(address=head_node, filters=[("class_name", "=", "RayTrainWorker")], detail=True)
    assert len(workers) == 1 and {worker.job_id for worker in workers} == {driver.id}, (workers, driver)
