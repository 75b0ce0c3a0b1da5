"""Text the tests train on, made here: a byte-level BPE tokenizer trained on Python's own help topics
(``pydoc_data.topics``: ships with Python), tiny Llama and GPT-2 models built from configs, both saved as local
Hugging Face directories, and JSON-lines files in each ``dataset.format``. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

# The chat template: a role header per turn; the assistant's turns end with the end-of-sequence token.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# A reasoning model's template, as Qwen3's stock one does it: an assistant turn before the last user turn loses its
# <think>...</think> block, so a conversation's earlier turns render otherwise once later turns follow.
QWEN3_STYLE_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- set content = m['content'] -%}"
    "{%- if loop.index0 < ns.last_user and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1] -%}{%- endif -%}"
    "<|assistant|>{{ content }}{{ eos_token }}"
    "{%- else -%}<|{{ m['role'] }}|>{{ m['content'] }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
# The training template TRL ships for such models: every turn keeps its reasoning, whatever follows.
TRAINING_TEMPLATE = CHAT_TEMPLATE
THINKING = [
    {"role": "user", "content": "op add:"},
    {"role": "assistant", "content": "<think>plus</think>a + b"},
    {"role": "user", "content": "op sub:"},
    {"role": "assistant", "content": "<think>minus</think>a - b"},
]

# 20 prompt -> code pairs (the learnability test's): a short name, a distinct line of code.
PAIRS = [(f"op {name}:", f" {code}") for name, code in [
    ("add", "a + b"), ("sub", "a - b"), ("mul", "a * b"), ("div", "a / b"), ("mod", "a % b"),
    ("pow", "a ** b"), ("neg", "-a"), ("abs", "abs(a)"), ("max", "max(a, b)"), ("min", "min(a, b)"),
    ("len", "len(a)"), ("sum", "sum(a)"), ("sort", "sorted(a)"), ("rev", "a[::-1]"), ("first", "a[0]"),
    ("last", "a[-1]"), ("str", "str(a)"), ("int", "int(a)"), ("list", "list(a)"), ("set", "set(a)"),
]]  # fmt: skip


def write_tokenizer(folder: Path, vocab_size: int = 320) -> Path:
    """A byte-level BPE trained on pydoc's topics (well under a second), saved with bos/eos/pad tokens and the
    chat template: what ``AutoTokenizer.from_pretrained(folder)`` loads."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(list(topics.values())[:60], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return folder


def write_model(
    folder: Path, model_type: str = "llama", tokenizer: Path | None = None, seed: int = 0, **sizes: int
) -> Path:
    """A tiny causal LM of ``model_type`` (llama, gpt2) with new weights (``seed``), saved with its tokenizer
    (trained here unless given): a local model directory as ``model.path`` takes it. ``sizes``: its config's
    sizes instead of the tiny ones."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = tokenizer or write_tokenizer(folder)
    loaded = AutoTokenizer.from_pretrained(tokenizer)
    tiny = {
        "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256),
        "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0),
    }[model_type]  # fmt: skip
    sizes = {"vocab_size": len(loaded), **tiny, **sizes}  # a larger vocab_size: rows the tokenizer never uses
    ids = dict(bos_token_id=loaded.bos_token_id, eos_token_id=loaded.eos_token_id, pad_token_id=loaded.pad_token_id)
    config = AutoConfig.for_model(model_type, **sizes, **ids)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    loaded.save_pretrained(folder)
    return folder


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def pair_rows(repeat: int = 1) -> list[dict]:
    """The 20 pairs as prompt_completion rows, ``repeat`` times."""
    return [{"prompt": prompt, "completion": code} for prompt, code in PAIRS] * repeat


def varied_rows(count: int = 48) -> list[dict]:
    """Prompt/completion rows whose supervised token counts differ a lot from row to row (so a per-worker or
    per-batch mean of the loss differs from the mean over tokens)."""
    from pydoc_data.topics import topics

    words = " ".join(list(topics.values())[:5]).split()
    rows = []
    for i in range(count):
        start = (i * 37) % (len(words) - 40)
        rows.append(
            {
                "prompt": " ".join(words[start : start + 3 + i % 5]),
                "completion": " " + " ".join(words[start + 8 : start + 9 + (i * 7) % 23]),
            }
        )
    return rows


def preference_rows(count: int = 48) -> list[dict]:
    """Prompt, chosen and rejected rows: each varied row's completion chosen over the next row's (sides of 1 to 24
    tokens, so that a pair's two sides and the pairs differ in length)."""
    rows = varied_rows(count)
    return [
        {"prompt": row["prompt"], "chosen": row["completion"], "rejected": rows[(i + 1) % count]["completion"]}
        for i, row in enumerate(rows)
    ]


def text_overrides(folder: Path) -> tuple[str, ...]:
    """A tiny Llama (its tokenizer beside it) and 48 prompt/completion rows whose supervised tokens per row vary
    from 1 to 24, written under ``folder``: the overrides of a float64 run on them (2 epochs, a global batch of 8)."""
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


# A keyword rule a text classifier learns: a review holding one of the KEYWORDS is "positive", else "negative".
KEYWORDS = ("great", "superb")
FILLER = (
    "the film was long and the plot moved slowly while actors spoke about a city a river a train and some old "
    "friends who met again after many years to talk of work music food weather books and small towns"
).split()


def review_rows(count: int, seed: int = 0) -> list[dict]:
    """``count`` reviews of 4-12 filler words, half with a keyword put among them: ``{"review", "stars"}`` rows whose
    label is ``positive`` or ``negative`` (what ``dataset.columns={text: review, label: stars}`` reads)."""
    import random

    draw = random.Random(seed)
    rows = []
    for i in range(count):
        words = draw.choices(FILLER, k=draw.randint(4, 12))
        if i % 2:
            words.insert(draw.randrange(len(words) + 1), draw.choice(KEYWORDS))
        rows.append({"id": i, "review": " ".join(words), "stars": "positive" if i % 2 else "negative"})
    return rows


def write_bert(folder: Path, seed: int = 0, **sizes: int) -> Path:
    """A tiny BERT encoder (new weights, ``seed``) with a WordPiece tokenizer over the reviews' words, saved as a
    local Hugging Face directory (``BertModel``: the classifier's head is ``model=text_classifier``'s to add)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted({*FILLER, *KEYWORDS})]
    tokenizer = BertTokenizer(vocab={word: i for i, word in enumerate(words)})
    tiny = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    config = BertConfig(vocab_size=len(words), max_position_embeddings=64, **{**tiny, **sizes})
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def classifier_overrides(folder: Path, rows: int = 192) -> tuple[str, ...]:
    """A tiny BERT and ``rows`` reviews written under ``folder``: the overrides of a text classification run on them
    (the labels in the ``stars`` column, the texts in ``review``)."""
    model = write_bert(folder / "bert")
    data = write_jsonl(folder / "reviews.jsonl", review_rows(rows))
    return (
        "task=text_classification",
        "model=text_classifier",
        f"model.path={model}",
        "dataset=text",
        f"dataset.path={data}",
        "dataset.format=classification",
        "dataset.columns={text: review, label: stars}",
        "dataset.val_fraction=0.25",
        "trainer.progress_bar=false",
    )
