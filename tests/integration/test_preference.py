"""Preference tuning (task=dpo, dataset.format=preference) on a tiny Llama built here: the first step's loss is ln 2
(the policy is its reference, with LoRA's adapters off or as a frozen copy), and the loss is exact in pairs whatever
the workers and accumulation."""

import json
import math

import pytest
import torch

from hydra_raytrain import train
from tests.conftest import compose_config
from tests.helpers.text import preference_rows, write_jsonl, write_model

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
    "2 workers x 4": ("scaling.num_workers=2", "trainer.batch_size=8"),
}
METRICS = ("loss", "rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin", "logps_chosen")


def test_dpo_starts_at_ln_2_and_its_loss_is_exact_in_pairs_whatever_the_workers(ray_address, dpo_run, tmp_path):
    """The first step's loss is ln 2 to float64's accuracy, the reference being the policy: LoRA's adapters off and
    a frozen copy alike. 1 worker with 8 pairs a step, 1 worker with 4 x 2 accumulated and 2 workers with 4 each take
    the same steps (float64, 1e-9): each step divides by its pairs on all workers and micro-batches, and every
    metric is a sum over pairs."""
    for reference in ("peft=none", "peft=lora"):
        first = ("scaling.num_workers=0", "trainer.max_epochs=1", "trainer.limit_train_batches=1", reference)
        run_dir = tmp_path / f"first_{reference}"
        assert train(compose_config(*dpo_run, *first), run_dir=str(run_dir))["status"] == "completed"
        [epoch] = history(run_dir)
        assert epoch["train_loss"] == pytest.approx(math.log(2), rel=1e-15, abs=1e-15), reference
        assert epoch["train_reward_margin"] == 0.0 and epoch["train_reward_accuracy"] == 0.0, reference
    runs = {}
    for label, layout in LAYOUTS.items():
        run_dir = tmp_path / label.replace(" ", "_")
        summary = train(compose_config(*dpo_run, *layout), run_dir=str(run_dir))
        assert summary["status"] == "completed", summary
        runs[label] = run_dir
    reference = history(runs["1 worker x 8"])
    assert [epoch["step"] for epoch in reference] == [5, 10]  # 36 training pairs, 8 a step (the last one wraps)
    # it learns the training pairs (each pair rejects the next one's chosen side: the first steps' moves conflict)
    assert reference[1]["train_loss"] < reference[0]["train_loss"]
    assert reference[1]["train_reward_accuracy"] > max(0.5, reference[0]["train_reward_accuracy"])
    for label, run_dir in runs.items():
        for epoch, expected in zip(history(run_dir), reference, strict=True):
            for metric in (f"{split}_{name}" for split in ("train", "val") for name in METRICS):
                assert epoch[metric] == pytest.approx(expected[metric], rel=1e-9, abs=1e-9), (label, metric)
        final = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
        for name, tensor in torch.load(runs["1 worker x 8"] / "model.pt", weights_only=True).items():
            assert torch.allclose(final[name], tensor, rtol=1e-9, atol=1e-10), (label, name)
