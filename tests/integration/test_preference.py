"""Preference tuning (task=dpo, dataset.format=preference) on a tiny Llama built here: the first step's loss is ln 2
(the policy is its reference, with LoRA's adapters off or as a frozen copy), and the loss is exact in pairs whatever
the workers and accumulation."""

import json
import math
import sys

import pytest
import torch

from hydra_raytrain import train
from tests.conftest import compose_config, run_predict, unused_port
from tests.helpers.text import PAIRS, preference_rows, write_jsonl, write_model

pytestmark = [pytest.mark.integration, pytest.mark.workers]


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory):
    """A tiny Llama and 48 pairs whose sides vary from 1 to 24 tokens: a float64 DPO run's overrides."""
    folder = tmp_path_factory.mktemp("dpo")
    model = write_model(folder / "llama", "llama")
    data = write_jsonl(folder / "pairs.jsonl", preference_rows(48))
    return (
        "task=dpo",
        "model=causal_lm",
        f"model.path={model}",
        "dataset=text",
        f"dataset.path={data}",
        "dataset.format=preference",
        "dataset.val_fraction=0.25",
        "trainer.max_epochs=2",
        "trainer.precision=64",
        "optimizer.lr=0.001",
        "trainer.progress_bar=false",
    )


def history(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


LAYOUTS = {
    "1 worker x 8": ("scaling.num_workers=0", "trainer.batch_size=8"),
    "1 worker x 4 x 2 accumulated": (
        "scaling.num_workers=0",
        "trainer.batch_size=4",
        "trainer.accumulate_grad_batches=2",
    ),
    "2 workers x 4, reference precomputed": (
        "scaling.num_workers=2",
        "trainer.batch_size=8",
        "task.precompute_reference=true",
    ),
}
SIDE_NAMES = ("chosen", "rejected")
METRICS = ("loss", "rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin", "logps_chosen")


def assert_alike(runs, reference, names):
    """Every run's epochs equal ``reference``'s in the ``names`` metrics of both splits, and its final weights the
    first layout's (``1 worker x 8``), to float64's 1e-9."""
    for label, run_dir in runs.items():
        for epoch, expected in zip(history(run_dir), reference, strict=True):
            for metric in (f"{split}_{name}" for split in ("train", "val") for name in names):
                assert epoch[metric] == pytest.approx(expected[metric], rel=1e-9, abs=1e-9), (label, metric)
        final = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
        for name, tensor in torch.load(runs["1 worker x 8"] / "model.pt", weights_only=True).items():
            assert torch.allclose(final[name], tensor, rtol=1e-9, atol=1e-10), (label, name)


def test_dpo_starts_at_ln_2_and_its_loss_is_exact_in_pairs_whatever_the_workers(ray_address, dpo_run, tmp_path):
    """The first step's loss is ln 2 to float64's accuracy, the reference being the policy: LoRA's adapters off and
    a frozen copy alike. 1 worker with 8 pairs a step (a frozen copy), 1 worker with 4 x 2 accumulated and 2 workers
    with 4 each, their reference's log-probabilities computed once as the run starts (each worker a share, gathered),
    take the same steps (float64, 1e-9): each step divides by its pairs on all workers and micro-batches, and every
    metric is a sum over pairs. (2 workers with a frozen copy each: the long tier's DPO-after-SFT test.)"""
    for reference in ("peft=none", "peft=lora"):
        first = ("scaling.num_workers=0", "trainer.max_epochs=1", "trainer.limit_train_batches=1", reference)
        run_dir = tmp_path / f"first_{reference}"
        assert train(compose_config(*dpo_run, *first), run_dir=str(run_dir))["status"] == "completed"
        [epoch] = history(run_dir)
        assert epoch["train_loss"] == pytest.approx(math.log(2), rel=1e-15, abs=1e-15), reference
        assert epoch["train_reward_margin"] == 0.0 and epoch["train_reward_accuracy"] == 0.0, reference
    runs = {}
    for label, layout in LAYOUTS.items():
        run_dir = tmp_path / label.replace(" ", "_").replace(",", "")
        summary = train(compose_config(*dpo_run, *layout), run_dir=str(run_dir))
        assert summary["status"] == "completed", summary
        runs[label] = run_dir
    reference = history(runs["1 worker x 8"])
    assert [epoch["step"] for epoch in reference] == [5, 10]  # 36 training pairs, 8 a step (the last one wraps)
    # it learns the training pairs (each pair rejects the next one's chosen side: the first steps' moves conflict)
    assert reference[1]["train_loss"] < reference[0]["train_loss"]
    assert reference[1]["train_reward_accuracy"] > max(0.5, reference[0]["train_reward_accuracy"])
    assert_alike(runs, reference, METRICS)


def memorised_pairs(folder):
    """The 20 prompt -> code pairs as SFT rows (4 times); as preference pairs, each code chosen over the codes of the
    3 prompts after it (training) and over those of the 5th and 9th after it (held out: rejections never trained)."""
    codes = [code for _, code in PAIRS]

    def pairs(shifts):
        return [
            {"prompt": prompt, "chosen": code, "rejected": codes[(i + shift) % len(codes)]}
            for shift in shifts
            for i, (prompt, code) in enumerate(PAIRS)
        ]

    sft = write_jsonl(folder / "sft.jsonl", [{"prompt": p, "completion": c} for p, c in PAIRS] * 4)
    return sft, write_jsonl(folder / "train.jsonl", pairs((1, 2, 3))), write_jsonl(folder / "val.jsonl", pairs((5, 9)))


def greedy(run_dir):
    """The run's greedy completions of the 20 prompts."""
    from hydra_raytrain.inference.evaluate import load_model
    from hydra_raytrain.inference.finished import FinishedRun
    from hydra_raytrain.models.text import complete, run_tokenizer

    tokenizer = run_tokenizer(FinishedRun.read(str(run_dir)).config)
    return complete(load_model(str(run_dir)), tokenizer, [prompt for prompt, _ in PAIRS], 8)


@pytest.mark.long("the gate's DPO test is its exactness; this is what it learns after SFT, through run.init_from")
def test_dpo_after_sft_prefers_the_memorised_completions_and_generates_them(ray_address, tmp_path):
    """SFT memorises 20 completions (full weights); DPO from that run (run.init_from: the reference is the SFT model,
    a frozen copy on each of 2 workers) prefers each completion over other prompts' completions: reward accuracy
    >= 0.95 on held-out pairs (rejections it never trained on), and greedy decoding says every chosen completion,
    those SFT got wrong included. A LoRA SFT run's adapters are merged into the base a LoRA DPO run starts from."""
    from hydra_raytrain.recipe.warm_start import starting_model

    model = write_model(tmp_path / "llama", "llama")
    sft_data, train_pairs, val_pairs = memorised_pairs(tmp_path)
    base = ("model=causal_lm", f"model.path={model}", "dataset=text", "trainer.progress_bar=false")
    sft = (*base, "task=causal_lm", f"dataset.path={sft_data}", "dataset.format=prompt_completion")
    sft_options = ("trainer.batch_size=8", "optimizer.lr=0.01", "scaling.num_workers=0")
    sft_dir = tmp_path / "sft"
    done = train(compose_config(*sft, *sft_options, "trainer.max_epochs=15"), run_dir=str(sft_dir))
    assert done["status"] == "completed"
    said = greedy(sft_dir)
    dpo = (
        *base,
        "task=dpo",
        f"dataset.path={train_pairs}",
        f"dataset.val_path={val_pairs}",
        "dataset.format=preference",
    )
    dpo_dir = tmp_path / "dpo"
    options = ("task.beta=0.5", "optimizer.lr=0.001", "trainer.max_epochs=8", "trainer.batch_size=8")
    done = train(
        compose_config(*dpo, *options, f"run.init_from={sft_dir}", "scaling.num_workers=2"), run_dir=str(dpo_dir)
    )
    assert done["status"] == "completed", done
    epochs = history(dpo_dir)
    assert epochs[-1]["val_reward_accuracy"] >= 0.95 and epochs[-1]["val_reward_margin"] > 0
    codes = [code for _, code in PAIRS]
    now = greedy(dpo_dir)
    assert sum(text == code for text, code in zip(now, codes, strict=True)) >= 19, (said, now)
    assert sum(text == code for text, code in zip(now, codes, strict=True)) > sum(
        text == code for text, code in zip(said, codes, strict=True)
    ), (said, now)

    lora_dir = tmp_path / "sft_lora"
    lora = ("peft=lora", "peft.r=4", "peft.alpha=8")
    assert train(compose_config(*sft, *sft_options, *lora, "trainer.max_epochs=3"), run_dir=str(lora_dir))
    from hydra_raytrain.inference.evaluate import load_model

    ids = torch.tensor([[1, 40, 41, 42, 43, 44]])
    merged = starting_model(compose_config(*sft).model, str(lora_dir)).eval()
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, load_model(str(lora_dir))(ids).logits, atol=1e-5)
    first = ("scaling.num_workers=0", "trainer.max_epochs=1", "trainer.limit_train_batches=1", *lora)
    lora_dpo = tmp_path / "dpo_lora"
    done = train(compose_config(*dpo, *first, f"run.init_from={lora_dir}"), run_dir=str(lora_dpo))
    assert done["status"] == "completed" and history(lora_dpo)[0]["train_loss"] == pytest.approx(math.log(2), abs=1e-6)


