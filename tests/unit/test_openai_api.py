"""OpenAI's API as serve reads and answers it: requests read (and refused by the parameter at fault), answer and chunk
bodies, server-sent events, and the batched generation behind it: every request of a batch, each with its own
settings, generates what it generates alone; stop texts, max_tokens, end tokens and a client gone end a row."""

import asyncio
import json

import pytest
import torch

from hydra_raytrain.inference.generate import held_back, stream_rows
from hydra_raytrain.inference.openai_api import (
    DONE,
    ApiError,
    Ask,
    Piece,
    answer_body,
    asked,
    check_length,
    events,
    messages,
)
from hydra_raytrain.models.sampling import GREEDY, Sampling
from hydra_raytrain.models.text import complete, load_tokenizer
from tests.helpers.text import write_model


def render(chat):
    return "".join(f"<{m['role']}>{m['content']}" for m in chat) + "<assistant>"


def read(kind="text", cap=16, **body):
    body.setdefault("model", "run")
    if kind == "text":
        body.setdefault("prompt", "op add:")
    else:
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return asked(kind, body, "run", cap, render)


def test_a_plain_request_is_greedy_with_the_server_s_cap_of_tokens():
    ask = read()
    assert (ask.prompt, ask.special, ask.max_tokens, ask.sampling, ask.stream) == (
        "op add:",
        True,
        16,
        Sampling(),
        False,
    )
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    chat = read("chat", messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": parts}])
    assert (chat.prompt, chat.special) == ("<system>be brief<user>ab<assistant>", False)
    sampled = read(temperature=0.7, top_p=0.9, seed=3, stop=" b", max_completion_tokens=4, stream=True)
    assert sampled.sampling == Sampling(0.7, 0.9, 3, (" b",)) and sampled.max_tokens == 4 and sampled.stream
    assert read(temperature=1.0).sampling.seed != read(temperature=1.0).sampling.seed  # no seed: one drawn


@pytest.mark.parametrize(
    "kind, body, status, param",
    [
        ("text", {"model": None}, 400, "model"),
        ("text", {"model": "gpt-4o"}, 404, "model"),
        ("text", {"max_tokens": 17}, 400, "max_tokens"),
        ("text", {"max_tokens": 0}, 400, "max_tokens"),
        ("text", {"max_tokens": True}, 400, "max_tokens"),
        ("text", {"max_completion_tokens": "8"}, 400, "max_completion_tokens"),
        ("text", {"temperature": 2.5}, 400, "temperature"),
        ("text", {"temperature": "0.7"}, 400, "temperature"),
        ("text", {"stop": "x" * 501}, 400, "stop"),
        ("text", {"tools": [{"type": "function"}]}, 400, "tools"),
        ("text", {"top_p": 0}, 400, "top_p"),
        ("text", {"seed": 1.5}, 400, "seed"),
        ("text", {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ("text", {"stop": ""}, 400, "stop"),
        ("text", {"n": 2}, 400, "n"),
        ("text", {"logprobs": 3}, 400, "logprobs"),
        ("text", {"stream": "yes"}, 400, "stream"),
        ("text", {"prompt": ["one", "two"]}, 400, "prompt"),
        ("chat", {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role"),
        ("chat", {"messages": [{"role": "user", "content": {"a": 1}}]}, 400, "messages[0].content"),
        ("chat", {"messages": []}, 400, "messages"),
    ],
)
def test_a_bad_request_is_refused_naming_its_parameter(kind, body, status, param):
    with pytest.raises(ApiError) as caught:
        read(kind, **body)
    assert (caught.value.status, caught.value.param) == (status, param)
    error = caught.value.body["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_what_clients_send_to_mean_off_is_accepted_and_developer_is_the_system():
    ask = read("chat", tools=[], logit_bias={}, response_format={"type": "text"}, top_logprobs=0, n=1, logprobs=False,
               messages=[{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}])  # fmt: skip
    assert ask.prompt == "<system>be brief<user>hi<assistant>"


def test_an_unknown_role_names_the_roles_the_template_renders():
    with pytest.raises(ApiError, match="one of system, developer, user, assistant"):
        messages([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}])


def test_a_prompt_that_leaves_no_room_for_max_tokens_is_refused_as_openai_does():
    ask = read(max_tokens=10)
    ask.prompt_ids = list(range(54))
    check_length(ask, 64)  # 54 + 10 fit
    ask.prompt_ids.append(0)
    with pytest.raises(ApiError) as caught:
        check_length(ask, 64)
    assert caught.value.code == "context_length_exceeded" and "64 tokens" in caught.value.message
    unasked = read()  # no max_tokens: the room left, up to the cap (16)
    unasked.prompt_ids = list(range(54))
    check_length(unasked, 64)
    assert unasked.max_tokens == 10
    unasked.prompt_ids = []
    with pytest.raises(ApiError, match="no tokens"):
        check_length(unasked, 64)


def test_answer_bodies_have_openai_s_shapes():
    ask = read("chat")
    body = answer_body(ask, [Piece(" a"), Piece(" +"), Piece(" b", "stop", 5, 4)])
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": " a + b"}, "finish_reason": "stop", "logprobs": None}
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    text = answer_body(read(), [Piece("x", "length", 2, 1)])
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "x"


def test_a_stream_is_chunks_then_the_usage_then_done_and_a_client_gone_cancels_it():
    async def pieces():
        for piece in [Piece(" a"), None, Piece(""), Piece(" b", "stop", 3, 2)]:
            yield piece

    async def sent(ask, limit=None):
        out = []
        stream = events(ask, pieces())
        async for chunk in stream:
            out.append(chunk)
            if limit and len(out) == limit:
                await stream.aclose()  # the client leaves
                break
        return out

    ask = read("chat", stream=True, stream_options={"include_usage": True})
    chunks = asyncio.run(sent(ask))
    assert chunks[-1] == DONE and all(c.startswith(b"data: ") and c.endswith(b"\n\n") for c in chunks)
    bodies = [json.loads(c[6:]) for c in chunks[:-1]]
    assert [b["choices"][0]["delta"] for b in bodies[:-1]] == [
        {"role": "assistant", "content": ""}, {"content": " a"}, {"content": " b"}, {}
    ]  # fmt: skip
    assert bodies[-2]["choices"][0]["finish_reason"] == "stop" and bodies[-1]["choices"] == []
    assert bodies[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    left = read("chat", stream=True)
    assert len(asyncio.run(sent(left, limit=2))) == 2 and left.cancelled.is_set()


def test_text_is_held_back_while_it_may_still_change():
    assert held_back("a + b\ufffd", []) == "a + b"
    assert held_back("a + b <", ["<end>"]) == "a + b " and held_back("a + b <en", ["<end>", "x"]) == "a + b "
    assert held_back("a + b", ["<end>"]) == "a + b"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = write_model(tmp_path_factory.mktemp("llama"), "llama")
    return AutoModelForCausalLM.from_pretrained(folder).eval(), load_tokenizer(str(folder))


PROMPTS = ["op add:", "op rev: a longer prompt than the others", "def f(a):", "x"]


def generated(model, tokenizer, asks):
    got = [[] for _ in asks]
    stream_rows(model, tokenizer, asks, lambda step: [got[i].append(p) for i, p in enumerate(step) if p is not None])
    return got


def text_ask(tokenizer, prompt, max_tokens=12, sampling=GREEDY, stream=True):
    ask = Ask("text", prompt, True, max_tokens, sampling, stream, False, "run")
    ask.prompt_ids = list(tokenizer(prompt)["input_ids"])
    return ask


def test_a_batch_of_requests_with_their_own_settings_generates_what_each_does_alone(llama):
    model, tokenizer = llama
    settings = [(12, Sampling()), (5, Sampling(1.0, 0.9, 4)), (12, Sampling(0.7, 1.0, 1)), (3, Sampling())]
    alone = [complete(model, tokenizer, [p], m, 1, s)[0] for p, (m, s) in zip(PROMPTS, settings, strict=True)]
    streams = [True, False, True, False]  # an answer sent whole is decoded once, at its end
    asks = [text_ask(tokenizer, p, m, s, st) for p, (m, s), st in zip(PROMPTS, settings, streams, strict=True)]
    got = generated(model, tokenizer, asks)
    assert ["".join(p.text for p in pieces) for pieces in got] == alone and len(set(alone)) == 4
    assert [len(pieces) for pieces in got] == [12, 1, 12, 1]
    assert [pieces[-1].finish for pieces in got] == ["length"] * 4
    assert [pieces[-1].completion_tokens for pieces in got] == [12, 5, 12, 3]
    assert [pieces[-1].prompt_tokens for pieces in got] == [len(a.prompt_ids) for a in asks]
    assert all(p.finish is None for pieces in got for p in pieces[:-1])


def test_a_stop_text_ends_its_row_alone_and_is_left_out(llama):
    model, tokenizer = llama
    whole = complete(model, tokenizer, [PROMPTS[2]], 12)[0]
    stop = whole[3:5]
    asks = [text_ask(tokenizer, PROMPTS[2], 12, Sampling(stop=(stop,))), text_ask(tokenizer, PROMPTS[0])]
    got = generated(model, tokenizer, asks)
    assert "".join(p.text for p in got[0]) == whole.split(stop)[0] and got[0][-1].finish == "stop"
    assert got[0][-1].completion_tokens < 12 and got[1][-1].completion_tokens == 12


def test_an_end_token_ends_a_row_with_stop(llama):
    model, tokenizer = llama
    model.generation_config.eos_token_id = None
    first = generated(model, tokenizer, [text_ask(tokenizer, PROMPTS[0], 4)])[0]
    tokens = tokenizer(PROMPTS[0])["input_ids"]
    step = model(torch.tensor([tokens])).logits[0, -1].argmax().item()
    try:
        model.generation_config.eos_token_id = step  # the first token the model picks ends it
        ended = generated(model, tokenizer, [text_ask(tokenizer, PROMPTS[0], 4)])[0]
    finally:
        model.generation_config.eos_token_id = None
    assert first[-1].finish == "length" and len(first) == 4
    assert [(p.text, p.finish, p.completion_tokens) for p in ended] == [("", "stop", 1)]


def test_a_cancelled_row_stops_at_its_next_token_and_the_others_go_on(llama):
    model, tokenizer = llama
    asks = [text_ask(tokenizer, PROMPTS[0]), text_ask(tokenizer, PROMPTS[1])]
    steps = []

    def emit(step):
        steps.append(step)
        if len(steps) == 2:
            asks[0].cancelled.set()

    stream_rows(model, tokenizer, asks, emit)
    assert [s[0] is not None for s in steps] == [True, True] + [False] * 10
    assert steps[-1][1].finish == "length" and len(steps) == 12


def test_the_requests_waiting_when_the_model_is_free_generate_together_and_share_its_failure():
    import time

    from hydra_raytrain.inference.serve_openai import GenerationBatches

    batches = []

    def generate(asks, emit):
        batches.append([ask.prompt for ask in asks])
        if "boom" in batches[-1]:
            raise RuntimeError("out of memory")
        time.sleep(0.3)  # the others arrive meanwhile
        for step in range(2):
            emit([Piece(f"{ask.prompt}{step}", "length" if step else None) for ask in asks])

    async def clients(names):
        batcher = GenerationBatches(generate, most=3, wait_s=0.001)

        async def one(name):
            if name != names[0]:
                while not batches:  # the first one's batch is running
                    await asyncio.sleep(0.001)
            try:
                return "".join([piece.text async for piece in batcher.pieces(read(prompt=name))])
            except RuntimeError as error:
                return str(error)

        return await asyncio.gather(*(one(name) for name in names))

    assert asyncio.run(clients("abcde")) == ["a0a1", "b0b1", "c0c1", "d0d1", "e0e1"]
    assert batches == [["a"], ["b", "c", "d"], ["e"]]
    batches.clear()
    assert asyncio.run(clients(["x", "boom", "y"])) == ["x0x1", "out of memory", "out of memory"]


def test_a_request_ends_with_its_row_keeps_its_answer_when_the_batch_fails_later_and_left_clients_are_dropped():
    import threading

    from hydra_raytrain.inference.serve_openai import GenerationBatches

    batches, go_on = [], threading.Event()

    def generate(asks, emit):
        batches.append([ask.prompt for ask in asks])
        emit([Piece("a", "stop", 1, 1), Piece("b")])  # the first row ends at its first step
        go_on.wait(5)
        raise RuntimeError("out of memory")

    async def clients():
        batcher = GenerationBatches(generate, most=4, wait_s=0.01)
        gone = read(prompt="gone")
        gone.cancelled.set()  # its client left before its batch began

        async def one(ask):
            got = []
            try:
                async for piece in batcher.pieces(ask):
                    got.append(piece.text)
            except RuntimeError as error:
                got.append(str(error))
            if ask.prompt == "short":
                go_on.set()  # answered while the batch still runs
            return got

        return await asyncio.gather(one(read(prompt="short")), one(read(prompt="long")), one(gone))

    assert asyncio.run(clients()) == [["a"], ["b", "out of memory"], []]
    assert batches == [["short", "long"]]


def test_requests_that_would_pass_the_model_s_positions_together_go_in_separate_batches():
    from hydra_raytrain.inference.serve_openai import GenerationBatches

    batches = []

    def generate(asks, emit):
        batches.append([ask.prompt for ask in asks])
        emit([Piece("", "length", 1, 1) for _ in asks])

    def fits(asks):
        return sum(len(ask.prompt) for ask in asks) <= 6

    async def clients(names):
        batcher = GenerationBatches(generate, most=8, wait_s=0.01, fits=fits)

        async def one(name):
            return [piece async for piece in batcher.pieces(read(prompt=name))]

        return await asyncio.gather(*(one(name) for name in names))

    asyncio.run(clients(["aaaa", "bb", "ccc", "d"]))
    assert batches == [["aaaa", "bb"], ["ccc", "d"]]


def test_a_tiny_temperature_draws_the_most_probable_token_without_overflow():
    from hydra_raytrain.models.sampling import RowSampler

    scores = torch.tensor([[1.0, 3.0, 2.0], [0.5, 0.1, 0.2]])
    kept = RowSampler(["a", "b"], [Sampling(1e-40, 1.0, 0), Sampling()])(None, scores)
    assert kept[0].argmax().item() == 1 and torch.isinf(kept[0]).sum() == 2
    assert torch.equal(kept[1], scores[1])  # a greedy row keeps its scores
