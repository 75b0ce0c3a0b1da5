"""Validation scored on what a causal LM says (``tasks/generation.py``): each row's prompt and answer read from its
tokens as training tokenized it, the completions predict would write, exact match from sums, the user's metrics."""

from __future__ import annotations

import functools

import pytest
import torch

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.monitor import monitored
from hydra_raytrain.data.token_rows import TokenizedRows
from hydra_raytrain.data.tokenized import Tokenize
from hydra_raytrain.models.text import complete, load_tokenizer
from hydra_raytrain.tasks.causal_lm import CausalLM
from hydra_raytrain.tasks.generation import called, named_metrics, prompts_and_answers
from tests.helpers.tasks import completion_census
from tests.helpers.text import PAIRS, write_model

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "op add:"},
    {"role": "assistant", "content": " a + b"},
    {"role": "user", "content": "op rev:"},
    {"role": "assistant", "content": " a[::-1]"},
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = write_model(tmp_path_factory.mktemp("llama"), "llama")
    return AutoModelForCausalLM.from_pretrained(folder).eval(), load_tokenizer(str(folder)), str(folder)


def collated(tokenizer, format: str, rows: list[dict]) -> dict[str, torch.Tensor]:
    columns = {"prompt": "prompt", "completion": "completion", "messages": "messages", "text": "text"}
    pairs, _, _ = Tokenize(tokenizer, format, columns, 64).cut(rows)
    data = TokenizedRows.of(pairs, tokenizer.pad_token_id)
    return data.collate([data[i] for i in range(len(data))])


def test_a_rows_prompt_is_what_predict_would_complete_and_its_answer_the_last_span(llama):
    _, tokenizer, _ = llama
    rows = [{"prompt": p, "completion": c} for p, c in PAIRS[:3]]
    prompts, answers = prompts_and_answers(collated(tokenizer, "prompt_completion", rows))  # right-padded rows
    assert prompts == [tokenizer(row["prompt"])["input_ids"] for row in rows]
    assert tokenizer.batch_decode(answers, skip_special_tokens=True) == [row["completion"] for row in rows]
    assert all(answer[-1] == tokenizer.eos_token_id for answer in answers)
    # a conversation: the turns before its last reply, with the generation prompt, as predict renders them
    prompts, answers = prompts_and_answers(collated(tokenizer, "messages", [{"messages": CONVERSATION}]))
    rendered = tokenizer.apply_chat_template(CONVERSATION[:-1], tokenize=False, add_generation_prompt=True)
    assert prompts == [tokenizer(rendered, add_special_tokens=False)["input_ids"]]
    assert tokenizer.decode(answers[0], skip_special_tokens=True) == " a[::-1]"


def test_rows_without_a_prompt_and_packed_rows_are_refused_by_name(llama):
    _, tokenizer, _ = llama
    batch = collated(tokenizer, "text", [{"text": "a + b"}])
    with pytest.raises(ConfigError, match="rows of dataset.format=text learn every token") as caught:
        prompts_and_answers(batch)
    assert caught.value.key == "task.eval_generation"
    with pytest.raises(ConfigError, match="dataset.packing=false"):
        prompts_and_answers({**batch, "position_ids": batch["input_ids"]})


def mine(predictions, references):
    return 0.25


def loss(predictions, references):
    return 1.0


class Scorer:
    def __call__(self, predictions, references):
        return len(predictions)


def test_metrics_are_named_by_their_function_and_bad_ones_refused_by_name():
    named = named_metrics(["exact_match", "tests.unit.test_generation_scores.mine", Scorer()])
    assert list(named) == ["mine", "Scorer"] and named["mine"]([], []) == 0.25  # exact_match: always, from sums
    assert list(named_metrics([functools.partial(mine, scale=2)])) == ["mine"]  # a partial: its function's name


@pytest.mark.parametrize(
    "metrics, problem",
    [
        ("exact_match", "is a list of metrics"),
        (["tests.unit.test_generation_scores.nothing"], "imports no function"),
        (["exact_match", 3], "is no metric"),
        (["tests.unit.test_generation_scores.mine", functools.partial(mine)], "names the metric 'mine' twice"),
        (["tests.unit.test_generation_scores.loss"], "a metric the task reports itself"),
    ],
)
def test_bad_metric_lists_are_refused_by_name(metrics, problem):
    with pytest.raises(ConfigError, match=problem) as caught:
        named_metrics(metrics)
    assert caught.value.key == "task.generation_metrics"


def test_a_metric_gives_a_number_under_its_name_or_a_dict_under_its_keys_and_a_failure_names_it():
    assert called("mine", mine, ["a"], ["b"]) == {"mine": 0.25}
    assert called("census", completion_census, ["ab", "c"], ["x", "x"]) == {"rows": 2, "distinct_answers": 1, "said": 3}
    with pytest.raises(ConfigError, match="reports count, exact_match, a name the task reports itself"):
        called("hf", lambda p, r: {"exact_match": 1.0, "count": 1}, ["a"], ["a"])  # evaluate's exact_match, say
    with pytest.raises(ConfigError, match=r"failed on 1 completions \(ZeroDivisionError") as caught:
        called("broken", lambda p, r: 1 / 0, ["a"], ["b"])
    assert caught.value.key == "task.generation_metrics" and caught.value.value == "broken"


