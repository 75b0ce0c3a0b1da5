"""Text's pure parts: each format's ids and supervised labels, cuts and drops, the refusals by name, the padding
collate, the split rules, the hub's refusal offline, and the token-exact gradient division."""

import pytest
import torch

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.finetuning import PeftConfig
from hydra_raytrain.data.tokenized import IGNORE, text
from hydra_raytrain.models.text import causal_lm, load_tokenizer
from hydra_raytrain.recipe.step import divide_gradients
from tests.helpers.text import QWEN3_STYLE_TEMPLATE, THINKING, TRAINING_TEMPLATE, write_jsonl


def rows_of(dataset):
    return [dataset[i] for i in range(len(dataset))]


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_prompt_completion_supervises_the_completion_and_its_end(tmp_path, tokenizer_dir, tokenizer):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "op add:", "completion": " a + b"}] * 4)
    splits = text(str(data), str(tokenizer_dir), "prompt_completion", val_fraction=0.25)
    assert (len(splits.train), len(splits.val), splits.test) == (3, 1, None)
    row = splits.train[0]
    prompt, completion = ids(tokenizer, "op add:"), ids(tokenizer, " a + b") + [tokenizer.eos_token_id]
    assert row["input_ids"].tolist() == prompt + completion
    assert row["labels"].tolist() == [IGNORE] * len(prompt) + completion


def test_text_supervises_every_token(tmp_path, tokenizer_dir, tokenizer):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"text": "def f(a): return a"}] * 3)
    row = text(str(data), str(tokenizer_dir), "text", val_fraction=0.3).train[0]
    assert row["input_ids"].tolist() == row["labels"].tolist() == ids(tokenizer, "def f(a): return a") + [2]


def test_messages_supervise_the_assistant_turns_alone(tmp_path, tokenizer_dir, tokenizer):
    conversation = [
        {"role": "system", "content": "be short"},
        {"role": "user", "content": "op add:"},
        {"role": "assistant", "content": "a + b"},
        {"role": "user", "content": "op sub:"},
        {"role": "assistant", "content": "a - b"},
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": conversation}] * 3)
    row = text(str(data), str(tokenizer_dir), "messages", val_fraction=0.3).train[0]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert row["input_ids"].tolist() == ids(tokenizer, rendered)
    learned = [i for i, label in zip(row["input_ids"].tolist(), row["labels"].tolist(), strict=True) if label != IGNORE]
    assert tokenizer.decode(learned) == "a + b<|eos|>a - b<|eos|>"


def test_max_length_cuts_and_says_so_and_rows_left_with_nothing_to_learn_are_dropped(tmp_path, tokenizer_dir):
    rows = [{"prompt": "op add: " * 20, "completion": " a"}] * 2 + [{"prompt": "op", "completion": " a + b"}] * 4
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.warns(UserWarning) as said:
        splits = text(str(data), str(tokenizer_dir), "prompt_completion", max_length=16, val_fraction=0.25)
    messages = [str(warning.message) for warning in said]
    assert any("dataset.max_length=16 cut 2 of 6 rows" in message for message in messages)
    assert any("2 rows of dataset.path supervise no token: dropped" in message for message in messages)
    assert len(splits.train) + len(splits.val) == 4
    assert all(len(row["input_ids"]) <= 16 for row in rows_of(splits.train))


CHATS = [{"messages": THINKING}] * 3


@pytest.mark.parametrize(
    "rows, options, key, words",
    [
        (
            [{"messages": [{"role": "user", "content": "hi"}]}] * 3,
            {"format": "messages"},
            "dataset.format",
            "supervises",
        ),
        ([{"question": "op", "answer": " a"}] * 3, {"format": "prompt_completion"}, "dataset.path", "no column prompt"),
        ([{"text": "a"}] * 3, {"format": "poem"}, "dataset.format", "unknown format"),
        ([{"text": "a"}] * 3, {"format": "text", "max_length": 1}, "dataset.max_length", "at least 2"),
        ([{"text": "a"}] * 3, {"format": "text", "chat_template": "t.jinja"}, "dataset.chat_template", "renders no"),
        (CHATS, {"format": "messages", "chat_template": "missing.jinja"}, "dataset.chat_template", "cannot be read"),
        (CHATS, {"format": "messages", "chat_template": "bad.jinja"}, "dataset.chat_template", "not a Jinja template"),
        (CHATS, {"format": "messages", "train_on": "every"}, "dataset.train_on", "all_assistant, last_assistant"),
    ],
)
def test_bad_text_is_refused_by_name(tmp_path, tokenizer_dir, rows, options, key, words):
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m['content'] }}")  # no endfor
    if "chat_template" in options:
        options = {**options, "chat_template": str(tmp_path / options["chat_template"])}
    with pytest.raises(ConfigError) as caught:
        text(str(data), str(tokenizer_dir), **options)
    assert caught.value.key == key and words in str(caught.value)


