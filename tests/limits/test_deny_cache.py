"""The local deny cache (``deny_cache=size``): denied hits answered in-process, exactly.

On every backend: a cached denial says what the backend says (a plain limiter's ``peek``
agrees), counts down, ends when the backend would admit again, is forgotten at once by a
``reset`` here and, through the backend's pub/sub, by a reset made over another backend
(another process); a flood of 64 tasks on one key costs one denied script call per retry
window; the cache holds at most ``size`` keys.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis
from support.pace import pace, until
from support.servers import RedisServer

import aioratelimit as arl
from aioratelimit._limits import deny_cache
from aioratelimit._scripts import Arg, Reply, Script

Make = Callable[..., arl.Limiter]

ALGORITHMS: dict[str, Make] = {
    "fixed": lambda rate, **kw: arl.FixedWindow(rate, **kw),
    "sliding": lambda rate, **kw: arl.SlidingWindow(rate, **kw),
    "token": lambda rate, **kw: arl.TokenBucket(rate, **kw),
}


@pytest.fixture(params=sorted(ALGORITHMS))
def make(request: pytest.FixtureRequest) -> Make:
    return ALGORITHMS[request.param]


class Counting:
    """Counts the limiter scripts run through ``backend`` and the denials among them."""

    def __init__(self, backend: arl.Backend) -> None:
        self.calls = 0
        self.denied = 0
        #: (when the denied call started, on the deny cache's clock; its retry_after in s)
        self.denials: list[tuple[float, float]] = []
        inner = backend._run

        async def run(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
            started = deny_cache.clock()
            reply = await inner(script, keys, args)
            if script.name in ("fixed_window", "sliding_window", "token_bucket"):
                self.calls += 1
                if reply[0] != 1:
                    self.denied += 1
                    self.denials.append((started, reply[4] / 1e6))
            return reply

        backend._run = run


async def cached_denial(limiter: arl.Limiter, key: str, limit: int) -> arl.Decision:
    """Use up ``key`` and hit until a denial comes from the cache (bounded)."""
    for _ in range(limit):
        assert (await limiter.hit(key)).allowed
    for _ in range(200):
        d = await limiter.hit(key)
        assert not d.allowed
        if d.source == "cache":
            return d
        await asyncio.sleep(0.01)  # the key's subscription is being confirmed
    raise AssertionError("no denial ever came from the cache")


async def test_cached_denials_agree_with_the_backend_and_count_down(
    backend: arl.Backend, make: Make, key: str
) -> None:
    """Once cached, denials cost no script call, count down, and a plain limiter's peek
    on the same key denies too; the first hit after retry_after goes to the backend."""
    # The denial holds the warm-up and the 20 cached hits and 20 peeks below: on memory://
    # they take about 20 ms, and a denial lasts 250-300 ms (a TokenBucket's, one token, a
    # third of its window); across a network 40 round trips get 667 ms or more.
    token = make is ALGORITHMS["token"]
    rate = pace(backend, network="3/2s", memory="3/750ms" if token else "3/300ms")
    limiter = make(rate, backend=backend, deny_cache=100)
    plain = make(rate, backend=backend)
    first = await cached_denial(limiter, key, 3)
    counting = Counting(backend)
    seen = [first]
    for _ in range(20):
        d = await limiter.hit(key)
        seen.append(d)
        assert (not d.allowed, d.source, d.limit) == (True, "cache", 3)
        assert not (await plain.peek(key)).allowed  # the backend agrees, later still
    assert counting.calls == 20  # the plain peeks only
    retries = [d.retry_after for d in seen]
    assert retries == sorted(retries, reverse=True)
    assert retries[-1] > 0
    await asyncio.sleep(seen[-1].retry_after + 0.05)
    after = await limiter.hit(key)
    assert after.source == "redis"
    assert after.allowed
    assert counting.calls == 21


async def test_reset_here_forgets_at_once(backend: arl.Backend, make: Make, key: str) -> None:
    """``reset`` in this process: the very next hit is admitted by the backend."""
    limiter = make("2/hour", backend=backend, deny_cache=10)
    await cached_denial(limiter, key, 2)
    await limiter.reset(key)
    d = await limiter.hit(key)
    assert (d.allowed, d.source) == (True, "redis")


async def test_reset_elsewhere_reaches_the_cache(
    backend: arl.Backend, backend_url: str, make: Make, key: str
) -> None:
    """A reset made over another backend (as by another process) reaches this limiter's
    cache through pub/sub: it is admitted again soon after, by the backend."""
    limiter = make("2/hour", backend=backend, deny_cache=10)
    await cached_denial(limiter, key, 2)
    other = backend if backend_url == "memory://" else arl.Backend.from_url(backend_url)
    try:
        await make("2/hour", backend=other).reset(key)
        for _ in range(500):  # up to 5 s for the message
            d = await limiter.hit(key)
            if d.allowed:
                break
            await asyncio.sleep(0.01)
        assert (d.allowed, d.source) == (True, "redis")
    finally:
        if other is not backend:
            await other.aclose()


async def test_a_flood_costs_one_denied_call_per_retry_window(
    backend: arl.Backend, key: str
) -> None:
    """64 tasks hitting one key for several windows: at most one denied script call per
    retry window (the others share it or read the cache), and never more admitted than the
    limit per window."""
    # Four windows whatever their length: a quarter of a second each on memory://, where a
    # call takes microseconds and no round trip of the flood lasts into the next window.
    window, limit, windows = pace(backend, network=0.5, memory=0.25), 5, 4
    limiter = arl.FixedWindow(arl.Rate(limit, window), backend=backend, deny_cache=100)
    await cached_denial(limiter, key, limit)  # warm: the key is subscribed
    counting = Counting(backend)
    loop = asyncio.get_running_loop()
    end = loop.time() + windows * window
    admitted = 0

    async def flood() -> None:
        nonlocal admitted
        while loop.time() < end:
            allowed = (await limiter.hit(key)).allowed  # (not `+= await`: a lost update)
            admitted += allowed
            await asyncio.sleep(0)  # a cached answer never yields: let the others run

    await asyncio.gather(*(flood() for _ in range(64)))
    spanned = windows + 2  # a window started before the flood, one may start at its end
    assert admitted <= limit * spanned
    # One denied call per retry window: each denied call starts only once the previous
    # denial has run out (the cache holds a denial from when its call was sent, a moment
    # before the wrapper above reads the clock: 1 ms of slack for that moment).
    denials = sorted(counting.denials)
    for (before, retry), (after, _) in itertools.pairwise(denials):
        assert after >= before + retry - 0.001, (before, retry, after)
    # A denial in a window's first millisecond reports the window (reset_after never exceeds
    # it), up to 1 ms short of the end Redis keeps in whole ms: the call when it runs out is
    # denied once more, for that rest; on a loaded machine, now and then a third time.
    assert counting.denied <= 3 * spanned, (counting.denied, counting.calls)


async def test_the_cache_is_bounded(backend: arl.Backend, key: str) -> None:
    """Denials on 20 keys with ``deny_cache=3``: the cache holds 3 keys at most."""
    limiter = arl.FixedWindow("1/hour", backend=backend, deny_cache=3)
    assert limiter._guard is not None
    cache = limiter._guard.cache
    assert cache is not None
    watchers: set[asyncio.Task[None]] = set()
    for i in range(20):
        await limiter.hit(f"{key}-{i}")
        await limiter.hit(f"{key}-{i}")
        assert len(cache) <= 3
        watchers.update(e.watcher for e in cache.entries.values() if e.watcher is not None)
    # The evicted keys' watchers have left (not a fixed pause, which might end first).
    kept = {e.watcher for e in cache.entries.values()}
    async with asyncio.timeout(10):
        await asyncio.gather(*(watchers - kept), return_exceptions=True)
    assert 0 < len(cache) <= 3


@pytest.mark.parametrize("size", [0, -1])
def test_a_size_below_one_is_refused(size: int) -> None:
    """A cache size of 0 or less: ValueError at construction."""
    with pytest.raises(ValueError, match="deny_cache"):
        arl.FixedWindow("1/s", deny_cache=size)


@pytest.mark.parametrize("size", ["10", 1.5, True])
def test_a_size_not_an_int_is_refused(size: Any) -> None:
    """A cache size that is not an int: TypeError at construction."""
    with pytest.raises(TypeError, match="deny_cache"):
        arl.FixedWindow("1/s", deny_cache=size)


async def test_bad_input_is_refused_before_the_cache(key: str) -> None:
    """A cached limiter still refuses a bad key or cost, with nothing sent."""
    backend = arl.Backend.from_url("memory://")
    limiter = arl.FixedWindow("1/hour", backend=backend, deny_cache=10)
    await cached_denial(limiter, key, 1)
    counting = Counting(backend)
    for bad, exc in (("", ValueError), (None, TypeError)):
        with pytest.raises(exc):
            await limiter.hit(bad)  # type: ignore[arg-type]
    for cost, exc in ((0, ValueError), (2, ValueError), (1.0, TypeError)):
        with pytest.raises(exc):
            await limiter.hit(key, cost)  # type: ignore[arg-type]
    assert counting.calls == 0


async def test_a_lost_subscriber_connection_voids_the_cache(
    own_redis: RedisServer, key: str
) -> None:
    """The subscriber's connection is killed (a reset's message may be lost with it): the
    next hit asks the backend again, and denials are cached again once resubscribed."""
    async with arl.Backend.from_url(own_redis.url) as backend:
        limiter = arl.FixedWindow("1/hour", backend=backend, deny_cache=10)
        await cached_denial(limiter, key, 1)
        epoch = backend._notifier.epoch
        admin = redis.Redis(port=own_redis.port, socket_timeout=10)
        try:
            assert admin.client_kill_filter(_type="pubsub") >= 1
        finally:
            admin.close()
        for _ in range(500):  # the reader notices within its 1 s read timeout
            if backend._notifier.epoch != epoch:
                break
            await asyncio.sleep(0.01)
        assert backend._notifier.epoch != epoch
        counting = Counting(backend)
        d = await limiter.hit(key)
        assert (d.allowed, d.source) == (False, "redis")
        assert counting.calls == 1
        again = await cached_denial(limiter, key, 0)  # subscribed again, then cached
        assert again.source == "cache"


def _nodes(url: str) -> list[redis.Redis]:
    """A client of each server a standalone or ``redis+cluster://`` URL names."""
    if url.startswith("redis+cluster://"):
        hosts = url.removeprefix("redis+cluster://").split("/")[0].split(",")
        return [redis.Redis(host=h.rsplit(":", 1)[0], port=int(h.rsplit(":", 1)[1])) for h in hosts]
    return [redis.Redis.from_url(url)]


