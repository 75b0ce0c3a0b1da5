"""Fine-tuning a causal LM: supervised tokens/s of hydra_raytrain against a raw PyTorch loop and transformers' Trainer.

    .venv/bin/python benchmarks/text.py            # or: make bench-text
    .venv/bin/python benchmarks/text.py --rows 4000 --epochs 4
    .venv/bin/python benchmarks/text.py --only packing

One small Llama (hidden 256, 4 layers; new weights, a byte-level BPE tokenizer trained on Python's help topics:
nothing downloaded) learns prompt/completion rows. The same model, rows (tokenized once by our ``dataset=text``
builder), batches (16 rows padded to their longest, in the same seeded order), fused AdamW and threads (torch's
default: one per core) in each contender: the raw loop (the mean over a batch's supervised tokens, backward,
step), ``transformers.Trainer`` (no evaluation, no saving, no logging; its loss: the model's own mean over tokens)
and ``python -m hydra_raytrain task=causal_lm`` on one worker sized to the machine (its own ``tokens_per_second``):
as it runs by default (its output head and loss on the supervised positions only), and with
``task.supervised_logits_only=false`` (every position's logits, as the raw loop and the Trainer compute them).
Printed: supervised tokens/s per contender, the median over the epochs after the first, and the ratios. Then
tokenization in rows/s (``--tokenized-rows``): a plain loop row by row, the driver's batch encoding and Ray Data's
actor pool (one actor per CPU at most, its start included).

Packing (``--only packing``, and after the rest): supervised tokens/s of ``dataset.packing=true`` against the same
run padded, on a corpus of mixed lengths (``dataset.format=text``: 4 rows in 5 of 1-12 words, 1 in 5 of 40-200
words), the same model and threads. Padded: 16 rows a step; packed: sequences of ``dataset.max_length`` tokens, as
many a step as hold the same tokens on average (the same optimisation per step). And TRL's ``SFTTrainer`` with
``packing=True`` (its best-fit-decreasing packing, padding-free) on the same model, training rows, sequences per
step, learning rate and threads (TRL is a bench-only dependency: ``pip install -e '.[bench]'``). ``--only trl``:
the packed run and TRL's alone.

A text classifier (``--only classifier``, and after the rest): examples/s of ``task=text_classification`` on one
worker against a plain PyTorch loop over the same BERT (hidden 256, 4 layers, new weights), reviews (the tests'
keyword rule: 4-13 words), batches of 32 in the same seeded order, fused AdamW and threads.

DPO (``--only dpo``, and after the rest): pairs/s of ``task=dpo`` on one worker against TRL's ``DPOTrainer`` with the
same model (a frozen copy as the reference in both), pairs (prompt, chosen, rejected strings: the varied rows, each
completion chosen over the next row's), 16 pairs a step, beta, learning rate, fused AdamW and threads; and ours with
``task.precompute_reference=true`` (the reference scored once as the run starts: its time is in the first epoch,
which the median leaves out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.helpers.text import (  # noqa: E402
    preference_rows,
    review_rows,
    varied_rows,
    write_bert,
    write_jsonl,
    write_model,
)

BATCH, LR = 16, 1e-3
EVERY = "ours, every position's logits"
CAUSAL = ("task=causal_lm", "model=causal_lm", "dataset.format=prompt_completion")
# The vocabulary padded to 3,072 rows (the tokenizer uses 320): the output head is then ~23% of a token's matmul
# work, as in the small LLMs users fine-tune (the head's share of the weights: SmolLM2-135M 21%, Qwen2.5-0.5B 28%,
# Llama-3.2-1B 21%).
SIZES = dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
    vocab_size=3072,
)  # fmt: skip


def splits(folder: Path, data: Path):
    from hydra_raytrain.data.tokenized import text

    return text(str(data), str(folder), "prompt_completion", max_length=256, val_fraction=0.05)


def batches(rows, epoch: int):
    import torch
    from torch.utils.data import DataLoader

    from hydra_raytrain.recipe.sampler import ShardedSampler

    sampler = ShardedSampler(len(rows), seed=0)  # the order our runs take: one permutation per epoch
    sampler.set_epoch(epoch)
    return DataLoader(rows, batch_size=BATCH, sampler=sampler, collate_fn=rows.collate, generator=torch.Generator())


def raw_loop(folder: Path, data: Path, epochs: int) -> list[float]:
    """Supervised tokens/s of each epoch of a plain loop."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    rows = splits(folder, data).train
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)  # as optimizer=adamw
    rates = []
    for epoch in range(epochs):
        started, tokens = time.perf_counter(), 0
        for batch in batches(rows, epoch):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
            targets = batch["labels"][:, 1:]
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tokens += int((targets != -100).sum())
        rates.append(tokens / (time.perf_counter() - started))
    return rates


