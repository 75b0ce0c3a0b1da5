"""Fine-tuning causal language models (task=causal_lm, model=causal_lm, dataset=text), full and LoRA, on a tiny
Llama built here with a tokenizer trained here: the loss exact in supervised tokens whatever the workers and
accumulation, LoRA's adapters alone training, the same on 1 and 2 workers."""

import json

import pytest
import torch

from hydra_raytrain import train
from tests.conftest import compose_config
from tests.helpers.text import varied_rows, write_jsonl, write_model

pytestmark = [pytest.mark.integration, pytest.mark.workers]


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A tiny Llama (its tokenizer beside it) and prompt/completion rows whose supervised tokens per row vary
    from 1 to 24: the overrides of a float64 run on them (2 epochs, a global batch of 8)."""
    folder = tmp_path_factory.mktemp("text")
    model = write_model(folder / "llama", "llama")
    data = write_jsonl(folder / "train.jsonl", varied_rows(48))
    return (
        "task=causal_lm",
        "model=causal_lm",
        f"model.path={model}",
        "dataset=text",
        f"dataset.path={data}",
        "dataset.format=prompt_completion",
        "dataset.val_fraction=0.25",
        "trainer.max_epochs=2",
        "trainer.precision=64",
        "optimizer.lr=0.01",
        "trainer.progress_bar=false",
    )


def history(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir):
    return torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)


LAYOUTS = {
    "1 worker x 8": ("scaling.num_workers=0", "trainer.batch_size=8"),
    "1 worker x 4 x 2 accumulated": ("scaling.num_workers=0", "trainer.batch_size=4", "trainer.accumulate_grad_batches=2"),
    "2 workers x 4": ("scaling.num_workers=2", "trainer.batch_size=8"),
}  # fmt: skip


def test_the_loss_is_exact_in_supervised_tokens_whatever_the_workers_and_accumulation(ray_address, text_run, tmp_path):
    """1 worker with batch 8, 1 worker with 4 x 2 accumulation and 2 workers with 4 each take the same steps (to
    float64's accuracy): every step divides by its supervised tokens on all workers and micro-batches. A mean per
    worker's micro-batch (what most loops take) on 2 workers x 4 moves away from them."""
    runs = {}
    for label, layout in LAYOUTS.items():
        run_dir = tmp_path / label.replace(" ", "_")
        summary = train(compose_config(*text_run, *layout), run_dir=str(run_dir))
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
        final = weights(run_dir)
        for name, tensor in weights(runs["1 worker x 8"]).items():
            assert torch.allclose(final[name], tensor, rtol=1e-9, atol=1e-10), (label, name)
    mean_dir = tmp_path / "mean"
    mean = ("task._target_=tests.helpers.tasks.MeanPerBatchLM", *LAYOUTS["2 workers x 4"])
    assert train(compose_config(*text_run, *mean), run_dir=str(mean_dir))["status"] == "completed"
    assert abs(history(mean_dir)[-1]["val_loss"] - reference[-1]["val_loss"]) > 1e-4
