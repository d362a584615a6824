"""The failure policy (``on_unavailable``), the circuit breaker and shadow mode.

Outages are real: a private server stopped and started again, and a blackhole proxy
(``faultproxy``). Invariants and counts only: how many calls reached the backend while the
breaker was open (none), what the fallback admitted (never more than its share), where
each decision came from (``Decision.source``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.faultproxy import FaultProxy
from support.servers import RedisServer as Server

import aioratelimit as arl
from aioratelimit._scripts import ScriptCall

TIMEOUT = 0.5


@pytest.fixture
def proxy(own_redis: Server) -> Iterator[FaultProxy]:
    with FaultProxy(own_redis.port) as p:
        yield p


def _backend(url: str, calls: list[ScriptCall]) -> arl.Backend:
    return arl.Backend.from_url(url, timeout=TIMEOUT, connect_timeout=TIMEOUT, on_call=calls.append)


async def test_breaker_opens_serves_the_fallback_and_recovers(
    own_redis: Server, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Server stopped: after 2 unavailable calls the breaker opens (logged, told to its
    listener); while open no call reaches the backend and the fallback admits exactly its
    share; after the cool-down one probe finds the server back, the breaker closes and the
    next decisions count on the server."""
    calls: list[ScriptCall] = []
    changes: list[tuple[str, str]] = []
    breaker = arl.Breaker(failures=2, cooldown=0.5, name="test")
    breaker.on_change(lambda b, old, new: changes.append((old, new)))
    async with _backend(own_redis.url, calls) as backend:
        limiter = arl.FixedWindow(
            "8/hour", backend=backend, on_unavailable=arl.Fallback(0.25), breaker=breaker
        )
        assert (await limiter.hit(key)).source == "redis"
        await asyncio.to_thread(own_redis.stop)
        with caplog.at_level(logging.INFO, logger="aioratelimit"):
            decisions = [await limiter.hit(key) for _ in range(2)]
            assert breaker.state == "open"
            sent = len(calls)
            decisions += [await limiter.hit(key) for _ in range(30)]
            assert len(calls) == sent  # open: nothing went to the backend
        assert {d.source for d in decisions} == {"fallback"}
        assert all(d.degraded for d in decisions)
        assert sum(d.allowed for d in decisions) == 2  # 8 * 0.25, never more
        assert changes == [("closed", "open")]
        assert any(
            "open" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records
        )
        await asyncio.to_thread(own_redis.start)
        await asyncio.sleep(0.6)
        back = await limiter.hit(key)  # the probe
        assert (back.source, back.allowed, back.remaining) == ("redis", True, 7)
        assert breaker.state == "closed"
        assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
        assert (await limiter.hit(key)).remaining == 6  # counted on the server


async def test_blackhole_with_the_breaker_open_answers_without_calls(
    proxy: FaultProxy, key: str
) -> None:
    """Blackhole: once the breaker is open, 200 decisions on many keys make no call and
    return within the bound of one timeout each (they do not wait for Redis); the fallback
    never admits more than its share per key; a probe that finds the blackhole still there
    opens the breaker again."""
    calls: list[ScriptCall] = []
    breaker = arl.Breaker(failures=1, cooldown=0.4)
    async with _backend(proxy.url, calls) as backend:
        limiter = arl.TokenBucket(
            "10/hour", backend=backend, on_unavailable=arl.Fallback(0.3), breaker=breaker
        )
        assert (await limiter.hit(key)).allowed
        proxy.stall()
        assert (await limiter.hit(key)).source == "fallback"
        assert breaker.state == "open"
        sent = len(calls)
        loop = asyncio.get_running_loop()
        start = loop.time()
        decisions = [await limiter.hit(f"{key}-{i % 5}") for i in range(200)]
        assert loop.time() - start < TIMEOUT  # a bound: not one of them waited for Redis
        assert len(calls) == sent
        per_key = {f"{key}-{i}": 0 for i in range(5)}
        for i, d in enumerate(decisions):
            per_key[f"{key}-{i % 5}"] += d.allowed
        assert max(per_key.values()) <= 3  # floor(10 * 0.3)
        await asyncio.sleep(0.5)
        assert (await limiter.hit(key)).source == "fallback"  # the probe timed out
        assert breaker.state == "open"
        proxy.passthrough()
        await asyncio.sleep(0.5)
        assert (await limiter.hit(key)).source == "redis"
        assert breaker.state == "closed"


