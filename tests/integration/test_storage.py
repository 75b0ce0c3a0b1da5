"""Ray storage beyond one local disk: an S3-compatible server on loopback, and a real 2-node Ray cluster."""

import json
import subprocess
import sys

import pyarrow.fs
import pytest
import torch

from hydra_raytrain import ConfigError, evaluate, train
from tests.conftest import ROOT, compose_config

pytestmark = [pytest.mark.integration, pytest.mark.workers]


def test_s3_storage_round_trip(ray_address, s3_endpoint, tmp_path):
    """On 1 worker: every rank's share reaching storage is test_resume's (2 workers); this one is about S3."""
    pyarrow.fs.S3FileSystem(endpoint_override=s3_endpoint, allow_bucket_creation=True).create_dir("runs-bucket")
    overrides = [
        "storage.path=s3://runs-bucket/team",
        "storage.name=s3run",
        "debug=smoke",
        "scaling.num_workers=1",
        "trainer.limit_val_batches=null",
        "dataset.test_fraction=0.1",
    ]
    train(compose_config(*overrides, "trainer.max_epochs=1"), run_dir=str(tmp_path / "first"))
    summary = train(compose_config(*overrides, "trainer.max_epochs=2"), run_dir=str(tmp_path / "second"))
    assert summary["storage"] == "s3://runs-bucket/team/s3run"
    s3, _ = pyarrow.fs.FileSystem.from_uri("s3://runs-bucket")
    stored = {info.path for info in s3.get_file_info(pyarrow.fs.FileSelector("runs-bucket/team/s3run", recursive=True))}
    assert {"runs-bucket/team/s3run/epoch_0001/model.pt", "runs-bucket/team/s3run/epoch_0002/rng_rank0.pt"} <= stored
    # The second command resumed the first's checkpoint from S3: it trained epoch 2 only.
    assert [json.loads(line)["epoch"] for line in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()] == [
        2
    ]
    # A checkpoint read back from S3 scores like the run said.
    local = tmp_path / "downloaded"
    local.mkdir()
    pyarrow.fs.copy_files(
        "runs-bucket/team/s3run/epoch_0002",
        str(local),
        source_filesystem=s3,
        destination_filesystem=pyarrow.fs.LocalFileSystem(),
    )
    assert abs(evaluate(str(local))["val_loss"] - summary["final"]["val_loss"]) <= 1e-5
    # The test split was scored on the best checkpoint, read from S3 by the driver
    tested = summary["test"]
    assert tested["checkpoint"] == f"s3://runs-bucket/team/s3run/epoch_{tested['epoch']:04d}"
    (tmp_path / "best").mkdir()
    pyarrow.fs.copy_files(tested["checkpoint"][5:], str(tmp_path / "best"), s3, pyarrow.fs.LocalFileSystem())
    assert abs(evaluate(str(tmp_path / "best"), split="test")["test_loss"] - tested["test_loss"]) <= 1e-6
    # A new run warm-started from that checkpoint on S3 (weights and optimizer state), trained with lr=0, keeps its
    # weights. In Ray Train's local mode: the workers reading S3 are the second run's.
    warm = [
        "scaling.num_workers=0",
        "debug=smoke",
        "optimizer.lr=0",
        "run.init_from=s3://runs-bucket/team/s3run/epoch_0002",
        "run.init_optimizer=true",
    ]
    train(compose_config(*warm), run_dir=str(tmp_path / "warm"))
    a = torch.load(local / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "warm" / "model.pt", weights_only=True)
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0