def _stats(nodes: list[redis.Redis]) -> tuple[int, int]:
    """(connections every node accepted so far, SUBSCRIBE and SSUBSCRIBE commands run)."""
    opened = subscribes = 0
    for node in nodes:
        opened += int(node.info("stats")["total_connections_received"])
        stats = node.info("commandstats")
        for name in ("cmdstat_subscribe", "cmdstat_ssubscribe"):
            subscribes += int(stats.get(name, {}).get("calls", 0))
    return opened, subscribes


@pytest.mark.parametrize("backend", ["redis", "cluster"], indirect=True)
async def test_a_burst_of_new_denials_is_cached_over_one_subscriber(
    backend: arl.Backend, key: str
) -> None:
    """400 keys denied at once: their 400 new channels are subscribed in a few batches on
    the one subscriber (one connection per master; never rebuilt for a new channel), so
    all 400 repeat hits are answered from the cache."""
    keys = [f"{key}-{i}" for i in range(400)]
    limiter = arl.FixedWindow("1/hour", backend=backend, deny_cache=1000)
    assert limiter._guard is not None
    cache = limiter._guard.cache
    assert cache is not None
    nodes = _nodes(backend.url)
    try:
        await asyncio.gather(*(limiter.hit(k) for k in keys))  # admitted: connections warm
        opened, subscribes = _stats(nodes)
        epoch = backend._notifier.epoch
        denied = await asyncio.gather(*(limiter.hit(k) for k in keys))
        assert not any(d.allowed for d in denied)

        def armed_or_rebuilt() -> bool:
            armed = all(e.armed_at is not None for e in cache.entries.values())
            return backend._notifier.epoch != epoch or armed

        await until(armed_or_rebuilt, what="every key's subscription confirmed")
        assert backend._notifier.epoch == epoch  # the subscriber was never rebuilt
        assert len(cache) == 400
        await asyncio.gather(*(limiter.hit(k) for k in keys))  # denied after: trusted
        again = await asyncio.gather(*(limiter.hit(k) for k in keys))
        assert collections.Counter(d.source for d in again) == {"cache": 400}
        masters = 3 if backend.url.startswith("redis+cluster://") else 1
        now_opened, now_subscribes = _stats(nodes)
        assert now_opened - opened <= masters, now_opened - opened
        if masters == 1:  # (a cluster's SSUBSCRIBE names one slot's channels at most)
            assert now_subscribes - subscribes <= 10, now_subscribes - subscribes
    finally:
        for node in nodes:
            node.close()
