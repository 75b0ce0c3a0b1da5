"""A served run (``python -m hydra_raytrain.serve``) under load: requests/s and latency at 1 and 8 clients; then a
causal LM's generated tokens/s through OpenAI's API.

    .venv/bin/python benchmarks/serve.py            # or: make bench-serve
    .venv/bin/python benchmarks/serve.py --run outputs/runs/<name> --seconds 20
    .venv/bin/python benchmarks/serve.py --only text

The embedded default (simple_cnn on the digits) trains for one epoch in local mode unless ``--run`` names a run
(what is measured is serving, not the model's quality). The server is the real command on a local cluster of
its own, one replica of one CPU, default batching. Each client is a thread with a keep-alive HTTP connection
sending ``POST /predict`` with one validation sample, the next as soon as the answer is read, for ``--seconds``.
Printed per client count: requests/s, p50 and p99 latency, and the ratio to the model alone (the same samples,
one at a time, ``load_model(run)`` in this process: the ceiling that HTTP, JSON and Serve's routing cost from).

Text (``--only text``, and after the rest): a small Llama (hidden 256, 4 layers, new weights, the tests' byte-level
BPE tokenizer: nothing downloaded) trained one epoch, served with ``--max-new-tokens 32``. Each client sends
``POST /v1/completions`` (greedy, ``max_tokens`` 32) with one of 64 prompts, the next when the answer is read;
generated tokens/s (the answers' ``usage.completion_tokens``) at 1 and 8 clients, with the server's batching
(``--max-batch-size 16``) and with ``--max-batch-size 1`` (one request at a time). Then the replica's generation
(``stream_rows``: a row's own settings, stop texts and streaming) against ``model.generate`` on the same model and
prompts in this process, one prompt at a time and 8 together (left-padded): the cost of what the replica adds.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
PORT = 8711
NEW_TOKENS = 32


def train(folder: str) -> str:
    run = os.path.join(folder, "run")
    args = ["scaling.num_workers=0", "trainer.max_epochs=1", f"hydra.run.dir={run}"]
    subprocess.run([sys.executable, "-m", "hydra_raytrain", *args], cwd=folder, check=True, capture_output=True)
    return run


def samples(run: str, n: int = 64) -> list[bytes]:
    """Request bodies of one validation sample each."""
    from hydra.utils import instantiate

    config = json.load(open(os.path.join(run, "config.json")))
    val = instantiate(config["dataset"], _convert_="all").val
    return [json.dumps({"inputs": [val[i][0].tolist()]}).encode() for i in range(n)]


def model_alone(run: str, bodies: list[bytes], seconds: float) -> float:
    """Calls/s of the model on one sample at a time in this process: decode, forward, softmax, answer."""
    import torch

    from hydra_raytrain import load_model

    model = load_model(run)
    done, started = 0, time.perf_counter()
    with torch.no_grad():
        while time.perf_counter() - started < seconds:
            x = torch.tensor(json.loads(bodies[done % len(bodies)])["inputs"])
            json.dumps({"probabilities": torch.softmax(model(x), dim=1).tolist()})
            done += 1
    return done / (time.perf_counter() - started)


def load(
    bodies: list[bytes],
    clients: int,
    seconds: float,
    path: str = "/predict",
    count: Callable[[bytes], int] | None = None,
) -> tuple[float, list[float]]:
    """Answers/s and every request's latency (s) with ``clients`` keep-alive clients posting ``bodies`` to ``path``
    for ``seconds``; with ``count``, what each answer counts (generated tokens) instead of one."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    counted = [0] * clients
    stop = time.perf_counter() + seconds

    def client(k: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
        i = k
        while time.perf_counter() < stop:
            sent = time.perf_counter()
            connection.request("POST", path, body=bodies[i % len(bodies)], headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            assert response.status == 200, (response.status, answer[:300])
            latencies[k].append(time.perf_counter() - sent)
            counted[k] += count(answer) if count else 1
            i += clients
        connection.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = sorted(t for each in latencies for t in each)
    return sum(counted) / (time.perf_counter() - started), every


def started_server(run: str, folder: str, *serve_args: str) -> subprocess.Popen:
    """The serve command on ``run``, once /health answers (its log in ``folder``)."""
    log = open(os.path.join(folder, "serve.log"), "a")
    server = subprocess.Popen(
        [sys.executable, "-m", "hydra_raytrain.serve", run, "--port", str(PORT), *serve_args],
        stdout=log,
        stderr=log,
        cwd=folder,
    )
    deadline = time.time() + 180
    while True:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return server
        except OSError:
            pass
        if time.time() > deadline or server.poll() is not None:
            server.terminate()
            sys.exit(f"the server did not start: see {log.name}")
        time.sleep(0.5)


def stopped(server: subprocess.Popen) -> None:
    server.terminate()
    server.wait(timeout=60)


def images(options: argparse.Namespace) -> None:
    folder = tempfile.mkdtemp(prefix="bench-serve-")
    run = os.path.abspath(options.run or train(folder))
    bodies = samples(run)
    alone = model_alone(run, bodies, min(options.seconds, 5))
    server = started_server(run, folder, *options.serve_args.split())
    try:
        load(bodies, 2, 2)  # warm up: the replica's first batches
        print(f"model alone, one sample per call, in this process: {alone:,.0f} calls/s")
        print(f"{'clients':>8} {'requests/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'x model alone':>14}")
        for clients in (int(n) for n in options.clients.split(",")):
            rate, every = load(bodies, clients, options.seconds)
            p50, p99 = statistics.median(every) * 1e3, every[min(len(every) - 1, int(len(every) * 0.99))] * 1e3
            print(f"{clients:>8} {rate:>11,.0f} {p50:>8.1f} {p99:>8.1f} {rate / alone:>13.2f}x")
    finally:
        stopped(server)


def text_run(folder: Path) -> str:
    """A small Llama's run: one epoch on prompt/completion rows in local mode."""
    from tests.helpers.text import varied_rows, write_jsonl, write_model

    sizes = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4)
    model = write_model(folder / "llama", "llama", num_key_value_heads=4, vocab_size=3072, **sizes)
    data = write_jsonl(folder / "train.jsonl", varied_rows(64))
    run = str(folder / "run")
    args = [
        "task=causal_lm", "model=causal_lm", f"model.path={model}", "dataset=text", f"dataset.path={data}",
        "dataset.format=prompt_completion", "scaling.num_workers=0", "trainer.max_epochs=1", f"hydra.run.dir={run}",
    ]  # fmt: skip
    subprocess.run([sys.executable, "-m", "hydra_raytrain", *args], cwd=folder, check=True, capture_output=True)
    return run


def generation_alone(run: str, prompts: list[str], together: int, rounds: int = 5) -> tuple[float, float]:
    """Generated tokens/s in this process, ``together`` prompts a call: ``model.generate`` (greedy, left-padded)
    and the replica's ``stream_rows`` on the same model and prompts; the median of ``rounds``."""
    import torch

    from hydra_raytrain.inference.evaluate import load_model
    from hydra_raytrain.inference.finished import FinishedRun
    from hydra_raytrain.inference.generate import stream_rows
    from hydra_raytrain.inference.openai_api import Ask
    from hydra_raytrain.models.sampling import GREEDY
    from hydra_raytrain.models.text import run_tokenizer

    tokenizer, model = run_tokenizer(FinishedRun.read(run).config), load_model(run).eval()  # type: ignore[union-attr]
    tokenizer.padding_side = "left"
    groups = [prompts[i : i + together] for i in range(0, len(prompts), together)]

    def plain() -> int:
        made = 0
        for group in groups:
            encoded = tokenizer(group, return_tensors="pt", padding=True)
            with torch.no_grad():
                out = model.generate(**encoded, max_new_tokens=NEW_TOKENS, do_sample=False)
            new = out[:, encoded["input_ids"].shape[1] :]
            made += int((new != tokenizer.pad_token_id).sum())
        return made

    def ours() -> int:
        made = 0
        for group in groups:
            asks = [Ask("text", p, True, NEW_TOKENS, GREEDY, False, False, "run") for p in group]
            for ask in asks:
                ask.prompt_ids = list(tokenizer(ask.prompt)["input_ids"])
            ends: list = []
            stream_rows(model, tokenizer, asks, functools.partial(finished, ends))
            made += sum(p.completion_tokens for p in ends)
        return made

    def rate(generate: Callable[[], int]) -> float:
        started = time.perf_counter()
        return generate() / (time.perf_counter() - started)

    rate(plain), rate(ours)  # warm up
    theirs, mine = [], []
    for round_ in range(rounds):  # alternating which goes first
        first, second = (plain, ours) if round_ % 2 == 0 else (ours, plain)
        rates = {first: rate(first), second: rate(second)}
        theirs.append(rates[plain])
        mine.append(rates[ours])
    return statistics.median(theirs), statistics.median(mine)


def finished(ends: list, step: list) -> None:
    ends.extend(piece for piece in step if piece is not None and piece.finish)


def text(options: argparse.Namespace) -> None:
    from tests.helpers.text import varied_rows

    folder = Path(tempfile.mkdtemp(prefix="bench-serve-text-"))
    run = text_run(folder)
    prompts = [row["prompt"] for row in varied_rows(64)]
    for together in (1, 8):
        theirs, ours = generation_alone(run, prompts, together)
        print(f"in this process, {together} prompt(s) a call: model.generate {theirs:,.0f} tokens/s, "
              f"stream_rows {ours:,.0f} tokens/s: {ours / theirs:.2f}x")  # fmt: skip
    bodies = [json.dumps({"model": "run", "prompt": p, "max_tokens": NEW_TOKENS}).encode() for p in prompts]

    def tokens(answer: bytes) -> int:
        return int(json.loads(answer)["usage"]["completion_tokens"])

    measured = {}
    for batching in ("16", "1"):
        batched = ["--max-new-tokens", str(NEW_TOKENS), "--max-batch-size", batching, *options.serve_args.split()]
        server = started_server(run, str(folder), *batched)
        try:
            load(bodies, 2, 3, "/v1/completions", tokens)  # warm up
            for clients in (int(n) for n in options.clients.split(",")):
                rate, every = load(bodies, clients, options.seconds, "/v1/completions", tokens)
                measured[batching, clients] = rate
                p50 = statistics.median(every) * 1e3
                print(f"served, --max-batch-size {batching:>2}, {clients} client(s): {rate:,.0f} generated tokens/s, "
                      f"p50 {p50:,.0f} ms a request")  # fmt: skip
        finally:
            stopped(server)
    most = max(int(n) for n in options.clients.split(","))
    print(f"{most} clients: batched {measured['16', most]:,.0f} vs one request at a time {measured['1', most]:,.0f} "
          f"tokens/s = {measured['16', most] / measured['1', most]:.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", help="a finished run dir (default: the embedded default, one epoch)")
    parser.add_argument("--seconds", type=float, default=15, help="seconds of load per client count")
    parser.add_argument("--clients", default="1,8", help="client counts, comma-separated")
    parser.add_argument("--serve-args", default="", help="more options of the serve command, e.g. '--num-replicas 2'")
    parser.add_argument("--only", choices=["images", "text"], help="one part only")
    options = parser.parse_args()
    if options.only != "text":
        images(options)
    if options.only != "images":
        text(options)


if __name__ == "__main__":
    main()
