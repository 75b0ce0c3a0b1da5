"""The how-to pages run as written: every file a page shows is written into a scratch folder, every
``python -m hydra_raytrain ...`` command it shows runs there through the real CLI, and every other Python block
runs too. Commands get ``debug=smoke scaling.num_workers=0`` (one process, one epoch of two batches: what is
under test is the page's config, module and layout), except those that name ``ray.address=HOST:PORT``, which run
on the session's cluster with their workers."""

import glob
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli
from tests.helpers.data import write_images

pytestmark = pytest.mark.integration

DOCS = Path(ROOT) / "docs"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
FILE_HEADER = re.compile(r"# ([\w/.-]+\.(?:py|yaml))\n")


def page(name):
    """(files, commands, snippets) of a page: files by their ``# path`` header line, the CLI commands of its bash
    blocks (continuation lines joined), and the Python blocks that are not files."""
    files, commands, snippets = {}, [], []
    for language, body in BLOCK.findall((DOCS / name).read_text()):
        header = FILE_HEADER.match(body)
        if header:
            files[header.group(1)] = body
        elif language == "bash":
            commands += [
                line.split("  #")[0].strip()
                for line in body.replace("\\\n", " ").splitlines()
                if line.startswith("python -m hydra_raytrain ")  # training (python -m hydra_raytrain.export: not)
            ]
        elif language == "python":
            snippets.append(body)
    return files, commands, snippets


