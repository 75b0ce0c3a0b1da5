"""Text classification's pure parts: the classes read and sorted, the labels as indices, token types of text pairs,
the padding collate, the refusals by name (one class, an unseen label, a class the training split lacks, labels of
no class type, packing, Ray Data), the model's head and names, LoRA's head, the task's step, and what predict and
serve answer with."""

import pytest
import torch

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.finetuning import PeftConfig
from hydra_raytrain.data.splits import split_indices
from hydra_raytrain.data.text_labels import check_text_task, text_classes
from hydra_raytrain.data.tokenized import text
from hydra_raytrain.models.text import text_classifier
from hydra_raytrain.recipe.finetune import add_adapters
from hydra_raytrain.tasks.classification import TextClassification
from tests.helpers.text import review_rows, write_bert, write_jsonl

COLUMNS = {"text": "review", "label": "stars"}
Z_SEED = next(seed for seed in range(100) if 12 in split_indices(13, 0.25, seed, 0.0, None, 0)[1])


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return write_bert(tmp_path_factory.mktemp("bert"))


def classified(path, bert, **options):
    return text(str(path), str(bert), "classification", **{"columns": COLUMNS, "val_fraction": 0.25, **options})


def test_the_classes_are_the_training_rows_labels_sorted_and_each_row_holds_its_index(tmp_path, bert):
    rows = [{"review": f"a film {i}", "stars": label} for i, label in enumerate(["pos", "neg", "mid", "pos"] * 4)]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    assert text_classes(str(data), "classification", COLUMNS) == ["mid", "neg", "pos"]
    assert text_classes(str(data), "messages", COLUMNS) is None  # the other formats: no classes
    splits = classified(data, bert)
    assert splits.train.targets.tolist() == [["mid", "neg", "pos"].index(row["stars"]) for row in rows]
    every = [splits.train[i] for i in range(len(splits.train))] + [splits.val[i] for i in range(len(splits.val))]
    assert sorted(int(row["labels"]) for row in every) == sorted(["mid", "neg", "pos"].index(r["stars"]) for r in rows)
    integers = write_jsonl(tmp_path / "ints.jsonl", [{"review": "a film", "stars": s} for s in [10, 2, 2, 10, 7] * 2])
    assert text_classes(str(integers), "classification", COLUMNS) == [2, 7, 10]  # numbers in their order


def test_a_text_pair_gets_token_types_and_the_collate_pads_every_input(tmp_path, bert):
    from transformers import AutoTokenizer

    rows = [{"review": "the film", "second": "was great", "stars": s} for s in ["a", "b"] * 4]
    data = write_jsonl(tmp_path / "pairs.jsonl", [rows[0] | {"second": "a long and slow film"}] + rows[1:])
    splits = classified(data, bert, columns={**COLUMNS, "text_pair": "second"}, val_path=str(data))  # in order
    tokenizer = AutoTokenizer.from_pretrained(bert)
    row = splits.train[0]
    expected = tokenizer(rows[0]["review"], "a long and slow film")
    assert row["input_ids"].tolist() == expected["input_ids"]
    assert row["token_type_ids"].tolist() == expected["token_type_ids"] and 1 in expected["token_type_ids"]
    batch = splits.train.collate([splits.train[i] for i in range(len(splits.train))])
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert batch["labels"].tolist() == [0, 1] * 4
    assert batch["attention_mask"].sum(1).tolist() == [len(splits.train[i]["input_ids"]) for i in range(8)]
    assert batch["input_ids"][1, batch["attention_mask"][1].sum() :].eq(tokenizer.pad_token_id).all()


@pytest.mark.parametrize(
    "rows, options, key, words",
    [
        ([{"review": "a", "stars": "pos"}] * 6, {}, "dataset.columns.label", "holds one label ('pos')"),
        ([{"review": "a", "stars": 0.5}, {"review": "b", "stars": 1.5}] * 3, {}, "dataset.columns.label", "float"),
        ([{"review": "a", "stars": "x"}, {"review": "b", "stars": 1}] * 3, {}, "dataset.path", "string to number"),
        ([{"review": "a", "stars": "x"}, {"review": "b", "stars": None}] * 3, {}, "dataset.columns.label", "no label"),
        ([{"review": "a", "stars": s} for s in "xy" * 3], {"packing": True}, "dataset.packing", "packs nothing"),
        ([{"review": "a", "stars": s} for s in "xy" * 3], {"tokenize": "ray_data"}, "dataset.tokenize", "driver"),
        # one row of "z" after twelve: validation (a quarter of the rows) draws it, training never sees it
        ([{"review": "a", "stars": s} for s in "xy" * 6 + "z"], {"split_seed": Z_SEED}, "dataset.val_fraction", "'z'"),
    ],
)
def test_bad_classification_rows_are_refused_by_name(tmp_path, bert, rows, options, key, words):
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(ConfigError) as caught:
        classified(data, bert, **options)
    assert caught.value.key == key and words in str(caught.value)