def keyword_pairs(count, seed):
    """Pairs whose chosen review holds a keyword the rejected one (the same words otherwise) lacks."""
    import random

    from tests.helpers.text import FILLER, KEYWORDS

    draw = random.Random(seed)
    rows = []
    for _ in range(count):
        words = draw.choices(FILLER, k=draw.randint(4, 10))
        kept = list(words)
        words.insert(draw.randrange(len(words) + 1), draw.choice(KEYWORDS))
        rows.append({"prompt": "review:", "chosen": " " + " ".join(words), "rejected": " " + " ".join(kept)})
    return rows


def test_a_reward_model_learns_a_preference_and_export_predict_and_serve_score_alike(ray_address, tmp_path):
    """task=reward_model: a tiny Llama with a score head (one output) scores the chosen side of >= 95% of held-out
    pairs higher; export --format hf loads in transformers as a sequence classifier of one label; predict writes
    each row's score after its prompt, as the exported model gives it, and serve answers the same scores."""
    from transformers import AutoModelForSequenceClassification

    from hydra_raytrain.inference.classify_text import TextClassifier
    from hydra_raytrain.inference.export import export
    from tests.helpers.serving import ask, serving

    model = write_model(tmp_path / "llama", "llama")
    train_pairs = write_jsonl(tmp_path / "train.jsonl", keyword_pairs(160, seed=0))
    val_pairs = write_jsonl(tmp_path / "val.jsonl", keyword_pairs(40, seed=1))
    run = tmp_path / "run"
    overrides = (
        "task=reward_model", "model=text_classifier", f"model.path={model}", "dataset=text",
        f"dataset.path={train_pairs}", f"dataset.val_path={val_pairs}", "dataset.format=preference",
        "optimizer=adamw", "optimizer.lr=3e-3", "trainer.batch_size=16", "trainer.max_epochs=8",
        "scaling.num_workers=0", "trainer.progress_bar=false",
    )  # fmt: skip
    summary = train(compose_config(*overrides), run_dir=str(run))
    assert summary["status"] == "completed", summary
    assert summary["final"]["val_reward_accuracy"] >= 0.95 and summary["final"]["val_reward_margin"] > 0

    assert export(str(run), "hf")["max_abs_diff"] <= 1e-4
    exported = AutoModelForSequenceClassification.from_pretrained(str(run / "export" / "hf")).eval()
    assert exported.config.num_labels == 1 and exported.config.id2label == {0: "score"}
    new = keyword_pairs(10, seed=2)
    rows = [{"prompt": row["prompt"], "text": row[side]} for row in new for side in SIDE_NAMES]
    rows = [{"id": i, **row} for i, row in enumerate(rows)]
    scorer = TextClassifier(str(run))
    expected = scorer.scores([row["text"] for row in rows], [row["prompt"] for row in rows])
    ids = scorer.tokenize.completed([rows[0]["prompt"]], [rows[0]["text"]])[0][0]
    with torch.no_grad():
        assert exported(torch.tensor([ids])).logits[0, 0].item() == pytest.approx(float(expected[0]), abs=1e-4)
    assert sum(expected[0::2] > expected[1::2]) >= 9  # the keyword's side

    data = write_jsonl(tmp_path / "new.jsonl", rows)
    written = run_predict(run, data, "scored", tmp_path, ray_address)
    scores = [score for _, score in sorted(zip(written["id"], written["prediction"], strict=True))]
    assert scores == pytest.approx(expected.tolist(), abs=1e-5)

    port = unused_port()
    command = [sys.executable, "-m", "hydra_raytrain.serve", str(run), "--port", str(port)]
    texts = [row["text"] for row in rows[:4]]
    with serving([*command, "--address", ray_address], tmp_path, port) as server:
        status, text = ask(port, "POST", "/predict", json.dumps({"inputs": texts}).encode())
        assert status == 200, text
        answered = [answer["score"] for answer in json.loads(text)["predictions"]]
        assert answered == pytest.approx(scorer.scores(texts).tolist(), abs=1e-5)
    assert server.process.returncode == 0, server.errors.read_text()[-3000:]


