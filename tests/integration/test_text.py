"""Fine-tuning causal language models (task=causal_lm, model=causal_lm, dataset=text), full and LoRA, on a tiny
Llama built here with a tokenizer trained here: the loss exact in supervised tokens whatever the workers and
accumulation, LoRA's adapters alone training, the same on 1 and 2 workers."""

import json

import pytest
import torch

from hydra_raytrain import train
from tests.conftest import compose_config, run_predict
from tests.helpers.loggers import read_scalars
from tests.helpers.preempt import sigterm_once_written
from tests.helpers.text import text_overrides, write_jsonl, write_model
from tests.helpers.wandb_files import wandb_runs

pytestmark = [pytest.mark.integration, pytest.mark.workers]


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A tiny Llama and rows whose supervised tokens vary from row to row: a float64 run's overrides."""
    return text_overrides(tmp_path_factory.mktemp("text"))


def history(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir):
    return torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)


ACCUMULATED = ("scaling.num_workers=0", "trainer.batch_size=4", "trainer.accumulate_grad_batches=2")
LAYOUTS = {
    "1 worker x 8": ("scaling.num_workers=0", "trainer.batch_size=8"),
    "1 worker x 4 x 2 accumulated": ACCUMULATED,
    "2 workers x 4": ("scaling.num_workers=2", "trainer.batch_size=8"),
}


# Validation completes each row's prompt too: exact match, and a metric that counts the rows it is given
GENERATION = (
    "task.eval_generation=true",
    "task.eval_max_new_tokens=6",
    "task.generation_metrics=[exact_match,tests.helpers.tasks.completion_census]",
)


def test_the_loss_is_exact_in_supervised_tokens_whatever_the_workers_and_accumulation(ray_address, text_run, tmp_path):
    """1 worker with batch 8, 1 worker with 4 x 2 accumulation and 2 workers with 4 each take the same steps (to
    float64's accuracy): every step divides by its supervised tokens on all workers and micro-batches. A mean per
    worker's micro-batch (what most loops take) on 2 workers x 4 moves away from them. Validation's generation
    completes every row once whatever the workers, and says the same."""
    runs = {}
    for label, layout in LAYOUTS.items():
        run_dir = tmp_path / label.replace(" ", "_")
        summary = train(compose_config(*text_run, *layout, *GENERATION), run_dir=str(run_dir))
        assert summary["status"] == "completed", summary
        runs[label] = run_dir
    reference = history(runs["1 worker x 8"])
    assert [epoch["step"] for epoch in reference] == [5, 10]  # 36 training rows, 8 a step (the last one wraps)
    assert reference[-1]["train_tokens"] > 0 and reference[-1]["tokens_per_second"] > 0
    assert reference[-1]["val_perplexity"] == pytest.approx(torch.tensor(reference[-1]["val_loss"]).exp().item())
    for label, run_dir in runs.items():
        for epoch, expected in zip(history(run_dir), reference, strict=True):
            for metric in ("train_loss", "val_loss", "train_tokens", "val_tokens"):
                assert epoch[metric] == pytest.approx(expected[metric], rel=1e-9, abs=1e-9), (label, metric)
            generation = ("val_exact_match", "val_rows", "val_distinct_answers", "val_said")
            assert {m: epoch[m] for m in generation} == {m: expected[m] for m in generation}, label
            assert epoch["val_rows"] == epoch["val_distinct_answers"] == 12 and epoch["val_said"] > 0  # each row once
        final = weights(run_dir)
        for name, tensor in weights(runs["1 worker x 8"]).items():
            assert torch.allclose(final[name], tensor, rtol=1e-9, atol=1e-10), (label, name)
    mean_dir = tmp_path / "mean"
    mean = ("task._target_=tests.helpers.tasks.MeanPerBatchLM", *LAYOUTS["2 workers x 4"])
    assert train(compose_config(*text_run, *mean), run_dir=str(mean_dir))["status"] == "completed"
    assert abs(history(mean_dir)[-1]["val_loss"] - reference[-1]["val_loss"]) > 1e-4


# 30 training rows of 15 to 136 tokens in 8 packs: an even number, so that 2 workers' epoch wraps no pack around (the
# sampler evens the ranks' shares by wrapping), as 1 worker's does not
PACKED = ("dataset.packing=true", "dataset.max_length=256", "dataset.test_fraction=0.125")
PACKED_LAYOUTS = {
    "1 worker x 4 packs": ("scaling.num_workers=0", "trainer.batch_size=4"),
    "1 worker x 2 x 2 accumulated": (
        "scaling.num_workers=0",
        "trainer.batch_size=2",
        "trainer.accumulate_grad_batches=2",
    ),
    "2 workers x 2, Ray Data's tokens": ("scaling.num_workers=2", "trainer.batch_size=4", "dataset.tokenize=ray_data"),
}


