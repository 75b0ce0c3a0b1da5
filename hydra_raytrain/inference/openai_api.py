"""OpenAI's HTTP API for a causal language model's run, as ``serve`` speaks it: ``/v1/chat/completions`` (the run's
chat template applied, as training rendered it), ``/v1/completions`` and ``/v1/models``, with OpenAI's request and
response shapes, server-sent events for ``stream``, and OpenAI's error objects. What a request asks is read here
(no model, no torch); ``inference/generate.py`` generates it.

Defaults follow the run's exported generation config: greedy (``temperature`` 0) unless a request says otherwise;
``max_tokens`` defaults to, and is capped by, ``serve --max-new-tokens``."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra_raytrain.config.errors import one_line
from hydra_raytrain.models.sampling import Sampling

ROLES = ("system", "developer", "user", "assistant")
ROLE_AS = {
    "developer": "system"
}  # OpenAI's newer name for the system's instructions, rendered as the template's system
MAX_STOPS, MAX_STOP_CHARS = 4, 500  # OpenAI's own limit of texts; a text's length, looked for after every token
# Settings this server does not implement, with the value that means "off": any other value is refused by name
UNSUPPORTED = {
    "n": 1,
    "best_of": 1,
    "logprobs": None,
    "top_logprobs": None,
    "echo": False,
    "suffix": None,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "logit_bias": None,
    "tools": None,
    "functions": None,
    "response_format": None,
}


class ApiError(Exception):
    """A request the server refuses: its HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def body(self) -> dict[str, Any]:
        kind = {404: "not_found_error", 413: "invalid_request_error"}.get(self.status, "invalid_request_error")
        if self.status >= 500:
            kind = "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass
class Ask:
    """One request, read: its prompt as text (a chat's rendered), how many tokens and how they are drawn."""

    kind: str  # "chat" (/v1/chat/completions) or "text" (/v1/completions)
    prompt: str
    special: bool  # the tokenizer adds its special tokens (a rendered chat template holds its own)
    max_tokens: int
    sampling: Sampling
    stream: bool
    include_usage: bool
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_ids: list[int] = field(default_factory=list)  # set by the replica, which holds the tokenizer
    max_tokens_given: bool = True  # else the room the model's positions leave, up to the server's cap
    cancelled: threading.Event = field(default_factory=threading.Event)  # the client left: generate no more