def test_columns_rename_what_a_format_reads(tmp_path, tokenizer_dir):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"question": "op", "answer": " a"}] * 3)
    splits = text(
        str(data), str(tokenizer_dir), "prompt_completion", columns={"prompt": "question", "completion": "answer"}
    )
    assert len(splits.train) + len(splits.val) == 3


def test_a_tokenizer_without_a_chat_template_is_refused_for_messages(tmp_path, tokenizer_dir):
    plain = tmp_path / "plain"
    tokenizer = load_tokenizer(str(tokenizer_dir))
    tokenizer.chat_template = None
    tokenizer.save_pretrained(plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}] * 3)
    with pytest.raises(ConfigError, match="has no chat template") as caught:
        text(str(data), str(plain), "messages")
    assert caught.value.key == "dataset.format"


def test_parquet_folders_and_a_validation_file(tmp_path, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "train"
    folder.mkdir()
    for part in range(2):
        pq.write_table(pa.table({"text": [f"row {part} {i}" for i in range(5)]}), folder / f"part-{part}.parquet")
    val = write_jsonl(tmp_path / "val.jsonl", [{"text": "held out"}] * 2)
    splits = text(str(folder), str(tokenizer_dir), "text", val_path=str(val), test_fraction=0.2)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (8, 2, 2)


def test_collate_pads_to_the_longest_row(tmp_path, tokenizer_dir, tokenizer):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"text": "a"}, {"text": "return a + b"}, {"text": "x"}])
    dataset = text(str(data), str(tokenizer_dir), "text", val_fraction=0.3).train
    batch = dataset.collate(rows_of(dataset))
    lengths = [len(row["input_ids"]) for row in rows_of(dataset)]
    assert batch["input_ids"].shape == (len(dataset), max(lengths))
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    short = lengths.index(min(lengths))
    assert (batch["labels"][short, min(lengths) :] == IGNORE).all()
    assert (batch["input_ids"][short, min(lengths) :] == tokenizer.pad_token_id).all()