def test_files_whose_labels_mix_strings_and_integers_are_refused(tmp_path, bert):
    write_jsonl(tmp_path / "rows" / "a.jsonl", [{"review": "a", "stars": s} for s in "xy"])
    write_jsonl(tmp_path / "rows" / "b.jsonl", [{"review": "a", "stars": s} for s in (1, 2)])
    with pytest.raises(ConfigError, match="holds int, str values") as caught:
        classified(tmp_path / "rows", bert)
    assert caught.value.key == "dataset.columns.label"


def test_a_validation_file_with_a_label_training_never_has_is_refused_naming_it(tmp_path, bert):
    data = write_jsonl(tmp_path / "train.jsonl", [{"review": "a", "stars": s} for s in "xy" * 3])
    held = write_jsonl(tmp_path / "val.jsonl", [{"review": "a", "stars": s} for s in "xyw"])
    with pytest.raises(ConfigError) as caught:
        classified(data, bert, val_path=str(held))
    assert caught.value.key == "dataset.val_path" and "'w'" in str(caught.value) and "'x', 'y'" in str(caught.value)


def test_the_classifier_names_its_classes_and_lora_trains_its_new_head_with_the_adapters(bert):
    model = text_classifier(str(bert), labels=["negative", "positive"])
    assert model.config.id2label == {0: "negative", 1: "positive"} and model.num_labels == 2
    with pytest.raises(ConfigError) as caught:
        text_classifier(str(bert), labels=[])
    assert caught.value.key == "model.labels"
    assert text_classifier(str(bert), labels=["score"]).num_labels == 1  # a score head: a reward model's
    adapted = add_adapters(model, PeftConfig(method="lora", r=4, alpha=8))
    trainable = {name for name, p in adapted.named_parameters() if p.requires_grad}
    assert any("lora_A" in name for name in trainable)
    assert {name for name in trainable if "lora" not in name} == {
        "base_model.model.classifier.modules_to_save.default.weight",
        "base_model.model.classifier.modules_to_save.default.bias",
    }
    assert type(adapted).__name__ == "PeftModelForSequenceClassification"


def test_the_step_scores_the_logits_of_ids_mask_and_types(tmp_path, bert):
    splits = classified(write_jsonl(tmp_path / "rows.jsonl", review_rows(16)), bert)
    torch.manual_seed(0)
    model = text_classifier(str(bert), labels=["negative", "positive"]).eval()
    batch = splits.train.collate([splits.train[i] for i in range(len(splits.train))])
    task = TextClassification(metrics=["f1"])
    output = task.training_step(model, batch)
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    expected = torch.nn.functional.cross_entropy(logits, batch["labels"])
    torch.testing.assert_close(output.outputs[0], logits, rtol=0, atol=1e-7)  # its mask and types read, not guessed
    torch.testing.assert_close(output.loss, expected, rtol=0, atol=1e-7)
    assert int(output.sums["count"]) == len(splits.train)
    assert int(output.sums["accuracy"]) == int((logits.argmax(1) == batch["labels"]).sum())
    assert "f1" in task.compute({**task.validation_step(model, batch)})


def test_a_text_format_that_does_not_fit_the_task_is_refused_naming_the_format():
    text_node, classify = {"_target_": "hydra_raytrain.data.text"}, "hydra_raytrain.tasks.classification."
    for format, task, words in [
        ("text", classify + "TextClassification", "dataset.format=classification"),
        ("classification", "hydra_raytrain.tasks.causal_lm.CausalLM", "task=text_classification"),
    ]:
        with pytest.raises(ConfigError, match=words) as caught:
            check_text_task({**text_node, "format": format}, {"_target_": task})
        assert caught.value.key == "dataset.format"
    check_text_task({**text_node, "format": "classification"}, {"_target_": classify + "TextClassification"})
    with pytest.raises(ConfigError, match="task=classification for images and tables") as caught:
        check_text_task({"_target_": "hydra_raytrain.data.digits"}, {"_target_": classify + "TextClassification"})
    assert caught.value.key == "task"
    check_text_task({"_target_": "hydra_raytrain.data.digits"}, {"_target_": classify + "Classification"})
