"""Counting a request by its response (``cost_from=``), on a real uvicorn server over
loopback, on memory:// and a real Redis: a rule admits on an estimate (a reservation) and
the response settles it, once, after it has been sent.

The app is a bare ASGI callable; its ``/state`` route (exempt) drains the backend's
settlements on the server's own loop and reports what the limiter still has free.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.responses import StreamingResponse
from support.ratelimit_fields import read_fields
from support.webserver import fresh_backend, serving

import aioratelimit as arl
from aioratelimit._scripts import Arg, Reply, Script
from aioratelimit._web.metering import Meter, owned
from aioratelimit.asgi import (
    RateLimitMiddleware,
    ResponseMeter,
    Rule,
    Served,
    body_bytes,
    only_status,
    report_cost,
    reported,
    skip_status,
)
from aioratelimit.fastapi import RateLimit

CLIENT = "ip:127.0.0.1"  # (every request of these tests comes from the loopback)


class Scripts:
    """Keeps the name of every script the backend runs (on the server's loop)."""

    def __init__(self, backend: arl.Backend) -> None:
        self.names: list[str] = []
        inner = backend._run

        async def run(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
            self.names.append(script.name)
            return await inner(script, keys, args)

        backend._run = run

    def count(self, name: str) -> int:
        return self.names.count(name)


class App:
    """A bare ASGI app: ``/doc`` (304 when the client has it), ``/login`` (401 unless the
    password is right), ``/stream?n=&size=`` (a body in n chunks), ``/tokens?n=`` (reports
    n, then answers), ``/hang`` (one chunk, then waits for the client to leave), and
    ``/state`` (drains the settlements, says what ``limiter`` has free for the client)."""

    def __init__(self, backend: arl.Backend, limiter: arl.Limiter) -> None:
        self.backend, self.limiter = backend, limiter
        self.served: list[Served] = []
        self.left = asyncio.Event()  # /hang's client went away (set on the server's loop)

    def recording(self, cost_from: Any) -> Any:
        """``cost_from`` that keeps the ``Served`` it was given."""

        def cost(served: Served) -> int | None:
            self.served.append(served)
            answer: int | None = cost_from(served)
            return answer

        return cost

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope["path"]
        query = {k: int(v[0]) for k, v in parse_qs(scope["query_string"].decode()).items()}
        headers = dict(scope["headers"])
        if path == "/state":
            if query.get("hang"):  # after /hang's client has left (settled as it ended)
                await self.left.wait()
            await self.backend.drain()
            free = await free_of(self.limiter)
            await self._answer(send, 200, json.dumps({"free": free}).encode())
        elif path == "/doc":
            fresh = headers.get(b"if-none-match") == b'"v1"'
            await self._answer(send, 304 if fresh else 200, b"" if fresh else b"the document")
        elif path == "/login":
            ok = headers.get(b"x-password") == b"right"
            await self._answer(send, 200 if ok else 401, b"welcome" if ok else b"no")
        elif path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(query["n"]):
                chunk = b"x" * query["size"]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/tokens":
            report_cost(scope, query["n"])
            await self._answer(send, 200, b"done")
        elif path == "/hang":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"x" * 100, "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.left.set()
        else:
            await self._answer(send, 404, b"")

    @staticmethod
    async def _answer(send: Any, status: int, body: bytes) -> None:
        start = {"type": "http.response.start", "status": status, "headers": []}
        await send(start)
        await send({"type": "http.response.body", "body": body})


async def free_of(limiter: arl.Limiter) -> int:
    """What ``limiter`` has free for the client now (0: denied, or in debt)."""
    decision = await limiter.peek(CLIENT)
    return decision.remaining + 1 if decision.allowed else 0


async def free(client: httpx.AsyncClient, **query: int) -> int:
    """What the limiter has free for the client once every settlement has landed."""
    answer = await client.get("/state", params=query)
    assert answer.status_code == 200
    value: int = answer.json()["free"]
    return value


def served(
    store_url: str, rate: str, path: str, cost: int, cost_from: Any
) -> tuple[arl.Backend, App, RateLimitMiddleware, Scripts]:
    backend = fresh_backend(store_url)
    limiter = arl.FixedWindow(rate, backend=backend, name="counted")
    app = App(backend, limiter)
    rule = Rule("*", path, limiter, cost=cost, cost_from=app.recording(cost_from))
    mw = RateLimitMiddleware(app, rules=[rule], exempt=["/state"])
    return backend, app, mw, Scripts(backend)


# -- the ready-made cost functions --------------------------------------------------------------


async def test_a_304_is_not_counted(store_url: str) -> None:
    """Revalidations answered 304 are given back; a full answer counts."""
    backend, app, mw, scripts = served(store_url, "5/minute", "/doc", 1, skip_status(304))
    async with serving(mw, backend) as client:
        for _ in range(2):  # twice the limit in all: none of them counts
            for _ in range(5):  # (within it until the give-backs have landed)
                r = await client.get("/doc", headers={"If-None-Match": '"v1"'})
                assert r.status_code == 304
            assert await free(client) == 5
        assert (await client.get("/doc")).status_code == 200
        assert await free(client) == 4
    assert [s.status for s in app.served] == [304] * 10 + [200]
    assert scripts.count("fixed_window_refund") == 10


async def test_only_failed_logins_are_counted(store_url: str) -> None:
    """Three failed logins a minute: successful ones give their admission back."""
    backend, _app, mw, _ = served(store_url, "3/minute", "/login", 1, only_status(401, 403))
    async with serving(mw, backend) as client:
        for _ in range(5):
            ok = await client.post("/login", headers={"X-Password": "right"})
            assert ok.status_code == 200
            assert await free(client) == 3
        for _ in range(3):
            assert (await client.post("/login")).status_code == 401
        assert await free(client) == 0
        assert (await client.post("/login", headers={"X-Password": "right"})).status_code == 429


async def test_a_streamed_body_is_counted_by_its_bytes_as_it_goes(store_url: str) -> None:
    """A body sent in chunks is counted whole (in KiB, rounded up), never buffered: each
    chunk reached the client as it was sent."""
    backend, app, mw, _ = served(store_url, "100/minute", "/stream", 10, body_bytes(1024))
    async with serving(mw, backend) as client:
        chunks = []
        async with client.stream("GET", "/stream", params={"n": 5, "size": 1000}) as r:
            assert r.status_code == 200
            # The admission's decision: the estimate of 10 counted, the settlement not yet.
            assert read_fields(r.headers).r == 90
            async for chunk in r.aiter_raw():
                chunks.append(len(chunk))
        assert sum(chunks) == 5000
        assert await free(client) == 100 - 5  # 5,000 bytes: 5 KiB (rounded up)
    assert [(s.body_bytes, s.complete) for s in app.served] == [(5000, True)]


async def test_a_value_the_endpoint_reports_is_counted(store_url: str) -> None:
    """``report_cost`` from the endpoint settles the request; above the estimate it is
    charged, below it given back; the response's fields show the admission."""
    backend, _app, mw, scripts = served(store_url, "100/minute", "/tokens", 20, reported())
    async with serving(mw, backend) as client:
        r = await client.get("/tokens", params={"n": 7})
        assert read_fields(r.headers).r == 80  # the estimate, as admitted
        assert await free(client) == 93
        r = await client.get("/tokens", params={"n": 50})
        assert read_fields(r.headers).r == 73  # 93 free less the estimate of 20
        assert await free(client) == 43
        r = await client.get("/tokens", params={"n": 20})  # the estimate: nothing to send
        assert await free(client) == 23
    assert scripts.count("fixed_window_refund") == 2
    assert scripts.count("fixed_window") == 3 + 3  # three admissions, three peeks


async def test_a_request_s_own_header_never_sets_its_cost(store_url: str) -> None:
    """No request header is a report: only the endpoint's ``report_cost`` counts."""
    backend, _app, mw, _ = served(store_url, "100/minute", "/doc", 20, reported())
    async with serving(mw, backend) as client:
        for name in ("x-cost", "x-ratelimit-cost", "aioratelimit.meter"):
            await client.get("/doc", headers={name: "0"})
        assert await free(client) == 100 - 3 * 20  # nothing reported: the estimates stand


async def test_the_middleware_s_options_reserve_through_their_guard(store_url: str) -> None:
    """With the face's options on (a breaker), the admission goes through its guard and
    still settles: every 200 given back, so the limit is never reached."""
    backend = fresh_backend(store_url)
    limiter = arl.FixedWindow("2/minute", backend=backend, name="counted")
    app = App(backend, limiter)
    rule = Rule("*", "/login", limiter, cost_from=only_status(401))
    mw = RateLimitMiddleware(
        app, rules=[rule], exempt=["/state"], breaker=arl.Breaker(), shadow=True
    )
    scripts = Scripts(backend)
    async with serving(mw, backend) as client:
        for _ in range(4):
            r = await client.post("/login", headers={"X-Password": "right"})
            assert r.status_code == 200
            assert r.headers["x-ratelimit-shadow"] == "allowed"  # never over the limit
            assert await free(client) == 2
    assert scripts.count("fixed_window_refund") == 4


# -- once, and only after the response -------------------------------------------------------


async def test_the_settlement_is_applied_once_under_two_meters(store_url: str) -> None:
    """A ``ResponseMeter`` around the middleware shares the request's meter: one settlement
    per request, one refund script call, whatever watches the response."""
    backend, _app, mw, scripts = served(store_url, "100/minute", "/tokens", 20, reported())
    async with serving(ResponseMeter(mw), backend) as client:
        for n in (1, 2, 3):
            assert (await client.get("/tokens", params={"n": n})).status_code == 200
        assert await free(client) == 94
    assert scripts.count("fixed_window_refund") == 3


async def test_a_disconnect_counts_what_was_sent_until_then(store_url: str) -> None:
    """The client leaves after the first chunk: the app ends without its last chunk and the
    cost function sees ``complete=False`` and the bytes sent, which are counted."""
    backend, app, mw, _ = served(store_url, "1000/minute", "/hang", 500, body_bytes())
    async with serving(mw, backend) as client:
        async with client.stream("GET", "/hang") as r:
            assert read_fields(r.headers).r == 500
            async for chunk in r.aiter_raw():
                assert chunk
                break  # leave with the stream open: the connection is closed
        assert await free(client, hang=1) == 1000 - 100
    assert app.left.is_set()
    assert [(s.status, s.body_bytes, s.complete) for s in app.served] == [(200, 100, False)]


async def test_a_denied_request_settles_nothing(store_url: str) -> None:
    """A refusal takes no reservation: no cost function runs, no refund is sent."""
    backend, app, mw, scripts = served(store_url, "2/minute", "/doc", 2, skip_status(304))
    async with serving(mw, backend) as client:
        assert (await client.get("/doc")).status_code == 200
        assert (await client.get("/doc")).status_code == 429
        assert await free(client) == 0
    assert len(app.served) == 1
    assert scripts.count("fixed_window_refund") == 0


# -- the FastAPI dependency ------------------------------------------------------------------


def fastapi_app(backend: arl.Backend, *, metered: bool = True) -> FastAPI:
    limiter = arl.FixedWindow("100/minute", backend=backend, name="tokens")
    limit = RateLimit(limiter, cost=30, cost_from=reported())
    app = FastAPI()
    if metered:
        app.add_middleware(ResponseMeter)

    @app.get("/complete", dependencies=[Depends(limit)])
    async def complete(n: int, request: Request) -> StreamingResponse:
        async def words() -> Any:
            for i in range(n):
                yield f"w{i} "
            report_cost(request, n)  # the usage, known at the end of the stream

        return StreamingResponse(words())

    @app.get("/state")
    async def state() -> dict[str, int]:
        await backend.drain()
        return {"free": await free_of(limiter)}

    return app


async def test_the_fastapi_dependency_settles_what_the_stream_reported(store_url: str) -> None:
    backend = fresh_backend(store_url)
    scripts = Scripts(backend)
    async with serving(fastapi_app(backend), backend) as client:
        r = await client.get("/complete", params={"n": 4})
        assert r.text == "w0 w1 w2 w3 "  # (its own Response: no dependency headers)
        assert await free(client) == 96
    assert scripts.count("fixed_window_refund") == 1


async def test_the_fastapi_dependency_without_a_meter_fails_before_counting() -> None:
    backend = fresh_backend("memory://")
    async with serving(fastapi_app(backend, metered=False), backend) as client:
        r = await client.get("/complete", params={"n": 4}, headers={"Connection": "close"})
        assert r.status_code == 500
        assert await free(client) == 100


# -- bad input ---------------------------------------------------------------------------------


def test_bad_cost_functions_are_refused_at_once() -> None:
    limiter = arl.FixedWindow("5/minute")
    with pytest.raises(TypeError, match="cost_from"):
        Rule("GET", "/x", limiter, cost_from=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cost_from"):
        RateLimit(limiter, cost_from="reported")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an HTTP status"):
        skip_status(600)
    with pytest.raises(TypeError, match="int statuses"):
        only_status("401")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        skip_status()
    with pytest.raises(ValueError, match="1 or more"):
        body_bytes(0)
    with pytest.raises(TypeError, match="unit"):
        body_bytes(1.5)  # type: ignore[arg-type]


def test_the_aiohttp_middleware_refuses_a_rule_counted_by_the_response() -> None:
    from aioratelimit.aiohttp import RateLimitMiddleware as AiohttpRateLimit

    rule = Rule("GET", "/x", arl.FixedWindow("5/minute"), cost_from=body_bytes())
    with pytest.raises(ValueError, match="ASGI middleware"):
        AiohttpRateLimit(rules=[rule])


def test_report_cost_checks_its_value_and_needs_a_meter() -> None:
    scope: dict[str, Any] = {"type": "http"}
    assert report_cost(scope, 3) is False  # nothing counts this request by its response
    scope["aioratelimit.meter"] = meter = Meter()
    assert report_cost(scope, 3) is True
    assert report_cost(scope, 4) is True
    assert meter.reported == 7
    with pytest.raises(ValueError, match="0 or more"):
        report_cost(scope, -1)
    with pytest.raises(TypeError, match="int"):
        report_cost(scope, True)
    with pytest.raises(TypeError, match="int"):
        report_cost(scope, 2.0)  # type: ignore[arg-type]
    assert meter.reported == 7


def test_the_ready_made_functions_answer_from_the_view() -> None:
    def view(status: int | None, size: int = 0) -> Served:
        return Served(status, (("etag", '"v1"'),), size, status is not None, None, 5)

    assert view(200).header("ETag") == '"v1"'
    assert skip_status(304, range(500, 600))(view(304)) == 0
    assert skip_status(304, range(500, 600))(view(503)) == 0
    assert skip_status(304)(view(200)) == 5
    assert skip_status(304)(view(None)) == 5  # no status sent: the estimate stands
    assert only_status(401, 403)(view(403)) == 5
    assert only_status(401, 403)(view(200)) == 0
    assert only_status(401)(view(None)) == 5
    assert body_bytes(1024)(view(200, 1025)) == 2
    assert body_bytes()(view(200, 0)) == 0
    assert reported()(view(200)) == 5


async def test_a_cost_function_that_fails_keeps_the_estimate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ``cost_from`` that raises, or answers what cannot be settled, is logged; the
    reservation stays held at its estimate and the other reservations still settle."""
    async with arl.configure("memory://") as backend:
        limiter = arl.FixedWindow("10/minute")
        broken, negative, fine = [await limiter.reserve("k", 4) for _ in range(2)] + [
            await limiter.reserve("j", 4)
        ]
        meter = Meter()
        meter.add(broken, lambda served: 1 // 0)
        meter.add(negative, lambda served: -1)
        meter.add(fine, lambda served: 1)
        with caplog.at_level(logging.ERROR, "aioratelimit"):
            meter.settle()
            meter.settle()  # once: nothing pending any more
        await backend.drain()
        assert (broken.state, negative.state, fine.state) == ("held", "held", "settled")
        assert caplog.text.count("cost_from failed") == 2
        assert "'k'" not in caplog.text  # (no user key in the log)


async def test_an_app_that_raises_is_settled_by_what_it_sent() -> None:
    """The app raised before its response started: ``cost_from`` sees no status and an
    incomplete response, once, as the app ends."""
    seen: list[Served] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("the endpoint failed")

    async def send(message: Any) -> None:
        raise AssertionError("nothing is sent")

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async with arl.configure("memory://"):
        limiter = arl.FixedWindow("10/minute")
        meter = Meter()
        meter.add(await limiter.reserve("k", 3), lambda served: seen.append(served))
        with pytest.raises(RuntimeError, match="endpoint failed"):
            await owned(meter, app, {"type": "http"}, receive, send)
    assert [(s.status, s.body_bytes, s.complete, s.estimate) for s in seen] == [(None, 0, False, 3)]