def test_a_hub_id_offline_and_not_cached_is_refused_at_once(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set") as caught:
        causal_lm(path="nobody/no-such-model")
    assert caught.value.key == "model.path"
    with pytest.raises(ConfigError, match="no such directory"):
        causal_lm(path="./models/missing")


def test_a_model_built_from_its_type_takes_the_tokenizer_s_vocabulary(tokenizer_dir, tokenizer):
    model = causal_lm(
        model_type="llama", tokenizer=str(tokenizer_dir), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, gradient_checkpointing=True,
    )  # fmt: skip
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing


def test_gradients_of_summed_losses_become_the_mean_over_the_window_s_units():
    weight = torch.nn.Parameter(torch.tensor([2.0, -1.0]))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    values = torch.tensor([[1.0, 3.0], [2.0, 0.5], [4.0, 1.0]])
    (values @ weight).sum().backward()
    divide_gradients(optimizer, torch.tensor(3))
    assert torch.allclose(weight.grad, values.mean(dim=0))


@pytest.mark.parametrize(
    "settings, key",
    [({"method": "qlora"}, "peft.method"), ({"method": "lora", "r": 0}, "peft.r"), ({"dropout": 1.0}, "peft.dropout")],
)
def test_peft_settings_are_checked(settings, key):
    with pytest.raises(ConfigError) as caught:
        PeftConfig(**settings)
    assert caught.value.key == key


def test_a_folder_of_json_lines_on_s3_is_read(s3_endpoint, tmp_path, tokenizer_dir):
    """``dataset.path=s3://...`` against a real S3 server (moto): every file of the prefix, in order."""
    import pyarrow.fs

    for part in range(3):
        write_jsonl(tmp_path / "chats" / f"part-{part}.jsonl", [{"text": f"row {part} {i}"} for i in range(4)])
    s3 = pyarrow.fs.S3FileSystem(endpoint_override=s3_endpoint, allow_bucket_creation=True)
    s3.create_dir("text-bucket")
    pyarrow.fs.copy_files(str(tmp_path / "chats"), "text-bucket/chats", pyarrow.fs.LocalFileSystem(), s3)
    splits = text("s3://text-bucket/chats", str(tokenizer_dir), "text", val_fraction=0.25)
    assert (len(splits.train), len(splits.val)) == (9, 3)
    with pytest.raises(ConfigError, match="no such file or folder") as caught:
        text("s3://text-bucket/nothing", str(tokenizer_dir), "text")
    assert caught.value.key == "dataset.path"


def test_a_bf16_checkpoint_loads_as_float32_weights(tmp_path):
    """transformers 5 loads a checkpoint in its own dtype; the optimizer steps float32 weights (bf16 compute is
    trainer.precision=bf16-mixed's)."""
    from tests.helpers.text import write_model

    folder = write_model(tmp_path / "lm", "llama")
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(folder).to(torch.bfloat16).save_pretrained(folder)
    assert {p.dtype for p in causal_lm(path=str(folder)).parameters()} == {torch.float32}


def test_a_tokenizer_s_added_tokens_grow_the_embeddings_alike_every_time(tmp_path, tokenizer_dir):
    """New rows are the mean of the old ones: a LoRA run's adapters find the base they trained on when the model
    is built again (load_model, export), where transformers' own resizing draws new rows at random."""
    from tests.helpers.text import write_model

    folder = write_model(tmp_path / "lm", "llama", tokenizer=tokenizer_dir)
    bigger = load_tokenizer(str(tokenizer_dir))
    bigger.add_special_tokens({"additional_special_tokens": ["<|tool|>", "<|result|>"]})
    bigger.save_pretrained(tmp_path / "bigger")
    first, again = (causal_lm(path=str(folder), tokenizer=str(tmp_path / "bigger")) for _ in range(2))
    weights = first.get_input_embeddings().weight
    assert weights.shape[0] == len(bigger) == len(tokenizer_dir_vocab(tokenizer_dir)) + 2
    assert torch.equal(weights, again.get_input_embeddings().weight)
    assert torch.allclose(weights[-1], weights[:-2].mean(dim=0))


def tokenizer_dir_vocab(folder):
    return load_tokenizer(str(folder)).get_vocab()


def test_a_template_that_renders_earlier_turns_otherwise_is_refused(tmp_path, tokenizer_dir):
    """Each assistant turn is found by rendering the conversation up to it: a template whose earlier turns change
    once later ones follow (the last turn marked, as some reasoning models' templates do) cannot be masked."""
    marked = tmp_path / "marked"
    tokenizer = load_tokenizer(str(tokenizer_dir))
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% if loop.last %}<|eos|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tokenizer.save_pretrained(marked)
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "?"},
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": turns}] * 3)
    with pytest.raises(ConfigError, match="renders assistant turn 1 of a conversation otherwise") as caught:
        text(str(data), str(marked), "messages")
    assert caught.value.key == "dataset.train_on"


def learned_text(tokenizer, row):
    pairs = zip(row["input_ids"].tolist(), row["labels"].tolist(), strict=True)
    return tokenizer.decode([i for i, label in pairs if label != IGNORE])