def hf_trainer(folder: Path, data: Path, epochs: int, scratch: str) -> list[float]:
    """Supervised tokens/s of each epoch of transformers' Trainer on the same rows and batches."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    rows = splits(folder, data).train
    per_epoch = sum(int((rows[i]["labels"][1:] != -100).sum()) for i in range(len(rows)))
    clock, ends = epoch_clock()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder)
    arguments = TrainingArguments(
        output_dir=scratch, per_device_train_batch_size=BATCH, num_train_epochs=epochs, learning_rate=LR,
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, lr_scheduler_type="constant", warmup_steps=0, disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=arguments, train_dataset=rows, data_collator=rows.collate, callbacks=[clock]).train()
    return [per_epoch / (end - start) for start, end in zip(ends[::2], ends[1::2], strict=True)]


def epoch_clock():
    """A Trainer callback that notes when each epoch begins and ends (``time.perf_counter``), and its list."""
    from transformers import TrainerCallback

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

        def on_epoch_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    return Clock(), ends


def ours(
    folder: Path, data: Path, epochs: int, scratch: str, *overrides: str, key: str = "tokens_per_second", task=CAUSAL
) -> list[float]:
    """Supervised tokens/s (``key``'s figure) of each epoch of python -m hydra_raytrain on one worker (its
    metrics.jsonl), a causal LM's run (``task``: the groups of another)."""
    run = os.path.join(scratch, f"ours{len(os.listdir(scratch))}")
    command = [
        sys.executable, "-m", "hydra_raytrain", *task, f"model.path={folder}",
        "dataset=text", f"dataset.path={data}", "dataset.max_length=256",
        "dataset.val_fraction=0.05", "scaling.num_workers=1", f"trainer.batch_size={BATCH}", "optimizer=adamw",
        f"optimizer.lr={LR}", "optimizer.weight_decay=0.0", f"trainer.max_epochs={epochs}",
        "trainer.progress_bar=false", f"hydra.run.dir={run}", *overrides,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    if done.returncode:
        raise SystemExit(f"hydra_raytrain failed:\n{done.stderr[-3000:]}")
    lines = Path(run, "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)[key] for line in lines]


def tokenization(folder: Path, rows: list[dict], scratch: str) -> dict[str, float]:
    """Rows/s of each way to tokenize the rows: a plain loop row by row, the driver's batch encoding
    (``dataset.tokenize=driver``) and Ray Data's actor pool (``ray_data``; a local cluster of this machine's CPUs,
    started before the clock; the pool's start counted, as a run counts it)."""
    import ray

    from hydra_raytrain.data.tokenized import Tokenize
    from hydra_raytrain.data.tokenized_ray import tokenize_on_ray
    from hydra_raytrain.models.text import load_tokenizer

    tokenizer = load_tokenizer(str(folder))
    columns = {"prompt": "prompt", "completion": "completion"}
    rates = {}
    started = time.perf_counter()
    for row in rows:
        tokenizer(row["prompt"])
        tokenizer(row["completion"], add_special_tokens=False)
    rates["a plain loop"] = len(rows) / (time.perf_counter() - started)
    started = time.perf_counter()
    Tokenize(tokenizer, "prompt_completion", columns, 256).cut(rows)
    rates["the driver's batch encoding"] = len(rows) / (time.perf_counter() - started)
    data = write_jsonl(Path(scratch, "tokenized.jsonl"), rows)
    ray.init(num_cpus=os.cpu_count(), logging_level="ERROR", include_dashboard=False)
    try:
        node = {"_target_": "hydra_raytrain.data.text", "path": str(data), "tokenizer": str(folder),
                "format": "prompt_completion", "max_length": 256}  # fmt: skip
        started = time.perf_counter()
        tokenize_on_ray(node).splits()
        rates["Ray Data's actors"] = len(rows) / (time.perf_counter() - started)
    finally:
        ray.shutdown()
    return rates


PACK_LENGTH = 512


def mixed_rows(count: int, seed: int = 0) -> list[dict]:
    """Text rows of mixed lengths: 4 in 5 short (1-12 words), 1 in 5 long (40-200 words), from pydoc's topics."""
    import random
    from pydoc_data.topics import topics

    words = " ".join(topics.values()).split()
    draw = random.Random(seed)
    rows = []
    for _ in range(count):
        n = draw.randint(40, 200) if draw.random() < 0.2 else draw.randint(1, 12)
        start = draw.randrange(len(words) - n)
        rows.append({"text": " ".join(words[start : start + n])})
    return rows


def packing(folder: Path, scratch: str, rows: int, epochs: int, padded: bool = True) -> dict[str, float]:
    """Supervised tokens/s of a padded run (unless not ``padded``), a packed one (``ours``'s runs) and TRL's on the
    same mixed-length rows."""
    from hydra_raytrain.data.tokenized import text

    data = write_jsonl(Path(scratch, "mixed.jsonl"), mixed_rows(rows))
    lengths = text(str(data), str(folder), "text", max_length=PACK_LENGTH, val_fraction=0.05).train.lengths()
    packs = max(1, round(BATCH * float(lengths.mean()) / PACK_LENGTH))
    print(f"packing: {rows:,} rows, {lengths.mean():.0f} tokens a row on average (longest {lengths.max()}); "
          f"padded: {BATCH} rows a step; packed: {packs} sequences of {PACK_LENGTH} a step", flush=True)  # fmt: skip
    common = (
        f"dataset.path={data}", "dataset.format=text", f"dataset.max_length={PACK_LENGTH}",
        "dataset.tokenize=driver",
    )  # fmt: skip
    figures = {}
    runs = {"padded": (*common, f"trainer.batch_size={BATCH}")} if padded else {}
    runs["packed"] = (*common, "dataset.packing=true", f"trainer.batch_size={packs}")
    for name, overrides in runs.items():
        rates = ours(folder, data, epochs, scratch, *overrides)
        figures[name] = steady(rates)
        each = ", ".join(f"{rate:,.0f}" for rate in rates)
        print(f"{name:28s} {figures[name]:10,.0f} supervised tokens/s  (epochs: {each})", flush=True)
    trl = figures["TRL SFTTrainer, packed"] = steady(trl_packed(folder, data, epochs, packs, scratch))
    print(f"{'TRL SFTTrainer, packed':28s} {trl:10,.0f} supervised tokens/s", flush=True)
    if padded:
        print(f"packed / padded: {figures['packed'] / figures['padded']:.2f}x", flush=True)
    print(f"packed / TRL SFTTrainer packed: {figures['packed'] / trl:.2f}x", flush=True)
    return figures


def trl_packed(folder: Path, data: Path, epochs: int, packs: int, scratch: str) -> list[float]:
    """Supervised tokens/s of each epoch of TRL's SFTTrainer with packing on our run's training rows."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from hydra_raytrain.data.tokenized import text

    train = text(str(data), str(folder), "text", max_length=PACK_LENGTH, val_fraction=0.05).train
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    per_epoch = int((train.lengths() - 1).sum())  # what our runs count: every token but each document's first
    clock, ends = epoch_clock()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder)
    config = SFTConfig(
        output_dir=os.path.join(scratch, "trl"), per_device_train_batch_size=packs, num_train_epochs=epochs,
        learning_rate=LR, max_length=PACK_LENGTH, packing=True, save_strategy="no", eval_strategy="no",
        logging_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0, lr_scheduler_type="constant",
        warmup_steps=0, disable_tqdm=True, optim="adamw_torch_fused", weight_decay=0.0,
        bf16=False,  # TRL defaults to bf16, ours (as transformers) to float32: bf16 is over 10x slower on this CPU
    )  # fmt: skip
    dataset = Dataset.from_list([rows[int(i)] for i in train.rows])
    SFTTrainer(model=model, args=config, train_dataset=dataset, callbacks=[clock]).train()
    return [per_epoch / (end - start) for start, end in zip(ends[::2], ends[1::2], strict=True)]


CLASSIFIER_BATCH = 32
BERT = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4)
REVIEWS = ("dataset.columns={text: review, label: stars}", "dataset.val_fraction=0.05")


def classifier(scratch: str, rows: int, epochs: int) -> dict[str, float]:
    """Examples/s of a text classifier: a plain loop against ``python -m hydra_raytrain`` on one worker."""
    folder = write_bert(Path(scratch, "bert"), **BERT)
    data = write_jsonl(Path(scratch, "reviews.jsonl"), review_rows(rows))
    figures = {"plain loop": steady(plain_classifier_loop(folder, data, epochs))}
    task = ("task=text_classification", "model=text_classifier", "dataset.format=classification")
    overrides = (*REVIEWS, f"trainer.batch_size={CLASSIFIER_BATCH}")
    rates = ours(folder, data, epochs, scratch, *overrides, key="samples_per_second", task=task)
    figures["hydra_raytrain, 1 worker"] = steady(rates)
    for name, rate in figures.items():
        print(f"classifier, {name:28s} {rate:10,.0f} examples/s", flush=True)
    print(f"classifier, ours / plain loop: {figures['hydra_raytrain, 1 worker'] / figures['plain loop']:.2f}x")
    return figures


def plain_classifier_loop(folder: Path, data: Path, epochs: int) -> list[float]:
    """Examples/s of each epoch of a plain loop over the classifier (the rows and order our run takes)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from hydra_raytrain.data.tokenized import text
    from hydra_raytrain.models.text import text_classifier
    from hydra_raytrain.recipe.sampler import ShardedSampler

    rows = text(str(data), str(folder), "classification", columns={"text": "review", "label": "stars"},
                val_fraction=0.05).train  # fmt: skip
    torch.manual_seed(0)
    model = text_classifier(str(folder), labels=["negative", "positive"]).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)
    rates = []
    for epoch in range(epochs):
        sampler = ShardedSampler(len(rows), seed=0)
        sampler.set_epoch(epoch)
        started = time.perf_counter()
        for batch in DataLoader(rows, batch_size=CLASSIFIER_BATCH, sampler=sampler, collate_fn=rows.collate):
            labels = batch.pop("labels")
            F.cross_entropy(model(**batch).logits, labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        rates.append(len(rows) / (time.perf_counter() - started))
    return rates


BETA = 0.1
DPO = ("task=dpo", "model=causal_lm", "dataset.format=preference")


def dpo(folder: Path, scratch: str, rows: int, epochs: int) -> dict[str, float]:
    """Pairs/s of ``task=dpo`` on one worker (a frozen reference, then a precomputed one) and of TRL's DPOTrainer."""
    data = write_jsonl(Path(scratch, "pairs.jsonl"), preference_rows(rows))
    figures = {}
    for name, overrides in (("ours, frozen copy", ()), ("ours, precomputed", ("task.precompute_reference=true",))):
        rates = ours(folder, data, epochs, scratch, f"task.beta={BETA}", *overrides, key="samples_per_second", task=DPO)
        figures[name] = steady(rates)
    figures["TRL DPOTrainer"] = steady(trl_dpo(folder, data, epochs, scratch))
    for name, rate in figures.items():
        print(f"DPO, {name:24s} {rate:10,.1f} pairs/s", flush=True)
    trl = figures["TRL DPOTrainer"]
    print(f"DPO, ours / TRL: {figures['ours, frozen copy'] / trl:.2f}x (frozen copy), "
          f"{figures['ours, precomputed'] / trl:.2f}x (precomputed)", flush=True)  # fmt: skip
    return figures


def trl_dpo(folder: Path, data: Path, epochs: int, scratch: str) -> list[float]:
    """Pairs/s of each epoch of TRL's DPOTrainer on our run's training pairs (its reference: a frozen copy)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from hydra_raytrain.data.tokenized import text

    train = text(str(data), str(folder), "preference", max_length=256, val_fraction=0.05).train
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    clock, ends = epoch_clock()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder)
    config = DPOConfig(
        output_dir=os.path.join(scratch, "trl_dpo"), per_device_train_batch_size=BATCH, num_train_epochs=epochs,
        learning_rate=LR, beta=BETA, max_length=256, save_strategy="no", eval_strategy="no", logging_strategy="no",
        report_to=[], use_cpu=True, dataloader_num_workers=0, lr_scheduler_type="constant", warmup_steps=0,
        disable_tqdm=True, optim="adamw_torch_fused", weight_decay=0.0, bf16=False,
    )  # fmt: skip
    dataset = Dataset.from_list([rows[int(i)] for i in train.rows])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[clock]).train()
    return [len(train) / (end - start) for start, end in zip(ends[::2], ends[1::2], strict=True)]


def steady(rates: list[float]) -> float:
    return statistics.median(rates[1:] or rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tokenized-rows", type=int, default=500_000, help="rows of the tokenization figures")
    parser.add_argument("--packed-rows", type=int, default=3000, help="rows of the packing figures")
    parser.add_argument("--classified-rows", type=int, default=4000, help="rows of the classifier's figures")
    parser.add_argument("--dpo-rows", type=int, default=1000, help="pairs of the DPO figures")
    parser.add_argument("--only", choices=["packing", "trl", "classifier", "dpo"], help="only this part")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = write_model(Path(scratch, "llama"), "llama", **SIZES, max_position_embeddings=PACK_LENGTH)
        if options.only in ("packing", "trl"):
            packing(folder, scratch, options.packed_rows, options.epochs, padded=options.only == "packing")
            return
        if options.only == "classifier":
            classifier(scratch, options.classified_rows, options.epochs)
            return
        if options.only == "dpo":
            dpo(folder, scratch, options.dpo_rows, options.epochs)
            return
        rows = varied_rows(options.rows)
        data = write_jsonl(Path(scratch, "train.jsonl"), rows)
        figures = {}
        for name, measure in (
            ("raw loop", lambda: raw_loop(folder, data, options.epochs)),
            ("transformers.Trainer", lambda: hf_trainer(folder, data, options.epochs, scratch)),
            ("hydra_raytrain, 1 worker", lambda: ours(folder, data, options.epochs, scratch)),
            (EVERY, lambda: ours(folder, data, options.epochs, scratch, "task.supervised_logits_only=false")),
        ):
            rates = measure()
            figures[name] = steady(rates)
            each = ", ".join(f"{rate:,.0f}" for rate in rates)
            print(f"{name:28s} {figures[name]:10,.0f} supervised tokens/s  (epochs: {each})", flush=True)
        raw = figures["raw loop"]
        print(f"ours / raw loop: {figures['hydra_raytrain, 1 worker'] / raw:.2f}x; "
              f"ours, every position's logits / raw loop: {figures[EVERY] / raw:.2f}x; "
              f"transformers.Trainer / raw loop: {figures['transformers.Trainer'] / raw:.2f}x")  # fmt: skip
        rates = tokenization(folder, varied_rows(options.tokenized_rows), scratch)
        plain = rates["a plain loop"]
        for name, rate in rates.items():
            print(f"tokenization, {name:28s} {rate:10,.0f} rows/s ({rate / plain:.2f}x a plain loop)", flush=True)
        packing(folder, scratch, options.packed_rows, options.epochs)
        classifier(scratch, options.classified_rows, options.epochs)
        dpo(folder, scratch, options.dpo_rows, options.epochs)


if __name__ == "__main__":
    main()
