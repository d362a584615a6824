"""The aiohttp middlewares on a real aiohttp server (``AppRunner`` + ``TCPSite`` on a free
loopback port) and a real HTTP client (aiohttp's), on memory:// and a real Redis."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from support.ratelimit_fields import read_fields
from support.webserver import fresh_backend

import aioratelimit as arl
from aioratelimit.aiohttp import IdempotencyMiddleware, RateLimitMiddleware, Rule, header

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
REDUCED = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"


class Counted:
    """A handler that counts its calls and answers JSON naming the path and the call."""

    def __init__(self) -> None:
        self.calls = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.read()
        return web.json_response(
            {"path": request.path, "call": self.calls, "body": body.decode()},
            status=201 if request.method == "POST" else 200,
        )


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[aiohttp.ClientSession]:
    """Serve ``app`` on a free loopback port; yield a client session bound to it."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession(f"http://{host}:{port}") as client:
            yield client
    finally:
        await runner.cleanup()


def app_with(*middlewares: object, handler: Counted) -> web.Application:
    app = web.Application(middlewares=middlewares)  # type: ignore[arg-type]
    app.router.add_route("*", "/{tail:.*}", handler.handle)
    return app


async def test_rate_limit_answers_429_with_the_quota_exceeded_problem(store_url: str) -> None:
    backend = fresh_backend(store_url)
    handler = Counted()
    limiter = arl.FixedWindow("3/minute", backend=backend)
    async with served(app_with(RateLimitMiddleware(limiter), handler=handler)) as client:
        answers = []
        for _ in range(4):
            async with client.get("/things") as r:
                answers.append((r.status, dict(r.headers), await r.read()))
    await backend.aclose()
    assert [status for status, _, _ in answers] == [200, 200, 200, 429]
    assert handler.calls == 3
    for (_, headers, _), remaining in zip(answers, (2, 1, 0), strict=False):
        got = read_fields(headers)
        assert got.policies == {"default": {"q": 3, "w": 60}}
        assert got.r == remaining
        assert "Retry-After" not in headers
    _, headers, body = answers[3]
    retry = int(headers["Retry-After"])
    assert 1 <= retry <= 60
    assert read_fields(headers).t == retry
    assert headers["Content-Type"] == "application/problem+json"
    assert json.loads(body) == {
        "type": QUOTA_EXCEEDED,
        "title": "Quota Exceeded",
        "status": 429,
        "detail": f"rate limit exceeded; try again in {retry} s",
        "violated-policies": ["default"],
    }


async def test_rules_exemptions_and_a_client_key_that_never_shows(store_url: str) -> None:
    """A rule's own limiter on its route, the default elsewhere, nothing on an exempt path;
    the client's key (an API key here) appears in no response field."""
    backend = fresh_backend(store_url)
    handler = Counted()
    middleware = RateLimitMiddleware(
        arl.FixedWindow("5/minute", backend=backend),
        client=header("X-Api-Key"),
        rules=[Rule("POST", "/orders/{id}", arl.TokenBucket("1/minute", backend=backend))],
        exempt=["/health"],
        policy_name="api",
    )
    secret = {"X-Api-Key": "sk-live-0123456789"}
    async with served(app_with(middleware, handler=handler)) as client:
        statuses, seen = [], []
        for method, path in [("POST", "/orders/7"), ("POST", "/orders/8"), ("GET", "/health")]:
            async with client.request(method, path, headers=secret) as r:
                statuses.append(r.status)
                seen.append(dict(r.headers))
        async with client.get("/things", headers=secret) as r:
            statuses.append(r.status)
            seen.append(dict(r.headers))
    await backend.aclose()
    assert statuses == [201, 429, 200, 200]
    assert read_fields(seen[0]).policies == {"api": {"q": 1, "w": 60}}
    assert "RateLimit" not in seen[2]  # exempt: not counted
    assert read_fields(seen[3]).r == 4
    assert not any("0123456789" in value for fields in seen for value in fields.values())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: a connection to it is refused