def run_page(name, folder, ray_address=None):
    """Write the page's files into ``folder`` and run its commands there; returns {command: CompletedProcess}. A
    command that joins a cluster (``ray.address=HOST:PORT``) joins the session's (``ray_address``); the others run
    in Ray Train's local mode, without one."""
    files, commands, _ = page(name)
    for path, body in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(body)
    done = {}
    for command in commands:
        args = shlex.split(command)[3:]
        if "ray.address=HOST:PORT" in args:
            assert ray_address, f"{name} joins a cluster: its test asks for ray_address (and is marked workers)"
            args = [f"ray.address={ray_address}" if a == "ray.address=HOST:PORT" else a for a in args] + ["debug=smoke"]
        else:
            args += ["debug=smoke", "scaling.num_workers=0"]
        done[command] = result = run_cli(args, cwd=str(folder))
        assert result.returncode == 0, (command, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, (command, result.stderr[-3000:])
    return done


def run_config(folder, pattern):
    (path,) = glob.glob(str(folder / "outputs" / "runs" / pattern / "config.json"))
    return json.loads(Path(path).read_text())


@pytest.mark.long("your model by _target_ in the gate: test_zoo_runs' command lines; this page also joins a cluster")
@pytest.mark.slow
@pytest.mark.workers
def test_own_model_page(ray_address, tmp_path):
    done = run_page("own-model.md", tmp_path, ray_address)
    replaced = done["python -m hydra_raytrain model._target_=my_models.MyNet"]
    # The replaced option's arguments are dropped and said; the dataset wiring stays; MyNet's own default holds.
    assert "Note: model._target_=my_models.MyNet starts model afresh" in replaced.stderr
    assert "channels=[32, 64], hidden=128" in replaced.stderr
    runs = {
        path: json.loads(Path(path).read_text())
        for path in glob.glob(str(tmp_path / "outputs/runs/mynet-digits-*/config.json"))
    }
    models = [cfg["model"] for cfg in runs.values()]
    wiring = {"_target_": "my_models.MyNet", "input_shape": [1, 8, 8], "num_outputs": 10}
    assert wiring in models and {**wiring, "hidden": 64} in models
    assert {**wiring, "hidden": 48} in models  # the --config-dir option
    for path in runs:  # Hydra's .hydra/config.yaml says what ran too, without the dropped arguments
        assert "channels" not in yaml.safe_load((Path(path).parent / ".hydra" / "config.yaml").read_text())["model"]
    for path in glob.glob(str(tmp_path / "outputs/runs/*/summary.json")):  # one identity, with a replaced _target_ too
        summary = json.loads(Path(path).read_text())
        assert Path(summary["storage"]).name == Path(summary["run_dir"]).name, summary
    sweep = sorted(Path(p).parent.name for p in glob.glob(str(tmp_path / "outputs/multirun/*/*/summary.json")))
    assert [name.split("-")[0] for name in sweep] == ["mlp", "mynet"]  # --config-dir with -m
    # The multi-node command: two workers on the cluster, the module shipped in the runtime_env.
    (shipped,) = [path for path, cfg in runs.items() if cfg["ray"]["runtime_env"].get("py_modules") == ["my_models.py"]]
    summary = json.loads((Path(shipped).parent / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final"]["world_size"] == 2

    # The page's Python snippet, with the run dir it names.
    (snippet,) = page("own-model.md")[2]
    run_dir = sorted(glob.glob(str(tmp_path / "outputs/runs/mynet-digits-*")))[0]
    code = snippet.replace('"outputs/runs/mynet-digits-<hash>"', repr(run_dir)) + "\nprint(type(model).__name__)\n"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "MyNet", loaded.stderr[-2000:]

    # evaluate from another folder: one message naming the module, the folder and the fix; exit 2.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    evaluated = subprocess.run(
        [sys.executable, "-m", "hydra_raytrain.evaluate", run_dir],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert evaluated.returncode == 2, evaluated.stderr[-2000:]
    assert (
        "model._target_='my_models.MyNet': cannot be imported" in evaluated.stderr
        and "No module named 'my_models'" in evaluated.stderr
    )
    assert f"PYTHONPATH={tmp_path} python -m hydra_raytrain.evaluate {run_dir}" in evaluated.stderr
    assert "Traceback" not in evaluated.stderr


def test_own_data_page(tmp_path):
    write_images(tmp_path / "pets", ["cat", "dog", "fox"], 4, size=(10, 12))
    run_page("own-data.md", tmp_path)
    # Inferred from the folder: 3 classes, [3, height 10, width 12]; the relative root made absolute.
    dataset = run_config(tmp_path, "simplecnn-imagefolder-*")["dataset"]
    assert (
        dataset["num_outputs"] == 3
        and dataset["input_shape"] == [3, 10, 12]
        and dataset["root"] == str(tmp_path / "pets")
    )
    assert run_config(tmp_path, "resnet18-imagefolder-*")["dataset"]["input_shape"] == [3, 32, 32]
    # One identity names the run dir and the run's Ray storage, with a relative dataset.root too.
    for path in glob.glob(str(tmp_path / "outputs/runs/*/summary.json")):
        summary = json.loads(Path(path).read_text())
        assert Path(summary["storage"]).name == Path(summary["run_dir"]).name, summary
    moons = [
        json.loads(Path(p).read_text())["dataset"]
        for p in glob.glob(str(tmp_path / "outputs/runs/mlp-moons-*/config.json"))
    ]
    assert {"_target_": "my_data.moons", "input_shape": [2], "num_outputs": 2} in moons
    assert any(d.get("n") == 2000 and d.get("noise") == 0.2 for d in moons)


def test_callbacks_page(tmp_path):
    run_page("callbacks.md", tmp_path)
    rows = {  # model -> its run's one epoch (debug=smoke)
        Path(p).parent.name.split("-")[0]: json.loads(Path(p).read_text())
        for p in glob.glob(str(tmp_path / "outputs/runs/*/metrics.jsonl"))
    }
    # The shipped ones' figures, and the page's own callback's beside the learning-rate monitor's
    assert set(rows) == {"simplecnn", "mlp"} and all(row["lr_model"] == row["lr"] for row in rows.values())
    assert rows["mlp"]["parameter_norm"] == rows["mlp"]["largest_parameter_norm"] > 0, rows["mlp"]
    assert "parameter_norm" not in rows["simplecnn"]


def test_own_task_page(tmp_path):
    done = run_page("own-task.md", tmp_path)
    own, metrics, regression = done.values()  # the page's commands, in its order
    assert "label_smoothing=0.0 were dropped" in own.stderr
    assert metrics.returncode == regression.returncode == 0, (metrics.stderr[-2000:], regression.stderr[-2000:])
    paths = glob.glob(str(tmp_path / "outputs/runs/*/summary.json"))
    by_monitor = {s["monitor"]: s for s in (json.loads(Path(p).read_text()) for p in paths)}
    assert 0 <= by_monitor["val_f1"]["final"]["val_f1"] <= 1 and "val_top3_accuracy" in by_monitor["val_f1"]["final"]
    assert {"val_rmse", "val_mape", "val_auroc"} & set(by_monitor["val_loss"]["final"]) == {"val_rmse", "val_mape"}
    summary = by_monitor["val_top2"]
    assert summary["best"]["epoch"] == 1
    assert 0 <= summary["final"]["val_top2"] <= 1 and 0 <= summary["final"]["train_top2"] <= 1


def test_text_page(tmp_path):
    """The text page's runs on a tiny Llama written at models/base: prompt/completion rows, chats with LoRA, and
    chats packed; and a tiny BERT's at models/bert classifying reviews."""
    from tests.helpers.text import PAIRS, pair_rows, review_rows, write_bert, write_jsonl, write_model

    write_model(tmp_path / "models" / "base", "llama")
    write_bert(tmp_path / "models" / "bert")
    write_jsonl(tmp_path / "data" / "reviews.jsonl", review_rows(40))
    write_jsonl(tmp_path / "data" / "train.jsonl", pair_rows(2))
    chats = [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": c}]} for p, c in PAIRS]
    write_jsonl(tmp_path / "data" / "chats.jsonl", chats)
    prefs = [{"prompt": p, "chosen": c, "rejected": PAIRS[(i + 1) % len(PAIRS)][1]} for i, (p, c) in enumerate(PAIRS)]
    write_jsonl(tmp_path / "data" / "prefs.jsonl", prefs)
    done = run_page("text.md", tmp_path)
    assert len(done) == 7
    every = [json.loads(Path(p).read_text()) for p in glob.glob(str(tmp_path / "outputs/runs/*/summary.json"))]
    assert sorted(s["status"] for s in every) == ["completed"] * 7
    preferring = [s for s in every if "val_reward_accuracy" in s["final"]]  # DPO's and the reward model's
    assert len(preferring) == 2 and sum("val_logps_chosen" in s["final"] for s in preferring) == 1
    every = [s for s in every if s not in preferring]
    (scored,) = [s for s in every if "val_exact_match" in s["final"]]  # and my_metrics.py's figure
    assert scored["monitor"] == "val_exact_match" and scored["final"]["val_length_ratio"] > 0
    (classified,) = [s for s in every if "val_accuracy" in s["final"]]  # a smoke run: it ran, and scored its classes
    assert run_config(tmp_path, Path(classified["run_dir"]).name)["dataset"]["classes"] == ["negative", "positive"]
    summaries = [s for s in every if s is not classified]
    assert all(s["final"]["train_tokens"] > 0 and s["final"]["val_perplexity"] > 1 for s in summaries)
    configs = [run_config(tmp_path, f"{Path(s['run_dir']).name}") for s in summaries]
    assert sorted((c["peft"]["method"], c["dataset"]["packing"]) for c in configs) == [
        ("lora", False),
        ("none", False),
        ("none", False),
        ("none", True),
    ]