@pytest.mark.long("a kill/resume variant: S3 storage in the gate is the round trip")
def test_a_worker_killed_during_an_asynchronous_upload_resumes_from_the_previous_complete_checkpoint(
    ray_address, s3_endpoint, tmp_path
):
    """Checkpoints go to S3 in the background (checkpoint_upload_mode=ASYNC, the default), ~100 MB each (an MLP with
    Adam's moments). Rank 0 is SIGKILLed at the micro-batch right after step 6's checkpoint was handed to Ray (once
    step 3's is counted), while it uploads (~2.5 s here): Ray never counted it, so the restarted workers resume from
    step 3's, and the run ends as planned."""
    pyarrow.fs.S3FileSystem(endpoint_override=s3_endpoint, allow_bucket_creation=True).create_dir("async-bucket")
    summary = train(
        compose_config(
            "model=mlp",
            "model.hidden_sizes=[4096,2048]",
            "storage.path=s3://async-bucket/runs",
            "trainer.max_epochs=1",
            "trainer.limit_train_batches=9",
            "trainer.limit_val_batches=2",
            "checkpoint.every_n_steps=3",
            "failure.max_failures=1",
            "task._target_=tests.helpers.tasks.CrashOnce",
            f"+task.marker={tmp_path / 'crashed'}",
            "+task.at_step=7",
            "+task.rank=0",
            "+task.after=step_00000003",  # counted by Ray (it was, in every run measured: step 6 waited for it)
        ),
        run_dir=str(tmp_path / "run"),
    )
    assert (tmp_path / "crashed").exists()  # the worker really was killed
    assert (
        "Resuming from checkpoint step_00000003: epoch 1, after batch 3/9"
        in (tmp_path / "run" / "driver.log").read_text()
    )
    assert summary["status"] == "completed" and summary["final"]["step"] == 9
    [failure] = summary["failures"]
    assert failure["retried"] is True and failure["why"] == "a worker process died", failure
    s3, _ = pyarrow.fs.FileSystem.from_uri("s3://async-bucket")
    stored = {
        info.path.split("/", 3)[3]
        for info in s3.get_file_info(pyarrow.fs.FileSelector("async-bucket/runs", recursive=True))
        if info.type == pyarrow.fs.FileType.File
    }
    for checkpoint in ("step_00000003", "step_00000006", "epoch_0001"):  # step 6's stored again after the resume
        assert {
            f"{checkpoint}/{name}" for name in ("model.pt", "train_state.pt", "rng_rank0.pt", "rng_rank1.pt")
        } <= stored, sorted(stored)


