"""A served run (``python -m hydra_raytrain.serve``) under load: requests/s and latency at 1 and 8 clients.

    .venv/bin/python benchmarks/serve.py            # or: make bench-serve
    .venv/bin/python benchmarks/serve.py --run outputs/runs/<name> --seconds 20

The embedded default (simple_cnn on the digits) trains for one epoch in local mode unless ``--run`` names a run
(what is measured is serving, not the model's quality). The server is the real command on a local cluster of
its own, one replica of one CPU, default batching. Each client is a thread with a keep-alive HTTP connection
sending ``POST /predict`` with one validation sample, the next as soon as the answer is read, for ``--seconds``.
Printed per client count: requests/s, p50 and p99 latency, and the ratio to the model alone (the same samples,
one at a time, ``load_model(run)`` in this process: the ceiling that HTTP, JSON and Serve's routing cost from).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 8711


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


def load(bodies: list[bytes], clients: int, seconds: float) -> tuple[float, list[float]]:
    """requests/s and every request's latency (s) with ``clients`` keep-alive clients for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop = time.perf_counter() + seconds

    def client(k: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
        i = k
        while time.perf_counter() < stop:
            sent = time.perf_counter()
            connection.request("POST", "/predict", body=bodies[i % len(bodies)])
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
            latencies[k].append(time.perf_counter() - sent)
            i += clients
        connection.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = sorted(t for each in latencies for t in each)
    return len(every) / (time.perf_counter() - started), every


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", help="a finished run dir (default: the embedded default, one epoch)")
    parser.add_argument("--seconds", type=float, default=15, help="seconds of load per client count")
    parser.add_argument("--clients", default="1,8", help="client counts, comma-separated")
    parser.add_argument("--serve-args", default="", help="more options of the serve command, e.g. '--num-replicas 2'")
    options = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-serve-")
    run = os.path.abspath(options.run or train(folder))
    bodies = samples(run)
    alone = model_alone(run, bodies, min(options.seconds, 5))
    log = open(os.path.join(folder, "serve.log"), "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "hydra_raytrain.serve", run, "--port", str(PORT), *options.serve_args.split()],
        stdout=log,
        stderr=log,
        cwd=folder,
    )
    try:
        deadline = time.time() + 180
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                sys.exit(f"the server did not start: see {log.name}")
            time.sleep(0.5)
        load(bodies, 2, 2)  # warm up: the replica's first batches
        print(f"model alone, one sample per call, in this process: {alone:,.0f} calls/s")
        print(f"{'clients':>8} {'requests/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'x model alone':>14}")
        for clients in (int(n) for n in options.clients.split(",")):
            rate, every = load(bodies, clients, options.seconds)
            p50, p99 = statistics.median(every) * 1e3, every[min(len(every) - 1, int(len(every) * 0.99))] * 1e3
            print(f"{clients:>8} {rate:>11,.0f} {p50:>8.1f} {p99:>8.1f} {rate / alone:>13.2f}x")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
