"""The causal LM task's head on the supervised positions: the same loss and gradients as every position's logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hydra_raytrain.data.tokenized import TokenizedRows, supervised_positions
from hydra_raytrain.tasks.causal_lm import IGNORE, CausalLM, supervised_head


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).double()


def batch():
    """Two rows: a prompt of 3 and 5 tokens (masked), completions of 4 and 2, the second padded at the end."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 97, (2, 9), generator=generator)
    labels = ids.clone()
    labels[0, :3] = IGNORE
    labels[1, :5], labels[1, 7:] = IGNORE, IGNORE
    attention = torch.ones_like(ids)
    attention[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def loss_and_grads(task: CausalLM, model):
    model.zero_grad()
    output = task.training_step(model, batch())
    output.loss.backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("wrap", ["plain", "lora"])
def test_the_head_on_supervised_positions_gives_every_positions_loss_and_gradients(wrap):
    model = tiny_llama()
    if wrap == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "lm_head"]))
    selected, selected_grads = loss_and_grads(CausalLM(), model)
    full, full_grads = loss_and_grads(CausalLM(supervised_logits_only=False), model)
    assert selected.normalizer.item() == full.normalizer.item() == 6 + 2  # row 0: tokens 3-8; row 1: tokens 5-6
    torch.testing.assert_close(selected.loss, full.loss, rtol=1e-12, atol=0)
    assert selected_grads.keys() == full_grads.keys() and any(g.abs().sum() > 0 for g in full_grads.values())
    for name, grad in full_grads.items():
        torch.testing.assert_close(selected_grads[name], grad, rtol=1e-10, atol=1e-14, msg=name)


def test_the_head_sees_only_the_supervised_positions_and_is_left_as_it_was():
    model, seen = tiny_llama(), []
    head = model.get_output_embeddings()
    head.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    labels = batch()["labels"]
    with supervised_head(model, labels.shape, supervised_positions(labels)):
        model(input_ids=batch()["input_ids"])
    model(input_ids=batch()["input_ids"])  # after it: every position again (generation, predict)
    assert seen == [(8, 97), (2, 9, 97)]
    with supervised_head(model, labels.shape, None):
        model(input_ids=batch()["input_ids"])
    assert seen[-1] == (2, 9, 97)


def test_the_collate_names_the_supervised_positions_on_the_host_and_a_step_counts_rows():
    pairs = [([5, 6, 7, 8], [IGNORE, IGNORE, 7, 8]), ([5, 6], [IGNORE, 6])]
    rows = TokenizedRows.of([(np.array(ids), np.array(labels)) for ids, labels in pairs], pad_id=0)
    collated = rows.collate([rows[0], rows[1]])
    # Row 0: positions 1 and 2 predict its supervised tokens 7 and 8; row 1 (length 4 in the batch): position 0
    assert collated["supervised"].tolist() == [1, 2, 4]
    assert collated["supervised"].tolist() == supervised_positions(collated["labels"]).tolist()
    output = CausalLM().training_step(tiny_llama(), collated)
    assert output.sums["count"].item() == 2 and output.normalizer.item() == 3  # rows, supervised tokens


def test_a_batch_that_supervises_nothing_steps_with_a_zero_loss():
    model, nothing = tiny_llama(), {**batch(), "labels": torch.full((2, 9), IGNORE)}
    output = CausalLM().training_step(model, nothing)
    output.loss.backward()
    assert output.loss.item() == 0 and output.normalizer.item() == 0 and output.sums["count"].item() == 2


def test_a_head_under_activation_checkpointing_keeps_every_positions_logits():
    """Checkpointing recomputes the head in the backward pass, after the selection is gone: left alone."""
    from hydra_raytrain.recipe.parallel import checkpoint_activations

    model = tiny_llama()
    assert checkpoint_activations(model, ["Linear"]) > 1  # the head among them
    selected, _ = loss_and_grads(CausalLM(), model)  # the backward pass recomputes the head without an error
    full, _ = loss_and_grads(CausalLM(supervised_logits_only=False), tiny_llama())
    torch.testing.assert_close(selected.loss, full.loss, rtol=1e-12, atol=0)
