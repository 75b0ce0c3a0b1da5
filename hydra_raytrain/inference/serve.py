"""Serve a trained run's model over HTTP with Ray Serve: batched requests, replicas on the cluster.

    python -m hydra_raytrain.serve outputs/runs/<name>                        # http://127.0.0.1:8000
    python -m hydra_raytrain.serve outputs/runs/<name> --port 9000 --num-replicas 2 --address auto

    curl -s 127.0.0.1:8000/predict -d '{"inputs": [<sample>, ...]}'
      -> {"predictions": [...], "probabilities": [[...], ...]}      (regression: no "probabilities")
    curl -s 127.0.0.1:8000/predict -d '{"inputs": ["def add(a, b):", ...]}'    (a causal LM's run)
      -> {"predictions": ["<greedy completion>", ...]}                (--max-new-tokens new tokens at most)
    curl -s 127.0.0.1:8000/predict -d '{"inputs": ["a great film", ...]}'     (a text classifier's run)
      -> {"predictions": [{"label": "positive", "probability": 0.98}, ...]}
    curl -s 127.0.0.1:8000/predict -d '{"inputs": ["Q: 2+2? A: 4", ...]}'    (a reward model's run)
      -> {"predictions": [{"score": 1.73}, ...]}
    curl -s 127.0.0.1:8000/health
      -> {"status": "ready", "run": ..., "input_shape": [...], "classes": [...]}

A causal LM's run also speaks OpenAI's API (``inference/openai_api.py``), for the clients people have:
    OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none").chat.completions.create(model="<name>", messages=...)
``/v1/chat/completions`` (the run's chat template applied), ``/v1/completions``, ``/v1/models``; ``stream``,
``temperature``, ``top_p``, ``seed``, ``stop``, ``max_tokens`` (at most ``--max-new-tokens``). Concurrent requests
generate together on a replica (each with its own settings; a streamed one sends its text as it comes).

Each sample is nested lists in the run's ``dataset.input_shape``: a model input as the run's dataset yields it (a
Parquet run's ``dataset.transform`` is applied here, as in training and predict). Predictions are the class (by
name when the run's classes are strings) or, for regression, the value. Requests are batched across clients
(``--max-batch-size`` requests, waiting at most ``--batch-wait-timeout-s``); a malformed request gets a 4xx
answer ``{"error": "<one line>"}``. One client cannot stall the others: a body over ``--max-body-mb`` is refused
(413) before it is parsed, parsing runs beside the event loop, the model takes ``--max-samples`` samples at a
time, the queue is bounded (``--max-queued-requests``: 503 beyond) and a request times out
(``--request-timeout-s``); the API's pages are off unless ``--docs``. The server listens on 127.0.0.1:
``--host 0.0.0.0`` opens it to every machine that can reach this one, with no authentication. Ctrl-C or SIGTERM
stops it: the app is deleted, and Serve itself is shut down when this command started it. The cluster:
``--address``, else ``RAY_ADDRESS``, else a local one of its own.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route's annotations (``Request``, imported in
# ``application`` because Ray Serve is an extra) as objects.
import argparse
import contextlib
import functools
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from hydra_raytrain.config.errors import ConfigError, one_line
from hydra_raytrain.config.schema import cluster_address
from hydra_raytrain.inference.finished import FinishedRun
from hydra_raytrain.inference.http_body import BadRequest, read_body
from hydra_raytrain.shell.program import BAD_INPUT, Command, at_least_one

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# How long a batch waits to fill unless --batch-wait-timeout-s says: a model call of milliseconds (/predict) starts at
# once; a generation of hundreds of milliseconds waits (this long at most) for the clients its last batch answered.
PREDICT_WAIT_S, GENERATION_WAIT_S = 0.001, 0.05
SERVE_EXTRA = "pip install 'hydra_raytrain[serve]' (Ray Serve: ray[serve], with FastAPI and uvicorn)"


def parse_inputs(body: bytes, shape: tuple[int, ...], limit: int) -> np.ndarray:
    """``{"inputs": [<sample>, ...]}`` as a float32 array of shape ``(n, *shape)``, or ``BadRequest``."""
    try:
        data = json.loads(body)
    except ValueError as error:  # JSONDecodeError, and bytes that are not UTF-8
        raise BadRequest(400, f"the body is not JSON ({error})") from None
    except RecursionError:
        raise BadRequest(400, "the body nests too deep to parse") from None
    usage = f'a JSON object {{"inputs": [<sample>, ...]}}, each sample nested lists of shape {list(shape)}'
    if not isinstance(data, dict) or "inputs" not in data:
        raise BadRequest(422, f"the body must be {usage}")
    inputs = data["inputs"]
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest(422, f'"inputs" must be a non-empty list of samples: {usage}')
    if len(inputs) > limit:
        raise BadRequest(413, f'"inputs" holds {len(inputs)} samples; at most {limit} per request (--max-samples)')
    return samples(inputs, shape)


def parse_prompts(body: bytes, limit: int) -> list[str]:
    """``{"inputs": ["prompt", ...]}`` (prompts, or a classifier's texts) as their list, or ``BadRequest``."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise BadRequest(400, f"the body is not JSON ({one_line(error)})") from None
    inputs = data.get("inputs") if isinstance(data, dict) else None
    if not isinstance(inputs, list) or not inputs or not all(isinstance(prompt, str) and prompt for prompt in inputs):
        raise BadRequest(
            422, 'the body must be a JSON object {"inputs": ["prompt", ...]}: a non-empty list of non-empty strings'
        )
    if len(inputs) > limit:
        raise BadRequest(413, f'"inputs" holds {len(inputs)} prompts; at most {limit} per request (--max-samples)')
    return inputs


def answer_prompts(complete: Any, requests: list[list[str]]) -> list[dict[str, Any] | BadRequest]:
    """Each request's completions, the batch's prompts completed together; when that fails, each request alone,
    so a prompt the model refuses (longer than its positions) fails its own request (422), not the batch."""
    try:
        done = iter(complete([prompt for prompts in requests for prompt in prompts]))
        return [{"predictions": [next(done) for _ in prompts]} for prompts in requests]
    except Exception:  # noqa: BLE001  (one request's prompts, found below)
        pass
    answers: list[dict[str, Any] | BadRequest] = []
    for prompts in requests:
        try:
            answers.append({"predictions": complete(prompts)})
        except Exception as error:  # noqa: BLE001  (the model refuses these prompts: said to their client)
            answers.append(BadRequest(422, f"the model cannot answer these inputs: {one_line(error)}"))
    return answers


def samples(inputs: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    """A request's samples as float32 ``(n, *shape)``: numbers only, of that shape, finite; else ``BadRequest``."""
    try:
        raw = np.asarray(inputs)
    except RecursionError:
        raise BadRequest(422, f'"inputs" nest deeper than samples of shape {list(shape)}') from None
    except (ValueError, TypeError):  # lists of unequal lengths
        raise BadRequest(422, f'"inputs" must be samples of shape {list(shape)}: lists of equal lengths') from None
    if raw.dtype.kind not in "iuf":
        raise BadRequest(
            422, f'"inputs" must hold numbers only (no text, booleans or nulls), each sample of shape {list(shape)}'
        )
    x = raw.astype(np.float32)
    if x.shape[1:] != shape:
        raise BadRequest(
            422, f"each sample must have shape {list(shape)} (the run's dataset.input_shape); got {list(x.shape[1:])}"
        )
    if not np.isfinite(x).all():
        raise BadRequest(422, '"inputs" hold NaN or infinite values')
    return x


def answer(predictions: Any, probabilities: np.ndarray | None) -> dict[str, Any] | BadRequest:
    """The JSON answer to one request: its predictions and, for classification, each class's probability; a
    ``BadRequest`` (422) where the model's output for its inputs is not finite (no JSON number holds it)."""
    values = np.asarray(predictions)
    numbers = [values] if values.dtype.kind in "fiu" else []
    if not all(np.isfinite(v).all() for v in [*numbers, *([probabilities] if probabilities is not None else [])]):
        return BadRequest(422, "the model's output for these inputs is not finite (NaN or infinite)")
    body: dict[str, Any] = {"predictions": values.tolist()}
    if probabilities is not None:
        body["probabilities"] = probabilities.tolist()
    return body


def served(cfg: dict[str, Any], run: str) -> dict[str, Any]:
    """What /health describes: the run, the shape of a sample, the outputs; a run with no such model is refused."""
    model = cfg.get("model") or {}
    if "_target_" not in model:
        raise ConfigError(
            "RUN_DIR",
            run,
            f"holds several models ({', '.join(sorted(model))}): serve answers a model that takes the dataset's "
            "samples (a GAN's generator is exported: python -m hydra_raytrain.export RUN_DIR).",
            "a run of a classification, regression or Lightning task",
        )
    from hydra_raytrain.inference.classify_text import is_classifier
    from hydra_raytrain.inference.export_text import is_text
    from hydra_raytrain.inference.predict import class_names, image_builder

    if is_classifier(cfg):  # a text classifier: texts in, their classes out
        return {"run": os.path.basename(os.path.abspath(run)), "inputs": "texts", "classes": cfg["dataset"]["classes"]}
    if is_text(cfg):  # a causal LM: prompts in, completions out
        return {"run": os.path.basename(os.path.abspath(run)), "inputs": "prompts", "classes": None}
    dataset = cfg["dataset"]
    classes = dataset.get("classes") or (class_names(dataset) if image_builder(dataset) else None)
    return {
        "run": os.path.basename(os.path.abspath(run)),
        "input_shape": [int(n) for n in dataset["input_shape"]],
        "num_outputs": int(dataset.get("num_outputs") or 1),
        "classes": classes,
    }


def request_parser(description: dict[str, Any], limit: int) -> Any:
    """A request body's parser for the run /health describes: prompts (a causal LM's) or texts (a classifier's),
    else samples."""
    if description.get("inputs") in ("prompts", "texts"):
        return functools.partial(parse_prompts, limit=limit)
    return functools.partial(parse_inputs, shape=tuple(description["input_shape"]), limit=limit)


def application(run: FinishedRun, description: dict[str, Any], options: argparse.Namespace) -> Any:
    """The Ray Serve app: a FastAPI ingress, the run's model in each replica, requests batched across clients."""
    import asyncio

    from fastapi import Request
    from ray import serve

    from hydra_raytrain.inference.serve_openai import generation_batches, openai_answer, openai_models

    app, path, created = _fastapi(description["run"], options.docs), os.path.abspath(run.path), int(time.time())
    cap, parse = int(options.max_body_mb * 2**20), request_parser(description, options.max_samples)

    @serve.deployment(**deployment_options(options))
    @serve.ingress(app)
    class Model:
        def __init__(self, dataset: dict[str, Any]) -> None:
            # A batch of requests goes through the model --max-samples samples at a time (one request's most)
            self.forward, self.completer = answering(description, path, dataset, options)
            # OpenAI's requests: those waiting when the model is free generate together, each piece sent as it comes
            self.generating = generation_batches(
                self.completer, options.max_batch_size, batch_wait_s(options, GENERATION_WAIT_S)
            )

        @app.get("/health")
        def health(self) -> dict[str, Any]:
            return {"status": "ready", **description}

        @app.post("/predict")
        async def predict(self, request: Request) -> Any:
            return await predict_answer(request, cap, parse, self.batched)

        @app.get("/v1/{path:path}")  # models, models/<name>
        def models(self, path: str) -> Any:
            return openai_models(path, self.completer, description["run"], created)

        @app.post("/v1/{endpoint:path}")  # chat/completions, completions
        async def openai(self, endpoint: str, request: Request) -> Any:
            limits = (description["run"], cap, options.max_new_tokens)
            return await openai_answer(endpoint, request, self.completer, self.generating, *limits)

        @serve.batch(max_batch_size=options.max_batch_size, batch_wait_timeout_s=batch_wait_s(options, PREDICT_WAIT_S))
        async def batched(self, requests: list[Any]) -> list[dict[str, Any] | BadRequest]:
            # The model runs beside the event loop, which goes on taking requests (and /health) meanwhile
            outputs = await asyncio.get_running_loop().run_in_executor(None, self.forward, requests)
            return outputs

    return Model.bind(run.dataset)  # type: ignore[attr-defined]  # serve.deployment's


async def predict_answer(request: Any, cap: int, parse: Any, batched: Any) -> Any:
    """A /predict request's answer: its body (at most ``cap`` bytes) parsed, answered in a batch (``batched``); or
    ``{"error"}`` with its 4xx status."""
    import asyncio

    from fastapi.responses import JSONResponse

    try:
        body = await read_body(request, cap)
        # Parsed in a thread: json's parser holds the GIL, so a body near the cap still delays the loop by its parse
        # (about 35 ms a MB here); the cap bounds that
        x = await asyncio.get_running_loop().run_in_executor(None, parse, body)
        answered = await batched(x)
        if isinstance(answered, BadRequest):
            raise answered
    except BadRequest as error:
        return JSONResponse({"error": error.reason}, status_code=error.status)
    return answered


def answering(
    description: dict[str, Any], path: str, dataset: dict[str, Any], options: argparse.Namespace
) -> tuple[Any, Any]:
    """A replica's model: what answers a batch of /predict requests, and the causal LM's ``Completer`` that answers
    OpenAI's API (``None`` for other runs). A batch goes through the model ``--max-samples`` samples at a time."""
    from hydra_raytrain.inference.predict import Predictor

    device, chunk = "cuda" if options.num_gpus else "cpu", options.max_samples
    if description.get("inputs") in ("prompts", "texts"):  # lists of prompts or texts: answered request by request
        answer_texts = text_answers(description["inputs"], path, device, options, chunk)
        completer = answer_texts.__self__ if description["inputs"] == "prompts" else None
        return functools.partial(answer_prompts, answer_texts), completer
    predictor = Predictor(path, [], dataset, device, classes=description["classes"], batch_size=chunk)
    return functools.partial(answer_samples, predictor), None


def answer_samples(predictor: Any, requests: list[np.ndarray]) -> list[dict[str, Any] | BadRequest]:
    """Each request's answer, the batch's samples through the model together."""
    predictions, probabilities = predictor.answer(predictor.forward(np.concatenate(requests)))
    ends = np.cumsum([len(x) for x in requests])[:-1]
    split = np.split(probabilities, ends) if probabilities is not None else [None] * len(requests)
    return [answer(p, q) for p, q in zip(np.split(np.asarray(predictions), ends), split, strict=True)]


def text_answers(inputs: str, path: str, device: str, options: argparse.Namespace, chunk: int) -> Any:
    """What a text run's replica answers a list of texts with: a classifier's ``{"label", "probability"}`` each
    (``inputs``: texts), a causal LM's greedy completions (prompts)."""
    from hydra_raytrain.inference.classify_text import TextClassifier
    from hydra_raytrain.inference.generate import Completer

    if inputs == "texts":
        return TextClassifier(path, device, batch_size=chunk).answers
    return Completer(path, device, options.max_new_tokens, batch_size=chunk).complete


def _fastapi(run_name: str, docs: bool) -> Any:
    """The app's FastAPI ingress; its API pages (/docs, /redoc, /openapi.json) only with ``docs``."""
    from fastapi import FastAPI

    return FastAPI(
        title=f"hydra_raytrain: {run_name}",
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )


def deployment_options(options: argparse.Namespace) -> dict[str, Any]:
    """The replicas' options for ``serve.deployment``: their resources, import path and queues."""
    from hydra_raytrain.runtime.host import import_path

    return {
        "num_replicas": options.num_replicas,
        "ray_actor_options": {
            "num_cpus": options.num_cpus,
            "num_gpus": options.num_gpus,
            # Ray's processes do not inherit this folder: the run's own modules import from it and PYTHONPATH
            "runtime_env": {"env_vars": {"PYTHONPATH": import_path()}},
        },
        "max_ongoing_requests": max(8, 2 * options.max_batch_size),
        "max_queued_requests": options.max_queued_requests,  # beyond: 503 at once, not a queue without end
    }


def batch_wait_s(options: argparse.Namespace, default: float) -> float:
    return default if options.batch_wait_timeout_s is None else float(options.batch_wait_timeout_s)


def check_resources(options: argparse.Namespace) -> None:
    """The replicas fit the cluster, or one ConfigError saying what does."""
    import ray

    for key, value, kind in (("--num-cpus", options.num_cpus, "CPU"), ("--num-gpus", options.num_gpus, "GPU")):
        have = float(ray.cluster_resources().get(kind, 0))
        if value < 0 or options.num_replicas * value > have:
            raise ConfigError(
                key,
                value,
                f"{options.num_replicas} replicas x {value:g} {kind}s each; the cluster has {have:g}.",
                f"at most {have / max(options.num_replicas, 1):g} per replica (--num-replicas {options.num_replicas})",
            )


def check_port(host: str, port: int) -> None:
    """The port is free on this machine (where a local cluster's proxy listens), or one ConfigError."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's own (connections closing)
        try:
            probe.bind((host, port))
        except OSError as error:
            problem = f"cannot be listened on at {host}: {error.strerror}."
            raise ConfigError("--port", port, problem, "a free port") from None


@dataclass
class Started:
    """What this command started on the cluster, so that every way out (an error, Ctrl-C, SIGTERM during the
    start) takes it down: Serve itself (``serve``), or only its app on a Serve that was running (``app``)."""

    serve: bool = False
    app: str = ""
    shared: bool = False  # Serve was running already: its proxies' host and port stand
    openai: bool = False  # a causal LM's run: OpenAI's API at /v1 too


def serve_run(options: argparse.Namespace, started: Started) -> None:
    """Start Serve (unless it runs on the cluster already) and the app, recording in ``started`` what to take
    down; a ConfigError for what the cluster cannot do, ``ServeFailed`` when the app does not start."""
    import ray
    from ray import serve

    from hydra_raytrain.runtime.reach import reach_ray

    finished = FinishedRun.read(options.run).checked("serve")
    description = served(finished.config, options.run)
    address = cluster_address(options.address, os.environ)
    if not address:
        check_port(options.host, options.port)
    cpus = math.ceil(max(os.cpu_count() or 1, options.num_replicas * options.num_cpus))  # Ray counts whole CPUs
    reach_ray(address or "local", cpus, given_as="--address")  # resolved above: None is a local cluster
    signal.signal(signal.SIGTERM, _interrupt)  # after ray.init, which sets a handler of its own
    check_resources(options)
    logs = {"log_level": options.log_level}
    logging.getLogger("ray.serve").setLevel(options.log_level)  # this process's Serve client too
    try:
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        started.shared = True
    except ValueError:
        started.serve = True
        http = {"host": options.host, "port": options.port, "request_timeout_s": options.request_timeout_s}
        serve.start(http_options=http, logging_config=logs)
    if started.shared:
        apps = sorted(serve.status().applications)
        if apps:  # the app's routes are at the root: one app per Serve
            raise ConfigError(
                "--address",
                address,
                f"Serve on that cluster already serves {', '.join(apps)} at its routes.",
                "a cluster whose Serve serves no app (serve.delete(name) ends one), or a local cluster",
            )
    started.app, started.openai = description["run"], description.get("inputs") == "prompts"
    try:
        serve.run(application(finished, description, options), name=started.app, route_prefix="/", logging_config=logs)
    except Exception as error:  # a replica that cannot start (Serve's DEPLOY_FAILED), a route taken meanwhile
        raise ServeFailed(f"the app did not start: {one_line(error)}") from None


class ServeFailed(Exception):
    """The Serve app did not start (its replicas failed)."""


def serving_line(options: argparse.Namespace, shared: bool, openai: bool = False) -> str:
    """Where the model answers (and a warning when that is beyond this machine)."""
    also = " OpenAI's API: /v1 (chat/completions, completions, models)." if openai else ""
    if shared:
        where = "the cluster's Serve proxies (their host and port; --host and --port apply to a Serve started here)"
        return f"Serving {options.run} at {where}: /predict (POST), /health (GET).{also} Ctrl-C stops it."
    url = f"http://{'[' + options.host + ']' if ':' in options.host else options.host}:{options.port}"
    line = f"Serving {options.run} at {url}/predict (POST) and {url}/health (GET)."
    line += f" OpenAI's API: {url}/v1 (base_url)." if openai else ""
    line += " Ctrl-C stops it."
    if options.host not in LOOPBACK:
        line += f"\nListening on {options.host}: anyone who can reach this machine can call the model."
    return line


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM stops the server as Ctrl-C does: through main's ``finally``."""
    raise KeyboardInterrupt


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a number > 0")
    return value


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a finished run dir (a classification, regression or Lightning run)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="the HTTP port (default 8000)")
    parser.add_argument("--num-replicas", type=at_least_one, default=1, help="model replicas answering at once")
    parser.add_argument("--num-cpus", type=float, default=1, help="CPUs per replica")
    parser.add_argument("--num-gpus", type=float, default=0, help="GPUs per replica (0: CPU)")
    parser.add_argument(
        "--max-batch-size", type=at_least_one, default=16, help="requests one model call answers at most"
    )
    parser.add_argument(
        "--batch-wait-timeout-s",
        type=float,
        help=f"how long a batch waits to fill (default {PREDICT_WAIT_S} s; generations {GENERATION_WAIT_S} s)",
    )
    parser.add_argument("--max-samples", type=at_least_one, default=1024, help="samples one request may hold")
    parser.add_argument(
        "--max-new-tokens", type=at_least_one, default=32, help="a causal LM's run: new tokens a completion (greedy)"
    )
    parser.add_argument(
        "--max-body-mb", type=positive, default=16, help="a request's largest body (MB): beyond, 413 before parsing"
    )
    parser.add_argument(
        "--max-queued-requests",
        type=at_least_one,
        default=256,
        help="requests waiting for a replica at most; beyond, 503 at once (default 256)",
    )
    parser.add_argument(
        "--request-timeout-s", type=float, default=60, help="a request's longest answer time (408 beyond; default 60)"
    )
    parser.add_argument("--docs", action="store_true", help="serve the API's pages (/docs, /redoc, /openapi.json)")
    parser.add_argument(
        "--log-level", default="WARNING", help="Serve's log level (INFO: a line per request; default WARNING)"
    )
    parser.add_argument("--address", help="the Ray cluster to serve on (default: RAY_ADDRESS, else a local cluster)")


def _serve(options: argparse.Namespace) -> int | None:
    try:
        import fastapi  # noqa: F401
        import ray.serve  # noqa: F401
    except ImportError as error:
        print(f"Cannot serve: {error}. {SERVE_EXTRA}", file=sys.stderr)
        return BAD_INPUT
    import ray
    from ray import serve

    started = Started()
    try:
        serve_run(options, started)
        print(serving_line(options, started.shared, started.openai), flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("Stopping.", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if ray.is_initialized():
            if started.serve:
                serve.shutdown()
            elif started.app:
                with contextlib.suppress(Exception):  # an app that never deployed
                    serve.delete(started.app)
            ray.shutdown()
    return None


COMMAND = Command(
    "serve", __doc__, _options, _serve, "Cannot serve this run", "Cannot serve this run", failures=(ServeFailed,)
)
main = COMMAND.run


if __name__ == "__main__":
    main()