def test_a_missing_bucket_is_refused_before_anything_starts(ray_address, s3_endpoint, tmp_path, capfd):
    with pytest.raises(ConfigError, match="storage.path='s3://no-such-bucket/x': cannot be written"):
        train(compose_config("storage.path=s3://no-such-bucket/x", "debug=smoke"), run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    # A permanent error: refused at once, not retried for storage.retry_window_s (600 s by default). The first
    # failure a retry would wait out is said at once ("is not answering"): none was.
    assert "is not answering" not in capfd.readouterr().out


MULTI_NODE = r"""
import glob, json, os, sys, threading, time
from ray.cluster_utils import Cluster
from ray.core.generated import autoscaler_pb2
import ray
from hydra import compose, initialize_config_module
import hydra_raytrain
from hydra_raytrain import cli

tmp = sys.argv[1]
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
cluster.add_node(num_cpus=1, node_ip_address="127.0.0.2")  # its own node:<ip> resource, unlike the head's
cluster.wait_for_nodes()
# the driver on the non-head node
ray.init(address=cluster.address, logging_level="WARNING", _node_ip_address="127.0.0.2")
out = {"nodes": len([n for n in ray.nodes() if n["Alive"]]), "driver_ip": ray.util.get_node_ip_address()}
shared = [f"storage.path={tmp}/shared", "storage.shared_filesystem=true"]
with initialize_config_module("hydra_raytrain.conf", version_base="1.3"):
    base = ["debug=smoke", "scaling.num_workers=2", "scaling.placement_strategy=SPREAD"]
    try:
        hydra_raytrain.train(compose("train", overrides=base), run_dir=f"{tmp}/refused")
    except hydra_raytrain.ConfigError as error:
        out["refused"] = str(error)
    out["summary"] = hydra_raytrain.train(compose("train", overrides=base + shared), run_dir=f"{tmp}/run")
# A ray_tune sweep from this driver: its trials (which write the run dirs) run on the driver's node.
sys.argv = ["hydra_raytrain", "-m", "hydra/sweeper=ray_tune", "debug=smoke", "scaling.num_workers=1",
            "optimizer.lr=1e-3,1e-2", *shared, f"hydra.sweep.dir={tmp}/sweep"]
cli.main()
results = sorted(glob.glob(f"{tmp}/sweep/tune/**/result.json", recursive=True))
out["trial_ips"] = [json.loads(open(path).readline())["node_ip"] for path in results]
out["sweep"] = [row["status"] for row in json.load(open(f"{tmp}/sweep/sweep_summary.json"))["trials"]]

# Ray drains a node of the run (what the autoscaler does on a spot reclaim's notice) in epoch 2 or 3: Ray Train's
# PreemptionWatcher tells the workers, every rank checkpoints at the next step and the run stops, preempted. The
# drained node's raylet exits once idle; the same call resumes the run on the node that replaces it.
os.environ["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] = "0.2"  # Ray's default is 5 s
os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "1"  # the test session's local cluster set 0 in our environment
spot = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.3")
cluster.wait_for_nodes()
drained = ["scaling.num_workers=3", *shared, "trainer.max_epochs=3", "trainer.batch_size=48",
           "trainer.limit_train_batches=20", "trainer.limit_val_batches=2", "logger=none",
           "task._target_=tests.helpers.tasks.Slow", "+task.seconds_per_batch=0.1"]

def drain_after_the_first_epoch():
    while not os.path.exists(f"{tmp}/drained/metrics.jsonl"):
        time.sleep(0.05)
    gcs = ray._raylet.GcsClient(address=cluster.address)  # as `ray drain-node` does
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    out["drain_accepted"] = gcs.drain_node(spot.node_id, reason, "spot instance reclaimed", 0)[0]

threading.Thread(target=drain_after_the_first_epoch, daemon=True).start()
with initialize_config_module("hydra_raytrain.conf", version_base="1.3"):
    out["drained"] = hydra_raytrain.train(compose("train", overrides=drained), run_dir=f"{tmp}/drained")
    out["spot"] = spot.node_id
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.4")
    while not any(n["Alive"] and n["NodeManagerAddress"] == "127.0.0.4" for n in ray.nodes()):
        time.sleep(0.1)
    out["resumed"] = hydra_raytrain.train(compose("train", overrides=drained), run_dir=f"{tmp}/drained")
ray.shutdown()
cluster.shutdown()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.long("multi-node: a second cluster of its own, the suite's longest test")
@pytest.mark.slow
def test_multi_node_cluster_needs_shared_storage_uses_every_node_and_stops_for_a_drained_node(tmp_path):
    """Ray's own multi-node test utility: two raylets on this machine, one CPU each, so two workers must
    land on both nodes; our package and tasks import there, and checkpoints land in the shared storage.
    The driver joins the second node (its own address, 127.0.0.2): a sweep's trials run there, beside the driver
    and its sweep dir, where Ray would otherwise place them on the head node. Then a third node joins, Ray drains
    it in the middle of a 3-worker run, which stops preempted and resumes on a fourth node."""
    done = subprocess.run(
        [sys.executable, "-c", MULTI_NODE, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    out = json.loads(lines[0][len("RESULT ") :])
    assert out["nodes"] == 2
    assert (
        "storage.path=" in out["refused"] and "2 nodes" in out["refused"] and "shared_filesystem=true" in out["refused"]
    )
    assert out["summary"]["status"] == "completed" and out["summary"]["final"]["world_size"] == 2
    assert list((tmp_path / "shared").glob("*/epoch_0001/model.pt"))
    assert out["driver_ip"] == "127.0.0.2" and out["sweep"] == ["completed", "completed"]
    assert out["trial_ips"] == ["127.0.0.2", "127.0.0.2"], out["trial_ips"]
    # The drained node: a checkpoint at the next step, the run preempted; resumed there on the new node.
    drained, resumed = out["drained"], out["resumed"]
    assert out["drain_accepted"] is True
    assert drained["status"] == "preempted" and drained["preempted_by"] == f"Ray drains node {out['spot']}", drained
    [stopped_at] = [int(p.name[5:]) for p in (tmp_path / "shared").glob("*/step_*")]
    assert 20 < stopped_at < 3 * 20 and drained["epochs_completed"] in (1, 2)
    log = (tmp_path / "drained" / "driver.log").read_text()
    assert f"Resuming from checkpoint step_{stopped_at:08d}: epoch " in log, log[-3000:]
    assert resumed["status"] == "completed" and resumed["final"]["step"] == 3 * 20
    assert resumed["final"]["world_size"] == 3
