"""A Hugging Face causal language model (``model=causal_lm``) or text classifier (``model=text_classifier``):
loaded from a local directory or a hub id, or built with new weights from a config (``model_type`` and its keys),
with its tokenizer's vocabulary.

Needs the text extra (``pip install 'hydra_raytrain[text]'``: transformers, tokenizers, peft). The hub is asked
only for an id that is not a local directory, and only when it answers: a hub id that is neither cached nor
reachable is refused at once, by name, never waited on."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from torch import nn

from hydra_raytrain.config.errors import ConfigError
from hydra_raytrain.models.sampling import GREEDY, Sampling, cut_at_stop, generation_options


def causal_lm(
    path: str | None = None,
    model_type: str | None = None,
    tokenizer: str | None = None,
    gradient_checkpointing: bool = False,
    **config: Any,
) -> nn.Module:
    """``path``: a directory that ``save_pretrained`` wrote, or a hub id; else ``model_type`` (llama, gpt2, ...)
    with ``config``'s keys (``+model.hidden_size=64``) and new weights. The input embeddings grow to the
    tokenizer's vocabulary when it holds more tokens (added special tokens). ``gradient_checkpointing``:
    activations recomputed in backward (non-reentrant: works under DDP, FSDP2 and with LoRA)."""
    from transformers import AutoModelForCausalLM

    return pretrained(AutoModelForCausalLM, path, model_type, tokenizer, gradient_checkpointing, config)


def text_classifier(
    path: str | None = None,
    model_type: str | None = None,
    tokenizer: str | None = None,
    labels: list[Any] | None = None,
    gradient_checkpointing: bool = False,
    **config: Any,
) -> nn.Module:
    """An ``AutoModelForSequenceClassification`` (``model=text_classifier``), loaded or built as :func:`causal_lm`
    is, with a head of one output per class of ``labels`` (``dataset.classes``: its ``id2label``, what an export
    and ``pipeline("text-classification")`` name). A folder's own head of another size is replaced by a new one
    (transformers says so). The padding token is the tokenizer's (GPT-2's and Llama's heads read the last one
    that is not)."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging

    if not labels:
        raise ConfigError(
            "model.labels", labels, "a classifier needs its classes (one: a head of one output, a reward model's).",
            "model.labels=${dataset.classes} (dataset=text dataset.format=classification or preference gives them)",
        )  # fmt: skip
    names = {i: str(label) for i, label in enumerate(labels)}
    heads = {"num_labels": len(names), "id2label": names, "label2id": {name: i for i, name in names.items()}}
    if path is not None:
        heads["ignore_mismatched_sizes"] = True  # a folder's head for other classes: a new one
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # its report of the new head, "newly initialized": what this builder is for
    try:
        model: Any = pretrained(
            AutoModelForSequenceClassification, path, model_type, tokenizer, gradient_checkpointing, {**heads, **config}
        )
    finally:
        logging.set_verbosity(verbosity)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = load_tokenizer(tokenizer or path).pad_token_id
    return model


def pretrained(
    auto: Any,
    path: str | None,
    model_type: str | None,
    tokenizer: str | None,
    gradient_checkpointing: bool,
    config: dict[str, Any],
) -> nn.Module:
    """A model of ``auto`` (transformers' Auto class), loaded from ``path`` or built from ``model_type``."""
    import torch
    from transformers import AutoConfig
    from transformers.utils import logging

    logging.disable_progress_bar()  # a bar per worker for reading one file
    if (path is None) == (model_type is None):
        raise ConfigError(
            "model.path", path, "a model is loaded from a path or built from a model type: one of them.",
            "model.path=DIR (or a hub id), or model.model_type=llama with model.tokenizer=DIR",
        )  # fmt: skip
    vocabulary = len(load_tokenizer(tokenizer or path, "model.tokenizer" if tokenizer else "model.path"))
    if path is not None:
        check_reachable("model.path", path)
        # float32 weights whatever the checkpoint's dtype (transformers 5 keeps a bf16 checkpoint's): the optimizer
        # steps full-precision weights, and trainer.precision=bf16-mixed computes in bf16 (autocast, FSDP's policy)
        model = auto.from_pretrained(path, **{dtype_argument(): torch.float32, **config})
    else:
        config = {key: value for key, value in config.items() if key != "ignore_mismatched_sizes"}
        settings = AutoConfig.for_model(str(model_type), **{"vocab_size": vocabulary, **config})
        model = auto.from_config(settings)
    embeddings: Any = model.get_input_embeddings()
    if embeddings.num_embeddings < vocabulary:
        grow(model, vocabulary)
    if gradient_checkpointing:
        recompute = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=recompute)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=recompute)
        model.config.use_cache = False  # the cache is of no use in training, and checkpointing refuses it
    return model


def dtype_argument() -> str:
    """``from_pretrained``'s name for the weights' dtype: ``dtype`` since transformers 5, ``torch_dtype`` before."""
    import transformers

    return "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


def grow(model: Any, vocabulary: int) -> None:
    """The embeddings (and an untied output layer) grown to ``vocabulary`` rows, each new row the mean of the old
    ones: the same weights every time the model is built from its files (transformers' own resizing draws them at
    random), so a LoRA run's saved adapters find the base they trained on."""
    import torch

    rows = model.get_input_embeddings().num_embeddings
    model.resize_token_embeddings(vocabulary, mean_resizing=False)
    with torch.no_grad():
        for layer in {
            id(m): m for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
        }.values():
            layer.weight[rows:] = layer.weight[:rows].mean(dim=0)
            if getattr(layer, "bias", None) is not None and layer.bias.shape[0] == vocabulary:
                layer.bias[rows:] = layer.bias[:rows].mean()


