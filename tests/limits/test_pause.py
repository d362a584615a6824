"""A shared pause (``Pause``) on every backend: set from one process (a backend of its own on
the same server), honoured by the limiters of another without a round trip once known,
extended and never shortened, lifted everywhere, waited out by waiters; bad input refused
before any I/O."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from support.counting import Calls
from support.pace import until

import aioratelimit as arl
from aioratelimit import _keys, _observe
from aioratelimit.testing import default_backend

KINDS: dict[str, Callable[..., arl.Limiter]] = {
    "fixed": lambda **kw: arl.FixedWindow("5/hour", **kw),
    "sliding": lambda **kw: arl.SlidingWindow("5/hour", **kw),
    "token": lambda **kw: arl.TokenBucket("5/hour", **kw),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_pause_set_elsewhere_denies_everywhere_until_lifted(
    backend: arl.Backend, other: arl.Backend, key: str, kind: str
) -> None:
    """A pause started by one process denies every hit of a limiter that declares it in
    another (source "pause", nothing counted, no round trip once known); lifting it
    admits again, in every process."""
    upstream = arl.Pause(f"api-{key}", backend=other)
    limiter = KINDS[kind](backend=backend, name=f"p-{key}", pause=f"api-{key}")
    assert (await limiter.hit(key)).allowed  # listening from here on
    assert await upstream.start(30) == 30.0
    mine = arl.Pause(f"api-{key}", backend=backend)
    await until(lambda: mine.known() > 0, what="the pause heard")
    calls = Calls(backend)
    for _ in range(10):
        d = await limiter.hit(key)
        assert (d.allowed, d.source, d.remaining, d.granted) == (False, "pause", 0, 0)
        assert 0 < d.retry_after <= 30.0
        assert d.retry_after == d.reset_after
    assert not (await limiter.peek(key)).allowed
    assert calls.count == 0  # known locally: no round trip
    await upstream.lift()
    await until(lambda: mine.known() == 0, what="the lift heard")
    d = await limiter.hit(key)
    assert (d.allowed, d.remaining) == (True, 3)  # the denied hits counted nothing
    assert await upstream.remaining() == 0.0


async def test_a_limiter_first_asking_reads_a_pause_already_running(
    backend: arl.Backend, other: arl.Backend, key: str
) -> None:
    """A process that starts listening while a pause runs learns it before its first
    decision (the read after subscribing), without any message."""
    await arl.Pause(f"api-{key}", backend=other).start(60)
    limiter = arl.FixedWindow("5/hour", backend=backend, pause=arl.Pause(f"api-{key}"))
    with default_backend(backend):  # the Pause has no backend of its own: the default one
        d = await limiter.hit(key)
    assert (d.allowed, d.source) == (False, "pause")
    assert 50 < d.retry_after <= 60


async def test_a_pause_is_extended_never_shortened(backend: arl.Backend, key: str) -> None:
    """A later, shorter Retry-After keeps the longer pause; a longer one extends it."""
    p = arl.Pause(f"api-{key}", backend=backend)
    assert await p.start(60) == 60.0
    left = await p.start(1)
    assert 50 < left <= 60
    assert 50 < await p.remaining() <= 60
    assert await p.start(120) == 120.0
    assert 110 < await p.remaining() <= 120
    await p.lift()
    assert await p.remaining() == 0.0
    await p.lift()  # lifting none is harmless


async def test_waiters_sleep_until_the_pause_ends(backend: arl.Backend, key: str) -> None:
    """``acquire(wait=True)`` waits a running pause out (then is admitted), and refuses at
    once when the pause outlasts its timeout."""
    p = arl.Pause(f"api-{key}", backend=backend)
    for kind in sorted(KINDS):
        limiter = KINDS[kind](backend=backend, name=f"{kind}-{key}", pause=p)
        await limiter.hit(key)  # listening
        await p.start(0.2)
        d = await limiter.acquire(key, wait=True, timeout=30)
        assert d.allowed
        assert d.source == "redis"
        assert await p.remaining() == 0.0  # admitted only once the pause had ended
        await p.start(60)
        with pytest.raises(arl.RateLimited) as caught:
            await limiter.acquire(key, wait=True, timeout=1)
        assert caught.value.decision is not None
        assert caught.value.decision.source == "pause"
        await p.lift()


async def test_shadow_mode_admits_through_a_pause(backend: arl.Backend, key: str) -> None:
    p = arl.Pause(f"api-{key}", backend=backend)
    limiter = arl.FixedWindow("5/hour", backend=backend, pause=p, shadow=True)
    await p.start(30)
    d = await limiter.hit(key)
    assert (d.allowed, d.shadow, d.shadow_denied, d.source) == (True, True, True, "pause")


async def test_a_paused_denial_is_reported_as_paused(backend: arl.Backend, key: str) -> None:
    seen: list[str] = []

    class Recorder(arl.Recorder):
        def decision(self, limiter: str | None, algorithm: str, result: str, *a: Any) -> None:
            seen.append(result)

    p = arl.Pause(f"api-{key}", backend=backend)
    limiter = arl.FixedWindow("5/hour", backend=backend, name="reported", pause=p)
    await p.start(30)
    arl.set_recorder(Recorder())
    try:
        await limiter.hit(key)  # the first: read through ``decide``
        await limiter.hit(key)  # known: answered at once
    finally:
        arl.set_recorder(None)
    assert seen == [_observe.PAUSED, _observe.PAUSED]


async def test_bad_input_is_refused_before_any_io(backend: arl.Backend) -> None:
    calls = Calls(backend)
    with pytest.raises(ValueError, match="name"):
        arl.Pause("")
    with pytest.raises(TypeError):
        arl.Pause(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        arl.Pause("x", backend="redis://")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        arl.FixedWindow("5/hour", pause=3)  # type: ignore[arg-type]
    p = arl.Pause("x", backend=backend)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="seconds"):
            await p.start(bad)
    with pytest.raises(TypeError):
        await p.start("5")  # type: ignore[arg-type]
    assert calls.count == 0


async def test_a_stranger_message_makes_the_listener_read_again(redis_url: str, key: str) -> None:
    """A message on the pause's channel that is not the script's (anyone who may PUBLISH
    can send one) is not believed: the listener reads the server again, which says what
    holds."""
    async with arl.Backend.from_url(redis_url) as backend:
        p = arl.Pause(f"api-{key}", backend=backend)
        limiter = arl.FixedWindow("5/hour", backend=backend, pause=p)
        await p.start(60)
        assert not (await limiter.hit(key)).allowed
        reads = Calls(backend)
        _, channel = _keys.pause(backend._head(_keys.PAUSE_KIND), p.name)
        client = redis.Redis.from_url(redis_url)
        try:
            client.publish(channel, "999999999999")  # 11 days: not true
            await until(lambda: reads.count > 0, what="the pause read again")
            client.publish(channel, "")  # a lift: not true either
            await until(lambda: reads.count > 1, what="the pause read again")
        finally:
            client.close()
        assert 0 < p.known() <= 60
        assert not (await limiter.hit(key)).allowed
