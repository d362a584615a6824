"""The ASGI middleware as services deploy it, on real uvicorn and memory:// or a real Redis:
mounted apps and ``root_path``, which responses an ``Idempotency-Key`` replays and whose
key it is, credentials kept out of key names, tiers picked per request, and refusals and
headers shaped by the application."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import redis
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.routing import Mount
from support.webserver import Server, fresh_backend, serving

import aioratelimit as arl
from aioratelimit._web.clients import resolve
from aioratelimit.asgi import (
    ClientFunc,
    IdempotencyMiddleware,
    RateLimitMiddleware,
    Refusal,
    Rule,
    Scope,
    header,
    path_param,
)


class Echo:
    """A bare ASGI app: 200 and a JSON body with the path it saw and the call number."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        body = json.dumps({"path": scope["path"], "call": self.calls}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def clients(
    app: Any, backend: arl.Backend, **config: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Serve ``app``; yield two clients, from 127.0.0.1 and from 127.0.0.2 (another network)."""
    with Server(app, cleanup=backend.aclose, **config) as server:
        other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=30) as one,
            httpx.AsyncClient(base_url=server.url, timeout=30, transport=other) as two,
        ):
            yield one, two


def limited(backend: arl.Backend, inner: Any) -> RateLimitMiddleware:
    return RateLimitMiddleware(
        inner,
        arl.FixedWindow("2/minute", backend=backend),
        rules=[
            Rule(
                "POST",
                "/orders/{id}",
                arl.FixedWindow("1/minute", backend=backend, name="orders"),
                client=path_param("id", "/orders/{id}"),
            )
        ],
        exempt=["/health"],
    )


# -- 1. mounted apps and root_path ----------------------------------------------------------


@pytest.mark.parametrize("where", ["mount", "root_path", "bare"])
async def test_exempt_and_rules_match_the_path_inside_the_app(store_url: str, where: str) -> None:
    """Under Mount("/api"), uvicorn --root-path /api, or bare: /health is never limited, a
    rule's template and path_param see the path inside the application."""
    backend = fresh_backend(store_url)
    echo = Echo()
    mw = limited(backend, echo)
    prefix = "" if where == "bare" else "/api"
    app: Any = Starlette(routes=[Mount("/api", app=mw)]) if where == "mount" else mw
    config = {"root_path": "/api"} if where == "root_path" else {}
    # uvicorn puts root_path in front of the path the client sent (the proxy stripped it).
    sent = "" if where == "root_path" else prefix
    async with serving_with(app, backend, **config) as client:
        health = [(await client.get(f"{sent}/health")).status_code for _ in range(3)]
        things = [(await client.get(f"{sent}/things")).status_code for _ in range(3)]
        orders = [await client.post(f"{sent}/orders/7") for _ in range(2)]
        other_order = (await client.post(f"{sent}/orders/8")).status_code
    assert health == [200, 200, 200]
    assert things == [200, 200, 429]
    assert [r.status_code for r in orders] == [200, 429]
    assert orders[1].headers["ratelimit-policy"] == '"orders";q=1;w=60'
    assert other_order == 200  # path_param keyed the rule per order id
    assert orders[0].json()["path"] == f"{prefix}/orders/7"  # the app still sees its own path


@asynccontextmanager
async def serving_with(app: Any, backend: arl.Backend, **config: Any) -> AsyncIterator[Any]:
    async with clients(app, backend, **config) as (one, _):
        yield one


async def test_idempotency_paths_are_the_app_s_own_under_a_mount(store_url: str) -> None:
    """routes=["/payments"], require=True holds for /api/payments under Mount("/api")."""
    backend = fresh_backend(store_url)
    mw = IdempotencyMiddleware(Echo(), backend=backend, routes=["/payments"], require=True)
    app = Starlette(routes=[Mount("/api", app=mw)])
    async with serving(app, backend) as client:
        missing = await client.post("/api/payments", content=b"x")
        keyed = await client.post("/api/payments", content=b"x", headers={"Idempotency-Key": "k"})
    assert missing.status_code == 400
    assert keyed.status_code == 200


# -- 3. what IdempotencyMiddleware stores, and whose key it is --------------------------------