def load_tokenizer(source: str | None, key: str = "model.tokenizer") -> Any:
    """The tokenizer at ``source`` (a directory or a hub id), with a padding token (its end-of-sequence token
    when it has none, as most causal LMs ship)."""
    from transformers import AutoTokenizer

    if source is None:
        raise ConfigError(key, None, "a model built from a model type needs a tokenizer.", "model.tokenizer=DIR")
    check_reachable(key, source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise ConfigError(key, source, f"no tokenizer loads from it: {str(error).splitlines()[0]}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def read_chat_template(path: str, key: str) -> str:
    """The Jinja text of a chat template's file; a ConfigError naming ``key`` for a file that cannot be read or
    does not parse as the Jinja transformers renders with."""
    import jinja2

    try:
        with open(path, encoding="utf-8") as file:
            template = file.read()
    except OSError as error:
        raise ConfigError(
            key, path, f"cannot be read ({error.strerror or error}).", "the path of a Jinja file (.jinja)"
        ) from None
    try:
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError as error:
        raise ConfigError(
            key, path, f"is not a Jinja template (line {error.lineno}: {error.message}).", "a Jinja chat template"
        ) from None
    return template


def chat_template_of(value: str, cwd: str = ".") -> str:
    """``dataset.chat_template``'s template: the Jinja file a path names (against ``cwd``), or the template itself.
    The driver puts the file's text in the run's config (``embed_chat_template``, data/tokenized.py): the workers
    on every node, Ray Data's actors, the checkpoints and what loads them (export, predict, serve) render with what
    the run read."""
    if "{{" in value or "{%" in value:
        return value
    return read_chat_template(os.path.join(cwd, os.path.expanduser(value)), "dataset.chat_template")


def run_tokenizer(cfg: dict[str, Any]) -> Any:
    """The tokenizer a run (``cfg``: its saved config, a run dir's or a checkpoint's) trained with: its model's,
    with the chat template the run set (``dataset.chat_template``, whose text the config holds), so that export,
    predict and serve render prompts as training did."""
    model, template = cfg["model"], (cfg.get("dataset") or {}).get("chat_template")
    tokenizer = load_tokenizer(model.get("tokenizer") or model.get("path"))
    if template:
        tokenizer.chat_template = chat_template_of(template)
    return tokenizer


def check_reachable(key: str, source: str) -> None:
    """A local directory, or a hub id that is cached or whose hub answers (HF_HUB_OFFLINE=1: cached only); else
    a ConfigError naming ``key``, before anything waits on the network."""
    if os.path.isdir(source):
        return
    from huggingface_hub import constants, try_to_load_from_cache

    if source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise ConfigError(key, source, "no such directory.", "a directory that save_pretrained wrote, or a hub id")
    if isinstance(try_to_load_from_cache(source, "config.json"), str) or isinstance(
        try_to_load_from_cache(source, "tokenizer_config.json"), str
    ):
        return
    where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(
            key, source, f"not a local directory, not in {where}, and HF_HUB_OFFLINE is set.",
            "a directory that save_pretrained wrote (download it where there is network and copy it here)",
        )  # fmt: skip
    host = urlparse(constants.ENDPOINT).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=5).close()
    except OSError as error:
        raise ConfigError(
            key, source, f"not a local directory, not in {where}, and {host} cannot be reached "
            f"({error.strerror or error}).", "a directory that save_pretrained wrote",
        ) from None  # fmt: skip


def complete(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int = 8,
    sampling: Sampling = GREEDY,
    special: bool = True,
) -> list[str]:
    """Each prompt's completion: the new tokens decoded (special tokens left out), ``batch_size`` prompts a call,
    padded on the left so that every prompt's last token is where generation starts. Greedy by default; else drawn
    as ``sampling`` says, each prompt from its seed and text alone (``models/sampling.py``), and ended before its
    first stop text. ``special``: the tokenizer adds its special tokens (a rendered chat template holds its own)."""
    training = model.training
    model.eval()
    completions: list[str] = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start : start + batch_size]
            ids = tokenizer(batch, add_special_tokens=special)["input_ids"]
            options = generation_options(batch, sampling, tokenizer)
            new = generated(model, tokenizer.pad_token_id, ids, max_new_tokens, **options)
            completions.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    finally:
        model.train(training)
    return [cut_at_stop(text, sampling.stop) for text in completions]


def generated(model: Any, pad: int, prompts: list[list[int]], max_new_tokens: int, **options: Any) -> list[Any]:
    """Each prompt's new ids (the end token and the padding after it included), the prompts (ids) generating
    together, padded on the left with ``pad`` (the tokenizer's padding token) so that every prompt's last token is where
    generation starts; greedy unless ``options`` (``generate``'s) say otherwise. What ``complete`` (predict, serve's
    /predict) and the validation's generation (``tasks/causal_lm.py``) run."""
    import torch

    ids, mask = left_padded(prompts, pad, next(model.parameters()).device)
    width = ids.shape[1]
    options.setdefault("do_sample", False)
    # Each caller generates on its own: on an FSDP-managed model transformers would step in lockstep with the other
    # ranks (an all-reduce a step) that never join it (validation gathers the units' parameters first)
    options.setdefault("synced_gpus", False)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad, **options
        )  # fmt: skip
    return out[:, width:].tolist()


def left_padded(prompts: Sequence[Sequence[int]], pad: int, device: Any = None) -> tuple[Any, Any]:
    """The prompts' ids padded on the left with ``pad`` to the longest, and their attention mask: every prompt's last
    token where generation starts. What validation's, predict's and serve's generation (``generated``) and the
    OpenAI API's batches (``inference/generate.py``) feed ``generate``."""
    import torch

    width = max(len(ids) for ids in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask
