"""Calls through the public API that the TLS and ACL tests run on a backend: a contended
hand-off of a lock or semaphore slot, and a conformance core touching every primitive.

Both only use ``aioratelimit``'s public names, so they mean the same on any transport
(and pace.asleep, which reads the backend's notifier to know when a waiter sleeps).
"""

from __future__ import annotations

import asyncio

import pytest

import aioratelimit as arl

from .pace import asleep

#: A waiter woken by pub/sub gets the lock within milliseconds of the release; without the
#: wake-up it would sleep until its fallback timer (1 s, the holder's TTL being 30 s).
WOKEN_WITHIN = 0.5


async def contended_handoff(resource: arl.Lock | arl.Semaphore) -> float:
    """Seconds from a holder's release to the success of an acquire that was already
    waiting (subscribed and asleep) when the release came."""
    holder = await resource.acquire()
    loop = asyncio.get_running_loop()
    waiter = asyncio.create_task(resource.acquire(timeout=10))
    try:
        await asleep(resource.backend, waiter=waiter)  # it has tried, subscribed and sleeps
        released = loop.time()
        await holder.release()
        lease = await waiter
        took = loop.time() - released
        await lease.release()
        return took
    finally:
        if not waiter.done():
            waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)


async def conformance_core(backend: arl.Backend, key: str) -> None:
    """Hits, peeks and resets on all three limiters (and a crowd of them at once, which a
    server decides in batches), a lock and a semaphore handed to a waiter woken by pub/sub,
    a renewed lock, one-shot tokens, and ``@idempotent`` calls (a replay, a failed call
    freeing its key, and a waiter given the first call's result)."""
    for limiter in (
        arl.FixedWindow("2/minute", backend=backend),
        arl.SlidingWindow("2/minute", backend=backend),
        arl.TokenBucket("2/minute", backend=backend),
    ):
        assert [(await limiter.hit(key)).allowed for _ in range(3)] == [True, True, False]
        assert not (await limiter.peek(key)).allowed
        await limiter.reset(key)
        assert (await limiter.hit(key)).remaining == 1
        crowd = await asyncio.gather(*(limiter.hit(f"{key}-{i % 5}") for i in range(30)))
        assert sorted(d.remaining for d in crowd if d.allowed) == [0] * 5 + [1] * 5

    lk = arl.Lock(key, ttl=30, backend=backend)
    assert min([await contended_handoff(lk) for _ in range(2)]) < WOKEN_WITHIN
    async with arl.lock(key, ttl=30, timeout=5, backend=backend) as lease:  # renewed
        assert await lk.locked()
        await lease.extend()
    assert not await lk.locked()
    sem = arl.Semaphore(key, limit=1, ttl=30, backend=backend)
    assert min([await contended_handoff(sem) for _ in range(2)]) < WOKEN_WITHIN

    token = await arl.issue_token(ttl=60, subject="alice", backend=backend)
    assert not await arl.consume_token(token, subject="bob", backend=backend)
    assert await arl.consume_token(token, subject="alice", backend=backend)
    assert not await arl.consume_token(token, subject="alice", backend=backend)

    runs: list[int] = []

    @arl.idempotent(key=lambda n: f"{key}:{n}", backend=backend)
    async def charge(n: int) -> dict[str, int]:
        runs.append(n)
        if len(runs) == 1:
            raise RuntimeError("the first attempt fails")
        return {"n": n}

    with pytest.raises(RuntimeError):
        await charge(1)
    assert await charge(1) == {"n": 1}  # the failed call freed the key: it runs again
    assert await charge(1) == {"n": 1}  # replayed
    assert runs == [1, 1]

    running, gate = asyncio.Event(), asyncio.Event()

    @arl.idempotent(key=f"{key}:slow", wait=True, backend=backend)
    async def slow() -> str:
        running.set()
        await gate.wait()
        return "done"

    first = asyncio.create_task(slow())
    await running.wait()  # the first call holds the key
    second = asyncio.create_task(slow())  # waits for the first one's result
    await asleep(backend, waiter=second)
    gate.set()
    assert list(await asyncio.wait_for(asyncio.gather(first, second), 10)) == ["done", "done"]
