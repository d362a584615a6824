"""Faults on a private server: a flushed script cache, a restart, a stopped or frozen server,
nothing listening. Each ends in a bounded time, with ``BackendUnavailable`` (cause chained)
where the server cannot answer, and the same Backend works again once it can, with the
limiter's counts intact."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from support.servers import RedisServer, free_port

import aioratelimit as arl
from aioratelimit._scripts import FIXED_WINDOW

LIMITERS: dict[str, Callable[[arl.Backend], Any]] = {
    "fixed": lambda backend: arl.FixedWindow("3/hour", backend=backend),
    "sliding": lambda backend: arl.SlidingWindow("3/hour", backend=backend),
    "token": lambda backend: arl.TokenBucket("3/hour", backend=backend),
}


def _commandstats(server: RedisServer) -> dict[str, Any]:
    client = server.client()
    try:
        return dict(client.info("commandstats"))
    finally:
        client.close()


def _calls(stats: dict[str, Any], command: str) -> tuple[int, int]:
    """(calls, failed calls) of one command in INFO commandstats."""
    entry = stats.get(f"cmdstat_{command}", {})
    return int(entry.get("calls", 0)), int(entry.get("failed_calls", 0))


async def test_script_flush_is_recovered_inside_the_call(own_redis: RedisServer, key: str) -> None:
    """After SCRIPT FLUSH the next hit reloads the script inside the same call."""
    async with arl.Backend.from_url(own_redis.url) as backend:
        limiter = arl.FixedWindow("3/hour", backend=backend)
        assert (await limiter.hit(key)).remaining == 2
        admin = own_redis.client()
        try:
            assert admin.script_exists(FIXED_WINDOW.sha) == [True]
            admin.script_flush()
            assert admin.script_exists(FIXED_WINDOW.sha) == [False]
            before = _commandstats(own_redis)
            decision = await limiter.hit(key)
            after = _commandstats(own_redis)
        finally:
            admin.close()
        assert (decision.allowed, decision.remaining) == (True, 1)
        evalsha_before, evalsha_after = _calls(before, "evalsha"), _calls(after, "evalsha")
        assert evalsha_after[0] + evalsha_after[1] > evalsha_before[0] + evalsha_before[1]
        assert _calls(after, "eval")[0] == _calls(before, "eval")[0] + 1  # one reload, in-call
        assert [d.allowed for d in [await limiter.hit(key) for _ in range(2)]] == [True, False]


@pytest.mark.parametrize("kind", sorted(LIMITERS))
async def test_restart_on_the_same_port_is_survived(
    own_redis: RedisServer, key: str, kind: str
) -> None:
    """After a restart on the same port the same Backend decides again at once."""
    async with arl.Backend.from_url(own_redis.url, timeout=2) as backend:
        limiter = LIMITERS[kind](backend)
        # Several connections in the pool, all of which go stale in the restart.
        await asyncio.gather(*(limiter.peek(f"{key}-{i}") for i in range(8)))
        assert [d.allowed for d in [await limiter.hit(key) for _ in range(4)]] == [
            True, True, True, False
        ]  # fmt: skip
        await asyncio.to_thread(own_redis.restart)  # the loop runs on, as in an application
        peeks = await asyncio.gather(*(limiter.peek(f"{key}-{i}") for i in range(8)))
        assert all(p.allowed for p in peeks)
        after = [await limiter.hit(key) for _ in range(4)]
        assert [(d.allowed, d.remaining) for d in after] == [
            (True, 2), (True, 1), (True, 0), (False, 0)
        ]  # fmt: skip


async def test_server_down_raises_backend_unavailable_then_recovers(
    own_redis: RedisServer, key: str
) -> None:
    """A stopped server gives BackendUnavailable in seconds; the Backend recovers after."""
    async with arl.Backend.from_url(own_redis.url, timeout=1, connect_timeout=1) as backend:
        limiter = arl.FixedWindow("3/hour", backend=backend)
        assert (await limiter.hit(key)).allowed
        await asyncio.to_thread(own_redis.stop)
        for attempt in range(2):  # the stale pooled connection, then a fresh connect
            started = time.monotonic()
            with pytest.raises(arl.BackendUnavailable) as info:
                await limiter.hit(key)
            assert time.monotonic() - started < 5, attempt
            assert isinstance(info.value.__cause__, (redis.RedisError, OSError))
        with pytest.raises(arl.BackendUnavailable):
            await limiter.reset(key)
        await asyncio.to_thread(own_redis.start)  # the same port, empty
        decisions = [await limiter.hit(key) for _ in range(4)]
        assert [d.allowed for d in decisions] == [True, True, True, False]


async def test_frozen_server_times_out_then_recovers(own_redis: RedisServer, key: str) -> None:
    """A frozen server gives BackendUnavailable after `timeout`; the Backend recovers after."""
    async with arl.Backend.from_url(own_redis.url, timeout=0.5, connect_timeout=0.5) as backend:
        limiter = arl.FixedWindow("5/hour", backend=backend)
        assert (await limiter.hit(key)).remaining == 4
        own_redis.pause()
        try:
            started = time.monotonic()
            with pytest.raises(arl.BackendUnavailable) as info:
                await limiter.hit(key)
            assert 0.4 < time.monotonic() - started < 5
            assert isinstance(info.value.__cause__, (redis.TimeoutError, TimeoutError))
        finally:
            own_redis.resume()
        # The counts are what the server executed: the timed-out hit was already in its
        # socket buffer and may have run when it woke.
        remaining = (await limiter.hit(key)).remaining
        assert remaining in (3, 2)  # 1 hit + this one, + the timed-out one if it ran
        rest = [await limiter.hit(key) for _ in range(4)]
        assert [d.allowed for d in rest] == [True] * remaining + [False] * (4 - remaining)


async def test_frozen_server_bounds_every_call_in_flight(own_redis: RedisServer) -> None:
    """Calls in flight on a frozen server all end in BackendUnavailable, staggered or not,
    and a cancellation from outside stays a cancellation (never turned into a timeout)."""
    async with arl.Backend.from_url(own_redis.url, timeout=0.5, connect_timeout=0.5) as backend:
        limiter = arl.FixedWindow("1000/hour", backend=backend)
        await asyncio.gather(*(limiter.hit(f"warm-{i}") for i in range(8)))  # open connections
        own_redis.pause()
        try:

            async def late_hit(i: int) -> BaseException | None:
                await asyncio.sleep(i * 0.05)  # deadlines that differ, one timer for all
                try:
                    await limiter.hit(f"k-{i}")
                except BaseException as exc:
                    return exc
                return None

            started = time.monotonic()
            outcomes = await asyncio.gather(*(late_hit(i) for i in range(8)))
            assert all(isinstance(o, arl.BackendUnavailable) for o in outcomes), outcomes
            assert time.monotonic() - started < 5

            cancelled = asyncio.ensure_future(limiter.hit("cancelled"))
            await asyncio.sleep(0.1)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
        finally:
            own_redis.resume()
        assert (await limiter.hit("after")).allowed


async def test_new_backend_on_a_frozen_server_times_out(own_redis: RedisServer, key: str) -> None:
    """A new Backend's first connect to a frozen server gives BackendUnavailable in bounds."""
    own_redis.pause()
    try:
        async with arl.Backend.from_url(own_redis.url, timeout=0.5, connect_timeout=0.5) as backend:
            started = time.monotonic()
            with pytest.raises(arl.BackendUnavailable) as info:
                await arl.TokenBucket("3/hour", backend=backend).hit(key)
            assert time.monotonic() - started < 5
            assert info.value.__cause__ is not None
    finally:
        own_redis.resume()


@pytest.mark.parametrize("kind", sorted(LIMITERS))
async def test_connection_refused_raises_backend_unavailable(key: str, kind: str) -> None:
    """Nothing listening: every call raises BackendUnavailable at once, error chained."""
    url = f"redis://127.0.0.1:{free_port()}"
    async with arl.Backend.from_url(url, timeout=1, connect_timeout=1) as backend:
        limiter = LIMITERS[kind](backend)
        started = time.monotonic()
        for call in (limiter.hit(key), limiter.peek(key), limiter.reset(key)):
            with pytest.raises(arl.BackendUnavailable) as info:
                await call
            assert isinstance(info.value.__cause__, (OSError, redis.ConnectionError))
        with pytest.raises(arl.BackendUnavailable):
            async with limiter(key, wait=True, timeout=1):
                pass
        assert time.monotonic() - started < 5
