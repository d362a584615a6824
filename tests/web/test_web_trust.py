"""Trust at the seams of the web layer, on real uvicorn where a request crosses a network:
a stored response replays only to whoever created it, a limit has no side door (``HEAD``,
another route, a value that spells a digest), and recording a streamed response costs the
same per chunk however long it runs."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
from support.webserver import fresh_backend

import aioratelimit as arl
from aioratelimit import _keys
from aioratelimit._web import records
from aioratelimit.asgi import (
    RateLimitMiddleware,
    path_param,
)

# -- a stored response replays only to whoever created it ----------------------------------


# -- no side door around a limit -----------------------------------------------------------


async def test_a_short_key_part_never_shares_a_long_one_s_counter() -> None:
    """A value over 128 characters is stored as "#" and its SHA-256; a short value spelling
    exactly that keeps a counter of its own (the encoding is injective)."""
    long = "k" * 200
    spelled = "#" + hashlib.sha256(long.encode()).hexdigest()
    backend = fresh_backend("memory://")
    mw = RateLimitMiddleware(
        _ok,
        arl.FixedWindow("1/minute", backend=backend),
        client=path_param("id", "/orders/{id}"),
    )
    transport = httpx.ASGITransport(app=mw)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        codes = [(await client.get(f"/orders/{v}")).status_code for v in (long, spelled, long)]
    await backend.aclose()
    assert codes == [200, 200, 429]
    assert _keys.key_part(long) == spelled
    assert _keys.key_part(spelled) != spelled
    assert len({_keys.key_part(v) for v in (long, spelled, "#" + spelled, "plain")}) == 4


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


# -- recording a streamed response ---------------------------------------------------------


async def test_recording_a_streamed_response_costs_the_same_per_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ResponseCopy measures each chunk once (a running total), not every chunk so far: 2,000
    chunks take at most two len() calls each; past max_response it keeps nothing more, and
    the client still gets every chunk."""
    calls = 0

    def counted(obj: Any) -> int:
        nonlocal calls
        calls += 1
        return len(obj)

    monkeypatch.setattr(records, "len", counted, raising=False)
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    chunks = 2000
    for limit, stored in ((1 << 20, True), (100, False)):
        calls, sent = 0, []
        copy = records.ResponseCopy(send, limit)
        await copy({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(chunks):
            body = {"type": "http.response.body", "body": b"0123456789", "more_body": True}
            await copy(body if i < chunks - 1 else {**body, "more_body": False})
        assert calls <= 2 * chunks, calls
        assert copy.storable(lambda status: True) is stored
        assert copy.size == (10 * chunks if stored else 110)
        assert len(copy.body) == (chunks if stored else 0)
        assert len(sent) == chunks + 1