LORA = ("peft=lora", "peft.r=4", "peft.alpha=8", "optimizer.lr=0.01")
# 5 optimizer steps an epoch, a checkpoint every 3: rank 1 is SIGKILLed before its 8th batch (epoch 2), once step 6's
# checkpoint (one batch into epoch 2) is counted; the run resumes there.
CRASH = (
    "checkpoint.every_n_steps=3",
    "task._target_=tests.helpers.tasks.CrashOnceDPO",
    "+task.at_step=8",
    "+task.after=step_00000006",
    "failure.max_failures=1",
)


@pytest.mark.long("the gate's DPO test is its exactness on DDP; this is resume and FSDP2 (LoRA's reference there)")
def test_dpo_with_lora_resumes_a_kill_mid_epoch_and_fsdp2_trains_it_as_one_worker(ray_address, dpo_run, tmp_path):
    """DPO with LoRA (the reference: the adapters off) on 2 DDP workers with gradient checkpointing, rank 1 killed
    mid-epoch and the run resumed from a checkpoint of adapters, and on 2 FSDP2 workers (the reference's
    log-probabilities precomputed on the starting model, unsharded, each rank a share) ends with a 1-worker run's
    adapters (float64: losses to 1e-9, adapters to 1e-6) and reward metrics."""
    one, two, sharded = tmp_path / "one", tmp_path / "two", tmp_path / "sharded"
    layout = ("scaling.num_workers=2", "trainer.batch_size=8")
    done = train(compose_config(*dpo_run, *LORA, *LAYOUTS["1 worker x 8"]), run_dir=str(one))
    assert done["status"] == "completed", done
    crash = (*CRASH, f"+task.marker={tmp_path / 'crashed'}", "model.gradient_checkpointing=true")
    done = train(compose_config(*dpo_run, *LORA, *layout, *crash), run_dir=str(two))
    assert done["status"] == "completed" and (tmp_path / "crashed").exists(), done
    fsdp = (
        "trainer.parallel_strategy=fsdp",
        "fsdp.shard_modules=[LlamaDecoderLayer]",
        "task.precompute_reference=true",
    )
    done = train(compose_config(*dpo_run, *LORA, *layout, *fsdp), run_dir=str(sharded))
    assert done["status"] == "completed", done
    adapters = torch.load(one / "model.pt", weights_only=True)
    assert adapters and all("lora_" in name for name in adapters)
    for run_dir in (two, sharded):
        for name, tensor in torch.load(run_dir / "model.pt", weights_only=True).items():
            assert torch.allclose(tensor, adapters[name], rtol=1e-6, atol=1e-7), (run_dir.name, name)
        for epoch, expected in zip(history(run_dir), history(one), strict=True):
            for metric in ("train_loss", "val_loss", "val_reward_accuracy", "val_reward_margin"):
                assert epoch[metric] == pytest.approx(expected[metric], rel=1e-9, abs=1e-9), (run_dir.name, metric)


