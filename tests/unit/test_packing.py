"""Packing (``dataset.packing=true``, hydra_raytrain/data/packing.py): rows placed best-fit decreasing, documents kept
apart (positions restart, no attention and no label across a boundary), the loss the same as unpacked."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from hydra_raytrain.config import ConfigError
from hydra_raytrain.data.packing import PackedRows, best_fit_decreasing, check_packing
from hydra_raytrain.data.tokenized import IGNORE, TokenizedRows
from hydra_raytrain.tasks.causal_lm import CausalLM, inputs_of

VOCABULARY = 97
ATTENTION = ["eager", "sdpa"]


def tiny(model_type: str, attention: str, seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = {
        "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2),
        "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0),
    }[model_type]  # fmt: skip
    config = AutoConfig.for_model(model_type, vocab_size=VOCABULARY, **sizes)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention).double()


def rows(lengths=(7, 3, 12, 5, 1, 9, 4, 2), pad_id=0, seed=1) -> TokenizedRows:
    """Rows of the given lengths, each with a masked prompt of a third of it (a text row's labels are its ids)."""
    generator = np.random.default_rng(seed)
    pairs = []
    for n in lengths:
        ids = generator.integers(3, VOCABULARY, n)
        labels = ids.copy()
        labels[: n // 3] = IGNORE
        pairs.append((ids, labels))
    return TokenizedRows.of(pairs, pad_id)


def reference_best_fit(lengths, capacity):
    """Best-fit decreasing by a scan of every pack (quadratic): what the segment tree must reproduce."""
    packs, rooms = [], []
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        fitting = [p for p, room in enumerate(rooms) if room >= lengths[row]]
        if not fitting:
            packs.append([]), rooms.append(capacity)
            fitting = [len(packs) - 1]
        best = min(fitting, key=lambda p: rooms[p])
        packs[best].append(row)
        rooms[best] -= lengths[row]
    return sorted(sorted(pack) for pack in packs)


def test_best_fit_decreasing_places_every_row_once_in_the_tightest_pack():
    assert [p.tolist() for p in best_fit_decreasing(np.array([5, 4, 3, 3, 2, 1]), 8)] == [[0, 2], [1, 3, 5], [4]]
    generator = np.random.default_rng(0)
    for capacity in (8, 33, 64):
        lengths = generator.integers(1, capacity + 1, 300)
        packs = best_fit_decreasing(lengths, capacity)
        assert sorted(np.concatenate(packs).tolist()) == list(range(300))
        assert all(lengths[pack].sum() <= capacity for pack in packs)
        # rooms of equal size may be taken in either order: the packs' fill is what best fit fixes
        assert sorted(lengths[p].sum() for p in packs) == sorted(
            lengths[p].sum() for p in reference_best_fit(lengths.tolist(), capacity)
        )
    with pytest.raises(ValueError, match="a row of 9 tokens does not fit a pack of 8"):
        best_fit_decreasing(np.array([9]), 8)


def test_a_pack_restarts_positions_and_masks_each_documents_first_label():
    packed = PackedRows(rows(), 16)
    assert len(packed) < len(packed.rows) and all(len(packed[i]["input_ids"]) <= 16 for i in range(len(packed)))
    for index in range(len(packed)):
        pack, documents = packed[index], [packed.rows[int(r)] for r in packed.packs[index]]
        starts = np.cumsum([0] + [len(d["input_ids"]) for d in documents])[:-1]
        assert torch.equal(pack["input_ids"], torch.cat([d["input_ids"] for d in documents]))
        assert pack["position_ids"].tolist() == [t for d in documents for t in range(len(d["input_ids"]))]
        assert all(pack["labels"][s] == IGNORE for s in starts)  # nothing predicts a document's first token
        assert (pack["labels"] != IGNORE).sum() == sum((d["labels"][1:] != IGNORE).sum() for d in documents)
    batch = packed.collate([packed[i] for i in range(len(packed))])
    assert "attention_mask" not in batch  # a 2D mask would turn transformers' packed-sequence mask off
    padded = batch["labels"] == IGNORE
    assert (batch["input_ids"][padded & (batch["position_ids"] == 0)] >= 0).all()


def loss_and_grads(model, batch):
    model.zero_grad()
    output = CausalLM().training_step(model, batch)
    output.loss.backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("model_type, attention", list(itertools.product(["llama", "gpt2"], ATTENTION)))
def test_one_step_over_rows_packed_gives_the_loss_and_gradients_of_the_rows_unpacked(model_type, attention):
    model, data = tiny(model_type, attention), rows()
    packed = PackedRows(data, 16)
    plain, plain_grads = loss_and_grads(model, data.collate([data[i] for i in range(len(data))]))
    pack, pack_grads = loss_and_grads(model, packed.collate([packed[i] for i in range(len(packed))]))
    assert plain.normalizer.item() == pack.normalizer.item() > 0
    torch.testing.assert_close(pack.loss, plain.loss, rtol=1e-9, atol=0)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(pack_grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("model_type, attention", list(itertools.product(["llama", "gpt2"], ATTENTION)))
def test_changing_one_document_leaves_every_other_documents_logits_in_the_pack_unchanged(model_type, attention):
    model, data = tiny(model_type, attention).eval(), rows()
    packed = PackedRows(data, 32)
    index = max(range(len(packed)), key=lambda i: len(packed.packs[i]))  # the pack of the most documents
    pack = packed[index]
    lengths = [len(packed.rows[int(r)]["input_ids"]) for r in packed.packs[index]]
    bounds = np.cumsum([0, *lengths])
    assert len(lengths) >= 3

    def logits(ids):
        batch = {"input_ids": ids[None], "position_ids": pack["position_ids"][None]}
        with torch.no_grad():
            return model(**inputs_of(batch)).logits[0]

    before = logits(pack["input_ids"])
    for changed in range(len(lengths)):
        ids = pack["input_ids"].clone()
        ids[bounds[changed] : bounds[changed + 1]] = (ids[bounds[changed] : bounds[changed + 1]] + 1) % VOCABULARY
        after = logits(ids)
        for other in set(range(len(lengths))) - {changed}:
            span = slice(bounds[other], bounds[other + 1])
            torch.testing.assert_close(after[span], before[span], rtol=0, atol=1e-12)
        assert not torch.allclose(
            after[bounds[changed] : bounds[changed + 1]], before[bounds[changed] : bounds[changed + 1]]
        )
    for document in range(len(lengths)):  # and each document's logits are its logits alone, to float32's rounding:
        span = slice(bounds[document], bounds[document + 1])  # Llama's rotary angles are float32, and torch's cos
        with torch.no_grad():  # rounds an angle by its place in the vector (the first document differs as much)
            alone = model(input_ids=pack["input_ids"][span][None]).logits[0]
        torch.testing.assert_close(before[span], alone, rtol=1e-6, atol=1e-7)


def test_a_tokenizer_whose_padding_is_its_end_of_sequence_keeps_eos_supervised_packed_and_not(tmp_path):
    from transformers import AutoTokenizer

    from hydra_raytrain.data.tokenized import Tokenize
    from tests.helpers.text import write_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(write_tokenizer(tmp_path / "tok"))
    tokenizer.pad_token = tokenizer.eos_token
    eos = tokenizer.eos_token_id
    texts = [{"text": "def f(a):"}, {"text": "return a + b"}, {"text": "x"}]
    pairs, _, _ = Tokenize(tokenizer, "text", {"text": "text"}, 64).cut(texts)
    data = TokenizedRows.of(pairs, tokenizer.pad_token_id)
    packed = PackedRows(data, 64)
    for batch in (data.collate([data[i] for i in range(3)]), packed.collate([packed[i] for i in range(len(packed))])):
        supervised_eos = ((batch["labels"] == eos) & (batch["input_ids"] == eos)).sum()
        assert supervised_eos == 3, batch  # each document's end, learned; the padding (eos ids too) is not
        assert ((batch["input_ids"] == eos) & (batch["labels"] == IGNORE)).sum() == (
            batch["input_ids"] == eos
        ).sum() - 3


class CumulativeMean(torch.nn.Module):
    """A causal model that takes position ids and ignores them: each position's logits from the mean of every
    embedding up to it, across a document boundary or not."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"vocab_size": VOCABULARY})()
        self.embed, self.head = torch.nn.Embedding(VOCABULARY, 8), torch.nn.Linear(8, VOCABULARY)

    def forward(self, input_ids, position_ids=None, use_cache=None, attention_mask=None):
        hidden = self.embed(input_ids).cumsum(1) / torch.arange(1, input_ids.size(1) + 1)[None, :, None]
        return type("Output", (), {"logits": self.head(hidden)})()


class NoPositions(CumulativeMean):
    def forward(self, input_ids, attention_mask=None):
        return super().forward(input_ids)


@pytest.mark.parametrize("attention", ATTENTION)
def test_packing_is_refused_for_a_model_that_lets_documents_in_and_accepted_for_transformers_masks(attention):
    check_packing({"packing": True}, {"model": tiny("llama", attention).float(), "gpt2": tiny("gpt2", attention)})
    check_packing({"packing": False}, {"model": CumulativeMean()})
    with pytest.raises(
        ConfigError,
        match=r"dataset.packing=True: the model \(model: CumulativeMean\) lets packed "
        r"documents attend to each other .*Valid: dataset.packing=false, or a model whose attention",
    ):
        check_packing({"packing": True}, {"model": CumulativeMean()})
    with pytest.raises(ConfigError, match=r"the model \(model: NoPositions\) takes no position_ids"):
        check_packing({"packing": True}, {"model": NoPositions()})
    flash = tiny("llama", attention)
    flash.config._attn_implementation = "flash_attention_2"  # packed by transformers for a batch of one row only
    with pytest.raises(ConfigError, match=r"attends with flash_attention_2, .* sdpa or eager"):
        check_packing({"packing": True}, {"model": flash})


def test_packed_documents_are_held_to_the_models_positions_and_padding_asks_position_0():
    from hydra_raytrain.data.packing import check_text_models
    from hydra_raytrain.data.splits import Splits

    packed = PackedRows(rows((40, 30, 20)), 64)
    splits = Splits(packed, packed, None)
    model = tiny("gpt2", "eager")  # 64 positions
    check_text_models({"max_length": 64, "packing": True}, splits, {"model": model})
    model.config.max_position_embeddings = 32
    with pytest.raises(ConfigError, match=r"dataset.max_length=64: rows of up to 40 tokens; the model has 32"):
        check_text_models({"max_length": 64, "packing": True}, splits, {"model": model})
    batch = packed.collate([packed[i] for i in range(len(packed))])
    padding = batch["input_ids"] == packed.pad_id
    assert padding.any() and (batch["position_ids"][batch["labels"] == IGNORE].max() < 40)
    assert batch["position_ids"].max() < 40 and (batch["position_ids"][:, -1] == 0).any()
