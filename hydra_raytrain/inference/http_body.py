"""A request's body read under its cap, and the 4xx answer a malformed request gets: what serve's routes share."""

from __future__ import annotations

from typing import Any


class BadRequest(Exception):
    """A request the model cannot answer: its HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


async def read_body(request: Any, cap: int) -> bytes:
    """A request's body, up to ``cap`` bytes: a larger one is answered 413 before it is read (its Content-Length)
    or as soon as it passes the cap (a body sent in chunks), never held whole."""
    declared = request.headers.get("content-length", "")
    too_big = f"at most {cap:,} bytes a request (--max-body-mb)"
    if declared.isdigit() and int(declared) > cap:
        raise BadRequest(413, f"the body holds {int(declared):,} bytes; {too_big}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise BadRequest(413, f"the body holds more than {cap:,} bytes; {too_big}")
        chunks.append(chunk)
    return b"".join(chunks)