def test_validation_scores_the_completions_predict_writes(llama):
    """Two rows whose answers are what the model says (greedy, as ``complete``: predict's), two that are not:
    exact match 2 of 4, and the user's metric sees the same completions."""
    model, tokenizer, folder = llama
    prompts = [p for p, _ in PAIRS[:4]]
    said = complete(model, tokenizer, prompts, 8)
    rows = [{"prompt": p, "completion": c} for p, c in zip(prompts, [*said[:2], " nope", " never"], strict=True)]
    task = CausalLM(
        tokenizer=folder, max_new_tokens=8, eval_generation=True,
        generation_metrics=["exact_match", "tests.helpers.tasks.completion_census"],
    )  # fmt: skip
    assert task.on_validation_start() is True  # a split scored after training: always generated
    with torch.no_grad():
        sums = task.validation_step(model, collated(tokenizer, "prompt_completion", rows))
    assert (sums["exact_match"].item(), sums["generated"].item()) == (2, 4)
    ended = task.on_validation_end()
    assert ended == {"rows": 4, "distinct_answers": 4, "said": sum(map(len, said))}
    values = task.compute({key: float(value) for key, value in {**sums, **ended}.items()})
    assert values["exact_match"] == 0.5 and values["rows"] == 4 and "generated" not in values
    assert task.on_validation_end()["rows"] == 0  # what the pass kept went with it
    assert "exact_match" not in task.compute({key: float(value) for key, value in sums.items() if key != "generated"})


def test_generation_runs_every_n_epochs_and_at_the_last_and_is_monitored_upwards():
    task = CausalLM(eval_generation=True, eval_generation_every=3)
    assert [epoch for epoch in range(1, 8) if task.on_validation_start(epoch, 7)] == [3, 6, 7]
    assert task.occasional == (frozenset({"exact_match"}), 3)
    off = CausalLM()
    assert not any(off.on_validation_start(epoch, 7) for epoch in range(1, 8)) and not off.on_validation_start()
    assert monitored(CausalLM, ("val_exact_match", None)) == ("val_exact_match", "max")
    assert monitored(CausalLM, (None, None)) == ("val_loss", "min")
    for key, value in [("eval_generation_every", 0), ("eval_max_new_tokens", 0)]:
        with pytest.raises(ConfigError) as caught:
            CausalLM(**{key: value})
        assert caught.value.key == f"task.{key}"


def test_checkpoints_ordered_by_a_metric_of_some_epochs_only_fall_on_those_epochs():
    from hydra_raytrain.preflight.rehearsal import check_monitors

    task = CausalLM(eval_generation=True, eval_generation_every=2)
    names = {"val_loss", "val_exact_match"}

    def cfg(every_n_epochs: int, score: str = "val_exact_match") -> dict:
        trainer = {"monitor": score, "monitor_mode": None, "early_stopping": {"monitor": None}}
        checkpoint = {"checkpoint_score_attribute": score, "every_n_epochs": every_n_epochs}
        return {"trainer": trainer, "checkpoint": checkpoint}

    check_monitors(cfg(2), names, task, allow_any_train=False)
    check_monitors(cfg(3, "val_loss"), names, task, allow_any_train=False)  # reported every epoch
    with pytest.raises(ConfigError, match="reports every 2 epochs only") as caught:
        check_monitors(cfg(3), names, task, allow_any_train=False)
    assert caught.value.key == "checkpoint.every_n_epochs" and "a multiple of 2" in caught.value.valid


def test_a_model_without_generate_and_a_sweep_on_a_metric_of_some_epochs_are_refused_by_name(llama):
    from hydra_raytrain.preflight.rehearsal import check_every_epoch

    _, tokenizer, folder = llama
    task = CausalLM(tokenizer=folder, eval_generation=True)
    batch = collated(tokenizer, "prompt_completion", [{"prompt": "op add:", "completion": " a + b"}])
    with pytest.raises(ConfigError, match="Linear has none") as caught:
        task.scores.sums(torch.nn.Linear(2, 2), batch)
    assert caught.value.key == "task.eval_generation"
    node = {"_target_": "hydra_raytrain.tasks.causal_lm.CausalLM", "eval_generation": True}
    tasks = [{**node, "eval_generation_every": every} for every in (1, 2)]
    check_every_epoch("val_exact_match", tasks[:1])
    check_every_epoch("val_loss", tasks)
    with pytest.raises(ConfigError, match="Tune reads it in every epoch's result") as caught:
        check_every_epoch("val_exact_match", tasks)
    assert caught.value.key == "task.eval_generation_every" and caught.value.value == 2
