"""Exactness under concurrency: however many callers race for a limit, exactly the limit is
admitted; and a burst far larger than the pool waits for connections instead of failing."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from support import loops
from support.servers import RedisServer

import aioratelimit as arl

#: Each algorithm at a limit of 100 over a window long enough that nothing refills during
#: the test, however loaded the machine is.
LIMITERS: dict[str, Callable[[arl.Backend], Any]] = {
    "fixed": lambda backend: arl.FixedWindow("100/hour", backend=backend),
    "sliding": lambda backend: arl.SlidingWindow("100/hour", backend=backend),
    "token": lambda backend: arl.TokenBucket("100/hour", backend=backend),
}


@pytest.mark.parametrize("kind", sorted(LIMITERS))
async def test_200_concurrent_hits_admit_exactly_100(
    backend: arl.Backend, key: str, kind: str
) -> None:
    """200 hits racing on one key with limit 100 admit exactly 100."""
    limiter = LIMITERS[kind](backend)
    decisions = await asyncio.gather(*(limiter.hit(key) for _ in range(200)))
    assert sum(d.allowed for d in decisions) == 100
    assert sorted(d.remaining for d in decisions if d.allowed) == list(range(100))
    assert (await limiter.peek(key)).allowed is False


@pytest.mark.parametrize("kind", sorted(LIMITERS))
async def test_concurrent_costs_never_overshoot(backend: arl.Backend, key: str, kind: str) -> None:
    """Racing hits of costs 1..7 are admitted up to the limit and never past it."""
    limiter = LIMITERS[kind](backend)
    costs = [1 + i % 7 for i in range(60)]  # 240 in all
    decisions = await asyncio.gather(*(limiter.hit(key, c) for c in costs))
    taken = sum(c for c, d in zip(costs, decisions, strict=True) if d.allowed)
    assert 100 - 6 <= taken <= 100  # every denied cost > what was left, so at most 6 lost
    assert (await limiter.peek(key, 1)).allowed == (taken < 100)


def _hammer(
    url: str,
    prefix: str,
    keys: dict[str, str],
    tasks: int,
    barrier: Any,
    results: Any,
) -> None:
    """One process: its own Backend; ``tasks`` concurrent hits on each algorithm's key, all
    fired once every process is ready. Puts {kind: admitted} on ``results``."""

    async def main() -> dict[str, int]:
        async with arl.Backend.from_url(url, prefix=prefix, max_connections=tasks) as backend:
            limiters = {kind: make(backend) for kind, make in LIMITERS.items()}
            # Open the connections before the race, so the race is about the scripts.
            await asyncio.gather(*(limiters["fixed"].peek(keys["fixed"]) for _ in range(tasks)))
            await asyncio.to_thread(barrier.wait, 60)
            admitted = {}
            for kind, limiter in limiters.items():
                decisions = await asyncio.gather(*(limiter.hit(keys[kind]) for _ in range(tasks)))
                admitted[kind] = sum(d.allowed for d in decisions)
            return admitted

    results.put(loops.run(main()))


@pytest.mark.slow
async def test_4_processes_of_50_tasks_admit_exactly_100(redis_url: str) -> None:
    """4 processes x 50 concurrent hits on limit 100 admit exactly 100, per algorithm."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    prefix = f"mp-{uuid.uuid4().hex[:8]}"
    keys = {kind: f"{kind}-{uuid.uuid4().hex[:8]}" for kind in LIMITERS}
    procs = [
        ctx.Process(target=_hammer, args=(redis_url, prefix, keys, 50, barrier, results))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    try:
        counts = [await asyncio.to_thread(results.get, True, 120) for _ in procs]
    finally:
        for p in procs:
            await asyncio.to_thread(p.join, 30)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        results.join_thread()
    assert all(p.exitcode == 0 for p in procs)
    for kind in LIMITERS:
        assert sum(c[kind] for c in counts) == 100, (kind, counts)
        assert all(0 <= c[kind] <= 50 for c in counts)
    async with arl.Backend.from_url(redis_url, prefix=prefix) as backend:
        for kind, make in LIMITERS.items():
            assert (await make(backend).peek(keys[kind])).allowed is False


async def test_burst_of_1000_through_4_connections_never_fails(
    own_redis: RedisServer, key: str
) -> None:
    """1,000 concurrent hits through 4 pooled connections all get a decision, none fails."""
    # Callers past the 4th wait for a free connection (within the default timeout) instead
    # of failing with "too many connections"; the server never sees more than 4.
    async with arl.Backend.from_url(own_redis.url, max_connections=4) as backend:
        limiter = arl.FixedWindow("500/hour", backend=backend)
        decisions = await asyncio.gather(*(limiter.hit(key) for _ in range(1000)))
        assert len(decisions) == 1000
        assert sum(d.allowed for d in decisions) == 500
        inspector = own_redis.client()
        try:
            clients = inspector.client_list()
        finally:
            inspector.close()
        assert 1 <= len(clients) - 1 <= 4  # the inspector itself is one client
