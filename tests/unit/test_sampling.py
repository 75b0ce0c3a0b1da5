"""Completions drawn from a seed and the prompt alone: the nucleus, the refusals, greedy batches that generate what
one prompt at a time does, sampled rows that do not depend on their batch, and stop texts."""

import pytest
import torch

from hydra_raytrain.config import ConfigError
from hydra_raytrain.models.sampling import Sampling, cut_at_stop, nucleus
from hydra_raytrain.models.text import complete, left_padded, load_tokenizer
from tests.helpers.text import write_model

PROMPTS = ["op add:", "op rev: a longer prompt than the others", "def f(a):", "x"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = write_model(tmp_path_factory.mktemp("llama"), "llama")
    return AutoModelForCausalLM.from_pretrained(folder).eval(), load_tokenizer(str(folder))


def test_the_nucleus_keeps_the_most_probable_tokens_up_to_top_p():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert nucleus(logits, 1.0)[0].tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05])
    assert nucleus(logits, 0.7)[0].tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    assert nucleus(logits, 0.5)[0].tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])  # the first reaches it alone


@pytest.mark.parametrize(
    "settings, key",
    [({"temperature": -1.0}, "--temperature"), ({"top_p": 0.0}, "--top-p"), ({"stop": ("",)}, "--stop")],
)
def test_bad_sampling_settings_are_refused_by_name(settings, key):
    with pytest.raises(ConfigError) as caught:
        Sampling(**settings)
    assert caught.value.key == key


def test_prompts_are_padded_on_the_left_so_that_each_ends_where_generation_starts():
    ids, mask = left_padded([[5, 6, 7], [8], (9, 10)], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 9, 10]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]


def test_a_left_padded_greedy_batch_generates_what_one_prompt_at_a_time_does(llama):
    model, tokenizer = llama
    alone = [complete(model, tokenizer, [prompt], 12, batch_size=1)[0] for prompt in PROMPTS]
    assert complete(model, tokenizer, PROMPTS, 12, batch_size=len(PROMPTS)) == alone
    assert len(set(alone)) > 1 and all(alone)


def test_a_sampled_completion_depends_on_the_seed_and_the_prompt_not_on_its_batch(llama):
    model, tokenizer = llama
    sampled = Sampling(temperature=1.0, top_p=0.95, seed=7)
    alone = [complete(model, tokenizer, [prompt], 12, 1, sampled)[0] for prompt in PROMPTS]
    together = complete(model, tokenizer, PROMPTS, 12, len(PROMPTS), sampled)
    reversed_ = complete(model, tokenizer, PROMPTS[::-1], 12, 2, sampled)[::-1]  # other neighbours, other places
    assert together == alone == reversed_
    again = complete(model, tokenizer, PROMPTS, 12, len(PROMPTS), sampled)
    assert again == alone  # the same seed, the same texts
    other = complete(model, tokenizer, PROMPTS, 12, len(PROMPTS), Sampling(temperature=1.0, top_p=0.95, seed=8))
    greedy = complete(model, tokenizer, PROMPTS, 12, len(PROMPTS))
    assert other != alone and greedy != alone  # a new-weights model's distribution is broad: draws differ


def test_a_completion_ends_before_its_first_stop_text(llama):
    assert cut_at_stop("a + b\nc", ["\n"]) == "a + b"
    assert cut_at_stop("a + b; c\nd", ["\n", ";"]) == "a + b"
    assert cut_at_stop("a + b", ["\n"]) == "a + b"
    model, tokenizer = llama
    full = complete(model, tokenizer, PROMPTS[:1], 12)[0]
    stop = full[3:5]
    assert complete(model, tokenizer, PROMPTS[:1], 12, sampling=Sampling(stop=(stop,)))[0] == full[: full.find(stop)]