def test_packed_rows_train_alike_on_1_and_2_workers_and_through_accumulation(ray_address, text_run, tmp_path):
    """dataset.packing=true: trainer.batch_size counts packs of up to dataset.max_length tokens, and the loss stays
    exact in supervised tokens: 1 worker with 4 packs a step, 1 worker accumulating 2 x 2 and 2 workers with 2 each
    (their packs made from Ray Data's tokens, on each worker) take the same steps and score the same validation and
    test rows (float64, to 1e-9). That packing keeps documents apart is tests/unit/test_packing.py's."""
    import math

    from hydra.utils import instantiate

    packs = instantiate(compose_config(*text_run, *PACKED).dataset)
    assert len(packs.train) == 8 and len(packs.train.rows) == 30
    runs = {}
    for label, layout in PACKED_LAYOUTS.items():
        run_dir = tmp_path / label.replace(" ", "_").replace(",", "").replace("'", "")
        summary = train(compose_config(*text_run, *PACKED, *layout), run_dir=str(run_dir))
        assert summary["status"] == "completed", summary
        runs[label] = run_dir, summary
    reference_dir, reference_summary = runs["1 worker x 4 packs"]
    reference = history(reference_dir)
    assert [epoch["step"] for epoch in reference] == [math.ceil(len(packs.train) / 4) * e for e in (1, 2)]
    for label, (run_dir, summary) in runs.items():
        for epoch, expected in zip(history(run_dir), reference, strict=True):
            for metric in ("train_loss", "val_loss", "train_tokens", "val_tokens"):
                assert epoch[metric] == pytest.approx(expected[metric], rel=1e-9, abs=1e-9), (label, metric)
        assert summary["test"]["test_loss"] == pytest.approx(reference_summary["test"]["test_loss"], rel=1e-9)
        final = weights(run_dir)
        for name, tensor in weights(reference_dir).items():
            assert torch.allclose(final[name], tensor, rtol=1e-9, atol=1e-10), (label, name)


def test_a_chat_template_given_trains_every_turn_and_goes_with_the_run_and_its_export(text_run, tmp_path):
    """A Qwen3-style tokenizer (earlier turns' reasoning dropped) is refused for every assistant turn, naming the
    fixes; dataset.chat_template=PATH (a training template) trains them, in Ray Train's local mode (what is
    asserted is the run's files). The run keeps its copy of the template: the file may go, and the export's
    tokenizer renders with it."""
    from transformers import AutoTokenizer

    from hydra_raytrain import ConfigError
    from hydra_raytrain.inference.export import export
    from hydra_raytrain.models.text import load_tokenizer
    from tests.helpers.text import QWEN3_STYLE_TEMPLATE, THINKING, TRAINING_TEMPLATE

    styled = load_tokenizer(text_run[2].split("=", 1)[1])
    styled.chat_template = QWEN3_STYLE_TEMPLATE
    styled.save_pretrained(tmp_path / "qwen3_style")
    data, template = write_jsonl(tmp_path / "chats.jsonl", [{"messages": THINKING}] * 8), tmp_path / "train.jinja"
    template.write_text(TRAINING_TEMPLATE)
    chat = (f"model.tokenizer={tmp_path / 'qwen3_style'}", f"dataset.path={data}", "dataset.format=messages")
    chat += ("scaling.num_workers=0", "trainer.max_epochs=1")
    with pytest.raises(ConfigError, match=r"dataset.train_on=last_assistant .*dataset.chat_template=PATH"):
        train(compose_config(*text_run, *chat), run_dir=str(tmp_path / "refused"))
    run = tmp_path / "run"
    summary = train(compose_config(*text_run, *chat, f"dataset.chat_template={template}"), run_dir=str(run))
    assert summary["status"] == "completed" and summary["final"]["train_tokens"] > 0
    template.unlink()  # the run's copy is what it trained with
    assert (run / "chat_template.jinja").read_text() == TRAINING_TEMPLATE
    export(str(run), "hf")
    exported = AutoTokenizer.from_pretrained(run / "export" / "hf")
    assert exported.chat_template == TRAINING_TEMPLATE
    assert "<think>plus</think>a + b" in exported.apply_chat_template(THINKING, tokenize=False)


