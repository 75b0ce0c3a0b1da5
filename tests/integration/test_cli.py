"""The real CLI: the embedded default, user code in workers, and every kind of bad input."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch
from mlflow.tracking import MlflowClient
from PIL import Image

from tests.conftest import ROOT, run_cli, unused_port
from tests.helpers.data import write_images
from tests.helpers.serving import ask, serving
from tests.helpers.text import write_jsonl, write_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def default_run(ray_address, tmp_path_factory):
    """`python -m hydra_raytrain` exactly as a user types it, run once for the tests below: it starts its own local
    cluster, 2 workers, while another Ray instance (the test session's, ``ray_address``) runs on this machine."""
    folder = tmp_path_factory.mktemp("default")
    started = time.time()
    done = run_cli(["hydra.run.dir=run", "trainer.progress_bar=true"], cwd=str(folder))
    print(f"embedded default: {time.time() - started:.1f}s wall")
    assert done.returncode == 0, done.stderr[-3000:]
    return done, folder / "run"


@pytest.mark.workers
def test_embedded_default_meets_the_accuracy_bar(default_run):
    _, run_dir = default_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_completed"] == 12
    assert summary["final"]["val_accuracy"] >= 0.95
    assert summary["final"]["world_size"] == 2


@pytest.mark.workers
def test_the_default_run_exports_and_each_export_computes_what_the_model_does(default_run, tmp_path):
    """ONNX through the CLI (ONNX Runtime on real validation digits against load_model), safetensors and a
    refused export in process; an unfinished run is refused by name, and a refusal leaves no file."""
    import onnxruntime
    from hydra.utils import instantiate

    from hydra_raytrain import load_model
    from hydra_raytrain.config import ConfigError
    from hydra_raytrain.inference.export import ExportRefused, export

    _, run_dir = default_run
    done = subprocess.run(
        [sys.executable, "-m", "hydra_raytrain.export", str(run_dir), "--format", "onnx"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    onnx_file = run_dir / "export" / "model.onnx"
    assert f"onnx: {onnx_file} (max abs diff from the model" in done.stdout
    described = json.loads((run_dir / "export" / "model.onnx.json").read_text())
    assert described["input"] == {"name": "input", "shape": ["batch", 1, 8, 8], "dtype": "float32"}
    assert described["output"]["shape"] == ["batch", 10] and described["max_abs_diff"] <= 1e-4
    config = json.loads((run_dir / "config.json").read_text())
    val = instantiate(config["dataset"], _convert_="all").val
    x = torch.stack([val[i][0] for i in range(5)])  # 5 samples: the export's batch axis is dynamic
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = load_model(str(run_dir))(x)
    assert torch.allclose(torch.from_numpy(session.run(None, {"input": x.numpy()})[0]), expected, atol=1e-5)

    weights = tmp_path / "w.safetensors"
    assert export(str(run_dir), "safetensors", str(weights))["max_abs_diff"] == 0.0 and weights.exists()
    with pytest.raises(ExportRefused, match="differs from the model by up to"):
        export(str(run_dir), "onnx", str(tmp_path / "strict.onnx"), tolerance=0.0)
    assert not (tmp_path / "strict.onnx").exists() and not (tmp_path / "strict.onnx.json").exists()
    good = onnx_file.read_bytes(), (run_dir / "export" / "model.onnx.json").read_text()
    with pytest.raises(ExportRefused, match="differs from the model by up to"):  # over the good export
        export(str(run_dir), "onnx", tolerance=0.0)
    assert (onnx_file.read_bytes(), (run_dir / "export" / "model.onnx.json").read_text()) == good  # kept whole
    assert sorted(p.name for p in (run_dir / "export").iterdir()) == ["model.onnx", "model.onnx.json"]  # no leftover
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    for name in ("config.json", "summary.json"):
        (unfinished / name).write_text((run_dir / name).read_text().replace('"completed"', '"failed"'))
    with pytest.raises(ConfigError, match=r"is not a finished run \(summary.json: status 'failed', no model.pt\)"):
        export(str(unfinished), "torch_export")
    assert not (unfinished / "export").exists()


@pytest.mark.workers
def test_the_default_run_predicts_its_validation_rows_as_load_model_does(default_run, ray_address, tmp_path):
    """python -m hydra_raytrain.predict on the embedded default (the bundled digits, input_shape [1, 8, 8]):
    its validation samples written as one Parquet file, each row's 64 values in a `features` list column beside an
    id and the label; 2 model actors on the session's cluster predict every row as load_model does, row for row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from hydra.utils import instantiate

    from hydra_raytrain import load_model

    _, run_dir = default_run
    config = json.loads((run_dir / "config.json").read_text())
    val = instantiate(config["dataset"], _convert_="all").val
    x, y = (torch.stack([val[i][n] for i in range(len(val))]) for n in (0, 1))
    ids = np.arange(len(val)) * 7 + 3  # the user's own keys
    rows = pa.table({"id": ids, "features": list(x.reshape(len(x), 64).numpy()), "label": y.numpy()})
    pq.write_table(rows, tmp_path / "val.parquet", row_group_size=100)
    (tmp_path / ".predictions.partial").mkdir()  # what a killed predict left: cleared, never part of the output
    pq.write_table(rows.slice(0, 5), tmp_path / ".predictions.partial" / "killed.parquet")

    def predict(output):
        return subprocess.run(
            [sys.executable, "-m", "hydra_raytrain.predict", str(run_dir), "val.parquet", "--output", output]
            + ["--num-workers", "2", "--address", ray_address],
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
            env={**os.environ, "PYTHONPATH": ROOT},
            timeout=300,
        )

    done = predict("predictions")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Predicted {len(val)} rows in" in done.stdout
    # Written beside it and renamed into place, marked complete (_SUCCESS, as Spark's jobs do), nothing else left
    written = sorted(p.name for p in (tmp_path / "predictions").iterdir())
    assert "_SUCCESS" in written and ".lock" not in written and not (tmp_path / ".predictions.partial").exists()
    predicted = pq.read_table(tmp_path / "predictions").to_pydict()
    assert set(predicted) == {"id", "label", "prediction", "probabilities"} and sorted(predicted["id"]) == list(ids)
    order = [(key - 3) // 7 for key in predicted["id"]]
    with torch.no_grad():
        expected = torch.softmax(load_model(str(run_dir))(x[order]), dim=1)
    assert torch.allclose(torch.tensor(predicted["probabilities"]), expected, atol=1e-6)
    assert predicted["prediction"] == expected.argmax(dim=1).tolist()
    assert predicted["label"] == y[order].tolist()  # carried through
    # An output another predict is writing is refused at once, naming it (exit 1), and left to it
    from hydra_raytrain.storage.locks import holding

    with holding(str(tmp_path / ".busy.partial"), "a predict writes it", "Wait for it to end."):
        busy = predict("busy")
        assert os.listdir(tmp_path / ".busy.partial") == [".lock"]
    assert busy.returncode == 1 and not (tmp_path / "busy").exists(), busy.stderr[-3000:]
    assert f"Cannot predict: {tmp_path / '.busy.partial'} is in use: a predict writes it by pid {os.getpid()}" in (
        busy.stderr
    )


def malformed_requests_get_a_4xx_and_one_line(port):
    for method, path, body, code, reason in [
        ("POST", "/predict", b"{not json", 400, "the body is not JSON"),
        ("POST", "/predict", b'{"inputs": [[1, 2, 3]]}', 422, "each sample must have shape [1, 8, 8]"),
        ("POST", "/predict", json.dumps({"inputs": [[[[0] * 8] * 8]] * 1025}).encode(), 413, "at most 1024"),
        ("POST", "/predict", b'{"inputs": ' + b"[" * 10**5 + b"]" * 10**5 + b"}", 400, "nests too deep"),
        ("POST", "/predict", json.dumps({"inputs": [[[[3e38] * 8] * 8]]}).encode(), 422, "output for these"),
        ("GET", "/predict", None, 405, "Method Not Allowed"),
        ("GET", "/docs", None, 404, "Not Found"),  # the API's pages: off unless --docs
        ("GET", "/openapi.json", None, 404, "Not Found"),
        ("GET", "/v1/models", None, 404, "not a causal language model's run: POST /predict answers it"),
        ("POST", "/v1/chat/completions", b"{}", 404, '"type":"not_found_error"'),  # OpenAI's error object
    ]:
        status, text = ask(port, method, path, body)
        assert (status, reason in text, "Traceback" in text) == (code, True, False), (path, (body or b"")[:80], text)


def held_up_while_a_big_body_arrives(port, x, expected):
    """A client posts a 32 MB body while 8 others ask /health and /predict: each of theirs is answered within 1 s
    and rightly, the big one gets 413 (over --max-body-mb's 16 MB, before it is parsed), and the replica that
    answered is the one that answers after (nothing restarted)."""
    from concurrent.futures import ThreadPoolExecutor

    from ray.util.state import list_actors

    def replicas():
        alive = list_actors(filters=[("state", "=", "ALIVE")])
        return sorted((a.actor_id, a.pid) for a in alive if "ServeReplica" in (a.class_name or ""))

    before = replicas()
    sample = json.dumps(x[0].tolist()).encode()
    big = b'{"inputs": [' + b",".join([sample] * (32 * 2**20 // len(sample) + 1)) + b"]}"
    assert len(big) >= 32 * 2**20

    def small(i):
        started = time.time()
        status, text = ask(
            port,
            *(
                ("GET", "/health")
                if i % 2
                else ("POST", "/predict", json.dumps({"inputs": [x[i % 24].tolist()]}).encode())
            ),
        )
        return status, text, time.time() - started, i

    with ThreadPoolExecutor(9) as clients:
        posted = clients.submit(ask, port, "POST", "/predict", big)
        answers = list(clients.map(small, range(40)))  # 8 clients at a time while the big body goes in
        status, text = posted.result(timeout=120)
    assert status == 413 and "at most 16,777,216 bytes a request (--max-body-mb)" in text, text[:300]
    assert max(seconds for _, _, seconds, _ in answers) <= 1.0, sorted(s for _, _, s, _ in answers)[-5:]
    for status, text, _, i in answers:
        assert status == 200, text
        if i % 2 == 0:
            assert json.loads(text)["predictions"] == [expected[i % 24].argmax().item()]
    assert replicas() == before and len(before) == 1


@pytest.mark.workers
def test_the_default_run_is_served_over_http_and_stops_on_sigterm(default_run, ray_address, tmp_path):
    """python -m hydra_raytrain.serve on the session's cluster, asked by real HTTP requests on 127.0.0.1: answers
    equal load_model's on validation digits, 8 concurrent clients each get their own answers, every malformed
    request gets a 4xx and one line, and SIGTERM ends it (exit 0, the port closed)."""
    from concurrent.futures import ThreadPoolExecutor

    from hydra.utils import instantiate

    from hydra_raytrain import load_model

    _, run_dir = default_run
    port = unused_port()
    command = [sys.executable, "-m", "hydra_raytrain.serve", str(run_dir), "--port", str(port)]
    with serving([*command, "--address", ray_address], tmp_path, port) as server:
        described = json.loads(server.health)
        assert described == {
            "status": "ready",
            "run": "run",
            "input_shape": [1, 8, 8],
            "num_outputs": 10,
            "classes": None,
        }

        config = json.loads((run_dir / "config.json").read_text())
        val = instantiate(config["dataset"], _convert_="all").val
        x = torch.stack([val[i][0] for i in range(24)])
        with torch.no_grad():
            expected = torch.softmax(load_model(str(run_dir))(x), dim=1)
        status, text = ask(port, "POST", "/predict", json.dumps({"inputs": x[:5].tolist()}).encode())
        assert status == 200, text
        answered = json.loads(text)
        assert answered["predictions"] == expected[:5].argmax(dim=1).tolist()
        assert torch.allclose(torch.tensor(answered["probabilities"]), expected[:5], atol=1e-5)

        def one(i: int) -> list[float]:  # 8 clients at once, each its own sample: answers reach their own asker
            status, text = ask(port, "POST", "/predict", json.dumps({"inputs": x[i : i + 1].tolist()}).encode())
            assert status == 200, text
            return json.loads(text)["probabilities"][0]

        with ThreadPoolExecutor(8) as clients:
            concurrent = torch.tensor(list(clients.map(one, range(24))))
        assert torch.allclose(concurrent, expected, atol=1e-5)

        malformed_requests_get_a_4xx_and_one_line(port)
        held_up_while_a_big_body_arrives(port, x, expected)
    printed, errors = server.printed, server.errors
    assert server.process.returncode == 0, errors.read_text()[-3000:]
    assert (
        printed[0].startswith(f"Serving {run_dir} at http://127.0.0.1:{port}/predict (POST)")
        and "Stopping.\n" in printed
    )
    with pytest.raises(ConnectionRefusedError):
        ask(port, "GET", "/health")


@pytest.mark.workers
def test_one_console_script_runs_every_command_and_reaches_ray_by_one_rule(default_run, tmp_path):
    """`hydra-raytrain COMMAND ...` (the installed console script) runs each command in its own words: evaluate
    and check succeed, a missing folder is refused as `hydra-raytrain evaluate`; predict and serve reach Ray by the
    training command's rule: `--address`, else RAY_ADDRESS, each named when no cluster answers there (exit 2,
    within seconds: no Ray started)."""
    _, run_dir = default_run
    script = os.path.join(os.path.dirname(sys.executable), "hydra-raytrain")
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("RAY_ADDRESS", None)

    def command(*args, **extra):
        return subprocess.run(
            [script, *args], capture_output=True, text=True, cwd=str(tmp_path), env={**env, **extra}, timeout=180
        )

    evaluated = command("evaluate", str(run_dir))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    written = json.loads((run_dir / "evaluation.json").read_text())
    assert written["val_accuracy"] == pytest.approx(summary["final"]["val_accuracy"], abs=1e-6)
    missing = command("evaluate", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and f"hydra-raytrain evaluate: error: {tmp_path / 'nowhere'}: no such folder" in (
        missing.stderr
    )
    checked = command("check", "model=mlp")
    assert checked.returncode == 0 and checked.stdout.startswith("ok   model=mlp"), checked.stderr[-3000:]
    port = unused_port()  # nothing listens there
    rows = tmp_path / "rows.parquet"
    rows.write_bytes(b"")
    predicted = command("predict", str(run_dir), str(rows), "--output", "out", "--address", f"127.0.0.1:{port}")
    assert predicted.returncode == 2, predicted.stderr[-3000:]
    assert predicted.stderr.startswith(f"Cannot predict: --address='127.0.0.1:{port}': no Ray cluster answers there")
    served = command("serve", str(run_dir), RAY_ADDRESS=f"127.0.0.1:{port}")
    assert served.returncode == 2, served.stderr[-3000:]
    assert served.stderr.startswith(f"Cannot serve this run: RAY_ADDRESS='127.0.0.1:{port}': no Ray cluster answers")
    assert not (tmp_path / "out").exists()


def test_help_is_the_projects_page_and_cfg_job_still_prints_the_config(tmp_path):
    """--help says what the program does, its commands, its groups (each option, one line a group), the most used
    overrides and where the docs are; not Hydra's "powered by" page with the whole config (--cfg job has it)."""
    helped = run_cli(["--help"], cwd=str(tmp_path))
    assert helped.returncode == 0, helped.stderr[-3000:]
    page = helped.stdout
    assert page.startswith("hydra-raytrain: train PyTorch models declared in Hydra configs, with DDP")
    for command in ("check", "evaluate", "export", "predict", "serve"):
        assert f"hydra-raytrain {command} " in page, command
    assert (
        "\nmodel: causal_lm, dcgan, huggingface, lit_classifier, mlp, resnet18" in page
        and "\nlogger: mlflow, none" in page
    )
    assert "scaling.num_workers=4" in page and "Docs: README.md and docs/" in page and "--cfg job" in page
    assert "powered by Hydra" not in page and "train_schema" not in page and "max_epochs: 12" not in page
    shown = run_cli(["--cfg", "job"], cwd=str(tmp_path))
    assert shown.returncode == 0 and "max_epochs: 12" in shown.stdout and not (tmp_path / "outputs").exists()


@pytest.mark.workers
def test_a_run_writes_the_output_contract(default_run):
    done, run_dir = default_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (run_dir / ".hydra" / "config.yaml").exists() and (run_dir / "model.pt").exists()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 12
    metrics = {"epoch", "train_loss", "val_loss", "val_accuracy", "samples_per_second", "epoch_seconds"}
    assert metrics <= json.loads(lines[0]).keys()
    assert {"status", "epochs_completed", "final", "best", "run_dir", "storage"} <= summary.keys()
    assert summary["run_dir"] == str(run_dir) and os.path.isdir(summary["storage"])
    origin = summary["provenance"]  # where the run came from: the command as typed, versions, host
    assert origin["command"] == "python -m hydra_raytrain hydra.run.dir=run trainer.progress_bar=true"
    assert origin["git"] is None and origin["launch_dir"] == str(run_dir.parent)  # a temporary folder: no repository
    assert origin["versions"]["torch"] == torch.__version__ and origin["versions"]["hydra_raytrain"]
    assert Image.open(run_dir / "curves.png").format == "PNG"


@pytest.mark.workers
def test_the_terminal_shows_epochs_a_progress_bar_and_a_summary_but_no_ray_noise(default_run):
    done, run_dir = default_run
    assert f"Run dir: {run_dir}" in done.stdout
    assert "hydra_raytrain: completed" in done.stdout and "best (val_accuracy, epoch" in done.stdout  # the table
    # One line per epoch, and rank 0's progress bar drawn by the driver.
    assert all(f"epoch {n}/12  train_accuracy" in done.stdout for n in range(1, 13))
    # How the workers were sized, once: 2 workers share this machine's cores; the digits sit on the device.
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert done.stdout.count("Workers: 2 x") == 1
    assert f"Workers: 2 x {share} CPU" in done.stdout and "data on cpu as tensors" in done.stdout
    assert "epoch 12/12: 100%" in done.stderr and "batch/s" in done.stderr
    # None of Ray Train's per-report INFO lines. Ray Train's placement-group cleaner reached this run's own
    # cluster, not "multiple active Ray instances", and the preemption watcher (nothing to watch on one local
    # node) logged no ERROR line.
    output = done.stdout + done.stderr
    assert "Reporting training result" not in output and "Moving model to device" not in output
    assert "Traceback" not in output and "multiple active Ray instances" not in output
    assert "PreemptionWatcher" not in output


@pytest.mark.workers
def test_the_driver_and_worker_logs_stay_on_disk(default_run):
    """The driver's terminal, and every worker's and the controller's stdout/stderr (copies, not links)."""
    _, run_dir = default_run
    assert "epoch 12/12  train_accuracy" in (run_dir / "driver.log").read_text()
    kept = sorted(p.name.split("-pid")[0] + p.suffix for p in (run_dir / "logs").iterdir())
    assert kept == ["controller.err", "controller.out", "rank0.err", "rank0.out", "rank1.err", "rank1.out"]
    assert not any(p.is_symlink() for p in (run_dir / "logs").iterdir())


@pytest.mark.workers
@pytest.mark.long("plain multirun in the gate: test_mlflow's MLFLOW_RUN_ID multirun; own-cluster sizing: default_run")
def test_a_plain_multirun_shares_one_local_cluster_sizes_each_job_and_keeps_the_cleaners_warnings_off(tmp_path):
    """Hydra's basic launcher: jobs one after another in one process, on the local cluster the first one started,
    each in the sweep dir its command names (and, with logger=mlflow, nested in the sweep's MLflow run).
    ray.include_dashboard=false: no state API, which Ray Train's placement-group cleaner asks every few seconds
    ("Failed to query Ray Train Controller actor state" each time, a whole run long). On a local cluster it has
    nothing to clean (the cluster ends with the command): its warnings stay off the console."""
    overrides = ["ray.include_dashboard=false", "debug=smoke", "scaling.num_workers=1", "trainer.seed=0,1"]
    done = run_cli(["-m", *overrides, "logger=mlflow"], cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    # One sweep dir (named by the command's hash) holds the sweep's multirun.yaml and both jobs' run dirs.
    [sweep] = (tmp_path / "outputs" / "multirun").iterdir()
    assert (sweep / "multirun.yaml").is_file() and len(list(sweep.glob("*/summary.json"))) == 2
    summaries = [json.loads(path.read_text()) for path in sorted(sweep.glob("*/summary.json"))]
    assert [summary["status"] for summary in summaries] == ["completed", "completed"]
    # MLflow's local store: one parent run named by the sweep dir, each job a run nested in it.
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    found = client.search_runs([experiment.experiment_id for experiment in client.search_experiments()])
    [parent] = [run for run in found if "mlflow.parentRunId" not in run.data.tags]
    assert parent.info.run_name == sweep.name and parent.info.status == "FINISHED"
    assert sorted(run.data.params["trainer.seed"] for run in found if run is not parent) == ["0", "1"]
    assert all(run.data.tags.get("mlflow.parentRunId") == parent.info.run_id for run in found if run is not parent)
    assert "Failed to query Ray Train Controller actor state" not in done.stdout + done.stderr
    # Each job's run dir is named by its run identity (different seeds: different identities, dirs and storage),
    # and sizing the worker does not rename the run: Ray's storage is found under the run dir's name.
    assert {os.path.basename(s["run_dir"]) for s in summaries} == {os.path.basename(s["storage"]) for s in summaries}
    assert summaries[0]["storage"] != summaries[1]["storage"]
    assert all(os.path.isdir(summary["storage"]) for summary in summaries)
    # Every job's one worker holds every core the command may use, and torch computes on all of them.
    cores = len(os.sched_getaffinity(0))
    plural = "s" if cores > 1 else ""
    assert done.stdout.count(f"Workers: 1 x {cores} CPU{plural}, {cores} torch thread{plural} each") == 2
    assert "data on cpu as tensors" in done.stdout


USER_TASK = '''
import torch.nn.functional as F
from hydra_raytrain.tasks.classification import Classification


class TopTwo(Classification):
    """Adds top-2 accuracy to the classification metrics."""

    def training_step(self, model, batch):
        output = super().training_step(model, batch)
        inputs, labels = batch
        top2 = model(inputs).topk(2, dim=1).indices
        output.sums["top2"] = (top2 == labels[:, None]).any(dim=1).sum()
        return output
'''


def test_one_run_holds_its_run_dir_and_the_same_command_again_is_refused_naming_it_or_waits(tmp_path):
    """The same command started in a second terminal while the first trains (here in one process: what is under
    test is the run dir's hold, taken before Ray starts): refused at once, exit 1, naming the first's pid and host,
    its run.resume=never deleting nothing; with run.if_running=wait it waits for the first to end, then reports the
    run complete. (A killed driver's hold ends with it: test_resume's killed runs resume through it.) The first
    trains until the test releases it, once the third says it waits."""
    release = tmp_path / "release"
    args = ["scaling.num_workers=0", "debug=smoke", "task._target_=tests.helpers.tasks.HeldUntil"]
    args += [f"+task.path={release}", "hydra.run.dir=run"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    lock = tmp_path / "run" / ".lock"
    with open(tmp_path / "first.txt", "w") as output, open(tmp_path / "third.txt", "w") as third_output:
        first = subprocess.Popen(
            [sys.executable, "-m", "hydra_raytrain", *args], cwd=tmp_path, env=env, stdout=output, stderr=output
        )
        deadline = time.time() + 120
        while not (lock.exists() and lock.read_text().strip()) and first.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert json.loads(lock.read_text())["pid"] == first.pid
        second = run_cli([*args, "run.resume=never"], cwd=str(tmp_path))
        assert first.poll() is None  # refused while the first still trains
        third = subprocess.Popen(
            [sys.executable, "-m", "hydra_raytrain", *args, "run.if_running=wait"],
            cwd=tmp_path, env=env, stdout=third_output, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert third.stderr is not None
        waiting = third.stderr.readline()  # its first line on stderr: the note on task._target_, then the wait
        while "Waiting for" not in waiting and third.poll() is None:
            waiting = third.stderr.readline()
        assert first.poll() is None  # it waits while the first still trains
        release.touch()
        assert first.wait(timeout=120) == 0, (tmp_path / "first.txt").read_text()[-3000:]
        third_errors = waiting + third.stderr.read()
        assert third.wait(timeout=120) == 0, third_errors[-3000:]
    assert second.returncode == 1, second.stderr[-3000:]
    import socket

    holder = f"by pid {first.pid} on {socket.gethostname()} since "
    refusal = f"Cannot train: {tmp_path / 'run'} is in use: a run of this config trains there {holder}"
    assert refusal in second.stderr, second.stderr[-3000:]
    assert "run.if_running=wait" in second.stderr and "discarded" not in second.stdout
    assert f"Waiting for {tmp_path / 'run'}: a run of this config trains there {holder}" in third_errors
    assert "Run already complete: 1 epochs" in (tmp_path / "third.txt").read_text()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_completed"] == 1


@pytest.mark.long("modules of tests/helpers import in the workers of the gate's sweep and resume tests")
@pytest.mark.workers
def test_a_users_own_task_module_imports_in_the_workers(ray_address, tmp_path):
    (tmp_path / "my_tasks.py").write_text(USER_TASK)
    done = run_cli(
        [
            f"ray.address={ray_address}",
            "task._target_=my_tasks.TopTwo",
            "debug=smoke",
            "scaling.num_workers=1",
            "hydra.run.dir=run",
        ],
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["val_top2"] >= metrics["val_accuracy"]


@pytest.mark.long("a worker's error said once in the gate: test_resume's error that would repeat")
@pytest.mark.workers
def test_a_failing_worker_says_its_cause_once(ray_address, tmp_path):
    """Both workers raise: the terminal gets one cause in one line (the lowest rank's that Ray reports: the
    controller may end the group on one rank's error before the other's arrives), not a traceback per rank;
    summary.json keeps the tracebacks. A URI's credentials in the error are *** wherever the driver writes it."""
    message = "the loss diverged at the first step (data: s3://AKIA7:wJalr-secret-e41@minio:9000/b)"
    done = run_cli(
        [
            f"ray.address={ray_address}",
            "task._target_=tests.helpers.tasks.FailsInTraining",
            f"+task.message='{message}'",
            "debug=smoke",
            "hydra.run.dir=run",
        ],
        cwd=str(tmp_path),
    )
    assert done.returncode == 1, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert output.count("RuntimeError: the loss diverged at the first step") == 1, output
    assert re.search(r"Training failed: worker [01]: RuntimeError: the loss diverged at the first step", done.stderr)
    assert "Traceback" not in output and "Error in training function" not in output, output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["epochs_completed"] == 0
    assert "Traceback" in summary["error"] and "the loss diverged" in summary["error"]
    [failure] = summary["failures"]
    assert failure["retried"] is False and failure["why"] == "failure.max_failures=0 reached"
    assert "s3://***@minio:9000/b" in done.stderr and "s3://***@minio:9000/b" in summary["error"]
    for written in ("summary.json", "failures.jsonl", "driver.log", ".hydra/overrides.yaml", ".hydra/config.yaml"):
        assert "wJalr-secret-e41" not in (tmp_path / "run" / written).read_text(), written
    assert "wJalr-secret-e41" not in output
    # The failed rank removed its checkpoint staging folder on the way out (the other may be killed by Ray first)
    from hydra_raytrain.recipe.checkpoint import private_temp, staging_folder

    rank = int(re.search(r"Training failed: worker ([01])", done.stderr).group(1))
    staged = staging_folder(os.path.basename(summary["storage"]), str(tmp_path / "run"), rank)
    assert os.path.dirname(staged) == private_temp() and not os.path.exists(staged)
    assert oct(os.stat(private_temp()).st_mode & 0o777) == "0o700"


TEXT = ["task=causal_lm", "model=causal_lm", "model.path=lm", "dataset=text", "dataset.path=text.jsonl"]
BAD_INPUTS = [
    # (overrides, what the message must name)
    (["model=resnet19"], ["model/resnet19", "resnet18"]),
    (
        ["model=torchvision", "model.name=efficientnet_b9"],
        ["model.name='efficientnet_b9'", "did you mean 'efficientnet_b"],
    ),
    (["model._target_=torch.nn.Flatten", "dataset=module"], ["dataset='module'", "only task=lightning reads"]),
    (
        ["task=lightning", "model._target_=lightning.pytorch.demos.boring_classes.DemoModel", "dataset=module"],
        ["dataset='module'", "DemoModel defines no train_dataloader"],
    ),
    (
        ["finetune.freeze=[featurez]"],
        ["finetune.freeze=['featurez']", "did you mean 'features'?", "top level: features"],
    ),
    (
        ["failure.retry_on=[[unclosed"],
        ["failure.retry_on='[[unclosed'", "Hydra's override grammar cannot parse", "no viable alternative"],
    ),
    (["--config-dir", "cfg", "model=bad"], ["cfg/model/bad.yaml, line 3, column 12: not valid YAML: expected ','"]),
    (["trainer.max_epoch=3"], ["trainer.max_epoch=", "did you mean 'max_epochs'", "trainer.seed"]),
    (["callbacks=lr_monitr"], ["callbacks/lr_monitr", "lr_monitor"]),
    (
        ["experiment=digits_lightning", "callbacks=lr_monitor"],
        ["callbacks='lr_monitor': run in the framework's loop", "configure_callbacks()"],
    ),
    (
        ["callbacks=loss_guard", "callbacks.loss_guard.spike_factor=0.5"],
        ["callbacks.loss_guard=", "spike_factor must be > 1 (or null), got 0.5"],
    ),
    (["scaling.num_workers=two"], ["scaling.num_workers", "two"]),
    (["scaling.num_workers=-1"], ["scaling.num_workers=-1", "must be >= 0"]),
    (["trainer.max_epochs=0"], ["trainer.max_epochs=0", "must be >= 1"]),
    (["scaling.num_workers=64"], ["scaling.num_workers=64", "cores", "scaling.num_workers <= "]),
    (["scaling.use_gpu=true"], ["scaling.use_gpu=True", "GPU", "scaling.use_gpu=false"]),
    (
        ["model._target_=torchvision.models.resnet19"],
        ["model._target_='torchvision.models.resnet19'", "cannot be imported", "resnet18"],
    ),
    (["+model.dropout=0.5"], ["model.dropout=0.5", "SimpleCNN has no argument 'dropout'", "channels"]),
    (["optimizer.lr=-1"], ["optimizer.lr=-1", "torch.optim.Adam rejects it: Invalid learning rate"]),
    (
        ["dataset=imagefolder", "dataset.root=/no/such/folder", "dataset.num_outputs=3"],
        ["dataset.root='/no/such/folder'", "no such folder"],
    ),
    # A wrong type inside a free-form _target_ node.
    (
        ["optimizer.lr=abc"],
        ["optimizer.lr='abc'", "torch.optim.Adam takes a number for 'lr'", "e.g. optimizer.lr=0.001"],
    ),
    # A metric the task does not report.
    (["trainer.monitor=val_bogus"], ["trainer.monitor='val_bogus'", "does not report this metric", "val_accuracy"]),
    # Dataset arguments only the builder can judge (built on the driver).
    (["dataset.val_fraction=1.5"], ["dataset.val_fraction=1.5", "between 0 and 1", "e.g. 0.2"]),
    (["dataset.num_outputs=4"], ["dataset.num_outputs=4", "has 10 outputs", "dataset.num_outputs=10"]),
    (["dataset.input_shape=[16,16]"], ["dataset.input_shape=[16, 16]", "dataset.input_shape=[1,8,8]"]),
    (
        ["dataset=imagefolder", "dataset.root=pets", "dataset.num_outputs=4"],
        ["dataset.num_outputs=4", "3 classes (a, b, c)", "dataset.num_outputs=3"],
    ),
    (
        ["model=mlp", "task=regression"],
        [
            "model='hydra_raytrain.models.MLP'",
            "does not fit the data or the task",
            "batch shapes [[16, 1, 8, 8], [16]]",
        ],
    ),
    (["logger=wandb", "logger.wandb.mode=bogus"], ["logger.wandb.mode='bogus'", "online, offline, disabled"]),
    (["logger=mlflow", "logger.mlflow.log_artifacts=all"], ["logger.mlflow.log_artifacts='all'", "none, best, last"]),
    (["logger=wandb", "logger.wandb.log_model=always"], ["logger.wandb.log_model='always'", "best, last, or false"]),
    (
        ["~optimizer._partial_"],
        ["optimizer._partial_=None", "needs 'params', which the runner passes", "add `_partial_: true`"],
    ),
    # No cluster at the address: refused in seconds, not after minutes of Ray's GCS retries.
    (["ray.address=127.0.0.1:1"], ["ray.address='127.0.0.1:1'", "no Ray cluster answers there", "ray start --head"]),
    # task=lightning: a LightningModule that logs no trainer.monitor (Lightning's fast_dev_run on the driver finds
    # what it logs); a setting Lightning runs do not take.
    (
        ["experiment=digits_lightning", "model._target_=tests.helpers.lit.NoValidationMetric", "model.net.hidden=128"],
        ["trainer.monitor='val_accuracy'", "NoValidationMetric does not report this metric", "train_accuracy"],
    ),
    (
        ["experiment=digits_lightning", "checkpoint.every_n_steps=10"],
        ["checkpoint.every_n_steps=10", "is not available with task=lightning", "checkpoint.every_n_steps=null"],
    ),
    # Several problems at once: every one in the same message.
    (
        ["dataset=imagefolder", "dataset.root=/no/such/folder", "trainer.max_epochs=0"],
        ["2 problems", "dataset.root='/no/such/folder'", "trainer.max_epochs=0"],
    ),
    (
        ["optimizer.lr=abc", "trainer.max_epochs=0", "scaling.num_workers=64"],
        ["3 problems", "optimizer.lr='abc'", "trainer.max_epochs=0", "scaling.num_workers=64"],
    ),
    # Sweeps (hydra/sweeper=ray_tune), refused before any trial and before Ray starts (as every case here). ASHA
    # where stopped trials' CPUs could not be freed (without the dashboard, Ray's state API, the sweep used to wait
    # forever after ASHA's first stop); one bad trial (every trial is composed and checked on the driver first); a
    # search algorithm with nothing to search.
    (
        [
            "-m",
            "hydra/sweeper=ray_tune",
            "hydra.sweeper.scheduler=asha",
            "ray.include_dashboard=false",
            "model=mlp",
            "scaling.num_workers=1",
            "optimizer.lr=1e-3,1e-2",
            "hydra.sweep.dir=sweep",
        ],
        ["hydra.sweeper.scheduler='asha'", "ray.include_dashboard=false", "hydra.sweeper.scheduler=fifo"],
    ),
    # Trials in Ray Train's local mode under a scheduler that continues trials from checkpoints (local mode stores none)
    (
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=hyperband", "scaling.num_workers=0"]
        + ["optimizer.lr=1e-3,1e-2", "hydra.sweep.dir=sweep"],
        ["scaling.num_workers=0", "hyperband continues a trial from its checkpoint", "scheduler=asha or fifo"],
    ),
    (
        ["-m", "hydra/sweeper=ray_tune", "trainer.max_epochs=2,0", "hydra.sweep.dir=sweep"],
        ["Invalid config: trainer.max_epochs=0: must be >= 1. (trial 1: trainer.max_epochs=0)"],
    ),
    (
        [
            "-m",
            "hydra/sweeper=ray_tune",
            "hydra.sweeper.search_alg=optuna",
            "trainer.max_epochs=3",
            "hydra.sweep.dir=sweep",
        ],
        ["hydra.sweeper.search_alg='optuna': has nothing to search"],
    ),
    # A sweep metric no trial reports: refused by the first trial's rehearsal, before any trial starts
    (
        [
            "-m",
            "hydra/sweeper=ray_tune",
            "hydra.sweeper.metric=val_nope",
            "optimizer.lr=1e-3,1e-2",
            "hydra.sweep.dir=sweep",
        ],
        ["hydra.sweeper.metric='val_nope'", "does not report this metric", "val_accuracy", "(trial 0: optimizer.lr="],
    ),
    # ASHA settings that cannot stop a trial: refused before the cluster starts
    (
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=asha", "hydra.sweeper.grace_period=13"]
        + ["optimizer.lr=1e-3,1e-2", "hydra.sweep.dir=sweep"],
        ["hydra.sweeper.grace_period=13", "the trials train 12", "1 to 12 (trainer.max_epochs)"],
    ),
    (
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=asha", "hydra.sweeper.reduction_factor=1"]
        + ["optimizer.lr=1e-3,1e-2", "hydra.sweep.dir=sweep"],
        ["hydra.sweeper.reduction_factor=1", "must be > 1"],
    ),
    # PBT can change only optimizer settings in a running trial; continuing a run needs the run to continue
    (
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=pbt", "model=mlp,simple_cnn"]
        + ["hydra.sweep.dir=sweep"],
        ["hydra.sweeper.scheduler='pbt'", "would change model in a running trial", "optimizer.*"],
    ),
    # PBT's population must be alive together: 4 trials of 2 workers on a local cluster of this machine's cores
    # (refused before it starts), or at most 2 at a time where the command asks for it (any machine)
    (
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=pbt", "hydra.sweeper.num_samples=4"]
        + ["hydra.sweeper.max_concurrent_trials=2", "optimizer.lr=tag(log,interval(1e-4,1e-1))"]
        + ["model=mlp", "hydra.sweep.dir=sweep"],
        ["hydra.sweeper.scheduler='pbt'", "its 4 trials exploit one another only while alive together"],
    ),
    # storage.name is one folder inside storage.path, which run.resume=never deletes: never the parent's
    (["storage.name=..", "run.resume=never"], ["storage.name='..'", "no path separator"]),
    (["storage.name=a/b"], ["storage.name='a/b'", "a plain name"]),
    (["run.if_running=queue"], ["run.if_running='queue'", "refuse, wait"]),
    # HyperBand continues paused trials from a checkpoint of the milestone's epoch; it fills brackets itself
    (
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=hyperband", "checkpoint.every_n_epochs=2"]
        + ["optimizer.lr=1e-3,1e-2", "hydra.sweep.dir=sweep"],
        ["checkpoint.every_n_epochs=2", "HyperBand pauses trials", "checkpoint.every_n_epochs=1 under hyperband"],
    ),
    (
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=hyperband", "hydra.sweeper.search_alg=optuna"]
        + ["optimizer.lr=interval(1e-4,1e-1)", "hydra.sweep.dir=sweep"],
        ["hydra.sweeper.search_alg='optuna'", "cannot suggest trials under hyperband", "search_alg=bohb"],
    ),
    (["+task.metrics=[f1,f2]"], ["task.metrics=['f1', 'f2']", "'f2' is no classification metric", "auroc"]),
    (["+task.metrics=[top20_accuracy]"], ["task.metrics='top20_accuracy'", "scores 10 classes", "top10_accuracy"]),
    (["run.init_full_state=true"], ["run.init_full_state=True", "run.init_from"]),
    (["trainer.ema.decay=1.5"], ["trainer.ema.decay=1.5", "must be in (0, 1)"]),
    # Cross-validation: a fold of no folds, and a fold past the folds (each trial's config checked up front)
    (["dataset.fold=2"], ["dataset.fold=2", "dataset.folds, which is not set", "dataset.folds=K"]),
    (
        ["-m", "hydra/sweeper=ray_tune", "dataset.folds=3", "dataset.fold=range(0,4)", "hydra.sweep.dir=sweep"],
        ["dataset.fold=3", "0 to 2", "(trial 3: dataset.folds=3 dataset.fold=3)"],
    ),
    (
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.search_alg=optuna", "dataset.folds=2"]
        + ["dataset.fold=range(0,2)", "hydra.sweep.dir=sweep"],
        ["hydra.sweeper.search_alg='optuna'", "would draw dataset.fold", "search_alg=basic to cross-validate"],
    ),
    # A search algorithm's trial is started from job.json, written without the sweep's secrets: none may be swept
    (
        ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.search_alg=optuna", "optimizer.lr=interval(1e-4,1e-1)"]
        + ["+scaling.worker_env.API_KEY=a1,b2", "hydra.sweep.dir=sweep"],
        ["scaling.worker_env.API_KEY='a swept value'", "secret-looking key swept", "${oc.env:NAME}"],
    ),
    # Text (a tiny Llama under lm/, rows of text in text.jsonl): refused by name before Ray starts
    ([*TEXT, "dataset.format=messages"], ["dataset.path=", "has no column messages", "its columns: text"]),
    ([*TEXT, "dataset.format=poem"], ["dataset.format='poem'", "unknown format", "prompt_completion"]),
    (
        ["task=causal_lm", "model=causal_lm", "model.path=nobody/no-such-model", "dataset=text"]
        + ["dataset.path=text.jsonl", "model.tokenizer=lm"],
        ["model.path='nobody/no-such-model'", "HF_HUB_OFFLINE is set"],
    ),
    ([*TEXT, "peft=lora", "peft.target_modules=[qkv]"], ["peft.target_modules=['qkv']", "q_proj"]),
    (  # packing with a model whose attention (BLOOM's ALiBi) lets packed documents attend to each other
        ["task=causal_lm", "model=causal_lm", "model.path=null", "model.model_type=bloom", "model.tokenizer=lm"]
        + ["+model.hidden_size=32", "+model.n_layer=1", "+model.n_head=2", "dataset=text", "dataset.path=text.jsonl"]
        + ["dataset.packing=true"],
        ["dataset.packing=True", "BloomForCausalLM) lets packed documents attend to each other", "packing=false"],
    ),
    (  # a text classifier on a label column of one class (the texts themselves, all alike here)
        ["task=text_classification", "model=text_classifier", "model.path=null", "model.model_type=bert"]
        + ["model.tokenizer=lm", "dataset=text", "dataset.path=text.jsonl", "dataset.format=classification"]
        + ["dataset.columns={label: text}"],
        ["dataset.columns.label='text'", "holds one label ('def f(a): return a')", "at least two classes"],
    ),
    (  # a text classifier on rows of text: no labels
        ["task=text_classification", "model=text_classifier", "model.path=null", "model.model_type=bert"]
        + ["model.tokenizer=lm", "dataset=text", "dataset.path=text.jsonl"],
        ["dataset.format='text'", "learns one label per text", "dataset.format=classification"],
    ),
]


# Every bad input through the CLI's entry point (hydra_raytrain.cli.main, what `python -m hydra_raytrain` calls), one
# after another in one fresh process, each in its own folder: one start-up (imports) instead of one per case.
CLI_CASES = r"""
import contextlib, io, json, os, signal, sys
import ray
from hydra.core.global_hydra import GlobalHydra
from hydra_raytrain import cli

inits = []  # every ray.init call of the cases: a refusal must come before any cluster is started or joined
real_init = ray.init
def counted_init(*args, **kwargs):
    inits.append(kwargs.get("address"))
    return real_init(*args, **kwargs)
ray.init = counted_init

def hung(signum, frame):  # a case that hangs (Ray's retries, a download) fails alone, after 60 s
    raise TimeoutError("no answer within 60 s")

signal.signal(signal.SIGALRM, hung)
results = []
for folder, overrides in json.loads(sys.argv[1]):
    os.chdir(folder)
    sys.argv = ["hydra_raytrain", *overrides, "hydra.run.dir=run"]
    stderr = io.StringIO()
    signal.alarm(60)
    started = len(inits)
    with contextlib.redirect_stderr(stderr):
        try:
            cli.main()
            code = 0
        except SystemExit as exit:
            code = exit.code
        except BaseException as error:
            code = None
            print(f"Traceback: the case raised {type(error).__name__}: {error}", file=sys.stderr)
    signal.alarm(0)
    GlobalHydra.instance().clear()
    results.append({"code": code, "stderr": stderr.getvalue(), "ray": inits[started:], "up": ray.is_initialized()})
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def bad_input_results(ray_address, tmp_path_factory):  # the session cluster up: the ASHA case is refused beside it
    folders = [tmp_path_factory.mktemp("bad_input") for _ in BAD_INPUTS]
    model = write_model(tmp_path_factory.mktemp("lm"), "llama")
    for folder in folders:
        write_images(folder / "pets", ["a", "b", "c"], 2)
        (folder / "lm").symlink_to(model)
        write_jsonl(folder / "text.jsonl", [{"text": "def f(a): return a"}] * 10)
        (folder / "cfg" / "model").mkdir(parents=True)  # a user's option file that is not YAML
        (folder / "cfg" / "model" / "bad.yaml").write_text("_target_: my.Net\nhidden: [32\ninput_shape: [1]\n")
    cases = [[str(folder), overrides] for folder, (overrides, _) in zip(folders, BAD_INPUTS, strict=True)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", "PYTHONPATH": ROOT}
    # Each case has 60 s against a hang; how fast a refusal comes is a figure of benchmarks/README.md, not an assertion.
    done = subprocess.run(
        [sys.executable, "-c", CLI_CASES, json.dumps(cases)], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert lines, done.stderr[-3000:]
    results = json.loads(lines[0][len("RESULTS ") :])
    return {
        " ".join(overrides): (folder, result)
        for folder, (overrides, _), result in zip(folders, BAD_INPUTS, results, strict=True)
    }


@pytest.mark.workers
@pytest.mark.parametrize("overrides, named", BAD_INPUTS, ids=[" ".join(o) for o, _ in BAD_INPUTS])
def test_bad_input_fails_fast_with_one_clear_message(overrides, named, bad_input_results):
    folder, done = bad_input_results[" ".join(overrides)]
    # Refused before Ray: no cluster started or joined (ray.init never called), none left up in the process
    assert done["ray"] == [] and not done["up"], (done["ray"], done["up"])
    assert done["code"] not in (0, None), done["stderr"][-3000:]  # 2 for ours; Hydra's composition errors exit 1
    if "-m" in overrides:  # a sweep refused before any trial: exit 2, as for a run
        assert done["code"] == 2, done["stderr"][-3000:]
    for text in named:
        assert text in done["stderr"], done["stderr"]
    assert "Traceback" not in done["stderr"]
    assert not (folder / "run").exists()  # nothing half-written
    assert not (folder / "sweep" / "sweep_summary.json").exists()


@pytest.mark.workers
def test_a_request_bigger_than_the_connected_cluster_is_refused(ray_address, tmp_path):
    done = run_cli(
        [f"ray.address={ray_address}", "scaling.num_workers=5", "trainer.batch_size=60", "hydra.run.dir=run"],
        cwd=str(tmp_path),
        timeout=60,
    )
    assert done.returncode == 2
    assert "scaling.num_workers=5" in done.stderr and "needs 5 CPU" in done.stderr and "has 4" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.workers
def test_a_pbt_population_the_connected_cluster_cannot_hold_together_is_refused_before_any_trial(ray_address, tmp_path):
    """3 trials of 2 workers: the session's 4 CPUs hold 2 at a time, and PBT compares the trials alive."""
    args = ["-m", "hydra/sweeper=ray_tune", "hydra.sweeper.scheduler=pbt", "hydra.sweeper.num_samples=3"]
    args += [f"ray.address={ray_address}", "model=mlp", "optimizer.lr=tag(log,interval(1e-4,1e-1))"]
    done = run_cli([*args, "hydra.sweep.dir=sweep"], cwd=str(tmp_path), timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "hydra.sweeper.scheduler='pbt'" in done.stderr and "its 3 trials" in done.stderr, done.stderr[-3000:]
    assert "the cluster's 4 CPUs hold 2 trials of 2 CPUs at a time" in done.stderr
    assert "at most 2 trials" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.glob("sweep/*/metrics.jsonl")) and not (tmp_path / "sweep" / "sweep_summary.json").exists()
