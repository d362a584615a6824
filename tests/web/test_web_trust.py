"""Trust at the seams of the web layer, on real uvicorn where a request crosses a network:
a stored response replays only to whoever created it, a limit has no side door (``HEAD``,
another route, a value that spells a digest), and recording a streamed response costs the
same per chunk however long it runs."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from support.webserver import Server, fresh_backend

import aioratelimit as arl
from aioratelimit import _keys
from aioratelimit._web import records
from aioratelimit._web.clients import resolve
from aioratelimit.asgi import (
    ClientFunc,
    IdempotencyMiddleware,
    RateLimitMiddleware,
    Rule,
    client_ip,
    header,
    path_param,
)
from aioratelimit.fastapi import IdempotencyKey, IdempotentRequest, RateLimit, credentials


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

API_KEYS = {"key-alice": "alice", "key-bob": "bob"}


class Payment(BaseModel):
    amount: int


class Receipt(BaseModel):
    account: str
    amount: int
    receipt: int


async def api_account(x_api_key: Annotated[str, Header()] = "") -> str:
    """The route's own authentication: an API key names the account, else 401."""
    if x_api_key not in API_KEYS:
        raise HTTPException(401, "unknown API key")
    return API_KEYS[x_api_key]


def shop(
    backend: arl.Backend, middleware: ClientFunc | None, opaque: bool = False, mount: str = ""
) -> Any:
    """A FastAPI app whose ``POST /payments`` keys itself (``IdempotencyKey``) and whose
    ``POST /orders`` relies on ``IdempotencyMiddleware`` around every route; ``opaque``
    wraps the app so that the middleware cannot see its routes; ``mount`` mounts it there
    in a Starlette app."""
    app = FastAPI()
    once = IdempotencyKey(client=Depends(api_account), backend=backend)
    receipts: list[str] = []

    @app.post("/payments", status_code=201)
    async def pay(
        payment: Payment,
        account: Annotated[str, Depends(api_account)],
        idem: IdempotentRequest = Depends(once),  # noqa: B008 (FastAPI's idiom; a local)
    ) -> Receipt:
        async def charge() -> Receipt:
            receipts.append(account)
            return Receipt(account=account, amount=payment.amount, receipt=len(receipts))

        return await idem.run(charge)

    @app.post("/orders", status_code=201)
    async def order(payment: Payment, authorization: Annotated[str, Header()] = "") -> Any:
        receipts.append(authorization)
        return {"by": authorization, "order": len(receipts)}

    async def hidden(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)

    inner: Any = hidden if opaque else app
    if mount:
        inner = Starlette(routes=[Mount(mount, app=inner)])
    return IdempotencyMiddleware(inner, backend=backend, client=middleware)