def test_a_qwen3_style_template_is_refused_naming_both_fixes_and_each_fix_trains(tmp_path, tokenizer_dir, tokenizer):
    """A template that drops earlier turns' reasoning cannot be prefix-rendered: refused, naming train_on and
    chat_template. train_on=last_assistant learns the last turn as inference renders it; a training template given
    by dataset.chat_template learns every turn with its reasoning."""
    qwen = tmp_path / "qwen3_style"
    styled = load_tokenizer(str(tokenizer_dir))
    styled.chat_template = QWEN3_STYLE_TEMPLATE
    styled.save_pretrained(qwen)
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": THINKING}] * 3)
    with pytest.raises(ConfigError) as caught:
        text(str(data), str(qwen), "messages")
    said = str(caught.value)
    assert caught.value.key == "dataset.train_on" and "drops earlier turns' reasoning" in said
    assert "dataset.train_on=last_assistant" in said and "dataset.chat_template=PATH" in said
    last = text(str(data), str(qwen), "messages", val_fraction=0.3, train_on="last_assistant").train[0]
    assert learned_text(tokenizer, last) == "<think>minus</think>a - b<|eos|>"
    assert "plus" not in tokenizer.decode(last["input_ids"])  # the earlier turn rendered as inference renders it
    template = tmp_path / "training.jinja"
    template.write_text(TRAINING_TEMPLATE)
    every = text(str(data), str(qwen), "messages", val_fraction=0.3, chat_template=str(template)).train[0]
    assert learned_text(tokenizer, every) == "<think>plus</think>a + b<|eos|><think>minus</think>a - b<|eos|>"


def test_last_assistant_learns_the_last_turn_alone(tmp_path, tokenizer_dir, tokenizer):
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": THINKING}] * 3)
    options = dict(val_fraction=0.3)
    every = text(str(data), str(tokenizer_dir), "messages", **options).train[0]
    last = text(str(data), str(tokenizer_dir), "messages", train_on="last_assistant", **options).train[0]
    assert torch.equal(every["input_ids"], last["input_ids"])
    assert learned_text(tokenizer, last) == "<think>minus</think>a - b<|eos|>"
    assert learned_text(tokenizer, every) == "<think>plus</think>a + b<|eos|>" + learned_text(tokenizer, last)


def test_folds_are_cut_from_the_rows_not_beside_a_validation_file(tmp_path, tokenizer_dir):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"text": f"row {i}"} for i in range(6)])
    with pytest.raises(ConfigError, match="cross-validation cuts its folds") as caught:
        text(str(data), str(tokenizer_dir), "text", val_path=str(data), folds=3)
    assert caught.value.key == "dataset.folds"


def test_a_window_mixes_no_summed_losses_with_means_and_few_units_divide_exactly():
    from hydra_raytrain.recipe.step import UNIT_SCALE, Precision, TrainStep

    weight = torch.nn.Parameter(torch.tensor([2.0, -1.0]))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    step = TrainStep(
        {"model": torch.nn.Linear(1, 1)}, {"model": optimizer}, {}, Precision.build("32", torch.device("cpu"))
    )
    step.sync = False
    step.optimize((torch.tensor([1.0, 3.0]) @ weight), normalizer=torch.tensor(1))
    with pytest.raises(ValueError, match="all pass a normalizer or none"):
        step.optimize(torch.tensor([1.0, 1.0]) @ weight)
    step.sync = True
    step.optimize((torch.tensor([3.0, 1.0]) @ weight), normalizer=torch.tensor(2))  # 3 units in all: far below 1024
    assert torch.allclose(weight.detach(), torch.tensor([2.0 - 4 / 3, -1.0 - 4 / 3])) and UNIT_SCALE > 3


def test_rows_over_several_chunks_read_as_one_in_the_order_picked():
    """Ray Data's blocks are chunks: rows are numbered across them, and a split reads the rows it picked."""
    import numpy as np

    from hydra_raytrain.data.tokenized import TokenizedRows, chunk_of

    pairs = [(np.arange(n, dtype=np.int32) + 10 * n, np.full(n, n, dtype=np.int32)) for n in (2, 5, 3, 4, 1)]
    whole = TokenizedRows.of(pairs, pad_id=0)
    chunked = TokenizedRows([chunk_of(pairs[:2]), chunk_of(pairs[2:3]), chunk_of(pairs[3:])], [4, 0, 3, 2], pad_id=0)
    assert len(chunked) == 4 and chunked.longest == 4  # row 1 (5 tokens) not picked
    for i, row in enumerate([4, 0, 3, 2]):
        assert torch.equal(chunked[i]["input_ids"], whole[row]["input_ids"])
        assert torch.equal(chunked[i]["labels"], whole[row]["labels"])
    assert torch.equal(chunked[-1]["input_ids"], whole[2]["input_ids"])
    with pytest.raises(IndexError):
        chunked[4]


