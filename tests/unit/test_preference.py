"""Preference pairs (dataset.format=preference) and DPO's pure parts: each layout's sides and supervised labels, the
pairs batched chosen first, the refusals by name, and the losses against their formulas."""

import math

import pytest
import torch

from hydra_raytrain.config import ConfigError
from hydra_raytrain.data.tokenized import IGNORE, text
from tests.helpers.text import write_jsonl


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


STRINGS = [{"prompt": f"op {n}:", "chosen": f" a {n} b", "rejected": f" b {n}"} for n in ("add", "sub", "mul", "div")]


def test_string_pairs_supervise_each_completion_after_the_same_prompt(tmp_path, tokenizer_dir, tokenizer):
    data = write_jsonl(tmp_path / "pairs.jsonl", STRINGS)
    splits = text(str(data), str(tokenizer_dir), "preference", val_fraction=0.25, split_seed=0)
    assert (len(splits.train), len(splits.val)) == (3, 1)
    pair = splits.val[0]
    row = STRINGS[int(splits.val.rows[0])]
    prompt, eos = ids(tokenizer, row["prompt"]), [tokenizer.eos_token_id]
    for side in ("chosen", "rejected"):
        completion = ids(tokenizer, row[side]) + eos
        assert pair[side]["input_ids"].tolist() == prompt + completion
        assert pair[side]["labels"].tolist() == [IGNORE] * len(prompt) + completion


