"""The web faces' failure policy and shadow mode (a guard per limiter, one breaker per
face): ``RateLimitMiddleware`` and the FastAPI ``RateLimit`` dependency with ``shadow=True``
never refuse and say what the limit said; with ``on_unavailable=Fallback(share)`` and the
server stopped, nothing past the share is admitted."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest
from support.servers import RedisServer
from support.webserver import fresh_backend, serving
from test_fastapi import limited_app
from test_web import Echo

import aioratelimit as arl
from aioratelimit._scripts import ScriptCall
from aioratelimit.asgi import IdempotencyMiddleware, RateLimitMiddleware, Rule
from aioratelimit.fastapi import IdempotencyKey, RateLimit


async def test_middleware_shadow_never_refuses(store_url: str) -> None:
    """shadow=True: every request reaches the app, with the real RateLimit fields and
    ``X-RateLimit-Shadow`` saying which ones the limit would have refused."""
    backend = fresh_backend(store_url)
    app = Echo()
    mw = RateLimitMiddleware(app, arl.FixedWindow("2/minute", backend=backend), shadow=True)
    async with serving(mw, backend) as client:
        responses = [await client.get("/") for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert app.calls == 4
    shadow = [r.headers["x-ratelimit-shadow"] for r in responses]
    assert shadow == ["allowed", "allowed", "denied", "denied"]
    assert all("ratelimit" in r.headers for r in responses)


async def test_middleware_fallback_admits_only_its_share(own_redis: RedisServer) -> None:
    """Server stopped, ``Fallback(0.2)`` of 10/minute: 2 of 6 requests pass, the rest get
    429 (counted in-process), none a 503."""
    backend = fresh_backend(own_redis.url)
    app = Echo()
    mw = RateLimitMiddleware(
        app,
        arl.FixedWindow("10/minute", backend=backend),
        on_unavailable=arl.Fallback(0.2),
        breaker=arl.Breaker(failures=1, cooldown=60.0),
    )
    async with serving(mw, backend) as client:
        own_redis.stop()
        responses = [await client.get("/") for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 2 + [429] * 4
    assert app.calls == 2


async def test_fastapi_shadow_and_fallback(own_redis: RedisServer) -> None:
    """The dependency: shadow mode lets the 4th request of 3/minute run, marked denied;
    with the server stopped, the fallback's share (1 of 3) still holds."""
    backend = fresh_backend(own_redis.url)
    app = limited_app(backend, shadow=True)
    async with serving(app, backend) as client:
        responses = [await client.get("/limited") for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert responses[-1].headers["x-ratelimit-shadow"] == "denied"
    backend = fresh_backend(own_redis.url)
    app = limited_app(backend, on_unavailable=arl.Fallback(0.34))
    async with serving(app, backend) as client:
        own_redis.stop()
        responses = [await client.get("/limited") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 429, 429]


@pytest.mark.parametrize(
    ("options", "exc"),
    [
        ({"on_unavailable": "maybe"}, ValueError),
        ({"on_unavailable": "raise"}, ValueError),
        ({"on_unavailable": 5}, TypeError),
        ({"breaker": "x"}, TypeError),
        ({"shadow": "y"}, TypeError),
    ],
)
def test_bad_web_options(options: dict[str, Any], exc: type[Exception]) -> None:
    """Bad options: refused when the middleware or the dependency is built."""
    limiter = arl.FixedWindow("1/s", backend=arl.Backend.from_url("memory://"))
    with pytest.raises(exc):
        RateLimitMiddleware(Echo(), limiter, **options)
    with pytest.raises(exc):
        RateLimit(limiter, **options)


@pytest.mark.parametrize(
    ("on_unavailable", "exc"),
    [("raise", ValueError), ("maybe", ValueError), (arl.Fallback(0.5), TypeError), (1, TypeError)],
)
def test_idempotency_faces_take_deny_or_allow(on_unavailable: Any, exc: type[Exception]) -> None:
    """The idempotency middleware and dependency take ``"deny"`` or ``"allow"`` only: a key
    has no in-process twin to fall back on, and ``"raise"`` has no HTTP answer."""
    with pytest.raises(exc, match="'deny' or 'allow'"):
        IdempotencyMiddleware(Echo(), on_unavailable=on_unavailable)
    with pytest.raises(exc, match="'deny' or 'allow'"):
        IdempotencyKey(on_unavailable=on_unavailable)
    assert IdempotencyMiddleware(Echo(), on_unavailable="allow").on_unavailable == "allow"
    assert IdempotencyKey().on_unavailable == "deny"


async def asgi_get(app: Any, path: str = "/") -> tuple[int, dict[bytes, bytes]]:
    """One GET through ``app`` called directly: its status and response headers."""
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "headers": [],
        "client": ("10.0.0.1", 1),
    }
    await app(scope, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"])


async def test_a_shadow_limiter_under_a_shadow_face_keeps_its_verdict(store_url: str) -> None:
    """A shadow limiter under a face with shadow=True: the face does not shape the decision
    a second time, so the third request of 2/minute still says ``denied``."""
    backend = fresh_backend(store_url)
    limiter = arl.FixedWindow("2/minute", backend=backend, shadow=True)
    mw = RateLimitMiddleware(Echo(), limiter, shadow=True)
    try:
        answers = [await asgi_get(mw) for _ in range(3)]
    finally:
        await backend.aclose()
    assert [status for status, _ in answers] == [200] * 3
    shadow = [headers[b"x-ratelimit-shadow"] for _, headers in answers]
    assert shadow == [b"allowed", b"allowed", b"denied"]


async def test_one_breaker_guards_every_limiter_of_a_face(own_redis: RedisServer) -> None:
    """Server stopped, two routes on two limiters, Breaker(failures=1): the first request's
    failure opens the face's one breaker, and the other route's requests are counted on its
    fallback twin without a call to the backend."""
    calls: list[ScriptCall] = []
    backend = arl.Backend.from_url(
        own_redis.url, timeout=0.5, connect_timeout=0.5, on_call=calls.append
    )
    breaker = arl.Breaker(failures=1, cooldown=60.0)
    orders = arl.FixedWindow("10/minute", backend=backend, name="orders")
    search = arl.FixedWindow("4/minute", backend=backend, name="search")
    mw = RateLimitMiddleware(
        Echo(),
        rules=[Rule("GET", "/orders", orders), Rule("GET", "/search", search)],
        on_unavailable=arl.Fallback(0.5),
        breaker=breaker,
    )
    try:
        own_redis.stop()
        assert (await asgi_get(mw, "/orders"))[0] == 200
        assert breaker.state == "open"
        sent = len(calls)
        statuses = [(await asgi_get(mw, "/search"))[0] for _ in range(4)]
        assert statuses == [200, 200, 429, 429]  # half of 4 in this process
        assert len(calls) == sent
    finally:
        await backend.aclose()