class Gate:
    """A bare ASGI app behind auth: ``Authorization: Bearer expired`` is 401; ``?status=``
    answers that status; else 201. Counts the calls that reached the charge."""

    def __init__(self) -> None:
        self.charged = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        headers = dict(scope["headers"])
        query = scope["query_string"].decode()
        if headers.get(b"authorization") == b"Bearer expired":
            status = 401
        elif query.startswith("status="):
            status = int(query.split("=")[1])
        else:
            self.charged += 1
            status = 201
        body = json.dumps({"status": status, "charged": self.charged}).encode()
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})


def key_header(value: str, token: str = "fresh") -> dict[str, str]:
    return {"Idempotency-Key": f'"{value}"', "Authorization": f"Bearer {token}"}


async def test_only_success_is_stored_by_default(store_url: str) -> None:
    """A 401 from an expired token, a 409 or a 429 is not stored: the retry with a fresh
    token runs and its 201 is what is replayed. stored= chooses other statuses."""
    backend = fresh_backend(store_url)
    gate = Gate()
    mw = IdempotencyMiddleware(gate, backend=backend)
    async with serving(mw, backend) as client:
        expired = await client.post("/pay", content=b"5", headers=key_header("k", "expired"))
        fresh = await client.post("/pay", content=b"5", headers=key_header("k"))
        retry = await client.post("/pay", content=b"5", headers=key_header("k"))
        inner = [
            (await client.post(f"/pay?status={s}", content=b"5", headers=key_header(f"s{s}")))
            for s in (409, 429, 409)
        ]
    assert [expired.status_code, fresh.status_code, retry.status_code] == [401, 201, 201]
    assert "idempotent-replayed" not in fresh.headers
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == {"status": 201, "charged": 1}
    assert all("idempotent-replayed" not in r.headers for r in inner)
    assert gate.charged == 1


async def test_stored_chooses_which_statuses_replay() -> None:
    """stored=range(200, 500) replays a 409 too, as it once did by default."""
    backend = fresh_backend("memory://")
    mw = IdempotencyMiddleware(Gate(), backend=backend, stored=range(200, 500))
    async with serving(mw, backend) as client:
        codes = [await client.post("/pay?status=409", headers=key_header("c")) for _ in "ab"]
    assert [r.status_code for r in codes] == [409, 409]
    assert codes[1].headers["idempotent-replayed"] == "true"


