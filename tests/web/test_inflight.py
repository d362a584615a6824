"""In-flight (concurrency) limits in the ASGI middleware's rules: a slot per request, taken
with the rule's rate in one script call, held to the end of the response and given back
whatever ends it (the response, a client that goes away, a cancellation), renewed while a
long response runs; HEAD requests and WebSocket connections held alike."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.responses import JSONResponse, StreamingResponse
from support.webserver import Server, fresh_backend, serving

import aioratelimit as arl
from aioratelimit import _scripts
from aioratelimit._scripts import ScriptCall
from aioratelimit._web.inflight import InFlightPlan
from aioratelimit.asgi import RateLimitMiddleware, Refusal, Rule, client_ip

CLIENT = "ip:10.0.0.1"


def scope_of(path: str = "/s", method: str = "GET", kind: str = "http") -> dict[str, Any]:
    scope: dict[str, Any] = {"type": kind, "path": path, "client": ("10.0.0.1", 1), "headers": []}
    if kind == "http":
        scope["method"] = method
    return scope


def plan_of(mw: RateLimitMiddleware, index: int = 0) -> InFlightPlan:
    plan = mw._book._rules[index][1]
    assert isinstance(plan, InFlightPlan)
    return plan


async def holders(plan: InFlightPlan, backend: arl.Backend, client: str = CLIENT) -> int:
    """The slots ``client`` holds, read through ``backend`` (on the test's own loop)."""
    keys = plan._names(backend, plan.key_of(client)).owner_keys[:1]
    return int(await backend._run(_scripts.SEMAPHORE_HOLDERS, keys, ()))


class Releases:
    """An ``on_call`` hook counting the slot releases that went through: a slot that is
    free because it was released, not because its TTL ran out."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, call: ScriptCall) -> None:
        if call.script == "semaphore_release" and call.error is None:
            self.count += 1


def served_backend(url: str, releases: Releases) -> tuple[arl.Backend, arl.Backend]:
    """A backend for the served app (a prefix of its own) and one for the test's loop."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    backend = arl.Backend.from_url(url, prefix=prefix, on_call=releases)
    return backend, backend if url == "memory://" else arl.Backend.from_url(url, prefix=prefix)


async def until_free(plan: InFlightPlan, checker: arl.Backend, releases: Releases) -> None:
    """Wait for the state (never for a time): no slot held, freed by a release. Its TTL
    running out would free a slot whose release was forgotten: that waits on (and the
    test fails on its timeout). The server's thread counts the release once its reply is
    read, which may come after the store has dropped the slot: both are waited for."""
    while (  # noqa: ASYNC110
        releases.count < 1 or await holders(plan, checker, "ip:127.0.0.1") != 0
    ):
        await asyncio.sleep(0.01)
    assert releases.count == 1


# -- the decision, on every backend ---------------------------------------------------------


async def test_the_slot_and_the_rate_are_one_decision(backend: arl.Backend) -> None:
    """A slot is taken only if the rate admits the hit; the hit counts only with a slot."""
    limiter = arl.FixedWindow("3/minute", backend=backend)
    plan = InFlightPlan(2, 30.0, limiter, client_ip(), 1, None, "api", "GET /s", None)
    first, one = await plan.enter(scope_of())
    second, two = await plan.enter(scope_of())
    assert first is not None
    assert second is not None
    assert one
    assert two
    assert (first.status, second.status) == (200, 200)
    assert dict(second.fields)[b"ratelimit"] == b'"api";r=1;t=60, "api-in-flight";r=0'
    assert dict(second.fields)[b"ratelimit-policy"] == (
        b'"api";q=3;w=60, "api-in-flight";q=2;qu="concurrent-requests"'
    )
    full, none = await plan.enter(scope_of())
    assert full is not None
    assert none is None
    assert (full.status, full.violated) == (429, ("api-in-flight",))
    assert dict(full.fields)[b"retry-after"] == b"1"
    # Refused for the slot: the rate's hit was not counted (one more still fits).
    assert (await limiter.peek(plan.key_of(CLIENT))).allowed
    await one.release()
    third, three = await plan.enter(scope_of())
    assert third is not None
    assert three is not None
    assert third.status == 200
    await two.release()
    await three.release()
    # The rate is spent: refused for it, and no slot taken.
    spent, nothing = await plan.enter(scope_of())
    assert spent is not None
    assert nothing is None
    assert (spent.status, spent.violated) == (429, ("api",))
    assert spent.decision is not None
    assert spent.decision.retry_after > 1
    assert await holders(plan, backend) == 0


async def test_an_in_flight_limit_alone(backend: arl.Backend) -> None:
    """Without a limiter a rule limits concurrency alone, on its own backend."""
    plan = InFlightPlan(1, 30.0, None, client_ip(), 1, "uploads", "x", "PUT /u", backend)
    ok, lease = await plan.enter(scope_of())
    assert ok is not None
    assert lease is not None
    assert dict(ok.fields) == {
        b"ratelimit-policy": b'"uploads";q=1;qu="concurrent-requests"',
        b"ratelimit": b'"uploads";r=0',
    }
    refused, _ = await plan.enter(scope_of())
    assert refused is not None
    assert refused.status == 429
    assert await holders(plan, backend) == 1
    await lease.release()
    assert await holders(plan, backend) == 0


# -- the middleware in-process: cancellation, renewal, WebSockets ---------------------------


class Held:
    """An app that starts its response and holds it until told (or cancelled)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finish = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            assert (await receive())["type"] == "websocket.connect"
            await send({"type": "websocket.accept"})
            self.started.set()
            assert (await receive())["type"] == "websocket.disconnect"
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        self.started.set()
        await self.finish.wait()
        await send({"type": "http.response.body", "body": b"b"})


def run(
    mw: Any, scope: dict[str, Any], inbox: asyncio.Queue[Any] | None = None
) -> tuple[list[dict[str, Any]], asyncio.Task[None]]:
    sent: list[dict[str, Any]] = []
    queue = inbox or asyncio.Queue()

    async def receive() -> Any:
        return await queue.get()

    async def send(message: Any) -> None:
        sent.append(message)

    return sent, asyncio.ensure_future(mw(scope, receive, send))


async def test_a_cancelled_request_gives_its_slot_back(store_url: str) -> None:
    backend = arl.Backend.from_url(store_url, prefix="t-inflight-cancel")
    app = Held()
    mw = RateLimitMiddleware(app, rules=[Rule("GET", "/s", in_flight=1, backend=backend)])
    plan = plan_of(mw)
    try:
        _, task = run(mw, scope_of())
        await app.started.wait()
        assert await holders(plan, backend) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await holders(plan, backend) == 0
    finally:
        await backend.aclose()


async def test_a_long_response_keeps_its_slot_renewed(store_url: str) -> None:
    """With a short TTL, the slot outlives it while the response runs (renewed every
    ttl/3: four renewals span more than a TTL), and is gone once it ends."""
    extended = asyncio.Event()
    renewals = 0

    def on_call(call: ScriptCall) -> None:
        nonlocal renewals
        if call.script == "semaphore_extend" and call.error is None:
            renewals += 1
            if renewals >= 4:
                extended.set()

    backend = arl.Backend.from_url(store_url, prefix="t-inflight-renew", on_call=on_call)
    app = Held()
    rule = Rule("GET", "/s", in_flight=1, in_flight_ttl=1.5, backend=backend)
    mw = RateLimitMiddleware(app, rules=[rule])
    plan = plan_of(mw)
    try:
        sent, task = run(mw, scope_of())
        await extended.wait()
        assert await holders(plan, backend) == 1
        app.finish.set()
        await task
        assert sent[-1] == {"type": "http.response.body", "body": b"b"}
        assert await holders(plan, backend) == 0
    finally:
        await backend.aclose()


async def test_a_websocket_holds_a_slot_for_its_lifetime() -> None:
    """A connection holds its slot until the client goes; a second is refused: with the
    server's HTTP-response extension a 429 problem, else a close with 1013."""
    backend = arl.Backend.from_url("memory://")
    app = Held()
    mw = RateLimitMiddleware(app, rules=[Rule("GET", "/ws", in_flight=1, backend=backend)])
    plan = plan_of(mw)
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    inbox.put_nowait({"type": "websocket.connect"})
    sent, task = run(mw, scope_of("/ws", kind="websocket"), inbox)
    await app.started.wait()
    assert sent[0]["type"] == "websocket.accept"
    assert (b"ratelimit", b'"default";r=0') in sent[0]["headers"]
    refused, other = run(mw, scope_of("/ws", kind="websocket"))
    await other
    assert refused == [{"type": "websocket.close", "code": 1013}]
    extended = scope_of("/ws", kind="websocket") | {"extensions": {"websocket.http.response": {}}}
    answered, third = run(mw, extended)
    await third
    assert answered[0]["type"] == "websocket.http.response.start"
    assert answered[0]["status"] == 429
    assert json.loads(answered[1]["body"])["violated-policies"] == ["default"]
    inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
    await task
    assert await holders(plan, backend) == 0


async def test_a_rate_rule_still_lets_websockets_pass() -> None:
    backend = arl.Backend.from_url("memory://")
    app = Held()
    limiter = arl.FixedWindow("1/minute", backend=backend)
    mw = RateLimitMiddleware(app, rules=[Rule("GET", "/ws", limiter)])
    for _ in range(2):
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        inbox.put_nowait({"type": "websocket.connect"})
        inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
        sent, task = run(mw, scope_of("/ws", kind="websocket"), inbox)
        await task
        assert sent[0]["type"] == "websocket.accept"


async def test_respond_shapes_an_in_flight_refusal() -> None:
    """A ``respond=`` hook gets the refusal of a full set of slots: 429, ``Retry-After: 1``,
    a decision whose limit is the slots, the in-flight policy item as the one violated."""
    backend = arl.Backend.from_url("memory://")
    app = Held()
    seen: list[Refusal] = []

    def respond(refusal: Refusal) -> Any:
        seen.append(refusal)
        return JSONResponse({"busy": True}, status_code=503, headers={"retry-after": "2"})

    rules = [Rule("GET", "/s", in_flight=1, backend=backend, name="jobs")]
    mw = RateLimitMiddleware(app, rules=rules, respond=respond)
    _, task = run(mw, scope_of())
    await app.started.wait()
    sent, other = run(mw, scope_of())
    await other
    assert sent[0]["status"] == 503
    (refusal,) = seen
    assert (refusal.status, refusal.retry_after, refusal.violated_policies) == (429, 1, ("jobs",))
    assert refusal.decision is not None
    assert (refusal.decision.limit, refusal.decision.remaining) == (1, 0)
    app.finish.set()
    await task


async def test_the_backend_down_answers_503_or_passes(own_redis: Any) -> None:
    backend = fresh_backend(own_redis.url)
    app = Held()
    app.finish.set()
    rules = [Rule("GET", "/s", arl.FixedWindow("5/minute", backend=backend), in_flight=2)]
    deny = RateLimitMiddleware(app, rules=rules)
    allow = RateLimitMiddleware(app, rules=rules, on_unavailable="allow")
    try:
        own_redis.stop()
        sent, task = run(deny, scope_of())
        await task
        assert sent[0]["status"] == 503
        assert (b"retry-after", b"5") in sent[0]["headers"]
        body = json.loads(sent[1]["body"])
        assert body["violated-policies"] == ["default", "default-in-flight"]
        sent, task = run(allow, scope_of())
        await task
        assert sent[0]["status"] == 200
    finally:
        await backend.aclose()


# -- on real uvicorn: streams the client walks away from, HEAD --------------------------------


def streaming_app() -> Any:
    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"tick\n"
            await asyncio.sleep(0.01)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        response = StreamingResponse(endless(), media_type="text/plain")
        await response(scope, receive, send)

    return app


async def test_a_client_that_walks_away_mid_stream_frees_its_slot(store_url: str) -> None:
    releases = Releases()
    backend, checker = served_backend(store_url, releases)
    limiter = arl.FixedWindow("10/minute", backend=backend)
    mw = RateLimitMiddleware(streaming_app(), rules=[Rule("GET", "/s", limiter, in_flight=1)])
    plan = plan_of(mw)
    try:
        async with serving(mw, backend) as client:
            async with client.stream("GET", "/s") as stream:
                assert stream.status_code == 200
                assert stream.headers["ratelimit"] == '"default";r=9;t=60, "default-in-flight";r=0'
                # (kept: a dropped iterator closes the stream when collected)
                chunks = stream.aiter_bytes()
                await anext(chunks)
                assert await holders(plan, checker, "ip:127.0.0.1") == 1
                # HEAD is counted as the GET it runs: refused while the slot is held.
                head = await client.head("/s")
                assert head.status_code == 429
                assert head.headers["retry-after"] == "1"
                await anext(chunks)
            # The client closed the connection mid-stream: the slot comes back.
            await until_free(plan, checker, releases)
            async with client.stream("GET", "/s") as again:
                assert again.status_code == 200
    finally:
        if checker is not backend:
            await checker.aclose()


# -- options ---------------------------------------------------------------------------------


def test_bad_in_flight_rules_are_refused_at_construction() -> None:
    app = Held()
    with pytest.raises(ValueError, match="in_flight"):
        Rule("GET", "/s", in_flight=0)
    with pytest.raises(TypeError, match="needs a limiter, in_flight="):
        Rule("GET", "/s")
    with pytest.raises(ValueError, match="FixedWindow of plain rates"):
        Rule("GET", "/s", arl.SlidingWindow("5/minute"), in_flight=2)
    with pytest.raises(ValueError, match="FixedWindow of plain rates"):
        Rule("GET", "/s", lambda scope: None, in_flight=2)
    with pytest.raises(ValueError, match="without deny_cache"):
        Rule("GET", "/s", arl.FixedWindow("5/minute", shadow=True), in_flight=2)
    with pytest.raises(ValueError, match="backend= goes with in_flight="):
        Rule("GET", "/s", arl.FixedWindow("5/minute"), backend=arl.Backend.from_url("memory://"))
    with pytest.raises(ValueError, match="cost"):
        Rule("GET", "/s", arl.FixedWindow("5/minute"), in_flight=2, cost=6)
    rules = [Rule("GET", "/s", in_flight=2)]
    for options in ({"shadow": True}, {"on_unavailable": arl.Fallback(0.5)}):
        with pytest.raises(ValueError, match="in_flight="):
            RateLimitMiddleware(app, rules=rules, **options)


# -- the FastAPI dependency ------------------------------------------------------------------


async def test_the_fastapi_dependency_holds_the_slot_to_the_end_of_the_stream(
    store_url: str,
) -> None:
    """``Depends(InFlight(...))`` holds the slot until the streamed response has ended
    (the client walked away), and adds the fields to an admitted response."""
    from fastapi import Depends, FastAPI

    from aioratelimit.fastapi import InFlight, add_problem_handler

    releases = Releases()
    backend, checker = served_backend(store_url, releases)
    limit = InFlight(1, arl.FixedWindow("10/minute", backend=backend), policy_name="feed")
    app = FastAPI()
    add_problem_handler(app)

    @app.get("/feed", dependencies=[Depends(limit)])
    async def feed() -> StreamingResponse:
        async def endless() -> AsyncIterator[bytes]:
            while True:
                yield b"tick\n"
                await asyncio.sleep(0.01)

        return StreamingResponse(endless(), media_type="text/plain")

    @app.get("/one", dependencies=[Depends(InFlight(2, backend=backend))])
    async def one() -> dict[str, bool]:
        return {"ok": True}

    try:
        async with serving(app, backend) as client:
            async with client.stream("GET", "/feed") as stream:
                assert stream.status_code == 200
                # (an endpoint's own Response takes no dependency's headers: FastAPI's rule)
                chunks = stream.aiter_bytes()
                await anext(chunks)
                busy = await client.get("/feed")
                assert busy.status_code == 429
                assert busy.json()["violated-policies"] == ["feed-in-flight"]
                await anext(chunks)
                plan = limit._plans["GET /feed"]
                assert await holders(plan, checker, "ip:127.0.0.1") == 1
            await until_free(plan, checker, releases)
            async with client.stream("GET", "/feed") as again:
                assert again.status_code == 200
            single = await client.get("/one")
            assert single.headers["ratelimit-policy"] == '"default";q=2;qu="concurrent-requests"'
            assert single.headers["ratelimit"] == '"default";r=1'
    finally:
        if checker is not backend:
            await checker.aclose()


# -- the aiohttp middleware ------------------------------------------------------------------


async def test_the_aiohttp_middleware_holds_the_slot_while_the_handler_runs(
    store_url: str,
) -> None:
    """A streamed aiohttp response holds its slot while written; a second is refused; the
    slot is given back (by a release) once the handler has returned."""
    import aiohttp
    from aiohttp import web

    from aioratelimit.aiohttp import RateLimitMiddleware as AiohttpMiddleware
    from aioratelimit.aiohttp import Rule as AiohttpRule

    releases = Releases()
    backend, checker = served_backend(store_url, releases)
    done = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"first\n")
        await done.wait()
        await response.write(b"last\n")
        return response

    limiter = arl.FixedWindow("5/minute", backend=backend)
    middleware = AiohttpMiddleware(rules=[AiohttpRule("GET", "/s", limiter, in_flight=1)])
    plan = middleware._book._rules[0][1]
    assert isinstance(plan, InFlightPlan)
    app = web.Application(middlewares=[middleware])
    app.router.add_get("/s", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession(f"http://{host}:{port}") as client:
            async with client.get("/s") as first:
                assert first.status == 200
                assert await first.content.readline() == b"first\n"
                async with client.get("/s") as busy:
                    assert busy.status == 429
                    assert busy.headers["Retry-After"] == "1"
                done.set()
                assert await first.read() == b"last\n"
            await until_free(plan, checker, releases)
    finally:
        await runner.cleanup()
        await backend.aclose()
        if checker is not backend:
            await checker.aclose()


# -- WebSockets on real uvicorn --------------------------------------------------------------


class WebSocketClient:
    """A bare WebSocket client (wsproto over a TCP stream): the handshake's answer, then a
    close."""

    def __init__(self, url: str) -> None:
        from wsproto import ConnectionType, WSConnection

        self.port = int(url.rsplit(":", 1)[1])
        self.ws = WSConnection(ConnectionType.CLIENT)

    async def handshake(self, target: str) -> list[Any]:
        from wsproto.events import AcceptConnection, RejectData, Request

        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(self.ws.send(Request(host="127.0.0.1", target=target)))
        events: list[Any] = []
        while not any(
            isinstance(e, AcceptConnection) or (isinstance(e, RejectData) and e.body_finished)
            for e in events
        ):
            data = await self.reader.read(65536)
            assert data, events
            self.ws.receive_data(data)
            events += list(self.ws.events())
        return events

    async def close(self) -> None:
        from wsproto.events import CloseConnection

        self.writer.write(self.ws.send(CloseConnection(code=1000)))
        await self.writer.drain()
        self.writer.close()


async def test_a_websocket_on_uvicorn_holds_its_slot_until_it_closes() -> None:
    """Through uvicorn (wsproto): a connection holds the slot; a second handshake gets the
    429 problem as an HTTP answer; the slot is released when the client closes."""
    from wsproto.events import AcceptConnection, RejectConnection, RejectData

    releases = Releases()
    backend, checker = served_backend("memory://", releases)

    async def echo(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass

    mw = RateLimitMiddleware(echo, rules=[Rule("GET", "/ws", in_flight=1, backend=backend)])
    plan = plan_of(mw)
    with Server(mw, cleanup=backend.aclose, ws="wsproto") as server:
        first = WebSocketClient(server.url)
        accepted = await first.handshake("/ws")
        assert isinstance(accepted[0], AcceptConnection)
        assert (b"ratelimit", b'"default";r=0') in accepted[0].extra_headers
        second = WebSocketClient(server.url)
        refused = await second.handshake("/ws")
        assert isinstance(refused[0], RejectConnection)
        assert refused[0].status_code == 429
        body = b"".join(e.data for e in refused if isinstance(e, RejectData))
        assert json.loads(body)["violated-policies"] == ["default"]
        second.writer.close()
        assert await holders(plan, checker, "ip:127.0.0.1") == 1
        await first.close()
        await until_free(plan, checker, releases)