@pytest.mark.long("the gate's tiny Llama test carries predict; this is its chat rendering and sampling")
def test_predict_renders_conversations_and_samples_each_row_from_its_seed_alone(ray_address, text_run, tmp_path):
    """A chat run's predict: a ``messages`` column is rendered by the run's chat template with its generation
    prompt, and completed sampled (--temperature, --top-p, --seed) as the same model completes it in this process;
    the completions are the same whatever the actors' batch size, and a stop text ends them."""

    from hydra_raytrain.inference.evaluate import load_model
    from hydra_raytrain.inference.finished import FinishedRun
    from hydra_raytrain.models.sampling import Sampling
    from hydra_raytrain.models.text import complete, run_tokenizer
    from tests.helpers.text import PAIRS, THINKING

    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": THINKING}] * 8)
    run = tmp_path / "run"
    chat = (f"dataset.path={data}", "dataset.format=messages", "scaling.num_workers=0", "trainer.max_epochs=1")
    assert train(compose_config(*text_run, *chat), run_dir=str(run))["status"] == "completed"
    conversations = [[{"role": "user", "content": prompt}] for prompt, _ in PAIRS[:6]]
    asked = write_jsonl(tmp_path / "asked.jsonl", [{"id": i, "messages": m} for i, m in enumerate(conversations)])
    sampled = ["--temperature", "1.0", "--top-p", "0.9", "--seed", "3", "--max-new-tokens", "10"]

    def sampled_texts(output, *options):
        written = run_predict(run, asked, output, tmp_path, ray_address, *sampled, *options)
        return [text for _, text in sorted(zip(written["id"], written["prediction"], strict=True))]

    tokenizer, model = run_tokenizer(FinishedRun.read(str(run)).config), load_model(str(run))
    rendered = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in conversations]
    assert all(text.endswith("<|assistant|>") for text in rendered)  # the template's generation prompt
    expected = complete(model, tokenizer, rendered, 10, 8, Sampling(1.0, 0.9, 3), special=False)
    one_by_one = sampled_texts("one", "--batch-size", "1")
    assert one_by_one == expected == sampled_texts("batched", "--batch-size", "4") and len(set(expected)) > 1
    stop = next(text for text in expected if len(text) > 4)[2:4]
    assert sampled_texts("stopped", "--stop", stop) == [text.split(stop)[0] for text in expected]


LORA = ("peft=lora", "peft.r=4", "peft.alpha=8", "optimizer.lr=0.05")
# 5 optimizer steps an epoch, a checkpoint every 3: rank 1 is SIGKILLed before its 8th batch (epoch 2), once step 6's
# checkpoint (one batch into epoch 2) is counted; the run resumes there.
CRASH = (
    "checkpoint.every_n_steps=3",
    "task._target_=tests.helpers.tasks.CrashOnceLM",
    "+task.at_step=8",
    "+task.after=step_00000006",
    "failure.max_failures=1",
)