class BearerUsers(AuthenticationBackend):
    """``Authorization: Bearer <name>`` is the user ``<name>`` (none: anonymous)."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        auth = conn.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return None
        return AuthCredentials(["authenticated"]), SimpleUser(auth.removeprefix("Bearer "))


async def test_keys_are_scoped_per_user_not_per_network(store_url: str) -> None:
    """By default the key belongs to the authenticated user: a retry from another network
    is a replay. Anonymous requests are scoped per IP address."""
    backend = fresh_backend(store_url)
    gate = Gate()
    app = Starlette(
        routes=[Mount("/", app=IdempotencyMiddleware(gate, backend=backend))],
        middleware=[Middleware(AuthenticationMiddleware, backend=BearerUsers())],
    )
    async with clients(app, backend) as (home, mobile):
        paid = await home.post("/pay", content=b"5", headers=key_header("order-1", "alice"))
        retried = await mobile.post("/pay", content=b"5", headers=key_header("order-1", "alice"))
        anonymous = {"Idempotency-Key": '"order-2"'}
        a = await home.post("/pay", content=b"5", headers=anonymous)
        b = await mobile.post("/pay", content=b"5", headers=anonymous)
    assert (paid.status_code, retried.status_code) == (201, 201)
    assert retried.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in a.headers
    assert "idempotent-replayed" not in b.headers  # two anonymous clients: two keys
    assert gate.charged == 3


async def test_fingerprint_decides_what_the_same_request_is(store_url: str) -> None:
    """fingerprint(scope, body) replaces the default: here only the body counts, so another
    query string is a replay, and another body is 422."""
    backend = fresh_backend(store_url)
    gate = Gate()

    async def body_only(scope: Scope, body: bytes) -> bytes:
        return body

    mw = IdempotencyMiddleware(gate, backend=backend, fingerprint=body_only)
    async with serving(mw, backend) as client:
        first = await client.post("/pay?utm=a", content=b"5", headers=key_header("f"))
        other_query = await client.post("/pay?utm=b", content=b"5", headers=key_header("f"))
        other_body = await client.post("/pay?utm=a", content=b"6", headers=key_header("f"))
    assert (first.status_code, other_query.status_code, other_body.status_code) == (201, 201, 422)
    assert other_query.headers["idempotent-replayed"] == "true"
    assert gate.charged == 1


# -- 4. credentials never in key names ------------------------------------------------------


async def test_api_keys_and_tokens_are_stored_as_digests(redis_url: str) -> None:
    """After requests keyed on X-API-Key and Authorization, no Redis key name holds either
    secret: SCAN sees only their digests (keyed with secret=)."""
    backend = fresh_backend(redis_url)
    mw = RateLimitMiddleware(
        Echo(),
        arl.FixedWindow("10/minute", backend=backend, name="free"),
        client=header("X-API-Key", fallback=header("Authorization", secret=b"s" * 32)),
    )
    async with serving(mw, backend) as client:
        keyed = await client.get("/", headers={"X-API-Key": "k-free-2"})
        bearer = await client.get("/", headers={"Authorization": "Bearer tok-secret-9"})
    assert (keyed.status_code, bearer.status_code) == (200, 200)
    sync = redis.Redis.from_url(redis_url)
    try:
        names = [k.decode() for k in sync.scan_iter(match=f"{backend.prefix}:*")]
    finally:
        sync.close()
    assert len(names) == 2, names
    assert not [n for n in names if "k-free-2" in n or "tok-secret-9" in n], names
    assert any("{hdr:x-api-key:sha256:" in n for n in names), names
    assert any("{hdr:authorization:hmac:" in n for n in names), names


async def test_credential_headers_are_digested_and_others_readable() -> None:
    """Credential-looking names are digested by default, others kept; digest= overrides,
    except for Authorization, Proxy-Authorization and Cookie."""

    async def key(fn: ClientFunc, name: str, value: str) -> str | None:
        return await resolve(fn, {"type": "http", "headers": [(name.encode(), value.encode())]})

    for name in ("X-API-Key", "Authorization", "X-Auth-Token", "Cookie", "X-Session-Id"):
        got = await key(header(name), name.lower(), "secret-value")
        assert got is not None
        assert "secret-value" not in got
        assert got.startswith(f"hdr:{name.lower()}:sha256:")
    assert await key(header("X-Tenant"), "x-tenant", "acme") == "hdr:x-tenant:acme"
    tenant = await key(header("X-Tenant", digest=True), "x-tenant", "acme")
    assert tenant is not None
    assert tenant.startswith("hdr:x-tenant:sha256:")
    assert await key(header("X-Key-Id", digest=False), "x-key-id", "kid-1") == "hdr:x-key-id:kid-1"
    a = await key(header("X-API-Key", secret=b"a" * 16), "x-api-key", "v")
    b = await key(header("X-API-Key", secret=b"b" * 16), "x-api-key", "v")
    assert a != b
    with pytest.raises(ValueError, match="only ever stored digested"):
        header("Authorization", digest=False)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        header("X-API-Key", secret=b"short")


# -- 5. tiers: the limiter picked per request -----------------------------------------------


async def test_a_function_picks_the_tier_and_the_cost(store_url: str) -> None:
    """An async function picks free or pro per API key and the cost from ?batch=; an unknown
    key is not limited, and each tier names its own policy."""
    backend = fresh_backend(store_url)
    free = arl.FixedWindow("3/minute", backend=backend, name="free")
    pro = arl.FixedWindow("100/minute", backend=backend, name="pro")
    plans = {"k-free": free, "k-pro": pro}

    async def tier(scope: Scope) -> tuple[arl.Limiter, int] | None:
        api_key = dict(scope["headers"]).get(b"x-api-key", b"").decode()
        limiter = plans.get(api_key)
        await asyncio.sleep(0)  # as a lookup in a database would
        if limiter is None:
            return None
        batch = scope["query_string"].decode().removeprefix("batch=")
        return limiter, int(batch or 1)

    mw = RateLimitMiddleware(Echo(), tier, client=header("X-API-Key"))
    async with serving(mw, backend) as client:
        free_codes = [await client.get("/", headers={"X-API-Key": "k-free"}) for _ in range(4)]
        pro_batch = await client.get("/?batch=50", headers={"X-API-Key": "k-pro"})
        unknown = [await client.get("/", headers={"X-API-Key": "?"}) for _ in range(4)]
    assert [r.status_code for r in free_codes] == [200, 200, 200, 429]
    assert free_codes[3].headers["ratelimit-policy"] == '"free";q=3;w=60'
    assert pro_batch.status_code == 200
    assert pro_batch.headers["ratelimit-policy"] == '"pro";q=100;w=60'
    assert pro_batch.headers["ratelimit"].startswith('"pro";r=50;t=')
    assert [r.status_code for r in unknown] == [200] * 4
    assert all("ratelimit" not in r.headers for r in unknown)


async def test_a_rule_takes_a_limiter_function_too(store_url: str) -> None:
    """A Rule's limiter may be a sync function of the scope; its cost applies per pick."""
    backend = fresh_backend(store_url)
    uploads = arl.FixedWindow("10/minute", backend=backend, name="uploads")
    rule = Rule("POST", "/upload", lambda scope: uploads, cost=4)
    mw = RateLimitMiddleware(Echo(), rules=[rule])
    async with serving(mw, backend) as client:
        codes = [(await client.post("/upload")).status_code for _ in range(3)]
        other = (await client.get("/elsewhere")).status_code
    assert codes == [200, 200, 429]
    assert other == 200


