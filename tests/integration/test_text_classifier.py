"""Text classification (task=text_classification, model=text_classifier, dataset=text dataset.format=classification)
on a tiny BERT built here with a WordPiece vocabulary of its own: a keyword rule learned on 2 workers, the run's
export loaded by transformers' pipeline with the label names, predict and serve answering as the export does; LoRA
training the new head with its adapters."""

import json
import sys

import pytest

from hydra_raytrain import train
from tests.conftest import compose_config, run_predict, unused_port
from tests.helpers.text import classifier_overrides, review_rows, write_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.workers]

LEARN = ("optimizer=adamw", "optimizer.lr=1e-3", "trainer.batch_size=16", "trainer.max_epochs=10")


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    """A tiny BERT and 192 reviews labelled by the keyword rule: the overrides of a run on them."""
    return classifier_overrides(tmp_path_factory.mktemp("reviews"))


def test_a_tiny_bert_learns_a_keyword_rule_on_2_workers_and_export_predict_and_serve_agree(
    ray_address, reviews, tmp_path
):
    """The rule learned to >= 0.95 on held-out rows by 2 DDP workers (F1 and AUROC reported, exact across them);
    then, offline: ``pipeline("text-classification")`` on the exported folder names each new review's class;
    predict (Ray Data on the session's cluster) writes the same class beside each row's columns, and serve answers
    the same label and probability over HTTP."""
    from transformers import pipeline

    from hydra_raytrain.inference.export import export
    from tests.helpers.serving import ask, serving

    run = tmp_path / "run"
    cfg = compose_config(*reviews, *LEARN, "scaling.num_workers=2", "+task.metrics=[f1,auroc]")
    summary = train(cfg, run_dir=str(run))
    assert summary["status"] == "completed", summary
    final = summary["final"]
    assert final["val_accuracy"] >= 0.95 and final["val_f1"] >= 0.95 and final["val_auroc"] >= 0.95, final
    assert json.loads((run / "config.json").read_text())["dataset"]["classes"] == ["negative", "positive"]

    export(str(run), "hf")
    classify = pipeline("text-classification", model=str(run / "export" / "hf"))
    new = review_rows(40, seed=1)  # reviews the run never saw
    exported = classify([row["review"] for row in new])
    assert sum(a["label"] == row["stars"] for a, row in zip(exported, new, strict=True)) >= 38

    data = write_jsonl(tmp_path / "new.jsonl", new)
    written = sorted(zip(*run_predict(run, data, "labelled", tmp_path, ray_address).values(), strict=True))
    assert [(i, review, stars) for i, review, stars, _, _ in written] == [tuple(row.values()) for row in new]
    for (_, _, _, label, probability), answer in zip(written, exported, strict=True):
        assert label == answer["label"] and probability == pytest.approx(answer["score"], abs=1e-5)

    port = unused_port()
    command = [sys.executable, "-m", "hydra_raytrain.serve", str(run), "--port", str(port)]
    with serving([*command, "--address", ray_address], tmp_path, port) as server:
        health = json.loads(server.health)
        assert health == {"status": "ready", "run": "run", "inputs": "texts", "classes": ["negative", "positive"]}
        status, text = ask(port, "POST", "/predict", json.dumps({"inputs": [r["review"] for r in new[:5]]}).encode())
        assert status == 200, text
        answered = json.loads(text)["predictions"]
        assert [a["label"] for a in answered] == [a["label"] for a in exported[:5]]
        assert [a["probability"] for a in answered] == pytest.approx([a["score"] for a in exported[:5]], abs=1e-5)
    assert server.process.returncode == 0, server.errors.read_text()[-3000:]


@pytest.mark.long("the gate's keyword-rule test carries text classification; LoRA's own is the causal LM's kill test")
def test_lora_trains_the_classifier_s_new_head_with_its_adapters_and_both_exports_load(ray_address, reviews, tmp_path):
    """peft=lora on 2 workers: the encoder's weights frozen, the adapters and the new head (peft's modules_to_save)
    trained and saved alone; the peft folder loads onto the base with PeftModel, the merged hf folder with the
    pipeline, each checked against the run's logits by export, and the rule learned well above chance."""
    import torch
    from transformers import pipeline

    from hydra_raytrain.inference.export import export

    run = tmp_path / "run"
    lora = ("peft=lora", "optimizer.lr=1e-2", "trainer.max_epochs=12", "scaling.num_workers=2")
    summary = train(compose_config(*reviews, *LEARN, *lora), run_dir=str(run))
    assert summary["status"] == "completed" and summary["final"]["val_accuracy"] >= 0.8, summary
    saved = torch.load(run / "model.pt", map_location="cpu", weights_only=True)
    assert {name for name in saved if "lora_" not in name} == {
        "base_model.model.classifier.modules_to_save.default.weight",
        "base_model.model.classifier.modules_to_save.default.bias",
    }
    assert export(str(run), "peft")["max_abs_diff"] <= 1e-4
    assert export(str(run), "hf")["max_abs_diff"] <= 1e-4
    classify = pipeline("text-classification", model=str(run / "export" / "hf"))
    new = review_rows(40, seed=2)
    answers = classify([row["review"] for row in new])
    assert sum(a["label"] == row["stars"] for a, row in zip(answers, new, strict=True)) >= 32
