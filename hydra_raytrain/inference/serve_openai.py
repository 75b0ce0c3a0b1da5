"""Serve's OpenAI routes for a causal LM's run: a request read, generated in a batch, answered whole or streamed.

Ray Serve's ``@serve.batch`` forms its next batch as soon as the running one has started, from the requests that
arrive within its wait: under load, requests then queue in fragments of one or two behind a running batch. Here a
batch is formed when the model is free, from every request waiting then (up to ``most``), after waiting briefly for
the clients the last batch answered, so that a replica under N clients generates N rows a step. Each request reads
its own pieces as the model makes them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from hydra_raytrain.config.errors import one_line

END = object()
logger = logging.getLogger(__name__)


class GenerationBatches:
    """``generate(asks, emit)`` (run in a thread) over batches of the requests that wait: ``most`` at most a batch,
    and those ``fits`` accepts together (the model's positions hold the longest prompt and the most new tokens). A
    batch waits (``wait_s`` at most) for the requests it expects: those waiting when the last batch ended and those it
    answered whose clients have not asked again, so that N clients asking in turn fill batches of N. A request's
    answer ends when its own row does, not its batch."""

    def __init__(
        self,
        generate: Callable[[list[Any], Callable[[Any], None]], None],
        most: int,
        wait_s: float,
        fits: Callable[[list[Any]], bool] | None = None,
    ) -> None:
        self.generate, self.most, self.wait_s, self.fits = generate, most, wait_s, fits
        self.waiting: list[tuple[Any, asyncio.Queue[Any]]] = []
        self.running: asyncio.Task[None] | None = None
        self.arrived = asyncio.Event()
        self.expected = 1

    async def pieces(self, ask: Any) -> AsyncIterator[Any]:
        """``ask``'s pieces as its batch generates them, the last with its finish reason."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.waiting.append((ask, queue))
        self.arrived.set()
        if self.running is None or self.running.done():
            self.running = asyncio.create_task(self.run())
        while (piece := await queue.get()) is not END:
            if isinstance(piece, Exception):
                raise piece
            yield piece

    async def run(self) -> None:
        try:
            while self.waiting:
                await self.gathered()
                batch = self.batch()
                if batch:
                    arrived = len(self.waiting)
                    await self.generated(batch)
                    # Expected next: those waiting, and those just answered that have not asked again yet
                    self.expected = min(
                        self.most, len(self.waiting) + max(len(batch) - (len(self.waiting) - arrived), 0)
                    )
        except BaseException as error:  # the loop itself failed (or the replica stops): no request waits forever
            for _, queue in self.waiting:
                queue.put_nowait(error if isinstance(error, Exception) else END)
            self.waiting = []
            raise

    def batch(self) -> list[tuple[Any, asyncio.Queue[Any]]]:
        """The waiting requests that generate together, in the order they came; those whose clients left, ended."""
        batch: list[tuple[Any, asyncio.Queue[Any]]] = []
        rest: list[tuple[Any, asyncio.Queue[Any]]] = []
        for ask, queue in self.waiting:
            if ask.cancelled.is_set():
                queue.put_nowait(END)
            elif len(batch) < self.most and (
                self.fits is None or not batch or self.fits([a for a, _ in batch] + [ask])
            ):
                batch.append((ask, queue))
            else:
                rest.append((ask, queue))
        self.waiting = rest
        return batch

    async def generated(self, batch: list[tuple[Any, asyncio.Queue[Any]]]) -> None:
        """``batch`` generated: each row's pieces to its request, its end as soon as it has finished."""
        finished = [False] * len(batch)
        try:
            async for step in steps(self.generate, [ask for ask, _ in batch]):
                for i, ((_, queue), piece) in enumerate(zip(batch, step, strict=True)):
                    if piece is not None and not finished[i]:
                        queue.put_nowait(piece)
                        if piece.finish:
                            finished[i] = True
                            queue.put_nowait(END)
        except Exception as error:  # noqa: BLE001  (said to every request of the batch not answered yet)
            logger.exception("Generation failed for a batch of %d requests", len(batch))
            for i, (_, queue) in enumerate(batch):
                if not finished[i]:
                    queue.put_nowait(error)
        for i, (_, queue) in enumerate(batch):
            if not finished[i]:
                queue.put_nowait(END)

    async def gathered(self) -> None:
        """Until the expected requests wait, or ``wait_s`` has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while len(self.waiting) < self.expected and (left := deadline - loop.time()) > 0:
            self.arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):  # TimeoutError's alias from Python 3.11 on; not on 3.10
                await asyncio.wait_for(self.arrived.wait(), left)


async def steps(generate: Callable[[list[Any], Callable[[Any], None]], None], asks: list[Any]) -> AsyncIterator[Any]:
    """``generate(asks, emit)`` run in a thread, each step's pieces (one per request, ``None`` for a request with
    nothing new) yielded as ``emit`` gets them."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue[Any]()

    def emit(item: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    def run() -> None:
        try:
            generate(asks, emit)
        except Exception as error:  # noqa: BLE001  (raised below, to every request of the batch)
            emit(error)
        finally:
            emit(END)

    loop.run_in_executor(None, run)
    try:
        while (item := await queue.get()) is not END:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        for ask in asks:  # closed early (an error): the rows stop at their next token
            ask.cancelled.set()


def generation_batches(completer: Any, most: int, wait_s: float) -> Any:
    """The replica's batches of OpenAI requests (``None`` for a run that is not a causal LM's): ``most`` requests a
    batch, its first waiting ``wait_s`` for others."""
    if completer is None:
        return None
    return GenerationBatches(completer.stream, most, wait_s, completer.fits).pieces


def not_a_language_model(run: str) -> Any:
    """OpenAI's 404 for a run that is not a causal LM's."""
    from hydra_raytrain.inference.openai_api import ApiError

    problem = f"{run} is not a causal language model's run: POST /predict answers it."
    return ApiError(404, problem, None, "not_found")


def openai_models(path: str, completer: Any, run: str, created: int) -> Any:
    """``GET /v1/models`` and ``/v1/models/<name>``: the run's model, by the run's name; else OpenAI's 404."""
    from fastapi.responses import JSONResponse

    from hydra_raytrain.inference.openai_api import ApiError, model_body, models_body

    if completer is None:
        error = not_a_language_model(run)
    elif path == "models":
        return models_body(run, created)
    elif path == f"models/{run}":
        return model_body(run, created)
    elif path.startswith("models/"):
        error = ApiError(
            404, f"The model {path[7:]!r} does not exist: this server serves {run!r}.", "model", "model_not_found"
        )
    else:
        error = ApiError(404, f"No GET /v1/{path} here: /v1/models.")
    return JSONResponse(error.body, status_code=error.status)


ENDPOINTS = {"chat/completions": "chat", "completions": "text"}


async def openai_answer(
    endpoint: str, request: Any, completer: Any, generating: Any, run: str, cap: int, most: int
) -> Any:
    """An OpenAI request (``endpoint``: chat/completions or completions) read by the replica's ``completer`` (a
    body over ``cap`` bytes, ``max_tokens`` over ``most``: refused), generated in a batch (``generating``) and answered
    whole or streamed (server-sent events); or OpenAI's error object."""
    from fastapi.responses import JSONResponse, StreamingResponse

    from hydra_raytrain.inference.http_body import BadRequest, read_body
    from hydra_raytrain.inference.openai_api import ApiError, answer_body, events

    try:
        if completer is None:
            raise not_a_language_model(run)
        if endpoint not in ENDPOINTS:
            raise ApiError(404, f"No /v1/{endpoint} here: /v1/chat/completions, /v1/completions, /v1/models.")
        body = await read_body(request, cap)
        read = functools.partial(completer.ask, ENDPOINTS[endpoint], body, run, most)
        ask = await asyncio.get_running_loop().run_in_executor(None, read)
    except BadRequest as bad:
        return JSONResponse(ApiError(bad.status, bad.reason).body, status_code=bad.status)
    except ApiError as error:
        return JSONResponse(error.body, status_code=error.status)
    except Exception as error:  # noqa: BLE001  (a tokenizer's own failure: logged, and said as OpenAI's error)
        logger.exception("Reading an OpenAI request failed")
        failed = ApiError(500, f"The request could not be read: {one_line(error)}")
        return JSONResponse(failed.body, status_code=500)
    pieces = generating(ask)
    if ask.stream:
        return StreamingResponse(events(ask, pieces), media_type="text/event-stream")
    try:
        answered = [piece async for piece in pieces if piece is not None]
        if not answered or answered[-1].finish is None:
            raise RuntimeError("the generation ended before this request's answer did")
    except Exception as error:  # noqa: BLE001  (the model failed on this batch: said to its clients)
        failed = ApiError(500, f"Generation failed: {one_line(error)}")
        return JSONResponse(failed.body, status_code=500)
    finally:
        ask.cancelled.set()
    return answer_body(ask, answered)