@pytest.mark.parametrize("who", ["default", "client_ip", "mounted"])
async def test_an_unknown_api_key_never_gets_another_account_s_receipt(
    store_url: str, who: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A route keyed by its own IdempotencyKey dependency is left to it by the middleware:
    a made-up API key from alice's address, with her key and body, is 401, not her 201
    receipt, even when the middleware scopes by address alone (or the app is mounted
    under it); her retry is a replay."""
    backend = fresh_backend(store_url)
    mount = "/v1" if who == "mounted" else ""
    app = shop(backend, None if who == "default" else client_ip(), mount=mount)
    body = {"amount": 5}
    key = {"Idempotency-Key": '"k-1"'}
    url = f"{mount}/payments"
    async with clients(app, backend) as (one, _):
        alice = await one.post(url, json=body, headers={**key, "X-API-Key": "key-alice"})
        stranger = await one.post(url, json=body, headers={**key, "X-API-Key": "nobody"})
        again = await one.post(url, json=body, headers={**key, "X-API-Key": "key-alice"})
    assert (alice.status_code, stranger.status_code, again.status_code) == (201, 401, 201)
    assert "idempotent-replayed" not in stranger.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == alice.json() == {"account": "alice", "amount": 5, "receipt": 1}
    assert "IdempotencyKey dependency" not in caplog.text  # found in the routes: never taken


async def test_routes_the_middleware_cannot_see_still_never_replay_its_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Behind an app that hides its routes, the middleware (keyed by address alone) runs the
    request, the dependency tells it the route is its own, and the middleware stores
    nothing: the stranger's request is 401, and one WARNING says why."""
    backend = fresh_backend("memory://")
    app = shop(backend, client_ip(), opaque=True)
    key = {"Idempotency-Key": '"k-2"'}
    with caplog.at_level(logging.WARNING, logger="aioratelimit"):
        async with clients(app, backend) as (one, _):
            codes = [
                (await one.post("/payments", json={"amount": 5}, headers=key | api)).status_code
                for api in ({"X-API-Key": "key-alice"}, {"X-API-Key": "nobody"}) * 2
            ]
    assert codes == [201, 401, 201, 401]
    assert caplog.text.count("reached an IdempotencyKey dependency") == 1


async def test_two_users_behind_one_address_keep_their_own_responses(store_url: str) -> None:
    """By default the middleware scopes a key by the request's credentials with its address:
    two users behind one NAT (one address, the same key and body) each get their own 201,
    each one's retry replays their own, and the same user from another address runs anew."""
    backend = fresh_backend(store_url)
    app = shop(backend, None)
    key = {"Idempotency-Key": '"o-1"'}

    async def order(client: httpx.AsyncClient, who: dict[str, str]) -> httpx.Response:
        return await client.post("/orders", json={"amount": 1}, headers=key | who)

    one_bearer, two_bearer = {"Authorization": "Bearer u-1"}, {"Authorization": "Bearer u-2"}
    one_cookie, two_cookie = {"Cookie": "session=s-1"}, {"Cookie": "session=s-2"}
    async with clients(app, backend) as (nat, elsewhere):
        first = [await order(nat, who) for who in (one_bearer, two_bearer)]
        retries = [await order(nat, who) for who in (one_bearer, two_bearer)]
        cookies = [await order(nat, who) for who in (one_cookie, two_cookie, one_cookie)]
        moved = await order(elsewhere, one_bearer)
    assert [r.status_code for r in first + retries + cookies] == [201] * 7
    assert [r.json()["by"] for r in first] == ["Bearer u-1", "Bearer u-2"]
    assert [r.headers.get("idempotent-replayed") for r in first] == [None, None]
    assert [r.json() for r in retries] == [r.json() for r in first]
    assert [r.headers.get("idempotent-replayed") for r in retries] == ["true", "true"]
    assert [r.json()["order"] for r in cookies] == [3, 4, 3]
    assert "idempotent-replayed" not in moved.headers


async def test_routes_names_the_only_routes_the_middleware_takes() -> None:
    """routes=[...] confines the middleware: a keyed POST elsewhere runs every time (never a
    replay), one on a listed route replays; require= is a bool and says how to list them."""
    backend = fresh_backend("memory://")
    ran: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        ran.append(scope["path"])
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": str(len(ran)).encode()})

    mw = IdempotencyMiddleware(app, backend=backend, routes=["/orders/{id}"], require=True)
    key = {"Idempotency-Key": '"r-1"'}
    transport = httpx.ASGITransport(app=mw)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        other = [(await client.post("/other", headers=key)).text for _ in range(2)]
        listed = [(await client.post("/orders/7", headers=key)).text for _ in range(2)]
        missing = await client.post("/orders/8")
    await backend.aclose()
    assert (other, listed, missing.status_code) == (["1", "2"], ["3", "3"], 400)
    with pytest.raises(TypeError, match=r"routes=\['/payments'\], require=True"):
        IdempotencyMiddleware(app, require=["/payments"])  # type: ignore[arg-type]


async def test_a_principal_is_never_an_address() -> None:
    """The dependency scopes a principal as "user:<id>": an account whose id spells an
    address ("ip:...") does not get the stored result of an anonymous request from it."""
    backend = fresh_backend("memory://")
    app = FastAPI()

    async def maybe_account(x_account: Annotated[str, Header()] = "") -> str | None:
        return x_account or None  # anonymous: the dependency's default scope decides

    once = IdempotencyKey(client=Depends(maybe_account), backend=backend)
    runs: list[str] = []

    @app.post("/notes", status_code=201)
    async def note(
        idem: IdempotentRequest = Depends(once),  # noqa: B008 (FastAPI's idiom; a local)
    ) -> int:
        async def write() -> int:
            runs.append("x")
            return len(runs)

        return await idem.run(write)

    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    key = {"Idempotency-Key": '"n-1"'}
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        anonymous = await client.post("/notes", headers=key)
        spelled = await client.post("/notes", headers=key | {"X-Account": "ip:127.0.0.1"})
    await backend.aclose()
    assert (anonymous.json(), spelled.json()) == (1, 2)
    assert "idempotent-replayed" not in spelled.headers


async def test_credentials_keys_the_credentials_with_the_address() -> None:
    """credentials(): the same credentials from the same address are one client; another
    credential, cookie or address is another; Idempotency-Key is not a credential; neither
    the credential nor the address is in the key."""
    key = credentials()

    async def of(peer: str, **headers: str) -> str | None:
        fields = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
        return await resolve(key, {"type": "http", "headers": fields, "client": (peer, 1)})

    alice = await of("10.0.0.1", authorization="Bearer a", idempotency_key="k1")
    assert alice is not None
    assert alice.startswith("cred:")
    assert "Bearer" not in alice
    assert "10.0.0.1" not in alice
    assert await of("10.0.0.1", authorization="Bearer a", idempotency_key="k2") == alice
    others = {
        await of("10.0.0.1", authorization="Bearer b"),
        await of("10.0.0.2", authorization="Bearer a"),
        await of("10.0.0.1", authorization="Bearer a", cookie="s=1"),
        await of("10.0.0.1", x_api_key="a"),
        await of("10.0.0.1"),
    }
    assert alice not in others
    assert len(others) == 5


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


async def test_header_keys_say_the_client_writes_them() -> None:
    """The key helpers that read what the client wrote say so in their docstrings."""
    assert header.__doc__ is not None
    assert "The client writes this header" in header.__doc__
    assert path_param.__doc__ is not None
    assert "The client writes the path" in path_param.__doc__


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


async def test_the_middleware_still_keys_the_routes_next_to_a_dependency(
    store_url: str,
) -> None:
    """The middleware around every route still protects a route without the dependency,
    next to one with it: both run once per key, each in its own store."""
    backend = fresh_backend(store_url)
    app = shop(backend, None)
    who = {"X-API-Key": "key-bob", "Authorization": "Bearer bob"}
    async with clients(app, backend) as (one, _):
        codes = []
        for path, key in (("/payments", "p"), ("/orders", "o")) * 2:
            r = await one.post(path, json={"amount": 2}, headers=who | {"Idempotency-Key": key})
            codes.append((r.status_code, r.headers.get("idempotent-replayed")))
    assert codes == [(201, None), (201, None), (201, "true"), (201, "true")]