def test_the_checks_tokenize_the_first_rows_only_and_say_nothing_of_cuts(tmp_path, tokenizer_dir):
    """text(sample=N): the first N rows, from the files they take (a later file is not read), no cut said."""
    import warnings

    write_jsonl(tmp_path / "rows" / "a.jsonl", [{"prompt": "op add:", "completion": " a + b + c + d + e + f"}] * 6)
    (tmp_path / "rows" / "b.jsonl").write_text('{"question": "no prompt column"}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        splits = text(str(tmp_path / "rows"), str(tokenizer_dir), "prompt_completion", 8, sample=5)
    assert len(splits.train) + len(splits.val) == 5
    with pytest.raises(ConfigError, match="b.jsonl has no column prompt"):
        text(str(tmp_path / "rows"), str(tokenizer_dir), "prompt_completion", 8)
    with pytest.warns(UserWarning, match="dataset.max_length=8 cut 6 of 6 rows of dataset.path"):  # all rows: said
        text(str(tmp_path / "rows" / "a.jsonl"), str(tokenizer_dir), "prompt_completion", 8)


def test_who_tokenizes_is_one_of_three(tmp_path, tokenizer_dir):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"text": "def f(a): return a"}] * 3)
    with pytest.raises(ConfigError, match=r"dataset.tokenize='actors'.*auto, ray_data, driver"):
        text(str(data), str(tokenizer_dir), "text", tokenize="actors")


def test_the_backends_ids_are_the_tokenizers_own(tokenizer):
    """Tokenize reads a fast tokenizer's Rust backend directly: the ids transformers' call gives, special tokens
    or not."""
    from hydra_raytrain.data.tokenized import Tokenize

    texts = ["def f(a): return a", "", "  spaces  and\ttabs\n", "unicode: é ß 東京", "<|user|>hi"]
    tokenize = Tokenize(tokenizer, "text", {"text": "text"}, 64)
    for special in (True, False):
        assert tokenize._ids(texts, special) == tokenizer(texts, add_special_tokens=special)["input_ids"]


def test_an_actors_blocks_read_in_place_as_the_rows_they_hold(tmp_path, tokenizer_dir):
    """TokenizeBatch's tables, joined into one block as Ray Data joins its calls' outputs (and sliced), read as
    Tokenize cut the rows: one chunk per record batch, over the block's own buffers."""
    import numpy as np
    import pyarrow as pa

    from hydra_raytrain.data.tokenized import Tokenize, TokenizedRows
    from hydra_raytrain.data.tokenized_ray import TokenizeBatch, chunks_of_table
    from tests.helpers.text import varied_rows

    rows, columns = varied_rows(30), {"prompt": "prompt", "completion": "completion"}
    actor = TokenizeBatch(str(tokenizer_dir), "prompt_completion", columns, 12)
    block = pa.concat_tables([actor(pa.Table.from_pylist(rows[:13])), actor(pa.Table.from_pylist(rows[13:]))])
    pairs, cut, _ = Tokenize(load_tokenizer(str(tokenizer_dir)), "prompt_completion", columns, 12).cut(rows)
    assert cut.any() and block.column("cut").to_pylist() == cut.tolist()
    for table, first in ((block, 0), (block.slice(9, 15), 9)):
        chunks = chunks_of_table(table)
        assert len(chunks) == 2  # no copy into one
        read = TokenizedRows(chunks, range(table.num_rows), pad_id=0)
        for i in range(table.num_rows):
            assert read[i]["input_ids"].tolist() == pairs[first + i][0].tolist()
            assert read[i]["labels"].tolist() == pairs[first + i][1].tolist()
    ids = block.column("input_ids").chunk(1).values
    assert np.shares_memory(chunks_of_table(block)[1][0], np.frombuffer(ids.buffers()[1], dtype=np.int32))
