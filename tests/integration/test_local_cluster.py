"""Local clusters started side by side on one machine keep their own state API."""

import os
import subprocess
import sys

import pytest

from hydra_raytrain.runtime.host import machine_cores
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.workers]

# Two commands started together: Ray's dashboard port looks free when this one checks it, and another
# process holds it by the time this cluster's dashboard starts.
RACE = """
import os, socket, ray
from hydra_raytrain.runtime import reach
from hydra_raytrain.driver import cluster

holder, checked, real = socket.socket(), [], reach.port_is_free
def racy(port):
    checked.append(port)
    if len(checked) == 1:
        try:
            holder.bind(("127.0.0.1", port)); holder.listen()
        except OSError:
            pass  # already held (the test session's cluster's dashboard): the same situation
        return True
    return real(port)
reach.port_is_free = racy
from hydra_raytrain.config.schema import RayConfig
# ray.address=local as the preflight resolves it (None) while RAY_ADDRESS names a cluster: a local cluster it is
cluster.connect(RayConfig(address=None, logging_level="ERROR"), cluster.ResourceRequest(1, {"CPU": 1}))
assert cluster.started_here(), ray.get_runtime_context().gcs_address
url = ray._private.worker.get_dashboard_url()
assert url and os.environ["RAY_API_SERVER_ADDRESS"] == "http://" + url, (url, os.environ["RAY_API_SERVER_ADDRESS"])
assert url.rsplit(":", 1)[1] != str(reach.DASHBOARD_PORT)
from ray.util.state import list_nodes
print("state API nodes:", len(list_nodes(limit=5)))
(raylet,) = ray._private.worker._global_node.all_processes["raylet"]
with open(f"/proc/{raylet.process.pid}/environ", "rb") as environ:
    print("raylet:", [v.decode() for v in environ.read().split(b"\\0") if v.startswith(b"RAY_worker_")])
"""


@pytest.mark.long("a start-up clash: the local cluster's start is in the gate (test_cli's default_run)")
def test_a_dashboard_port_taken_at_start_up_restarts_the_cluster_on_a_free_one(tmp_path):
    """Else this cluster's processes would ask the other cluster's state API about their own actors (Ray Train's
    placement-group cleaner would find its controller missing there). Also: ``ray.address=local`` (resolved to None)
    starts a local cluster while RAY_ADDRESS names another, where nothing answers."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RAY_worker_")}
    done = subprocess.run(
        [sys.executable, "-c", RACE],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        env={**inherited, "PYTHONPATH": ROOT, "RAY_ADDRESS": "127.0.0.1:1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "state API nodes: 1" in done.stdout
    # The cluster's raylet starts its worker processes at niceness 0, at least 8 at a time (hydra_raytrain's
    # local cluster settings, not this test session's: the command's environment does not hold them)
    concurrency = max(machine_cores(), 8)
    assert f"raylet: ['RAY_worker_niceness=0', 'RAY_worker_maximum_startup_concurrency={concurrency}']" in done.stdout
