"""Access lists in the web faces, on memory:// and a real Redis: an allow entry passes a
client uncounted (past its limit, past a block), a deny entry answers 403 with a problem
document before anything is counted, a rule's own list replaces the middleware's, a block
(``Limiter.block``) answers 429 with ``Retry-After``; the same through the FastAPI
dependency and the aiohttp middleware. The client's address is ``client_ip``'s, after the
trusted-proxy rules."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from support.webserver import fresh_backend
from test_aiohttp import Counted, app_with, served
from test_web import Echo

import aioratelimit as arl
from aioratelimit import _observe
from aioratelimit.aiohttp import RateLimitMiddleware as AiohttpMiddleware
from aioratelimit.asgi import RateLimitMiddleware, Rule, client_ip
from aioratelimit.fastapi import RateLimit, add_problem_handler

FORBIDDEN = {
    "type": "about:blank",
    "title": "Forbidden",
    "status": 403,
    "detail": "the client is denied access",
}
#: the test client's peer is 127.0.0.1: a trusted proxy, so X-Forwarded-For names the client
CLIENT = client_ip(trusted_proxies=["127.0.0.0/8"])


def asgi_client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def listed(backend: arl.Backend) -> arl.AccessList:
    lst = arl.AccessList("web", backend=backend)
    await lst.deny(network="203.0.113.0/24")
    await lst.deny(network="2001:db8::/32")
    await lst.allow(key="ip:203.0.113.9")  # inside the denied /24: allow first
    await lst.allow(network="198.51.100.0/24")
    return lst


async def test_the_middleware_allows_denies_then_limits(store_url: str) -> None:
    backend = fresh_backend(store_url)
    lst = await listed(backend)
    app = Echo()
    limiter = arl.FixedWindow("1/minute", backend=backend, name="web", blockable=True)
    mw = RateLimitMiddleware(app, limiter, client=CLIENT, lists=lst)
    async with asgi_client(mw) as client:

        async def get(ip: str) -> httpx.Response:
            return await client.get("/", headers={"X-Forwarded-For": ip})

        denied = [await get("203.0.113.7"), await get("2001:db8:1::5")]
        allowed = [await get("198.51.100.7") for _ in range(3)]
        allowed.append(await get("203.0.113.9"))
        counted = [await get("192.0.2.1") for _ in range(2)]
        await limiter.block("ip:192.0.2.2", 30)
        await limiter.block("ip:198.51.100.8", 30)
        blocked = await get("192.0.2.2")
        allowed_past_a_block = await get("198.51.100.8")
    for r in denied:
        assert r.status_code == 403
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json() == FORBIDDEN
        assert "ratelimit" not in r.headers
    assert [r.status_code for r in allowed] == [200] * 4
    assert all("ratelimit" not in r.headers for r in allowed)  # not counted
    assert [r.status_code for r in counted] == [200, 429]
    assert blocked.status_code == 429
    assert 1 <= int(blocked.headers["retry-after"]) <= 30
    assert allowed_past_a_block.status_code == 200
    assert app.calls == 4 + 1 + 1  # the allowed, the first counted, past the block
    # Nothing was counted for a denied or an allowed client.
    for ip in ("203.0.113.7", "198.51.100.7"):
        assert (await limiter.peek(f"ip:{ip}")).allowed
    await backend.aclose()


async def test_a_rule_s_list_replaces_the_middleware_s_and_results_are_reported(
    store_url: str,
) -> None:
    backend = fresh_backend(store_url)
    everywhere = await listed(backend)
    admins = arl.AccessList("admins", backend=backend)
    await admins.deny(network="0.0.0.0/0")
    await admins.allow(key="ip:192.0.2.10")
    limiter = arl.FixedWindow("5/minute", backend=backend, name="web")
    rules = [Rule("*", "/admin/{rest:path}", limiter, lists=admins)]
    mw = RateLimitMiddleware(Echo(), limiter, client=CLIENT, rules=rules, lists=everywhere)
    seen: list[str] = []

    class Heard(arl.Recorder):
        def decision(self, limiter: Any, algorithm: str, result: str, *_: Any) -> None:
            seen.append(result)

    _observe.set_recorder(Heard())
    try:
        async with asgi_client(mw) as client:

            async def get(path: str, ip: str) -> int:
                return (await client.get(path, headers={"X-Forwarded-For": ip})).status_code

            codes = [
                await get("/admin/x", "192.0.2.10"),
                await get("/admin/x", "192.0.2.11"),
                await get("/admin/x", "203.0.113.7"),  # denied by both lists
                await get("/shop", "192.0.2.11"),
                await get("/shop", "203.0.113.7"),
            ]
    finally:
        _observe.set_recorder(None)
    assert codes == [200, 403, 403, 200, 403]
    assert seen.count("allowed_listed") == 1
    assert seen.count("denied_listed") == 3
    await backend.aclose()


async def test_shadow_mode_admits_a_denied_client_and_says_so(store_url: str) -> None:
    backend = fresh_backend(store_url)
    lst = await listed(backend)
    limiter = arl.FixedWindow("5/minute", backend=backend)
    mw = RateLimitMiddleware(Echo(), limiter, client=CLIENT, lists=lst, shadow=True)
    async with asgi_client(mw) as client:
        r = await client.get("/", headers={"X-Forwarded-For": "203.0.113.7"})
    assert r.status_code == 200
    assert r.headers["x-ratelimit-shadow"] == "denied"
    await backend.aclose()


async def test_the_fastapi_dependency_allows_and_denies(store_url: str) -> None:
    backend = fresh_backend(store_url)
    lst = await listed(backend)
    app = FastAPI()
    add_problem_handler(app)
    limit = RateLimit(arl.FixedWindow("1/minute", backend=backend), client=CLIENT, lists=lst)

    @app.get("/")
    async def root(
        d: arl.Decision | None = Depends(limit),  # noqa: B008 (FastAPI's idiom)
    ) -> dict[str, int | None]:
        return {"remaining": None if d is None else d.remaining}

    async with asgi_client(app) as client:

        async def get(ip: str) -> httpx.Response:
            return await client.get("/", headers={"X-Forwarded-For": ip})

        denied = await get("2001:db8::1")
        allowed = [await get("198.51.100.1") for _ in range(2)]
        counted = [await get("192.0.2.1") for _ in range(2)]
    assert denied.status_code == 403
    assert denied.json() == FORBIDDEN
    assert [(r.status_code, r.json()) for r in allowed] == [(200, {"remaining": None})] * 2
    assert [r.status_code for r in counted] == [200, 429]
    await backend.aclose()


async def test_the_aiohttp_middleware_denies_with_403(store_url: str) -> None:
    backend = fresh_backend(store_url)
    lst = await listed(backend)
    handler = Counted()
    limiter = arl.FixedWindow("1/minute", backend=backend)
    mw = AiohttpMiddleware(limiter, lists=lst)
    async with served(app_with(mw, handler=handler)) as client:
        # (the peer is 127.0.0.1, not a trusted proxy here: the list names it)
        await lst.deny(key="ip:127.0.0.1")
        answers = []
        for _ in range(2):
            async with client.get("/") as r:
                answers.append((r.status, r.headers["Content-Type"], await r.read()))
    assert [a[0] for a in answers] == [403, 403]
    assert answers[0][1] == "application/problem+json"
    assert json.loads(answers[0][2]) == FORBIDDEN
    assert handler.calls == 0
    await backend.aclose()


def test_lists_must_be_an_access_list() -> None:
    limiter = arl.FixedWindow("1/minute")
    with pytest.raises(TypeError, match="AccessList"):
        RateLimitMiddleware(Echo(), limiter, lists="web")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AccessList"):
        Rule("*", "/", limiter, lists=["10.0.0.0/8"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AccessList"):
        RateLimit(limiter, lists=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AccessList"):
        AiohttpMiddleware(limiter, lists=limiter)  # type: ignore[arg-type]
