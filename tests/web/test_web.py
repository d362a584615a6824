"""ASGI middleware against a real uvicorn server on loopback, on memory:// and a real Redis.

The app under the middleware is a bare ASGI callable (no framework), so these tests also pin
down that the middleware needs nothing but ASGI.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest
from support import jobs
from support.servers import RedisServer
from support.webserver import fresh_backend, serving

import aioratelimit as arl
from aioratelimit._web import clients as _clients
from aioratelimit._web import headers as _http_headers
from aioratelimit._web.idempotency_flow import parse_idempotency_key
from aioratelimit.asgi import (
    IdempotencyMiddleware,
    RateLimitMiddleware,
    Rule,
    client_ip,
    header,
    path_param,
    user_id,
)

Scope = dict[str, Any]


class Echo:
    """A bare ASGI app: 200 with a JSON body naming the path and the call number."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        self.calls += 1
        body = json.dumps({"path": scope["path"], "call": self.calls}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


RATELIMIT = re.compile(r'^"default";r=(\d+);t=(\d+)$')


def ratelimit(response: httpx.Response) -> tuple[int, int]:
    """``(r, t)`` of the response's ``RateLimit`` field."""
    m = RATELIMIT.match(response.headers["ratelimit"])
    assert m, response.headers["ratelimit"]
    return int(m[1]), int(m[2])


# -- RateLimitMiddleware over HTTP ----------------------------------------------------------


async def test_limit_answers_429_with_problem_and_ietf_headers(store_url: str) -> None:
    """Three of four requests pass with RateLimit fields; the fourth gets exactly the 429."""
    backend = fresh_backend(store_url)
    app = Echo()
    mw = RateLimitMiddleware(app, arl.FixedWindow("3/minute", backend=backend))
    async with serving(mw, backend) as client:
        responses = [await client.get("/things") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert app.calls == 3
    for r, remaining in zip(responses[:3], (2, 1, 0), strict=True):
        assert r.headers["ratelimit-policy"] == '"default";q=3;w=60'
        r_, t = ratelimit(r)
        assert r_ == remaining
        assert 1 <= t <= 60
        assert "retry-after" not in r.headers
        assert r.json()["path"] == "/things"
    limited = responses[3]
    assert limited.headers["content-type"] == "application/problem+json"
    retry = int(limited.headers["retry-after"])
    assert 1 <= retry <= 60
    assert limited.headers["ratelimit-policy"] == '"default";q=3;w=60'
    assert limited.headers["ratelimit"] == f'"default";r=0;t={retry}'
    assert limited.json() == {
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Quota Exceeded",
        "status": 429,
        "detail": f"rate limit exceeded; try again in {retry} s",
        "violated-policies": ["default"],
    }
    assert int(limited.headers["content-length"]) == len(limited.content)


async def test_a_ban_answers_429_with_its_retry_after(store_url: str) -> None:
    """A Rule's limiter made with ``ban=``: the refusal that bans, and those during the
    ban, answer 429 with the ban's Retry-After, longer than the rate's window."""
    backend = fresh_backend(store_url)
    app = Echo()
    ban = arl.Ban(after=2, within=60, first=600)
    mw = RateLimitMiddleware(app, arl.FixedWindow("2/minute", backend=backend, ban=ban))
    async with serving(mw, backend) as client:
        responses = [await client.get("/login") for _ in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 429, 429, 429]
    assert app.calls == 2
    assert int(responses[2].headers["retry-after"]) <= 60  # the rate's refusal: a strike
    assert int(responses[3].headers["retry-after"]) == 600  # the second: banned
    assert 540 < int(responses[4].headers["retry-after"]) <= 600


async def test_retry_after_is_rounded_up_to_at_least_one_second(store_url: str) -> None:
    """A sub-second wait is announced as Retry-After: 1, never 0."""
    backend = fresh_backend(store_url)
    mw = RateLimitMiddleware(Echo(), arl.FixedWindow("1/500ms", backend=backend))
    async with serving(mw, backend) as client:
        responses = await asyncio.gather(*(client.get("/") for _ in range(10)))
    denied = [r for r in responses if r.status_code == 429]
    assert denied, "ten concurrent requests cannot all fall in different 500 ms windows"
    for r in denied:
        assert r.headers["retry-after"] == "1"
        assert r.headers["ratelimit-policy"] == '"default";q=1;w=1'
        assert r.headers["ratelimit"] == '"default";r=0;t=1'


async def test_limits_are_counted_per_client(store_url: str) -> None:
    """One client exhausting its quota does not limit another."""
    backend = fresh_backend(store_url)
    mw = RateLimitMiddleware(
        Echo(), arl.FixedWindow("2/minute", backend=backend), client=header("X-Client")
    )
    async with serving(mw, backend) as client:
        a = [await client.get("/", headers={"X-Client": "a"}) for _ in range(3)]
        b = [await client.get("/", headers={"X-Client": "b"}) for _ in range(2)]
        anonymous = [await client.get("/") for _ in range(3)]
    assert [r.status_code for r in a] == [200, 200, 429]
    assert [r.status_code for r in b] == [200, 200]
    # Requests without the header share one bucket (no way around the limit by omitting it).
    assert [r.status_code for r in anonymous] == [200, 200, 429]


async def test_x_forwarded_for_is_ignored_by_default(store_url: str) -> None:
    """Without trusted proxies, a forged X-Forwarded-For does not buy a fresh quota."""
    backend = fresh_backend(store_url)
    mw = RateLimitMiddleware(Echo(), arl.FixedWindow("2/minute", backend=backend))
    async with serving(mw, backend) as client:
        codes = [
            (await client.get("/", headers={"X-Forwarded-For": f"203.0.113.{i}"})).status_code
            for i in range(4)
        ]
    assert codes == [200, 200, 429, 429]


async def test_x_forwarded_for_is_honoured_from_a_trusted_proxy(store_url: str) -> None:
    """Behind a trusted proxy each forwarded client has its own quota, and only the hops the
    trusted proxies wrote count: a client-supplied left part of the chain is ignored."""
    backend = fresh_backend(store_url)
    mw = RateLimitMiddleware(
        Echo(),
        arl.FixedWindow("2/minute", backend=backend),
        client=client_ip(trusted_proxies=["127.0.0.0/8", "10.0.0.0/8"]),
    )
    async with serving(mw, backend) as client:

        async def get(xff: str) -> int:
            return (await client.get("/", headers={"X-Forwarded-For": xff})).status_code

        one = [await get("198.51.100.1") for _ in range(3)]
        two = [await get("198.51.100.2") for _ in range(2)]
        # The client forges the left part; 10.1.2.3 is a trusted proxy that saw 192.0.2.7.
        forged = [await get(f"203.0.113.{i}, 192.0.2.7, 10.1.2.3") for i in range(3)]
    assert one == [200, 200, 429]
    assert two == [200, 200]
    assert forged == [200, 200, 429]


async def test_rules_route_by_method_and_template_and_exempt_paths(store_url: str) -> None:
    """A rule applies to its method and path template only, keyed per path parameter; other
    routes take the default limiter; exempt paths are never counted nor annotated."""
    backend = fresh_backend(store_url)
    orders = arl.FixedWindow("1/minute", backend=backend, name="orders")
    mw = RateLimitMiddleware(
        Echo(),
        arl.FixedWindow("3/minute", backend=backend),
        rules=[
            Rule(
                "POST",
                "/orders/{id}",
                orders,
                client=path_param("id", "/orders/{id}"),
                name="orders",
            )
        ],
        exempt=["/health", "/static/{rest:path}"],
    )
    async with serving(mw, backend) as client:
        post1 = [(await client.post("/orders/1")).status_code for _ in range(2)]
        post2 = (await client.post("/orders/2")).status_code
        limited = await client.post("/orders/1")
        got = await client.get("/orders/1")  # not the rule's method: the default limiter
        health = [await client.get("/health") for _ in range(5)]
        static = [(await client.get("/static/css/site.css")).status_code for _ in range(5)]
    assert post1 == [200, 429]
    assert post2 == 200
    assert limited.headers["ratelimit-policy"] == '"orders";q=1;w=60'
    assert limited.headers["ratelimit"].startswith('"orders";r=0;t=')
    assert got.status_code == 200
    assert got.headers["ratelimit-policy"] == '"default";q=3;w=60'
    assert ratelimit(got)[0] == 2
    assert [r.status_code for r in health] == [200] * 5
    assert all("ratelimit" not in r.headers for r in health)
    assert static == [200] * 5


async def test_backend_down_fails_closed_with_503(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """With the Redis server stopped, requests get 503 + Retry-After and nothing runs; one
    WARNING goes to the aioratelimit logger."""
    backend = fresh_backend(own_redis.url)
    app = Echo()
    mw = RateLimitMiddleware(app, arl.FixedWindow("5/minute", backend=backend))
    with caplog.at_level(logging.WARNING, logger="aioratelimit"):
        async with serving(mw, backend) as client:
            assert (await client.get("/")).status_code == 200
            own_redis.stop()
            responses = [await client.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == [503] * 3
    assert app.calls == 1
    down = responses[0]
    assert down.headers["retry-after"] == "5"
    assert down.headers["content-type"] == "application/problem+json"
    assert down.json() == {
        "type": "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
        "title": "Temporary Reduced Capacity",
        "status": 503,
        "detail": "the rate limit backend is unavailable; try again later",
        "violated-policies": ["default"],
    }
    lines = [r for r in caplog.records if r.name == "aioratelimit"]
    assert len(lines) == 1, lines  # throttled: one line for the burst of failures
    assert "answering 503" in lines[0].getMessage()


async def test_backend_down_allow_lets_requests_through(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """on_unavailable="allow": with the Redis server stopped every request runs, unannotated,
    and the outage is logged."""
    backend = fresh_backend(own_redis.url)
    app = Echo()
    limiter = arl.FixedWindow("1/minute", backend=backend)
    mw = RateLimitMiddleware(app, limiter, on_unavailable="allow")
    with caplog.at_level(logging.WARNING, logger="aioratelimit"):
        async with serving(mw, backend) as client:
            own_redis.stop()
            responses = [await client.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert app.calls == 3
    assert all("ratelimit" not in r.headers for r in responses)
    assert any("fail open" in r.getMessage() for r in caplog.records if r.name == "aioratelimit")


async def test_concurrent_requests_admit_exactly_the_limit(store_url: str) -> None:
    """50 concurrent requests against a limit of 20: exactly 20 reach the app."""
    backend = fresh_backend(store_url)
    app = Echo()
    mw = RateLimitMiddleware(app, arl.SlidingWindow("20/minute", backend=backend))
    async with serving(mw, backend) as client:
        responses = await asyncio.gather(*(client.get("/") for _ in range(50)))
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 20 + [429] * 30
    assert app.calls == 20
    assert sorted(ratelimit(r)[0] for r in responses if r.status_code == 200) == list(range(20))


# -- key helpers, policies, construction (no server needed) --------------------------------


def scope(
    client: tuple[str, int] | None = ("127.0.0.1", 5000),
    headers: dict[str, str] | None = None,
    path: str = "/",
    **extra: Any,
) -> Scope:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "client": client,
        "headers": raw,
        **extra,
    }


async def key_of(fn: Any, s: Scope) -> str | None:
    return await _clients.resolve(fn, s)


async def test_client_ip_normalises_addresses() -> None:
    """IPv6 clients are grouped by /64, IPv4-mapped addresses count as IPv4, and a scope with
    no client (a unix socket) has one shared key."""
    key = client_ip()
    assert await key_of(key, scope(("2001:db8::1", 1))) == "ip:2001:db8::/64"
    assert await key_of(key, scope(("2001:db8::ffff:1", 1))) == "ip:2001:db8::/64"
    assert await key_of(client_ip(ipv6_prefix=128), scope(("2001:db8::1", 1))) == "ip:2001:db8::1"
    assert await key_of(key, scope(("::ffff:192.0.2.1", 1))) == "ip:192.0.2.1"
    assert await key_of(key, scope(None)) == "ip:unknown"


async def test_client_ip_walks_the_forwarded_chain_through_trusted_proxies_only() -> None:
    """The first untrusted hop from the right is the client; an untrusted peer's header and a
    malformed hop are not believed."""
    key = client_ip(trusted_proxies=["10.0.0.0/8", "127.0.0.1"])
    xff = {"X-Forwarded-For": "1.1.1.1, 2.2.2.2, 10.0.0.9"}
    assert await key_of(key, scope(("10.0.0.1", 1), xff)) == "ip:2.2.2.2"
    assert await key_of(key, scope(("192.0.2.50", 1), xff)) == "ip:192.0.2.50"
    assert await key_of(key, scope(("10.0.0.1", 1), {"X-Forwarded-For": "10.0.0.2"})) == (
        "ip:10.0.0.2"
    )
    bad = {"X-Forwarded-For": "1.1.1.1, not-an-ip"}
    assert await key_of(key, scope(("10.0.0.1", 1), bad)) == "ip:10.0.0.1"
    two_lines = [(b"x-forwarded-for", b"3.3.3.3"), (b"x-forwarded-for", b"4.4.4.4:8080")]
    s = scope(("127.0.0.1", 1))
    s["headers"] = two_lines
    assert await key_of(key, s) == "ip:4.4.4.4"


async def test_header_path_and_user_keys() -> None:
    """header, path_param and user_id name their source, bound huge values, and fall back."""
    assert await key_of(header("X-Client"), scope(headers={"X-Client": "k1"})) == "hdr:x-client:k1"
    huge = await key_of(header("X-Client"), scope(headers={"X-Client": "k" * 10_000}))
    assert huge is not None
    assert huge.startswith("hdr:x-client:#")
    assert len(huge) < 100
    assert await key_of(header("X-Api-Key", fallback=client_ip()), scope()) == "ip:127.0.0.1"
    order = path_param("id", "/orders/{id}")
    assert await key_of(order, scope(path="/orders/42")) == "path:id:42"
    assert await key_of(order, scope(path="/other")) == "path:id:-"

    class User:
        is_authenticated = True
        identity = "alice"

    class Anonymous:
        is_authenticated = False

    uid = user_id(fallback=client_ip())
    assert await key_of(uid, scope(user=User())) == "user:alice"
    assert await key_of(uid, scope(user=7)) == "user:7"
    assert await key_of(uid, scope(user=Anonymous())) == "ip:127.0.0.1"
    assert await key_of(user_id(), scope()) == "user:-"
    with pytest.raises(TypeError):
        await key_of(uid, scope(user=object()))


def test_policy_fields_for_several_rates_and_a_token_bucket() -> None:
    """Several rates are one policy each and RateLimit names the tightest; a token bucket's
    window is the time to refill its burst."""
    policy = _http_headers.QuotaPolicy(arl.FixedWindow("10/second", "100/minute"), "api")
    assert policy.policy_header == '"api-1";q=10;w=1, "api-2";q=100;w=60'
    tight = arl.Decision(False, 100, 0, 20.0, 12.2)
    assert policy.ratelimit(tight) == '"api-2";r=0;t=13'
    bucket = _http_headers.QuotaPolicy(arl.TokenBucket("10/second", burst=20), "tb")
    assert bucket.policy_header == '"tb";q=20;w=2'
    assert bucket.ratelimit(arl.Decision(True, 20, 19, 0.1, 0.0)) == '"tb";r=19;t=1'
    assert _http_headers.sf_string('a"b\\c') == '"a\\"b\\\\c"'


async def test_policy_fields_name_the_policy_a_decision_obeyed() -> None:
    """A limiter with policies: RateLimit-Policy names the key's policy with its rates, and
    RateLimit uses them; the code's rates keep the face's name; a key's own override shows
    its limit without a window."""
    async with arl.Backend.from_url("memory://") as backend:
        policies = arl.Policies()
        limiter = arl.FixedWindow("5/minute", backend=backend, name="api", policies=policies)
        fields = _http_headers.QuotaPolicy(limiter, "api")
        await policies.set("pro", "100/minute", "1000/hour")
        await policies.assign("alice", "pro")
        await policies.assign("bob", arl.Policy("7/second"))
        pro = dict(fields.headers(await limiter.hit("alice")))
        assert pro[b"ratelimit-policy"] == b'"pro-1";q=100;w=60, "pro-2";q=1000;w=3600'
        assert pro[b"ratelimit"] == b'"pro-1";r=99;t=60'
        default = dict(fields.headers(await limiter.hit("carol")))
        assert default[b"ratelimit-policy"] == b'"api";q=5;w=60'
        own = dict(fields.headers(await limiter.hit("bob")))
        assert own[b"ratelimit-policy"] == b'"key";q=7'
        assert own[b"ratelimit"] == b'"key";r=6;t=1'


async def test_other_scopes_pass_through_untouched() -> None:
    """Lifespan and WebSocket scopes reach the app without a hit."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async with arl.Backend.from_url("memory://") as backend:
        mw = RateLimitMiddleware(app, arl.FixedWindow("1/minute", backend=backend))

        async def nothing() -> Any:
            return {}

        async def drop(message: Any) -> None:
            return None

        for kind in ("lifespan", "websocket", "websocket"):
            await mw({"type": kind, "path": "/", "client": ("1.2.3.4", 1)}, nothing, drop)
    assert seen == ["lifespan", "websocket", "websocket"]


def test_bad_configuration_is_rejected_at_construction() -> None:
    """Misconfigurations raise TypeError/ValueError when the middleware is built."""
    limiter = arl.FixedWindow("1/minute", backend=arl.Backend.from_url("memory://"))
    with pytest.raises(ValueError, match="needs a limiter"):
        RateLimitMiddleware(Echo())
    with pytest.raises(TypeError):
        RateLimitMiddleware(Echo(), object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="start with"):
        Rule("GET", "orders", limiter)
    with pytest.raises(ValueError, match="malformed HTTP method"):
        Rule("GE T", "/orders", limiter)
    with pytest.raises(ValueError, match="can never be admitted"):
        Rule("GET", "/orders", limiter, cost=2)
    with pytest.raises(ValueError, match="printable ASCII"):
        RateLimitMiddleware(Echo(), limiter, policy_name="caf\u00e9")
    with pytest.raises(ValueError, match="no parameter"):
        path_param("id", "/orders/{order}")
    with pytest.raises(ValueError, match="does not appear to be"):
        client_ip(trusted_proxies=["not-a-network"])
    with pytest.raises(TypeError, match="wait must be a bool"):
        IdempotencyMiddleware(Echo(), wait=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        IdempotencyMiddleware(Echo(), wait=True, timeout=-1)


def import_the_package() -> subprocess.CompletedProcess[str]:
    """In a fresh interpreter: the web frameworks that ``import aioratelimit`` and
    ``aioratelimit.asgi`` loaded (a background job: tests/support/jobs.py)."""
    code = (
        "import sys, aioratelimit, aioratelimit.asgi;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('fastapi', 'starlette', 'uvicorn', 'httpx', 'pydantic'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.early(job=import_the_package)
def test_importing_the_package_imports_no_web_framework(request: pytest.FixtureRequest) -> None:
    """``import aioratelimit`` and ``aioratelimit.asgi`` load neither FastAPI nor Starlette."""
    proc = jobs.result(request)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- IdempotencyMiddleware over HTTP --------------------------------------------------------


class Payments:
    """A bare ASGI app that charges: counts calls, echoes the body, can be slow or fail.

    ``?delay=<s>`` sleeps first; ``/flaky`` answers 503 on its own first call; ``/boom``
    raises on its own first call; ``/big`` answers a body of ``?size=`` bytes.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.per_path: Counter[str] = Counter()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        n = self.calls
        self.per_path[scope["path"]] += 1
        first = self.per_path[scope["path"]] == 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        query = dict(
            part.split("=", 1) for part in scope["query_string"].decode().split("&") if part
        )
        await asyncio.sleep(float(query.get("delay", 0)))
        path = scope["path"]
        if path == "/boom" and first:
            raise RuntimeError("the handler failed")
        status = 503 if path == "/flaky" and first else 201
        if path == "/big":
            out = b"x" * int(query["size"])
        else:
            out = json.dumps({"call": n, "body": body.decode()}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"x-request-id", f"req-{n}".encode()),
                    (b"set-cookie", b"session=secret"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": out})


def idem(key: str) -> dict[str, str]:
    return {"Idempotency-Key": f'"{key}"'}


async def test_a_key_runs_once_and_replays_the_stored_response(store_url: str) -> None:
    """The second request with a key gets the first response (status, safe headers, body)
    with Idempotent-Replayed: true, and nothing runs again; cookies are not replayed."""
    backend = fresh_backend(store_url)
    app = Payments()
    mw = IdempotencyMiddleware(app, backend=backend)
    async with serving(mw, backend) as client:
        first = await client.post("/pay", content=b'{"amount":5}', headers=idem("k1"))
        # A retry follows a lost response: the client never got the cookie it set (one that
        # had it would send other credentials, and so be another client).
        client.cookies.clear()
        again = await client.post("/pay", content=b'{"amount":5}', headers=idem("k1"))
        bare = await client.post("/pay", content=b'{"amount":5}', headers={"Idempotency-Key": "k1"})
    assert app.calls == 1
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert first.headers["set-cookie"] == "session=secret"
    for replay in (again, bare):
        assert replay.status_code == 201
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.content == first.content
        assert replay.json() == {"call": 1, "body": '{"amount":5}'}
        assert replay.headers["x-request-id"] == "req-1"
        assert replay.headers["content-type"] == "application/json"
        assert "set-cookie" not in replay.headers


async def test_a_hundred_concurrent_duplicates_run_the_handler_once(store_url: str) -> None:
    """100 concurrent POSTs with one key: one original 2xx, the others 409 (Retry-After) or
    replays of it, and the handler ran exactly once."""
    backend = fresh_backend(store_url)
    app = Payments()
    mw = IdempotencyMiddleware(app, backend=backend)
    async with serving(mw, backend) as client:
        responses = await asyncio.gather(
            *(
                client.post("/pay?delay=0.5", content=b"same", headers=idem("dup"))
                for _ in range(100)
            )
        )
    assert app.calls == 1
    originals = [
        r for r in responses if r.status_code == 201 and "idempotent-replayed" not in r.headers
    ]
    assert len(originals) == 1
    for r in responses:
        if r is originals[0]:
            continue
        if r.status_code == 409:
            assert r.headers["retry-after"] == "1"
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["status"] == 409
        else:
            assert r.status_code == 201
            assert r.headers["idempotent-replayed"] == "true"
            assert r.content == originals[0].content


async def test_duplicates_may_wait_for_the_first_request(store_url: str) -> None:
    """With wait=True (no timeout), concurrent duplicates wait for the first and all get
    its response."""
    backend = fresh_backend(store_url)
    app = Payments()
    mw = IdempotencyMiddleware(app, backend=backend, wait=True)
    async with serving(mw, backend) as client:
        responses = await asyncio.gather(
            *(client.post("/pay?delay=0.3", content=b"w", headers=idem("w")) for _ in range(5))
        )
    assert app.calls == 1
    assert [r.status_code for r in responses] == [201] * 5
    assert sum("idempotent-replayed" in r.headers for r in responses) == 4
    assert len({r.content for r in responses}) == 1


async def test_a_waiting_duplicate_gives_up_after_its_timeout(store_url: str, key: str) -> None:
    """wait=True, timeout=0.05: a duplicate of a request that still runs gets the 409 once
    its timeout has passed, and runs nothing; the first one then ends as usual."""
    backend = fresh_backend(store_url)
    started, release, calls = asyncio.Event(), asyncio.Event(), []

    async def held(scope: Any, receive: Any, send: Any) -> None:
        calls.append(await receive())
        started.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"charged"})

    mw = IdempotencyMiddleware(held, backend=backend, wait=True, timeout=0.05)

    async def post() -> list[MutableMapping[str, Any]]:
        sent: list[MutableMapping[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"x", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/pay",
            "query_string": b"",
            "headers": [(b"idempotency-key", key.encode())],
            "client": ("10.0.0.1", 1234),
        }
        await mw(scope, receive, send)
        return sent

    try:
        first = asyncio.create_task(post())
        async with asyncio.timeout(10):
            await started.wait()
            duplicate = await post()
        assert duplicate[0]["status"] == 409
        release.set()
        assert (await first)[0]["status"] == 201
        assert len(calls) == 1
    finally:
        await backend.aclose()


async def test_the_same_key_with_another_request_is_422(store_url: str) -> None:
    """Another body, path or query under a used key is 422 and runs nothing; the same key
    from another client is that client's own."""
    backend = fresh_backend(store_url)
    app = Payments()
    mw = IdempotencyMiddleware(app, backend=backend, client=header("X-Client"))
    async with serving(mw, backend) as client:
        a = {"X-Client": "a", **idem("k")}
        first = await client.post("/pay", content=b"one", headers=a)
        others = [
            await client.post("/pay", content=b"two", headers=a),
            await client.post("/refund", content=b"one", headers=a),
            await client.post("/pay?x=1", content=b"one", headers=a),
            await client.patch("/pay", content=b"one", headers=a),
        ]
        other_client = await client.post(
            "/pay", content=b"two", headers={"X-Client": "b", **idem("k")}
        )
    assert first.status_code == 201
    assert [r.status_code for r in others] == [422] * 4
    assert others[0].headers["content-type"] == "application/problem+json"
    assert others[0].json() == {
        "type": "about:blank",
        "title": "Unprocessable Content",
        "status": 422,
        "detail": "this Idempotency-Key was already used with another request"
        " (method, path, query or body differ)",
    }
    assert other_client.status_code == 201
    assert app.calls == 2


async def test_missing_or_malformed_keys_are_400_where_required() -> None:
    """A required key that is missing or malformed is 400; routes the middleware does not
    take run as they are, and methods outside ``methods`` pass through."""
    backend = fresh_backend("memory://")
    app = Payments()
    mw = IdempotencyMiddleware(app, backend=backend, routes=["/pay"], require=True)
    async with serving(mw, backend) as client:
        missing = await client.post("/pay", content=b"x")
        malformed = [
            await client.post("/pay", content=b"x", headers={"Idempotency-Key": v})
            for v in ('""', '"' + "a" * 256 + '"', "two words", '"unterminated')
        ]
        doubled = await client.post(
            "/pay", content=b"x", headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
        )
        optional = [(await client.post("/other", content=b"x")).status_code for _ in range(2)]
        got = [(await client.get("/pay", headers=idem("g"))).status_code for _ in range(2)]
    assert missing.status_code == 400
    assert missing.json()["detail"] == "this request needs an Idempotency-Key header"
    assert [r.status_code for r in malformed] == [400] * 4
    assert malformed[0].headers["content-type"] == "application/problem+json"
    assert doubled.status_code == 400
    assert optional == [201, 201]
    assert got == [201, 201]
    assert app.calls == 4


async def test_a_body_over_the_cap_is_413_never_a_bypass() -> None:
    """Over max_body, declared or streamed in chunks, the request is 413 and nothing runs;
    a body at the cap runs."""
    backend = fresh_backend("memory://")
    app = Payments()
    mw = IdempotencyMiddleware(app, backend=backend, max_body=1000)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"y" * 500

    async with serving(mw, backend) as client:
        declared = await client.post("/pay", content=b"x" * 1001, headers=idem("big"))
        streamed = await client.post("/pay", content=chunks(), headers=idem("chunked"))
        at_cap = await client.post("/pay", content=b"x" * 1000, headers=idem("ok"))
    assert declared.status_code == 413
    assert declared.headers["content-type"] == "application/problem+json"
    assert streamed.status_code == 413
    assert at_cap.status_code == 201
    assert app.calls == 1


async def test_5xx_and_failures_are_not_stored(store_url: str) -> None:
    """A 5xx answer or a handler exception frees the key: the retry runs, and its 2xx is
    what is replayed after."""
    backend = fresh_backend(store_url)
    app = Payments()
    mw = IdempotencyMiddleware(app, backend=backend)
    async with serving(mw, backend) as client:
        flaky = [(await client.post("/flaky", content=b"f", headers=idem("f"))) for _ in range(3)]
        boom = [(await client.post("/boom", content=b"b", headers=idem("b"))) for _ in range(3)]
    assert [r.status_code for r in flaky] == [503, 201, 201]
    assert "idempotent-replayed" not in flaky[1].headers
    assert flaky[2].headers["idempotent-replayed"] == "true"
    assert [r.status_code for r in boom] == [500, 201, 201]
    assert boom[2].headers["idempotent-replayed"] == "true"
    assert app.calls == 4


async def test_a_response_over_max_response_is_not_stored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A response too large to store reaches the client whole, frees the key, and is logged."""
    backend = fresh_backend("memory://")
    app = Payments()
    mw = IdempotencyMiddleware(app, backend=backend, max_response=100)
    with caplog.at_level(logging.WARNING, logger="aioratelimit"):
        async with serving(mw, backend) as client:
            big = [await client.post("/big?size=500", headers=idem("big")) for _ in range(2)]
            small = [await client.post("/big?size=50", headers=idem("small")) for _ in range(2)]
    assert [len(r.content) for r in big] == [500, 500]
    assert all("idempotent-replayed" not in r.headers for r in big)
    assert small[1].headers["idempotent-replayed"] == "true"
    assert app.calls == 3
    assert any("max_response" in r.getMessage() for r in caplog.records)


async def test_idempotency_backend_down_fails_closed_or_open(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """With the Redis server stopped: 503 + Retry-After and nothing runs by default; with
    on_unavailable="allow" the request runs unprotected; a WARNING either way."""
    backend = fresh_backend(own_redis.url)
    open_backend = fresh_backend(own_redis.url)
    app = Payments()
    closed = IdempotencyMiddleware(app, backend=backend)
    opened = IdempotencyMiddleware(app, backend=open_backend, on_unavailable="allow")
    with caplog.at_level(logging.WARNING, logger="aioratelimit"):
        async with serving(closed, backend) as c1, serving(opened, open_backend) as c2:
            own_redis.stop()
            down = await c1.post("/pay", content=b"x", headers=idem("k"))
            through = [await c2.post("/pay", content=b"x", headers=idem("k")) for _ in range(2)]
    assert down.status_code == 503
    assert down.headers["retry-after"] == "5"
    assert down.json()["detail"] == "the idempotency backend is unavailable; try again later"
    assert [r.status_code for r in through] == [201, 201]
    assert app.calls == 2
    messages = [r.getMessage() for r in caplog.records if r.name == "aioratelimit"]
    assert any("answering 503" in m for m in messages)
    assert any("fail open" in m for m in messages)


def test_idempotency_key_parsing() -> None:
    """Keys are Structured Field strings (escapes undone) or bare visible-ASCII tokens."""
    assert parse_idempotency_key('"8e03978e-40d5-43e8-bc93-6894a57f9324"') == (
        "8e03978e-40d5-43e8-bc93-6894a57f9324"
    )
    assert parse_idempotency_key('"a\\"b"') == 'a"b'
    assert parse_idempotency_key("plain-token") == "plain-token"
    for bad in ("", '""', "a b", "caf\u00e9", '"x', "a" * 256, '"\x01"'):
        assert parse_idempotency_key(bad) is None, bad