def read_request(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or ApiError(400)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise ApiError(400, f"The body is not JSON ({one_line(error)}).") from None
    if not isinstance(data, dict):
        raise ApiError(400, "The body must be a JSON object.")
    return data


def asked(kind: str, data: dict[str, Any], model: str, cap: int, render: Callable[[list[dict[str, str]]], str]) -> Ask:
    """A request's body (``kind``: chat or text) read into an Ask, or ApiError naming the parameter: ``model`` must
    be this run's name; ``max_tokens`` (or ``max_completion_tokens``) at most ``cap``; ``render`` turns a chat's
    messages into the prompt (the run's chat template)."""
    if data.get("model") != model:
        if not isinstance(data.get("model"), str):
            raise ApiError(400, f"'model' is required: this server serves {model!r} (GET /v1/models).", "model")
        raise ApiError(
            404,
            f"The model {data['model']!r} does not exist: this server serves {model!r}.",
            "model",
            "model_not_found",
        )
    for name, off in UNSUPPORTED.items():
        value = data.get(name, off)
        if value in (off, None, [], {}, False, 0) or value == {"type": "text"}:  # what means "off" in a client's body
            continue
        raise ApiError(400, f"{name}={str(value)[:80]} is not supported here: leave it out (or {off!r}).", name)
    if kind == "chat":
        prompt, special = render(messages(data.get("messages"))), False
    else:
        prompt, special = text_prompt(data.get("prompt")), True
    tokens_key = "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
    given = data.get(tokens_key) is not None
    max_tokens: Any = data[tokens_key] if given else cap
    if not is_int(max_tokens) or not 1 <= max_tokens <= cap:
        raise ApiError(
            400, f"{tokens_key}={max_tokens!r}: an integer from 1 to {cap} (serve --max-new-tokens).", tokens_key
        )
    stream = data.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream={stream!r}: true or false.", "stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(
            400, f"stream_options={options!r}: an object such as {{'include_usage': true}}.", "stream_options"
        )
    read = Ask(kind, prompt, special, max_tokens, sampling(data), stream, bool(options.get("include_usage")), model)
    read.max_tokens_given = given
    return read


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number(data: dict[str, Any], name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    """``data[name]``: a number from ``low`` (excluded when ``low_open``) to ``high``, ``default`` when absent."""
    value = data.get(name)
    if value is None:
        return default
    number = not isinstance(value, bool) and isinstance(value, int | float)
    if not number or not ((low < value if low_open else low <= value) and value <= high):
        raise ApiError(400, f"{name}={value!r}: a number {'>' if low_open else '>='} {low:g} and <= {high:g}.", name)
    return float(value)


def sampling(data: dict[str, Any]) -> Sampling:
    """How the request's tokens are drawn: greedy unless ``temperature`` > 0; a sampled request without a ``seed``
    draws one, so that such calls differ (with one, the same seed and prompt give the same text)."""
    temperature, top_p = number(data, "temperature", 0.0, 0, 2), number(data, "top_p", 1.0, 0, 1, low_open=True)
    seed = data.get("seed")
    if seed is not None and not is_int(seed):
        raise ApiError(400, f"seed={seed!r}: an integer.", "seed")
    stop = data.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"stop={str(stop)[:80]!r}: a non-empty string, or a list of at most {MAX_STOPS}.", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ApiError(400, f"stop: texts of at most {MAX_STOP_CHARS} characters each.", "stop")
    if seed is None:
        seed = random.randrange(2**63) if temperature > 0 else 0
    return Sampling(temperature, top_p, seed % 2**63, tuple(stops))


def messages(value: Any) -> list[dict[str, Any]]:
    """A chat's messages as ``{"role", "content"}`` with text content (OpenAI's list of text parts joined), or
    ApiError naming what is wrong."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list of {'role': ..., 'content': ...}.", "messages")
    read = []
    for i, message in enumerate(value):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise ApiError(
                400, f"messages[{i}].role={str(role)[:40]!r}: one of {', '.join(ROLES)}.",
                f"messages[{i}].role",
            )  # fmt: skip
        read.append({"role": ROLE_AS.get(role, role), "content": content(message.get("content"), i)})
    return read


def content(value: Any, i: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(str(part.get("text", "")) for part in value)
    raise ApiError(400, f"messages[{i}].content: a string, or a list of text parts.", f"messages[{i}].content")


def text_prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str) or not value:
        raise ApiError(400, "'prompt' must be a non-empty string (one prompt a request).", "prompt")
    return value


def render_with(tokenizer: Any) -> Callable[[list[dict[str, str]]], str]:
    """A chat's messages as the run's chat template renders them with its generation prompt, or ApiError."""

    def render(chat: list[dict[str, str]]) -> str:
        if not getattr(tokenizer, "chat_template", None):
            raise ApiError(
                400, "This run's tokenizer has no chat template: use /v1/completions with a prompt (or train with "
                "dataset.chat_template).", "messages",
            )  # fmt: skip
        try:
            return str(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
        except Exception as error:  # noqa: BLE001  (the template refuses these messages: its own words)
            raise ApiError(400, f"The chat template refuses these messages: {one_line(error)}", "messages") from None

    return render


def check_length(ask: Ask, positions: int | None) -> None:
    """The prompt holds tokens, and they and ``max_tokens`` fit the model's positions (a request that named no
    ``max_tokens`` gets the room left, up to the server's cap); else ApiError (OpenAI's ``context_length_exceeded``)."""
    param = "messages" if ask.kind == "chat" else "prompt"
    if not ask.prompt_ids:
        raise ApiError(400, "The prompt holds no tokens once tokenized.", param)
    if positions and not ask.max_tokens_given:
        ask.max_tokens = max(1, min(ask.max_tokens, positions - len(ask.prompt_ids)))
    if positions and len(ask.prompt_ids) + ask.max_tokens > positions:
        raise ApiError(
            400,
            f"This model's maximum context length is {positions} tokens; the prompt holds {len(ask.prompt_ids)} and "
            f"max_tokens asks {ask.max_tokens} more: shorten the prompt or lower max_tokens.",
            param,
            "context_length_exceeded",
        )


@dataclass
class Piece:
    """What one generation step adds to a request's answer: text (possibly empty: a stop text or an unfinished
    character is held back), and at the end why it ended and the token counts."""

    text: str
    finish: str | None = None  # "stop" (an end token or a stop text) or "length" (max_tokens)
    prompt_tokens: int = 0
    completion_tokens: int = 0


def usage(piece: Piece) -> dict[str, int]:
    return {
        "prompt_tokens": piece.prompt_tokens,
        "completion_tokens": piece.completion_tokens,
        "total_tokens": piece.prompt_tokens + piece.completion_tokens,
    }


def answer_body(ask: Ask, pieces: Sequence[Piece]) -> dict[str, Any]:
    """A whole answer: ``chat.completion`` or ``text_completion``, with its usage."""
    text, last = "".join(p.text for p in pieces), pieces[-1]
    if ask.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        head = {"id": f"chatcmpl-{ask.id}", "object": "chat.completion"}
    else:
        choice, head = {"index": 0, "text": text}, {"id": f"cmpl-{ask.id}", "object": "text_completion"}
    choice.update(finish_reason=last.finish, logprobs=None)
    return {**head, "created": ask.created, "model": ask.model, "choices": [choice], "usage": usage(last)}


def chunk_body(ask: Ask, piece: Piece | None, first: bool = False) -> dict[str, Any]:
    """One streamed chunk: the first (a chat's role), a piece of text, or the last (its finish reason); ``None``
    with ``include_usage``: the usage chunk, with no choices."""
    if ask.kind == "chat":
        head = {"id": f"chatcmpl-{ask.id}", "object": "chat.completion.chunk"}
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if piece is not None and piece.text:
            delta["content"] = piece.text
        choice: dict[str, Any] = {"index": 0, "delta": delta}
    else:
        head = {"id": f"cmpl-{ask.id}", "object": "text_completion"}
        choice = {"index": 0, "text": piece.text if piece is not None else ""}
    choice.update(finish_reason=piece.finish if piece is not None else None, logprobs=None)
    return {**head, "created": ask.created, "model": ask.model, "choices": [choice]}


def event(body: dict[str, Any]) -> bytes:
    """A server-sent event carrying ``body``."""
    return b"data: " + json.dumps(body).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def models_body(model: str, created: int) -> dict[str, Any]:
    """``/v1/models``: the one model this server serves, by its run's name."""
    return {"object": "list", "data": [model_body(model, created)]}


def model_body(model: str, created: int) -> dict[str, Any]:
    """``/v1/models/<name>``."""
    return {"id": model, "object": "model", "created": created, "owned_by": "hydra_raytrain"}


def usage_chunk(ask: Ask, last: Piece) -> dict[str, Any]:
    """A stream's last chunk when ``stream_options.include_usage``: no choices, the usage."""
    head = {"id": f"{'chatcmpl' if ask.kind == 'chat' else 'cmpl'}-{ask.id}", "created": ask.created}
    kind = "chat.completion.chunk" if ask.kind == "chat" else "text_completion"
    return {**head, "object": kind, "model": ask.model, "choices": [], "usage": usage(last)}


async def events(ask: Ask, pieces: AsyncIterator[Piece | None]) -> AsyncIterator[bytes]:
    """A streamed answer as server-sent events: a chunk per piece of text, the finish reason, the usage when asked,
    ``[DONE]`` last. A client that leaves (the stream closed early) cancels the request's generation."""
    try:
        if ask.kind == "chat":
            yield event(chunk_body(ask, None, first=True))
        last = None
        async for piece in pieces:
            if piece is None:
                continue
            last = piece
            if piece.text:
                yield event(chunk_body(ask, Piece(piece.text)))
            if piece.finish:
                yield event(chunk_body(ask, Piece("", piece.finish)))
        if ask.include_usage and last is not None:
            yield event(usage_chunk(ask, last))
        yield DONE
    except Exception as error:  # noqa: BLE001  (generation failed after the stream began: said in the stream)
        yield event(ApiError(500, f"Generation failed: {one_line(error)}").body)
    finally:
        ask.cancelled.set()