def test_lora_trains_the_adapters_alone_the_same_on_1_and_2_workers_and_through_a_kill(ray_address, text_run, tmp_path):
    """peft=lora: model.pt and every checkpoint hold the adapters alone, and the optimizer holds their state
    alone; the model's own weights stay as they were; 2 workers under DDP with gradient checkpointing whose rank 1
    is killed mid-epoch (resumed from a checkpoint of adapters) end with the adapters of 1 worker (float64, to
    1e-9), and W&B and TensorBoard log it as they log any run. The adapter exported as peft saves it loads onto the
    base with PeftModel and computes the run's logits."""
    from transformers import AutoModelForCausalLM

    from hydra_raytrain import load_model

    one, two = tmp_path / "one", tmp_path / "two"
    assert train(compose_config(*text_run, *LORA, *LAYOUTS["1 worker x 8"]), run_dir=str(one))["status"] == "completed"
    crash = (*CRASH, f"+task.marker={tmp_path / 'crashed'}", "model.gradient_checkpointing=true")
    crash += ("logger=[wandb,tensorboard]", "logger.wandb.mode=offline")
    summary = train(compose_config(*text_run, *LORA, *LAYOUTS["2 workers x 4"], *crash), run_dir=str(two))
    assert summary["status"] == "completed" and (tmp_path / "crashed").exists()
    adapters = weights(one)
    assert adapters and all("lora_" in name for name in adapters)  # nothing of the frozen model
    for name, tensor in weights(two).items():
        assert torch.allclose(tensor, adapters[name], rtol=1e-6, atol=1e-7), name
    for epoch, expected in zip(history(two), history(one), strict=True):
        assert epoch["val_loss"] == pytest.approx(expected["val_loss"], rel=1e-9)
    # Its trackers, from rank 0 through the kill: the resumed attempt continues the W&B run; TensorBoard has each
    # epoch once, with the text metrics
    attempts = wandb_runs(two)
    assert len(attempts) == 2 and len({run.name for run in attempts}) == 1
    scalars = read_scalars(two / "tensorboard")
    assert sorted(step for step, _ in scalars["val_perplexity"]) == [1, 2]
    assert [value for _, value in sorted(scalars["train_tokens"])] == [epoch["train_tokens"] for epoch in history(two)]
    assert all(value > 0 for _, value in scalars["tokens_per_second"])
    states = sorted(two.glob("ray_storage/*/*/train_state.pt"))
    assert len(states) == 5  # epochs 1 and 2, steps 3, 6 and 9
    for state in states:
        optimizer = torch.load(state, weights_only=True)["optimizers"]["model"]["state"]
        assert optimizer and all("lora_" in name for name in optimizer)
        assert all("lora_" in name for name in torch.load(state.with_name("model.pt"), weights_only=True))
    path = text_run[2].split("=", 1)[1]
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).state_dict()
    trained = load_model(str(one))  # the base from model.path, the adapters from model.pt
    for name, parameter in trained.named_parameters():
        if "lora_" not in name:
            assert torch.equal(parameter, base[name.replace("base_model.model.", "").replace(".base_layer", "")])
    # The adapter alone, as peft saves it: PeftModel.from_pretrained puts it on the base and computes the run's logits
    from peft import PeftModel

    from hydra_raytrain.inference.export import export

    export(str(one), "peft")
    base_model = AutoModelForCausalLM.from_pretrained(path)  # float32, as load_model builds it
    adapted = PeftModel.from_pretrained(base_model, one / "export" / "adapter").eval()
    ids = torch.randint(300, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(adapted(input_ids=ids).logits, trained(input_ids=ids).logits, atol=1e-6)


@pytest.mark.long("a SIGTERM variant: preemption is test_resume's, LoRA through a kill and packing this file's")
def test_sigterm_preempts_a_lora_run_mid_epoch_and_the_same_config_resumes_it_exactly(ray_address, text_run, tmp_path):
    """SIGTERM to the driver (this process) once epoch 1 is written, in a LoRA run on 2 workers whose rows Ray Data
    tokenized and each worker packed, with gradient checkpointing (8 packs, 2 a step: 4 optimizer steps an epoch,
    0.5 s each): every worker stops at the same step, checkpointed, status preempted. The same config again resumes
    from that checkpoint mid-epoch (tokenizing and packing again) and ends with the adapters and losses of the same
    run never interrupted (float64)."""
    import re

    packed = (*PACKED, "model.gradient_checkpointing=true", "dataset.tokenize=ray_data")
    layout = (*text_run, *LORA, "scaling.num_workers=2", "trainer.batch_size=2", *packed, "trainer.max_epochs=3")
    slow = (*layout, "task._target_=tests.helpers.tasks.SlowLM", "+task.seconds_per_batch=0.5")
    run_dir = tmp_path / "run"

    sigterm_once_written(run_dir / "metrics.jsonl")  # in epoch 2
    summary = train(compose_config(*slow), run_dir=str(run_dir))
    assert summary["status"] == "preempted" and summary["preempted_by"] == "SIGTERM", summary
    assert len(history(run_dir)) in (1, 2)  # stopped within epoch 2 (or 3, on a slow machine)
    summary = train(compose_config(*slow), run_dir=str(run_dir))  # the same config again
    assert summary["status"] == "completed", summary
    log = (run_dir / "driver.log").read_text()
    resumed = r"Resuming from checkpoint \S+: (epoch [23], after batch [1-4]/4|the start of epoch [23]), optimizer step"
    assert re.search(resumed, log), log[-3000:]  # where every worker stopped: in epoch 2 (or 3)
    whole = tmp_path / "whole"
    assert train(compose_config(*layout), run_dir=str(whole))["status"] == "completed"
    assert [epoch["epoch"] for epoch in history(run_dir)] == [1, 2, 3]
    for epoch, expected in zip(history(run_dir), history(whole), strict=True):
        assert epoch["val_loss"] == pytest.approx(expected["val_loss"], rel=1e-9)
    adapters = weights(whole)
    for name, tensor in weights(run_dir).items():
        assert torch.allclose(tensor, adapters[name], rtol=1e-9, atol=1e-10), name


@pytest.mark.long("the driver's tokenization in the gate: every text test; Ray Data's, the gate's budget")
def test_ray_data_tokenizes_a_mixed_folder_as_the_driver_does_in_file_order(ray_address, text_run, tmp_path):
    """dataset.tokenize=ray_data: a folder of JSON lines and Parquet files, and chat rows with a validation file,
    tokenized by Ray Data's actor pool give the splits text() gives in this process, row for row and in the files'
    order; what was cut and dropped is said as text() says it."""
    import warnings

    import pyarrow as pa
    import pyarrow.parquet as pq

    from hydra_raytrain.data.tokenized import text
    from hydra_raytrain.data.tokenized_ray import tokenize_on_ray
    from tests.helpers.text import varied_rows

    model, rows = next(o for o in text_run if o.startswith("model.path=")).split("=", 1)[1], varied_rows(900)
    folder = tmp_path / "rows"
    write_jsonl(folder / "a.jsonl", rows[:300])
    pq.write_table(pa.Table.from_pylist(rows[300:600]), folder / "b.parquet")
    write_jsonl(folder / "c.jsonl", rows[600:])
    chats = [{"messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"]}]}
             for r in rows[:260]]  # fmt: skip
    cases = {
        "a mixed folder": dict(path=str(folder), format="prompt_completion", max_length=24, test_fraction=0.1),
        "chat rows and a validation file": dict(
            path=str(write_jsonl(tmp_path / "chat.jsonl", chats[:200])), format="messages",
            val_path=str(write_jsonl(tmp_path / "chat_val.jsonl", chats[200:])),
        ),
    }  # fmt: skip
    said = {}
    for case, settings in cases.items():
        node = {"_target_": "hydra_raytrain.data.text", "tokenizer": model, **settings}
        with warnings.catch_warnings(record=True) as here_said:
            warnings.simplefilter("always")
            here = text(**settings, tokenizer=model)
        with warnings.catch_warnings(record=True) as ray_said:
            warnings.simplefilter("always")
            splits = tokenize_on_ray(node).splits()
        ours_said = [str(w.message) for w in ray_said if "rows of dataset." in str(w.message)]  # not Ray's notes
        assert ours_said == [str(w.message) for w in here_said if "rows of dataset." in str(w.message)], case
        for name in ("train", "val", "test"):
            ours, theirs = getattr(splits, name), getattr(here, name)
            assert (ours is None) == (theirs is None), (case, name)
            assert ours is None or len(ours) == len(theirs) > 0, (case, name)
            for i in range(len(ours) if ours is not None else 0):
                for column in ("input_ids", "labels"):
                    assert torch.equal(ours[i][column], theirs[i][column]), (case, name, i, column)
        said[case] = ours_said
    assert any("dataset.max_length=24 cut" in message for message in said["a mixed folder"])


def test_a_tiny_llama_memorises_20_pairs_and_export_predict_and_serve_complete_them(ray_address, text_run, tmp_path):
    """20 prompt -> code pairs learned in Ray Train's local mode (what is asserted is the finished run; the loss on
    workers is the exactness test's), the samples the task writes say so; then, offline: the exported Hugging Face
    folder loads with transformers' own Auto classes and generates each code greedily; predict (Ray Data on the
    session's cluster) writes each prompt's completion beside its id; serve answers them over HTTP."""
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hydra_raytrain.inference.export import export
    from tests.conftest import unused_port
    from tests.helpers.serving import ask, serving
    from tests.helpers.text import PAIRS, pair_rows

    unseen = [{"prompt": "op hex:", "completion": " hex(a)"}, {"prompt": "op chr:", "completion": " chr(a)"}]
    data, val = (
        write_jsonl(tmp_path / "train.jsonl", pair_rows(8)),
        write_jsonl(tmp_path / "val.jsonl", pair_rows() + unseen),  # 20 of 22 can be learned: 0.909 at best
    )
    learn = (
        f"dataset.path={data}",
        f"dataset.val_path={val}",
        "scaling.num_workers=1",  # a Ray Train worker: Ray keeps the checkpoints (local mode keeps none)
        "trainer.max_epochs=12",
        "trainer.batch_size=16",
        "trainer.precision=32",
        "optimizer=adamw",
        "task.prompts=[op add:,op rev:]",
        "task.max_new_tokens=8",
        "task.eval_generation=true",  # every epoch's validation completes its 22 prompts
        "task.eval_generation_every=2",
        "trainer.monitor=val_exact_match",
        "checkpoint.every_n_epochs=2",
        "checkpoint.checkpoint_score_attribute=val_exact_match",
    )
    run, tracked = tmp_path / "run", ("logger=mlflow", f"logger.mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")
    summary = train(compose_config(*text_run, *learn, *tracked), run_dir=str(run))
    assert summary["status"] == "completed" and summary["monitor_mode"] == "max"
    scored = [(m["epoch"], m["val_exact_match"]) for m in history(run) if "val_exact_match" in m]
    assert [epoch for epoch, _ in scored] == [2, 4, 6, 8, 10, 12] and scored[0][1] < 0.5, scored
    best = summary["best"]
    assert best["val_exact_match"] == max(score for _, score in scored) >= 0.9, scored
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [(s["epoch"], s["completion"]) for s in samples[-2:]] == [(12, " a + b"), (12, " a[::-1]")]
    from mlflow.tracking import MlflowClient  # the tracker has the samples and the perplexity

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (logged,) = client.search_runs([client.get_experiment_by_name("hydra_raytrain").experiment_id])
    assert "samples.jsonl" in {item.path for item in client.list_artifacts(logged.info.run_id)}
    assert logged.data.metrics["val_perplexity"] == pytest.approx(
        json.loads((run / "summary.json").read_text())["final"]["val_perplexity"]
    )

    export(str(run), "hf")
    folder = run / "export" / "hf"
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    for prompt, code in PAIRS:
        ids = tokenizer(prompt, return_tensors="pt")
        out = model.generate(**ids, max_new_tokens=8)  # the folder's generation config: greedy
        assert tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True) == code, prompt

    # predict of the best checkpoint (by val_exact_match) says what its validation scored, on the same rows
    (checkpoint,) = (run / "ray_storage").glob(f"*/epoch_{best['epoch']:04d}")
    rows = pair_rows() + unseen
    said = predicted(checkpoint, [row["prompt"] for row in rows], tmp_path, ray_address)
    matched = [completion.strip() == row["completion"].strip() for completion, row in zip(said, rows, strict=True)]
    assert sum(matched) / len(rows) == best["val_exact_match"] and matched[:20] == [True] * 20, said

    port = unused_port()
    command = [sys.executable, "-m", "hydra_raytrain.serve", str(run), "--port", str(port), "--max-new-tokens", "8"]
    with serving([*command, "--address", ray_address], tmp_path, port) as server:
        assert json.loads(server.health) == {"status": "ready", "run": "run", "inputs": "prompts", "classes": None}
        status, text = ask(port, "POST", "/predict", json.dumps({"inputs": [p for p, _ in PAIRS[:5]]}).encode())
        assert status == 200 and json.loads(text) == {"predictions": [code for _, code in PAIRS[:5]]}, text
        status, text = ask(port, "POST", "/predict", json.dumps({"inputs": [1, 2]}).encode())
        assert status == 422 and "a non-empty list of non-empty strings" in text
        speaks_openai(port, tokenizer, model)
    assert server.process.returncode == 0, server.errors.read_text()[-3000:]