def test_a_batch_holds_the_chosen_sides_then_the_rejected_ones_padded(tmp_path, tokenizer_dir, tokenizer):
    data = write_jsonl(tmp_path / "pairs.jsonl", STRINGS)
    train = text(str(data), str(tokenizer_dir), "preference", val_fraction=0.25).train
    pairs = [train[i] for i in range(len(train))]
    batch = train.collate(pairs)
    sides = [pair["chosen"] for pair in pairs] + [pair["rejected"] for pair in pairs]
    assert batch["input_ids"].shape == (6, max(len(side["input_ids"]) for side in sides))
    for i, side in enumerate(sides):
        n = len(side["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == side["input_ids"].tolist()
        assert batch["attention_mask"][i].sum() == n and (batch["labels"][i, n:] == IGNORE).all()
    assert train.longest == max(len(side["input_ids"]) for side in sides)


def test_conversations_compare_their_last_assistant_turns_after_their_shared_turns(tmp_path, tokenizer_dir, tokenizer):
    prompt = [{"role": "user", "content": "op add:"}]
    implicit = {
        "chosen": prompt + [{"role": "assistant", "content": "a + b"}],
        "rejected": prompt + [{"role": "assistant", "content": "a - b"}],
    }
    explicit = {"prompt": prompt, **{side: turns[-1:] for side, turns in implicit.items()}}
    for name, row in (("implicit", implicit), ("explicit", explicit)):
        data = write_jsonl(tmp_path / f"{name}.jsonl", [row] * 2)
        pair = text(str(data), str(tokenizer_dir), "preference", val_fraction=0.5).train[0]
        head = ids(tokenizer, tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
        for side in ("chosen", "rejected"):
            whole = ids(tokenizer, tokenizer.apply_chat_template(implicit[side], tokenize=False))
            assert pair[side]["input_ids"].tolist() == whole, name
            assert pair[side]["labels"].tolist() == [IGNORE] * len(head) + whole[len(head) :], name


@pytest.mark.parametrize(
    "rows, key, says",
    [
        ([{"prompt": "a", "chosen": " b"}] * 4, "dataset.path", "rejected"),
        ([{"prompt": "a", "chosen": " b", "rejected": " b"}] * 4, "dataset.format", "chosen equals rejected"),
        ([{"chosen": " b", "rejected": " c"}] * 4, "dataset.columns.prompt", "need their prompt"),
        (
            [{"chosen": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
              "rejected": [{"role": "user", "content": "z"}, {"role": "assistant", "content": "w"}]}] * 4,
            "dataset.columns.chosen", "differ before their last turn",
        ),
        (
            [{"chosen": [{"role": "user", "content": "x"}], "rejected": [{"role": "user", "content": "z"}]}] * 4,
            "dataset.columns.chosen", "ending with an assistant turn",
        ),
    ],
)  # fmt: skip
def test_pairs_that_cannot_train_are_refused_by_name(tmp_path, tokenizer_dir, rows, key, says):
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as refused:
        text(str(data), str(tokenizer_dir), "preference")
    assert says in str(refused.value)


def test_a_pair_that_ties_is_dropped_and_said_and_preference_packs_nothing(tmp_path, tokenizer_dir):
    rows = STRINGS + [{"prompt": "op x:", "chosen": " y", "rejected": " y"}]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    with pytest.warns(UserWarning, match="1 rows of dataset.path have chosen = rejected: dropped"):
        splits = text(str(data), str(tokenizer_dir), "preference", val_fraction=0.25)
    assert len(splits.train) + len(splits.val) == 4
    with pytest.raises(ConfigError, match="dataset.packing"):
        text(str(data), str(tokenizer_dir), "preference", packing=True)
    with pytest.raises(ConfigError, match="dataset.tokenize='ray_data'"):
        text(str(data), str(tokenizer_dir), "preference", tokenize="ray_data")


def logistic(x):
    return -math.log(1 / (1 + math.exp(-x)))


def test_the_dpo_losses_follow_their_formulas_and_start_at_ln_2():
    from tasks.dpo import preference_loss

    chosen, rejected, ref_chosen, ref_rejected = torch.tensor(
        [[-3.0, -5.0], [-4.0, -2.0], [-3.5, -4.0], [-3.0, -3.0]], dtype=torch.float64
    )
    beta = 0.5
    margins = [((c - rc) - (r - rr)) for c, r, rc, rr in zip(chosen, rejected, ref_chosen, ref_rejected, strict=True)]
    sigmoid = preference_loss(chosen, rejected, ref_chosen, ref_rejected, beta, "sigmoid", 0.0)
    assert sigmoid.tolist() == pytest.approx([logistic(beta * float(m)) for m in margins], rel=1e-12)
    smoothed = preference_loss(chosen, rejected, ref_chosen, ref_rejected, beta, "sigmoid", 0.2)
    expected = [0.8 * logistic(beta * float(m)) + 0.2 * logistic(-beta * float(m)) for m in margins]
    assert smoothed.tolist() == pytest.approx(expected, rel=1e-12)
    ipo = preference_loss(chosen, rejected, ref_chosen, ref_rejected, beta, "ipo", 0.0)
    assert ipo.tolist() == pytest.approx([(float(m) - 1 / (2 * beta)) ** 2 for m in margins], rel=1e-12)
    same = preference_loss(chosen, rejected, chosen, rejected, beta, "sigmoid", 0.0)
    assert same.tolist() == [math.log(2)] * 2


@pytest.mark.parametrize(
    "dataset, task, key",
    [
        ({"_target_": "hydra_raytrain.data.digits"}, "hydra_raytrain.tasks.dpo.DPO", "task"),
        ({"_target_": "hydra_raytrain.data.text", "format": "text"}, "hydra_raytrain.tasks.dpo.DPO", "dataset.format"),
        (
            {"_target_": "hydra_raytrain.data.text", "format": "preference"},
            "hydra_raytrain.tasks.causal_lm.CausalLM",
            "dataset.format",
        ),
    ],
)
def test_dpo_takes_pairs_and_pairs_take_dpo(dataset, task, key):
    from hydra_raytrain.data.text_labels import check_text_task

    with pytest.raises(ConfigError) as refused:
        check_text_task(dataset, {"_target_": task})
    assert refused.value.key == key


def test_a_dpo_setting_out_of_range_is_refused_by_name():
    from tasks.dpo import DPO

    for settings, key in (({"beta": 0}, "task.beta"), ({"loss": "hinge"}, "task.loss")):
        with pytest.raises(ConfigError) as refused:
            DPO(**settings)
        assert refused.value.key == key
    with pytest.raises(ConfigError, match="task.label_smoothing"):
        DPO(loss="ipo", label_smoothing=0.1)


def test_a_dpo_reference_that_cannot_be_built_again_is_refused_by_name():
    """New weights (model.path=null) are drawn anew at each build: a frozen or precomputed reference of them would
    not be the policy's start. LoRA's adapters off, or run.init_from's weights, are."""
    from hydra_raytrain.data.text_labels import check_reference

    dpo, new = (
        {"_target_": "hydra_raytrain.tasks.dpo.DPO"},
        {"_target_": "hydra_raytrain.models.causal_lm", "path": None},
    )
    with pytest.raises(ConfigError) as refused:
        check_reference(dpo, new, "none", None)
    assert refused.value.key == "model.path" and "peft=lora" in str(refused.value)
    with pytest.raises(ConfigError):
        check_reference({**dpo, "precompute_reference": True}, new, "lora", None)
    check_reference(dpo, new, "lora", None)
    check_reference(dpo, new, "none", "outputs/runs/sft")
    check_reference(dpo, {**new, "path": "models/base"}, "none", None)