@pytest.mark.long("the gate's sweeps carry the sweeper; this is one on a preference metric, its direction the task's")
def test_a_sweep_on_reward_accuracy_picks_the_learning_rate_that_learns_upwards(ray_address, tmp_path):
    """A sweep of a reward model's learning rate on val_reward_accuracy (no mode given: the task's, upwards): the
    rate that learns the keyword preference is the best, the one that barely moves is not."""
    from tests.conftest import run_cli

    model = write_model(tmp_path / "llama", "llama")
    train_pairs = write_jsonl(tmp_path / "train.jsonl", keyword_pairs(96, seed=0))
    val_pairs = write_jsonl(tmp_path / "val.jsonl", keyword_pairs(32, seed=1))
    args = [
        "-m", "hydra/sweeper=ray_tune", "hydra.sweeper.max_concurrent_trials=2", f"ray.address={ray_address}",
        "task=reward_model", "model=text_classifier", f"model.path={model}", "dataset=text",
        f"dataset.path={train_pairs}", f"dataset.val_path={val_pairs}", "dataset.format=preference",
        "optimizer=adamw", "trainer.batch_size=16", "trainer.max_epochs=6", "trainer.progress_bar=false",
        "scaling.num_workers=1", "hydra.sweeper.metric=val_reward_accuracy", "optimizer.lr=3e-3,1e-9",
        "hydra.sweep.dir=sweep",
    ]  # fmt: skip
    done = run_cli(args, cwd=str(tmp_path), timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    assert summary["mode"] == "max" and summary["best"]["overrides"] == "optimizer.lr=0.003", summary
    assert summary["best"]["best"] >= 0.9, summary["best"]


@pytest.mark.long("the gate's DPO test shows the pairs' division on 1 and 2 workers; this is the reward model's step")
def test_a_reward_model_s_loss_is_exact_in_pairs_whatever_the_workers(ray_address, tmp_path):
    """task=reward_model in float64: 1 worker with 8 pairs a step, 1 worker with 4 x 2 accumulated and 2 workers
    with 4 each take the same steps (losses and reward metrics to 1e-9, weights to 1e-9)."""
    model = write_model(tmp_path / "llama", "llama")
    pairs = write_jsonl(tmp_path / "pairs.jsonl", keyword_pairs(48, seed=0))
    overrides = (
        "task=reward_model", "model=text_classifier", f"model.path={model}", "dataset=text", f"dataset.path={pairs}",
        "dataset.format=preference", "dataset.val_fraction=0.25", "trainer.max_epochs=2", "trainer.precision=64",
        "optimizer.lr=0.001", "trainer.progress_bar=false",
    )  # fmt: skip
    layouts = {**LAYOUTS, "2 workers x 4": ("scaling.num_workers=2", "trainer.batch_size=8")}
    runs = {}
    for label, layout in layouts.items():
        if "precomputed" in label:
            continue
        run_dir = tmp_path / label.replace(" ", "_")
        assert train(compose_config(*overrides, *layout), run_dir=str(run_dir))["status"] == "completed", label
        runs[label] = run_dir
    reference = history(runs["1 worker x 8"])
    assert [epoch["step"] for epoch in reference] == [5, 10]
    assert_alike(runs, reference, METRICS[:5])  # a reward model has no log-probabilities
