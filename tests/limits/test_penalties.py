"""Penalties, refunds and partial grants on every backend and all three limiters:
``block(key, seconds)``, ``refund(key, cost)``, ``count_denied=True`` and
``hit(key, cost, partial=True)``; each one script, atomic, with a TTL on every key, applied
to every rate of a multi-rate limiter; bad input refused before any I/O."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from support.kinds import Build

import aioratelimit as arl
from aioratelimit._scripts import Arg, Reply, Script


class Calls:
    """Wraps ``backend._run`` to keep the name of every script run."""

    def __init__(self, backend: arl.Backend) -> None:
        self.names: list[str] = []
        inner = backend._run

        async def run(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
            self.names.append(script.name)
            return await inner(script, keys, args)

        backend._run = run


def ttls(backend: arl.Backend, sync_redis: redis.Redis, fragment: str) -> dict[str, int]:
    """PTTL (ms) of every key of this test (its user key in the name), on either store."""
    store = backend._store
    keyspace = getattr(store, "keyspace", None)
    if keyspace is not None:  # memory://: an expiry or none (-1)
        return {k: 1 if k in keyspace.exp else -1 for k in keyspace.data if fragment in k}
    found = {}
    for name in sync_redis.scan_iter(match=f"*{fragment}*", count=1000):
        found[name.decode()] = int(sync_redis.pttl(name))
    return found


# -- block ---------------------------------------------------------------------------------


async def test_block_denies_every_hit_until_it_ends(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """A block denies every hit (none counted) with retry_after counting it down, then ends."""
    limiter = build("5/second", "10/minute", backend=backend, blockable=True)
    left = await limiter.block(key, 0.3)
    assert 0.29 <= left <= 0.3
    denied = await limiter.hit(key)
    assert not denied.allowed
    assert denied.granted == 0
    assert 0 < denied.retry_after <= 0.3
    assert denied.remaining == 0
    assert not (await limiter.peek(key)).allowed
    await asyncio.sleep(denied.retry_after + 0.01)
    admitted = await limiter.hit(key)
    assert admitted.allowed
    assert admitted.remaining == 4  # the denied hits during the block counted nothing


async def test_a_block_never_shortens_one_and_reset_lifts_it(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """A shorter block keeps the longer one in place; ``reset`` lifts the block."""
    limiter = build("5/second", backend=backend, blockable=True)
    await limiter.block(key, 60)
    assert await limiter.block(key, 0.01) > 59
    assert (await limiter.hit(key)).retry_after > 59
    await limiter.reset(key)
    assert (await limiter.hit(key)).allowed


async def test_a_block_is_per_limiter_and_per_key(backend: arl.Backend, key: str) -> None:
    """Blocking a key on one limiter leaves its other keys and other limiters alone."""
    blocked = arl.FixedWindow("5/second", backend=backend, name="login", blockable=True)
    other = arl.FixedWindow("5/second", backend=backend, name="api", blockable=True)
    await blocked.block(key, 60)
    assert not (await blocked.hit(key)).allowed
    assert (await blocked.hit(key + "-other")).allowed
    assert (await other.hit(key)).allowed


async def test_a_block_is_seen_by_another_process(backend_url: str, key: str) -> None:
    """A block set through one backend (another process's) denies through another."""
    if backend_url == "memory://":
        pytest.skip("memory:// is per process")
    async with (
        arl.Backend.from_url(backend_url) as one,
        arl.Backend.from_url(backend_url) as two,
    ):
        await arl.SlidingWindow("5/second", backend=one, blockable=True).block(key, 60)
        decision = await arl.SlidingWindow("5/second", backend=two, blockable=True).hit(key)
        assert not decision.allowed
        assert decision.retry_after > 59


# -- refund --------------------------------------------------------------------------------


async def test_refund_gives_back_to_every_rate(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """A refund gives back what admitted hits counted, under every rate, never below zero."""
    limiter = build("3/minute", "5/hour", backend=backend)
    for _ in range(3):
        assert (await limiter.hit(key)).allowed
    assert not (await limiter.peek(key)).allowed
    assert await limiter.refund(key, 2) == 2
    after = await limiter.peek(key)
    assert after.allowed
    assert after.remaining == 1  # (the peek's own cost of 1 taken off)
    assert await limiter.refund(key, 3) == 1  # only one was still counted
    assert (await limiter.peek(key)).remaining == 2
    assert await limiter.refund(key, 1) == 0  # nothing counted: nothing to give
    for _ in range(3):
        assert (await limiter.hit(key)).allowed
    assert not (await limiter.hit(key)).allowed


async def test_refund_counts_only_failed_logins(backend: arl.Backend, key: str) -> None:
    """The recipe: hit on every attempt, refund the ones that succeed."""
    attempts = arl.FixedWindow("3/minute", backend=backend)
    for succeeded in (True, True, False, True, False, False):
        assert (await attempts.hit(key)).allowed
        if succeeded:
            await attempts.refund(key)
    assert not (await attempts.hit(key)).allowed


async def test_refund_of_a_token_bucket_moves_the_tat_back(backend: arl.Backend, key: str) -> None:
    """A TokenBucket refund refills tokens but never beyond a full bucket."""
    bucket = arl.TokenBucket("4/minute", backend=backend)
    await bucket.hit(key, 3)
    assert await bucket.refund(key, 2) == 2
    assert (await bucket.peek(key)).remaining == 2
    assert await bucket.refund(key, 4) == 1
    assert (await bucket.peek(key)).remaining == 3  # full, less the peek's cost


# -- count_denied --------------------------------------------------------------------------


async def test_count_denied_keeps_a_hammering_client_denied(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """With count_denied, denied hits count: after hammering, the limit stays used up longer
    than it would for a client that stopped at the limit."""
    calm = build("2/400ms", backend=backend, name="calm")
    strict = build("2/400ms", backend=backend, name="strict", count_denied=True)
    assert strict.count_denied
    for limiter in (calm, strict):
        assert (await limiter.hit(key, 2)).allowed
    hammer = [await strict.hit(key) for _ in range(4)]
    assert not any(d.allowed for d in hammer)
    for _ in range(4):
        assert not (await calm.hit(key)).allowed
    # A refund of one does not reopen the strict limiter: the denied hits counted too.
    await calm.refund(key)
    await strict.refund(key)
    assert (await calm.peek(key)).allowed
    assert not (await strict.peek(key)).allowed


async def test_count_denied_fixed_window_counts_past_the_limit(
    backend: arl.Backend, key: str
) -> None:
    """A FixedWindow with count_denied counts denied hits into the open window."""
    strict = arl.FixedWindow("2/minute", backend=backend, count_denied=True)
    for _ in range(5):
        await strict.hit(key)
    assert await strict.refund(key, 2) == 2
    assert not (await strict.peek(key)).allowed  # 5 counted, 3 left after the refund


# -- partial grants ------------------------------------------------------------------------


async def test_partial_grants_what_the_tightest_rate_allows(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """hit(key, cost, partial=True) admits as much as every rate allows and says how much."""
    limiter = build("5/minute", "8/hour", backend=backend)
    first = await limiter.hit(key, 3, partial=True)
    assert (first.allowed, first.granted, first.remaining) == (True, 3, 2)
    second = await limiter.hit(key, 10, partial=True)  # above the limit: what is left
    assert (second.allowed, second.granted, second.remaining) == (True, 2, 0)
    third = await limiter.hit(key, 4, partial=True)
    assert (third.allowed, third.granted) == (False, 0)
    assert third.retry_after > 0
    peeked = await limiter.peek(key, 4, partial=True)
    assert (peeked.allowed, peeked.granted) == (False, 0)


async def test_partial_is_limited_by_the_fuller_rate(backend: arl.Backend, key: str) -> None:
    """With several rates, the grant is what the fullest rate leaves, whichever it is."""
    minute_tighter = arl.FixedWindow("5/minute", "6/hour", backend=backend, name="a")
    assert (await minute_tighter.hit(key, 4)).allowed
    assert (await minute_tighter.hit(key, 5, partial=True)).granted == 1
    hour_tighter = arl.SlidingWindow("10/minute", "3/hour", backend=backend, name="b")
    assert (await hour_tighter.hit(key, 5, partial=True)).granted == 3


async def test_whole_hits_report_their_grant(backend: arl.Backend, build: Build, key: str) -> None:
    """A whole hit's granted is its cost when admitted, 0 when denied."""
    limiter = build("3/minute", backend=backend)
    assert (await limiter.hit(key, 2)).granted == 2
    assert (await limiter.hit(key, 2)).granted == 0


# -- TTLs ----------------------------------------------------------------------------------


async def test_every_key_written_has_a_ttl(
    backend: arl.Backend, build: Build, key: str, sync_redis: redis.Redis
) -> None:
    """Blocks, refunds, counted denials and partial grants leave no key without a TTL."""
    limiter = build("2/minute", "3/hour", backend=backend, count_denied=True, blockable=True)
    await limiter.hit(key, 5, partial=True)
    for _ in range(3):
        await limiter.hit(key)
    await limiter.refund(key)
    await limiter.block(key, 30)
    found = ttls(backend, sync_redis, key)
    assert found, "no key written"
    assert all(ttl > 0 for ttl in found.values()), found


# -- bad input -----------------------------------------------------------------------------


BAD_SECONDS: list[tuple[Any, type[Exception]]] = [
    (-1, ValueError),
    (0, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
]
BAD_SECONDS += [("1", TypeError), (None, TypeError), (True, TypeError)]
BAD_COSTS: list[tuple[Any, type[Exception]]] = [
    (0, ValueError),
    (-1, ValueError),
    (1.5, TypeError),
    (math.nan, TypeError),
]
BAD_COSTS += [("1", TypeError), (True, TypeError)]


@pytest.mark.parametrize(("seconds", "error"), BAD_SECONDS)
async def test_bad_block_seconds_raise_before_any_io(
    backend: arl.Backend, build: Build, key: str, seconds: Any, error: type[Exception]
) -> None:
    """Negative, zero, NaN, infinite or non-number seconds: refused, nothing sent."""
    limiter = build("5/second", backend=backend, blockable=True)
    calls = Calls(backend)
    with pytest.raises(error):
        await limiter.block(key, seconds)
    assert calls.names == []


@pytest.mark.parametrize(("cost", "error"), [*BAD_COSTS, (6, ValueError)])
async def test_bad_refund_costs_raise_before_any_io(
    backend: arl.Backend, build: Build, key: str, cost: Any, error: type[Exception]
) -> None:
    """A refund of a negative, NaN or non-int cost, or of more than one hit could ever have
    counted (above the limit): refused, nothing sent."""
    limiter = build("5/second", backend=backend)
    calls = Calls(backend)
    with pytest.raises(error):
        await limiter.refund(key, cost)
    assert calls.names == []


@pytest.mark.parametrize(("cost", "error"), BAD_COSTS)
async def test_bad_partial_costs_raise_before_any_io(
    backend: arl.Backend, build: Build, key: str, cost: Any, error: type[Exception]
) -> None:
    """A partial hit may ask for more than the limit, but not for a bad cost."""
    limiter = build("5/second", backend=backend)
    calls = Calls(backend)
    with pytest.raises(error):
        await limiter.hit(key, cost, partial=True)
    assert calls.names == []


async def test_bad_options_raise_before_any_io(backend: arl.Backend, key: str) -> None:
    """``partial`` and ``count_denied`` must be bools; an empty key is refused."""
    limiter = arl.FixedWindow("5/second", backend=backend)
    calls = Calls(backend)
    with pytest.raises(TypeError, match="partial"):
        await limiter.hit(key, 1, partial=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="partial"):
        await limiter.peek(key, 1, partial="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="count_denied"):
        arl.TokenBucket("5/second", backend=backend, count_denied=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="blockable"):
        arl.SlidingWindow("5/second", backend=backend, blockable=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="blockable=True"):
        await limiter.block(key, 1.0)  # its hits read no block
    blockable = arl.FixedWindow("5/second", backend=backend, blockable=True)
    for call in (blockable.block("", 1.0), limiter.refund("", 1)):
        with pytest.raises(ValueError, match="key"):
            await call
    assert calls.names == []