# -- 6. responses the application shapes ----------------------------------------------------


async def test_respond_builds_the_429_and_legacy_headers_go_along(store_url: str) -> None:
    """respond= answers the 429 with the app's own body and headers; legacy_headers adds
    X-RateLimit-*; the default limiter's name= is its policy name."""
    backend = fresh_backend(store_url)
    seen: list[Refusal] = []

    def respond(refusal: Refusal) -> JSONResponse:
        seen.append(refusal)
        body = {"error": "slow down", "retry_in": refusal.retry_after, "policy": refusal.policy}
        return JSONResponse(body, status_code=refusal.status, headers=refusal.headers)

    mw = RateLimitMiddleware(
        Echo(),
        arl.FixedWindow("2/minute", backend=backend, name="api"),
        legacy_headers=True,
        respond=respond,
    )
    async with serving(mw, backend) as client:
        before = time.time()
        responses = [await client.get("/") for _ in range(3)]
        after = time.time()
    admitted, denied = responses[0], responses[2]
    assert admitted.headers["ratelimit-policy"] == '"api";q=2;w=60'
    assert admitted.headers["x-ratelimit-limit"] == "2"
    assert admitted.headers["x-ratelimit-remaining"] == "1"
    # The window ends at most 60 s after the hit; the header rounds the clock up (<= 1 s).
    assert before < int(admitted.headers["x-ratelimit-reset"]) <= after + 61
    assert denied.status_code == 429
    assert denied.headers["content-type"] == "application/json"
    retry = int(denied.headers["retry-after"])
    assert denied.json() == {"error": "slow down", "retry_in": retry, "policy": "api"}
    assert denied.headers["x-ratelimit-remaining"] == "0"
    assert denied.headers["ratelimit"] == f'"api";r=0;t={retry}'
    assert [r.status for r in seen] == [429]
    assert seen[0].decision is not None
    assert not seen[0].decision.allowed


async def test_respond_builds_the_503_when_the_backend_is_down(own_redis: Any) -> None:
    """With Redis stopped, an async respond= hook answers the 503 (decision None)."""
    backend = fresh_backend(own_redis.url)

    async def respond(refusal: Refusal) -> JSONResponse:
        assert refusal.decision is None
        return JSONResponse({"down": True}, status_code=refusal.status, headers=refusal.headers)

    mw = RateLimitMiddleware(Echo(), arl.FixedWindow("5/minute", backend=backend), respond=respond)
    async with serving(mw, backend) as client:
        own_redis.stop()
        down = await client.get("/")
    assert down.status_code == 503
    assert down.json() == {"down": True}
    assert down.headers["retry-after"] == "5"


def test_bad_web_options_are_refused_at_construction() -> None:
    """A bad limiter function, respond=, stored= or fingerprint= is refused when built."""
    with pytest.raises(TypeError, match="or a function"):
        RateLimitMiddleware(Echo(), 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="respond"):
        RateLimitMiddleware(Echo(), lambda s: None, respond="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost"):
        Rule("GET", "/", lambda s: None, cost=0)
    with pytest.raises(ValueError, match="final status"):
        IdempotencyMiddleware(Echo(), stored=[100])
    with pytest.raises(TypeError, match="fingerprint"):
        IdempotencyMiddleware(Echo(), fingerprint="body")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="base"):
        arl.Limiter(None, None)