@pytest.mark.parametrize(("policy", "allowed"), [("allow", True), ("deny", False)])
async def test_allow_and_deny_policies(
    own_redis: Server, key: str, policy: Any, allowed: bool
) -> None:
    """``"allow"``/``"deny"``: every decision during the outage says so, marked "policy";
    a denial's retry_after is the breaker's cool-down (a waiter does not spin)."""
    calls: list[ScriptCall] = []
    async with _backend(own_redis.url, calls) as backend:
        limiter = arl.SlidingWindow(
            "5/hour", backend=backend, on_unavailable=policy, breaker=arl.Breaker(1, 2.0)
        )
        await asyncio.to_thread(own_redis.stop)
        decisions = [await limiter.hit(key) for _ in range(10)]
        assert {(d.allowed, d.source) for d in decisions} == {(allowed, "policy")}
        if not allowed:
            assert {d.retry_after for d in decisions} == {2.0}
            with pytest.raises(arl.RateLimited):
                await limiter.acquire(key)


async def test_raise_with_an_open_breaker_raises_at_once(own_redis: Server, key: str) -> None:
    """``"raise"`` with a breaker: once open, BackendUnavailable with no call made."""
    calls: list[ScriptCall] = []
    async with _backend(own_redis.url, calls) as backend:
        limiter = arl.FixedWindow("5/hour", backend=backend, breaker=arl.Breaker(1, 30.0))
        await asyncio.to_thread(own_redis.stop)
        with pytest.raises(arl.BackendUnavailable):
            await limiter.hit(key)
        sent = len(calls)
        for _ in range(5):
            with pytest.raises(arl.BackendUnavailable, match="circuit breaker open"):
                await limiter.hit(key)
        assert len(calls) == sent


async def test_bad_input_is_refused_with_the_breaker_open(own_redis: Server, key: str) -> None:
    """An open breaker does not hide bad input: ValueError/TypeError, nothing counted."""
    calls: list[ScriptCall] = []
    async with _backend(own_redis.url, calls) as backend:
        limiter = arl.FixedWindow(
            "4/hour", backend=backend, on_unavailable=arl.Fallback(0.5), breaker=arl.Breaker(1)
        )
        await asyncio.to_thread(own_redis.stop)
        await limiter.hit(key)
        for cost, exc in ((0, ValueError), (5, ValueError), (math.nan, TypeError)):
            with pytest.raises(exc):
                await limiter.hit(key, cost)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="key"):
            await limiter.hit("")
        assert sum([(await limiter.hit(key)).allowed for _ in range(5)]) == 1  # 2 - the first


@pytest.mark.parametrize(
    ("share", "exc"),
    [
        (0, ValueError),
        (-0.5, ValueError),
        (1.5, ValueError),
        (math.nan, ValueError),
        ("half", TypeError),
        (True, TypeError),
    ],
)
def test_bad_fallback_shares(share: Any, exc: type[Exception]) -> None:
    """A share outside (0, 1] (above the limit), NaN, or not a number: refused."""
    with pytest.raises(exc):
        arl.Fallback(share)


@pytest.mark.parametrize(
    ("options", "exc"),
    [
        ({"on_unavailable": "maybe"}, ValueError),
        ({"on_unavailable": 1}, TypeError),
        ({"breaker": "yes"}, TypeError),
        ({"shadow": "yes"}, TypeError),
    ],
)
def test_bad_limiter_options(options: dict[str, Any], exc: type[Exception]) -> None:
    """Bad policy, breaker or shadow options: refused at construction."""
    with pytest.raises(exc):
        arl.FixedWindow("1/s", **options)