async def test_an_unreachable_backend_is_a_503_of_reduced_capacity() -> None:
    backend = arl.Backend.from_url(f"redis://127.0.0.1:{_closed_port()}")
    handler = Counted()
    limiter = arl.SlidingWindow("5/minute", backend=backend, name="search")
    served_app = served(app_with(RateLimitMiddleware(limiter), handler=handler))
    async with served_app as client, client.get("/") as r:
        status, headers, body = r.status, dict(r.headers), await r.read()
    await backend.aclose()
    assert (status, handler.calls) == (503, 0)
    assert headers["Retry-After"] == "5"
    assert json.loads(body) == {
        "type": REDUCED,
        "title": "Temporary Reduced Capacity",
        "status": 503,
        "detail": "the rate limit backend is unavailable; try again later",
        "violated-policies": ["search"],
    }


async def test_an_idempotency_key_runs_once_and_is_replayed(store_url: str) -> None:
    backend = fresh_backend(store_url)
    handler = Counted()
    middleware = IdempotencyMiddleware(backend=backend, client=header("X-Client"), require=True)
    key = {"X-Client": "a", "Idempotency-Key": '"order-1"'}
    async with served(app_with(middleware, handler=handler)) as client:
        answers = []
        for body in (b"one", b"one", b"two"):
            async with client.post("/pay", data=body, headers=key) as r:
                answers.append((r.status, dict(r.headers), await r.read()))
        async with client.post("/pay", data=b"x", headers={"X-Client": "a"}) as r:
            missing = (r.status, await r.json())
        async with client.get("/pay", headers=key) as r:
            not_taken = r.status
    await backend.aclose()
    (first, h1, b1), (again, h2, b2), (other, _, b3) = answers
    assert (first, again, other) == (201, 201, 422)
    assert b2 == b1
    assert json.loads(b1) == {"path": "/pay", "call": 1, "body": "one"}
    assert h2["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in h1
    assert h2["Content-Type"] == h1["Content-Type"] == "application/json; charset=utf-8"
    assert json.loads(b3)["status"] == 422
    assert missing == (400, missing[1])
    assert missing[1]["type"] == "about:blank"
    assert not_taken == 200  # GET is not a protected method
    assert handler.calls == 2  # the first POST and the GET


async def test_a_failed_response_frees_the_key_and_a_body_over_max_body_is_413(
    store_url: str,
) -> None:
    backend = fresh_backend(store_url)
    calls = 0

    async def flaky(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        await request.read()
        return web.json_response({"call": calls}, status=500 if calls == 1 else 200)

    app = web.Application(middlewares=[IdempotencyMiddleware(backend=backend, max_body=4)])
    app.router.add_post("/pay", flaky)
    key = {"Idempotency-Key": "k-1"}
    async with served(app) as client:
        statuses = []
        for body in (b"ab", b"ab", b"ab", b"abcdefgh"):
            async with client.post("/pay", data=body, headers=key) as r:
                statuses.append(r.status)
    await backend.aclose()
    assert statuses == [500, 200, 200, 413]
    assert calls == 2  # the 500 was not stored; the 200 was, and replayed


async def test_a_raised_see_other_is_stored_and_replayed(store_url: str) -> None:
    """aiohttp answers a redirect by raising it: a raised 303 is a completed request."""
    backend = fresh_backend(store_url)
    calls = 0

    async def create(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        raise web.HTTPSeeOther(f"/orders/{calls}")

    app = web.Application(middlewares=[IdempotencyMiddleware(backend=backend)])
    app.router.add_post("/orders", create)
    key = {"Idempotency-Key": '"o-9"'}
    async with served(app) as client:
        answers = []
        for _ in range(2):
            async with client.post("/orders", headers=key, allow_redirects=False) as r:
                answers.append(
                    (r.status, r.headers["Location"], r.headers.get("Idempotent-Replayed"))
                )
    await backend.aclose()
    assert answers == [(303, "/orders/1", None), (303, "/orders/1", "true")]
    assert calls == 1


def test_options_are_checked_before_any_request() -> None:
    with pytest.raises(ValueError, match="needs a limiter"):
        RateLimitMiddleware()
    with pytest.raises(TypeError):
        RateLimitMiddleware(arl.FixedWindow("1/s"), respond="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not '\\*'"):
        IdempotencyMiddleware(methods=["*"])
    assert "aiohttp RateLimitMiddleware" in repr(RateLimitMiddleware(arl.FixedWindow("1/s")))