def predicted(run, prompts, tmp_path, ray_address):
    """``predict``'s completions of ``prompts`` by ``run`` (a run dir or a checkpoint), greedy, 8 new tokens, on the
    session's cluster: in the prompts' order (its output keeps each row's id)."""

    rows = write_jsonl(tmp_path / "prompts.jsonl", [{"id": i, "prompt": p} for i, p in enumerate(prompts)])
    written = run_predict(run, rows, "completions", tmp_path, ray_address, "--max-new-tokens", "8")
    assert sorted(written["id"]) == list(range(len(prompts))), written
    said = dict(zip(written["id"], written["prediction"], strict=True))
    return [said[i] for i in range(len(prompts))]


def speaks_openai(port, tokenizer, model):
    """The run's model through OpenAI's own client: the memorised completion whole and streamed (as the model's
    tokens come, in several chunks), a chat rendered by the run's template as transformers generates it, sampled
    completions that the seed alone decides, concurrent requests of mixed settings answered together as each alone,
    and a bad request refused by name."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import BadRequestError, NotFoundError, OpenAI

    from tests.helpers.text import PAIRS

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == ["run"]
    prompt, code = PAIRS[0]
    plain = client.completions.create(model="run", prompt=prompt, max_tokens=8)
    assert plain.choices[0].text == code, plain
    assert plain.usage.prompt_tokens == len(tokenizer(prompt)["input_ids"])
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
    streamed = [c.choices[0] for c in client.completions.create(model="run", prompt=prompt, max_tokens=8, stream=True)]
    assert "".join(c.text for c in streamed) == code and sum(1 for c in streamed if c.text) > 1
    assert streamed[-1].finish_reason == plain.choices[0].finish_reason

    chat = [{"role": "user", "content": PAIRS[3][0]}]
    ids = tokenizer(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
                    return_tensors="pt", add_special_tokens=False)  # fmt: skip
    out = model.generate(**ids, max_new_tokens=6)
    expected = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    answered = client.chat.completions.create(model="run", messages=chat, max_tokens=6)
    assert answered.choices[0].message.content == expected and answered.choices[0].message.role == "assistant"

    def completion(settings):
        return client.completions.create(model="run", **settings).choices[0].text

    seeded = [completion(dict(prompt="def f(x):", max_tokens=8, temperature=1.5, seed=s)) for s in (1, 1, 2, 3)]
    assert seeded[0] == seeded[1] and len(set(seeded)) > 1, seeded
    mixed = [dict(prompt=p, max_tokens=m, temperature=t, seed=5, stop=stop)
             for (p, _), m, t, stop in zip(PAIRS[:6], [8, 3, 8, 5, 8, 8], [0, 0, 1.0, 0, 1.0, 0],
                                           [None, None, None, None, None, " b"], strict=True)]  # fmt: skip
    alone = [completion(settings) for settings in mixed]
    with ThreadPoolExecutor(len(mixed)) as pool:
        assert list(pool.map(completion, mixed)) == alone
    assert alone[5] == PAIRS[5][1].split(" b")[0]  # " a ** b" cut before its stop text

    with pytest.raises(BadRequestError) as caught:
        client.completions.create(model="run", prompt=prompt, max_tokens=9)
    assert caught.value.param == "max_tokens" and "--max-new-tokens" in caught.value.message
    with pytest.raises(NotFoundError):
        client.completions.create(model="another", prompt=prompt)


@pytest.mark.long("the gate's tiny Llama test speaks OpenAI's API through its client; this is a chat model's")
def test_a_chat_model_answers_its_memorised_replies_through_the_openai_client(ray_address, text_run, tmp_path):
    """A tiny Llama trained on ``messages`` (20 questions, a reply each, the template ending the assistant's turn with
    the end token), served: OpenAI's client asks each question as a chat and gets its reply, ended by the model
    ("stop"), whole and streamed; an unknown role, a prompt longer than the model's positions and max_tokens over the
    cap are refused with OpenAI's error objects naming the parameter; a client that leaves a stream mid-way does not
    keep the server from answering the next."""
    import http.client
    import sys

    from openai import BadRequestError, OpenAI

    from tests.conftest import unused_port
    from tests.helpers.serving import serving
    from tests.helpers.text import PAIRS

    chats = [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": c}]} for p, c in PAIRS]
    learn = (
        f"dataset.path={write_jsonl(tmp_path / 'chats.jsonl', chats * 8)}", "dataset.format=messages",
        "scaling.num_workers=0", "trainer.max_epochs=24", "trainer.batch_size=16", "trainer.precision=32",
        "optimizer=adamw",
    )  # fmt: skip
    run = tmp_path / "run"
    assert train(compose_config(*text_run, *learn), run_dir=str(run))["status"] == "completed"
    port = unused_port()
    command = [sys.executable, "-m", "hydra_raytrain.serve", str(run), "--port", str(port), "--max-new-tokens", "12"]
    with serving([*command, "--address", ray_address], tmp_path, port) as server:
        assert any(f"127.0.0.1:{port}/v1" in line for line in server.printed), server.printed
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        for prompt, code in PAIRS:
            answered = client.chat.completions.create(model="run", messages=[{"role": "user", "content": prompt}])
            assert (answered.choices[0].message.content, answered.choices[0].finish_reason) == (code, "stop"), prompt
        prompt, code = PAIRS[8]  # " max(a, b)": several tokens
        question = [{"role": "user", "content": prompt}]
        stream = client.chat.completions.create(
            model="run", messages=question, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens > 2
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == code and len(pieces) > 1, pieces

        refusals = [
            (
                {"messages": [{"role": "tool", "content": prompt}]},
                "messages[0].role",
                "one of system, developer, user, assistant",
            ),
            ({"messages": [{"role": "user", "content": "op add: " * 200}]}, "messages", "maximum context length"),
            ({"messages": [{"role": "user", "content": prompt}], "max_tokens": 13}, "max_tokens", "from 1 to 12"),
        ]
        for settings, param, says in refusals:
            with pytest.raises(BadRequestError) as caught:
                client.chat.completions.create(model="run", **settings)
            assert caught.value.param == param and says in caught.value.message, caught.value.message

        left = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # a client that reads one chunk and leaves
        body = {"model": "run", "messages": [{"role": "user", "content": prompt}], "stream": True}
        left.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = left.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
        left.close()
        again = client.chat.completions.create(model="run", messages=[{"role": "user", "content": prompt}])
        assert again.choices[0].message.content == code
    assert server.process.returncode == 0, server.errors.read_text()[-3000:]


@pytest.mark.long("FSDP in the gate is the GAN in bf16, LoRA the kill test here")
def test_fsdp2_shards_a_gpt2_with_lora_and_checkpointing_and_gathers_the_whole_adapter(ray_address, text_run, tmp_path):
    """GPT-2 with LoRA adapters and gradient checkpointing on packed rows, sharded by FSDP2 over 2 workers (its
    blocks' units), stepped by optimizer=adamw (fused: one kernel over each rank's shards, the frozen weights among
    them): the adapters saved (gathered whole from the shards) are a 1-worker run's: its losses to 1e-9, its test
    rows, its adapters to 1e-6 (float64's rounding of the two layouts' sums through the Adam steps: ~3e-8 here;
    GPT-2 on DDP alike)."""
    gpt2 = write_model(tmp_path / "gpt2", "gpt2")
    overrides = (
        *text_run,
        f"model.path={gpt2}",
        *LORA,
        "optimizer=adamw",
        "peft.target_modules=[c_attn,c_proj]",
        "dataset.max_length=120",
        "dataset.test_fraction=0.15",
        "dataset.packing=true",  # 18 packs of up to 120 tokens (even: see PACKED); GPT-2's learned positions restart
    )
    one, two = tmp_path / "one", tmp_path / "two"
    assert train(compose_config(*overrides, *LAYOUTS["1 worker x 8"]), run_dir=str(one))["status"] == "completed"
    sharded = ("trainer.parallel_strategy=fsdp", "fsdp.shard_modules=[GPT2Block]", "model.gradient_checkpointing=true")
    sharded += ("dataset.tokenize=ray_data",)
    with pytest.warns(UserWarning) as said:
        summary = train(compose_config(*overrides, *LAYOUTS["2 workers x 4"], *sharded), run_dir=str(two))
    assert summary["status"] == "completed", summary
    # The test split scored after training on the same tokens: cut once, said once
    assert [str(w.message) for w in said].count("dataset.max_length=120 cut 3 of 48 rows of dataset.path") == 1
    tested = json.loads((one / "summary.json").read_text())["test"]  # its rows (the model: each run's best)
    assert summary["test"]["test_tokens"] == tested["test_tokens"] > 0, (summary["test"], tested)
    # Tokenized once, by Ray Data's actors: the workers read the blocks in place and cut nothing themselves
    assert "Text tokenized once for the workers, by Ray Data's actors" in (two / "driver.log").read_text()
    workers = [path.read_text() for path in two.glob("logs/rank*")]
    assert len(workers) == 4 and not any("cut" in text for text in workers)
    adapters = weights(one)
    assert sorted(weights(two)) == sorted(adapters) and len(adapters) == 12  # 2 blocks x 3 modules x (A, B)
    for name, tensor in weights(two).items():
        assert torch.allclose(tensor, adapters[name], rtol=1e-6, atol=1e-7), name
    for epoch, expected in zip(history(two), history(one), strict=True):
        assert epoch["val_loss"] == pytest.approx(expected["val_loss"], rel=1e-9)


@pytest.mark.long("the gate's exactness test generates on DDP's workers; this is FSDP2's, ranks of unequal rows")
def test_fsdp2_validation_generates_every_row_once_as_one_worker_does(ray_address, text_run, tmp_path):
    """Validation's generation under FSDP2 over 2 workers whose shares of the 9 validation rows differ (5 and 4: 3
    batches and 2): each unit's parameters gathered for the pass (a forward would otherwise wait for a rank that
    has none left), and the same completions (a checksum of the text), exact match and rows as 1 worker's run
    (whose training rows the 2 workers' sampler may even out by repeating one: the weights differ a little, the
    completions not). Rank 0's samples (``task.prompts``) are generated on it alone, no other rank stepping with it;
    the test split, scored after training, is completed too."""
    split = ("dataset.val_fraction=0.1875", "trainer.val_batch_size_per_worker=2", "trainer.max_epochs=1", *GENERATION)
    split += ("task.prompts=[op add:]", "task.max_new_tokens=4")  # and rank 0's samples, generated alone
    split += ("dataset.test_fraction=0.125",)  # 6 rows, scored after training on the driver: test_exact_match
    one, two = tmp_path / "one", tmp_path / "two"
    assert train(compose_config(*text_run, *split, *LAYOUTS["1 worker x 8"]), run_dir=str(one))["status"] == "completed"
    sharded = ("trainer.parallel_strategy=fsdp", "fsdp.shard_modules=[LlamaDecoderLayer]")
    summary = train(compose_config(*text_run, *split, *LAYOUTS["2 workers x 4"], *sharded), run_dir=str(two))
    assert summary["status"] == "completed", summary
    generation = ("val_exact_match", "val_rows", "val_distinct_answers", "val_said")
    (alone,), (together,) = history(one), history(two)
    assert {m: together[m] for m in generation} == {m: alone[m] for m in generation}
    assert together["val_rows"] == together["val_distinct_answers"] == 9 and together["val_said"] > 0
    tested = summary["test"]
    assert tested["test_rows"] == tested["test_distinct_answers"] == 6 and 0 <= tested["test_exact_match"] <= 1
    (sample,) = [json.loads(line) for line in (two / "samples.jsonl").read_text().splitlines()]
    assert sample["epoch"] == 1 and sample["completion"], sample
