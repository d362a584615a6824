"""Clients users bring to ``Backend(client)``: redis-py's, valkey-py's ``valkey.asyncio.Valkey``
and fakeredis's ``FakeAsyncRedis`` (with lupa) each run the conformance core (every
primitive, wake-ups by pub/sub within ``WOKEN_WITHIN``); valkey's NOSCRIPT, outages and
error replies are ours; anything else is a TypeError at ``Backend(...)``; a client decoding
binary replies, or one from another event loop, fails with a BackendError that says so.
"""

from __future__ import annotations

import asyncio
import pickle
import uuid
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio as aredis
import valkey
import valkey.asyncio as avalkey
from support.core_calls import conformance_core
from support.servers import RedisServer

import aioratelimit as arl

CLIENTS: dict[str, Callable[[str], Any]] = {
    "redis-py": lambda url: aredis.Redis.from_url(url),
    "valkey": lambda url: avalkey.Valkey.from_url(url),
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_a_passed_in_client_runs_the_conformance_core(redis_url: str, client: str) -> None:
    """Every primitive through the client, on a real server, after a SCRIPT FLUSH too
    (NOSCRIPT answered by EVAL); waiters woken by pub/sub, not by their 1 s timer."""
    c = CLIENTS[client](redis_url)
    try:
        async with arl.Backend(c) as backend:
            await conformance_core(backend, uuid.uuid4().hex)
            await c.script_flush()
            limiter = arl.FixedWindow("1/minute", backend=backend)
            key = uuid.uuid4().hex
            assert [(await limiter.hit(key)).allowed for _ in range(2)] == [True, False]
    finally:
        await c.aclose()


async def test_fakeredis_with_lupa_runs_the_conformance_core() -> None:
    """fakeredis's FakeAsyncRedis, a test double for users' own tests, runs every primitive
    (its server check passes: HELLO names it fakeredis)."""
    client = fakeredis.FakeAsyncRedis()
    async with arl.Backend(client) as backend:
        await conformance_core(backend, "k")
    await client.aclose()


async def test_a_valkey_client_outage_is_backend_unavailable() -> None:
    """valkey's ConnectionError becomes ours, so 503s and fail-open see an outage."""
    client = avalkey.Valkey(port=1, socket_connect_timeout=0.5)
    async with arl.Backend(client) as backend:
        with pytest.raises(arl.BackendUnavailable) as caught:
            await arl.FixedWindow("2/minute", backend=backend).hit("k")
    assert isinstance(caught.value.__cause__, valkey.exceptions.ConnectionError)
    await client.aclose()


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_maxmemory_is_a_backend_error_with_the_fix(
    own_redis: RedisServer, client: str
) -> None:
    """A server out of memory refuses the write: BackendError (not an outage) naming
    maxmemory and what to do, through either client."""
    admin = redis.Redis(port=own_redis.port)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    c = CLIENTS[client](own_redis.url)
    try:
        async with arl.Backend(c) as backend:
            with pytest.raises(arl.BackendError, match=r"maxmemory.*fix: maxmemory reached"):
                await arl.FixedWindow("2/minute", backend=backend).hit("k")
    finally:
        await c.aclose()
        admin.config_set("maxmemory", "0")
        admin.close()


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (object, "builtins.object"),
        (lambda: redis.Redis(), r"redis.client.Redis \(a synchronous client"),
        (lambda: valkey.Valkey(), "valkey.client.Valkey"),
        (lambda: avalkey.ValkeyCluster(host="127.0.0.1", port=1), "a Valkey cluster"),
    ],
)
def test_an_unknown_client_is_a_type_error_at_once(make: Callable[[], Any], named: str) -> None:
    try:
        client = make()
    except Exception:  # a cluster client that cannot even be built here
        pytest.skip("the client cannot be built without a server")
    with pytest.raises(TypeError, match=rf"takes redis\.asyncio\.Redis.*{named}"):
        arl.Backend(client)


async def test_a_decoding_client_and_a_binary_result_is_a_backend_error(redis_url: str) -> None:
    """decode_responses=True cannot read a binary result back (pickle): a BackendError that
    names the option, not a raw UnicodeDecodeError."""
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    async with arl.Backend(client) as backend:

        @arl.idempotent(
            key=lambda: uuid.uuid4().hex[:0] + "pickled", serializer=pickle, backend=backend
        )
        async def binary() -> bytes:
            return b"\x80\xff"

        await binary()
        with pytest.raises(arl.BackendError, match="decode_responses=True") as caught:
            await binary()
    assert isinstance(caught.value.__cause__, UnicodeDecodeError)
    await client.aclose()


def test_a_client_of_another_event_loop_is_a_backend_error(redis_url: str) -> None:
    """A client (and its backend) made and used on one event loop, used from another while
    the first still runs: a BackendError naming the event loop, not redis-py's RuntimeError
    (the same once the first loop is closed: "Event loop is closed")."""
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    client = aredis.Redis.from_url(redis_url)
    limiter = arl.FixedWindow("5/minute", backend=arl.Backend(client))
    key = uuid.uuid4().hex
    try:
        first.run_until_complete(limiter.hit(key))
        with pytest.raises(arl.BackendError, match="belongs to another event loop") as caught:
            second.run_until_complete(limiter.hit(key))
        assert isinstance(caught.value.__cause__, RuntimeError)
        first.run_until_complete(client.aclose())
    finally:
        first.close()
        second.close()


# -- what an error reply says, and what fail-open covers -------------------------------------


@pytest.mark.parametrize(
    ("reply", "fix"),
    [
        ("unknown command 'evalsha', with args beginning with: 'abc'", "pip install lupa"),
        (
            "Error running script: @user_script:31: Unknown Redis command called from Lua script",
            "needs Redis 6.2 or newer",
        ),
        ("command not allowed when used memory > 'maxmemory'.", "maxmemory reached"),
    ],
)
def test_an_error_reply_names_its_fix(reply: str, fix: str) -> None:
    """The translation of an error reply whose cause is known adds what to do."""
    from aioratelimit._stores.base import translate

    error = translate(redis.ResponseError(reply))
    assert isinstance(error, arl.BackendError)
    assert fix in str(error)
    assert str(error).startswith(f"Redis answered with an error: {reply}")


async def test_allow_does_not_cover_a_backend_error(own_redis: RedisServer) -> None:
    """RateLimitMiddleware(on_unavailable="allow") lets traffic through an outage, not past a
    server that answers with an error (here maxmemory): that request fails (500)."""
    import httpx

    from aioratelimit.asgi import RateLimitMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    admin = redis.Redis(port=own_redis.port)
    try:
        async with arl.Backend.from_url(own_redis.url) as backend:
            limiter = arl.FixedWindow("100/minute", backend=backend)
            guarded = RateLimitMiddleware(app, limiter, on_unavailable="allow")
            transport = httpx.ASGITransport(app=guarded, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as web:
                assert (await web.get("/")).status_code == 200
                admin.config_set("maxmemory-policy", "noeviction")
                admin.config_set("maxmemory", "1")
                assert (await web.get("/")).status_code == 500
    finally:
        admin.config_set("maxmemory", "0")
        admin.close()