@pytest.mark.parametrize(
    ("args", "exc"),
    [
        ((0, 1.0), ValueError),
        ((1, -1.0), ValueError),
        ((1, math.nan), ValueError),
        ((1.5, 1.0), TypeError),
        ((1, "1"), TypeError),
    ],
)
def test_bad_breakers(args: tuple[Any, Any], exc: type[Exception]) -> None:
    """``failures`` < 1, a cool-down that is not a positive finite number: refused."""
    with pytest.raises(exc):
        arl.Breaker(*args)


# -- shadow mode -------------------------------------------------------------------------


async def test_shadow_never_denies_and_says_what_would_have_happened(
    backend: arl.Backend, key: str
) -> None:
    """A shadow limiter admits every hit (``acquire`` never raises) and each Decision
    carries what the limit said: ``shadow_denied``, the real remaining and retry_after;
    it counts exactly what the enforced limit would have counted."""
    shadow = arl.FixedWindow("3/hour", backend=backend, shadow=True)
    enforced = arl.FixedWindow("3/hour", backend=backend)
    decisions = [await shadow.hit(key) for _ in range(5)]
    assert all(d.allowed and d.shadow for d in decisions)
    assert [d.shadow_denied for d in decisions] == [False] * 3 + [True] * 2
    assert [d.remaining for d in decisions] == [2, 1, 0, 0, 0]
    assert all(d.retry_after > 0 for d in decisions[3:])
    assert (await shadow.acquire(key)).shadow_denied
    async with shadow(key) as d:
        assert d.shadow_denied
    assert not (await enforced.peek(key)).allowed  # 3 counted, as if enforced


async def test_shadow_with_the_cache(backend: arl.Backend, key: str) -> None:
    """Shadow mode over the deny cache: cached denials are shadow decisions too."""
    limiter = arl.TokenBucket("2/hour", backend=backend, shadow=True, deny_cache=10)
    seen = []
    for _ in range(1000):  # up to 10 s: the key's subscription is being confirmed
        seen.append(await limiter.hit(key))
        if seen[-1].source == "cache":
            break
        await asyncio.sleep(0.01)
    assert seen[-1].source == "cache"
    assert seen[-1].shadow_denied
    assert all(d.allowed for d in seen)


def test_breaker_states_step_by_step() -> None:
    """The breaker alone: opens after ``failures`` consecutive failures (a success between
    resets the count), lets exactly one probe through per cool-down, reopens when the probe
    fails, lets the next call probe at once when a probe is abandoned, closes on success;
    a listener that raises changes nothing."""
    breaker = arl.Breaker(failures=2, cooldown=0.05)
    seen: list[str] = []
    breaker.on_change(lambda b, old, new: seen.append(new))

    def broken(b: arl.Breaker, old: str, new: str) -> None:
        raise RuntimeError("a listener's bug")

    breaker.on_change(broken)  # logged, ignored
    breaker.failed()
    breaker.succeeded()
    breaker.failed()
    assert breaker.state == "closed"
    breaker.failed()
    assert breaker.state == "open"
    assert not breaker.allow()
    time.sleep(0.06)
    assert breaker.allow()  # the probe
    assert breaker.state == "half_open"
    assert not breaker.allow()  # only one
    breaker.failed()
    assert breaker.state == "open"
    assert not breaker.allow()
    time.sleep(0.06)
    assert breaker.allow()
    breaker.abandoned()  # the probe was cancelled: no answer either way
    assert breaker.allow()  # the next call probes at once
    breaker.succeeded()
    assert breaker.state == "closed"
    assert breaker.allow()
    assert seen == ["open", "half_open", "open", "half_open", "open", "half_open", "closed"]
