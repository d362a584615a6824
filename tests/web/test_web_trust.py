"""Trust at the seams of the web layer, on real uvicorn where a request crosses a network:
a stored response replays only to whoever created it, a limit has no side door (``HEAD``,
another route, a value that spells a digest), and recording a streamed response costs the
same per chunk however long it runs."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from support.webserver import Server, fresh_backend

import aioratelimit as arl
from aioratelimit import _keys
from aioratelimit._web import records
from aioratelimit.asgi import (
    RateLimitMiddleware,
    Rule,
    path_param,
)
from aioratelimit.fastapi import RateLimit


@asynccontextmanager
async def clients(
    app: Any, backend: arl.Backend
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Serve ``app`` on uvicorn; two clients, from 127.0.0.1 and from 127.0.0.2."""
    with Server(app, cleanup=backend.aclose) as server:
        other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=30) as one,
            httpx.AsyncClient(base_url=server.url, timeout=30, transport=other) as two,
        ):
            yield one, two


# -- a stored response replays only to whoever created it ----------------------------------


# -- no side door around a limit -----------------------------------------------------------


async def test_head_counts_under_a_get_rule() -> None:
    """Starlette answers HEAD with the GET endpoint: a GET rule counts HEAD too, so HEAD
    cannot run the endpoint past the limit, and the GET after one HEAD is refused."""
    backend = fresh_backend("memory://")

    async def search(request: Any) -> PlainTextResponse:
        return PlainTextResponse("results")

    app = Starlette(routes=[Route("/search", search, methods=["GET"])])
    mw = RateLimitMiddleware(
        app, rules=[Rule("GET", "/search", arl.FixedWindow("1/minute", backend=backend))]
    )
    async with clients(mw, backend) as (one, _):
        head = await one.head("/search")
        get = await one.get("/search")
    assert (head.status_code, get.status_code) == (200, 429)


async def test_an_unnamed_limit_counts_per_route_a_named_one_is_shared() -> None:
    """Two routes that each declare RateLimit(FixedWindow("2/minute")) count apart (the
    route's methods and template in the key, so /items/1 and /items/2 are one route and HEAD
    is GET); a named limiter shares its count across routes; so do the middleware's rules."""
    backend = fresh_backend("memory://")
    app = FastAPI()
    shared = arl.FixedWindow("2/minute", backend=backend, name="shared")

    def own() -> Any:
        return Depends(RateLimit(arl.FixedWindow("2/minute", backend=backend)))

    @app.get("/a", dependencies=[own()])
    async def a() -> str:
        return "a"

    @app.get("/b", dependencies=[own()])
    async def b() -> str:
        return "b"

    @app.api_route("/items/{item}", methods=["GET", "HEAD"], dependencies=[own()])
    async def item(item: int) -> int:
        return item

    @app.get("/c", dependencies=[Depends(RateLimit(shared))])
    async def c() -> str:
        return "c"

    @app.get("/d", dependencies=[Depends(RateLimit(shared))])
    async def d() -> str:
        return "d"

    @app.post("/x")
    @app.post("/y")
    async def xy() -> str:
        return "xy"

    mw = RateLimitMiddleware(
        app,
        rules=[
            Rule("POST", "/x", arl.FixedWindow("1/minute", backend=backend)),
            Rule("POST", "/y", arl.FixedWindow("1/minute", backend=backend)),
        ],
    )
    async with clients(mw, backend) as (one, _):

        async def codes(*requests: tuple[str, str]) -> list[int]:
            return [(await one.request(m, path)).status_code for m, path in requests]

        routes = await codes(("GET", "/a"), ("GET", "/a"), ("GET", "/b"), ("GET", "/b"))
        items = await codes(("GET", "/items/1"), ("HEAD", "/items/2"), ("GET", "/items/3"))
        named = await codes(("GET", "/c"), ("GET", "/c"), ("GET", "/d"))
        rules = await codes(("POST", "/x"), ("POST", "/y"), ("POST", "/x"))
    assert routes == [200, 200, 200, 200]
    assert items == [200, 200, 429]
    assert named == [200, 200, 429]
    assert rules == [200, 200, 429]


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
