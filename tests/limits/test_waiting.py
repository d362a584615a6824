"""Waiting that scales (``_limits.waiting``): ``acquire(wait=True)``, ``async with limiter(key,
wait=True)`` and ``@limiter.limit(wait=True)`` cost one or two script calls per admitted
request (counted with the backend's ``on_call`` hook), admit a process's waiters first come
first served, and a TokenBucket waiter cancelled in its sleep gives its booked slot back."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.pace import now, pace, until

import aioratelimit as arl

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_waiting.py"


def rate(b: arl.Backend) -> str:
    """The waiters' rate: a window of 50 ms on memory:// (a call takes microseconds, and a
    waiter late from its sleep finds room, never a fuller window), 100 ms on a network."""
    return pace(b, network="5/100ms", memory="5/50ms")


KINDS: dict[str, Callable[[arl.Backend, str], arl.Limiter]] = {
    "fixed": lambda b, r: arl.FixedWindow(r, backend=b),
    "sliding": lambda b, r: arl.SlidingWindow(r, backend=b),
    "token": lambda b, r: arl.TokenBucket(r, burst=1, backend=b),
}
BLOCKABLE: dict[str, Callable[[arl.Backend], arl.Limiter]] = {
    "fixed": lambda b: arl.FixedWindow(rate(b), backend=b, blockable=True),
    "sliding": lambda b: arl.SlidingWindow(rate(b), backend=b, blockable=True),
    "token": lambda b: arl.TokenBucket(rate(b), burst=1, backend=b, blockable=True),
}
#: what uses the limit up before the waiters come
FULL = {"fixed": 5, "sliding": 5, "token": 1}
WAITERS = 12


class Counted:
    """A backend whose script calls are counted by its ``on_call`` hook (memory:// too)."""

    def __init__(self, url: str) -> None:
        self.calls = 0
        self.backend = arl.Backend.from_url(url, on_call=self.count)

    def count(self, call: object) -> None:
        self.calls += 1


@pytest.fixture
async def counted(backend: arl.Backend, backend_url: str) -> AsyncIterator[Counted]:
    """A counted backend on each deployment (``backend`` gives the parameter and marks)."""
    c = Counted(backend_url)
    try:
        yield c
    finally:
        await c.backend.aclose()


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


Entry = Callable[[arl.Limiter, str], Awaitable[None]]


async def by_acquire(limiter: arl.Limiter, key: str) -> None:
    await limiter.acquire(key, wait=True, timeout=30)


async def by_async_with(limiter: arl.Limiter, key: str) -> None:
    async with limiter(key, wait=True, timeout=30) as decision:
        assert decision.allowed


async def by_decorator(limiter: arl.Limiter, key: str) -> None:
    @limiter.limit(key, wait=True, timeout=30)
    async def job() -> None:
        return None

    await job()


ENTRIES: dict[str, Entry] = {
    "acquire": by_acquire,
    "async-with": by_async_with,
    "decorator": by_decorator,
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
async def test_waiters_cost_at_most_two_calls_each_and_go_in_order(
    counted: Counted, kind: str, entry: str, key: str
) -> None:
    """12 waiters on a used-up key: a TokenBucket's cost exactly one script call each (a
    booking), a window's at most two; each is admitted in the order it asked."""
    limiter = KINDS[kind](counted.backend, rate(counted.backend))
    assert (await limiter.hit(key, FULL[kind])).allowed
    counted.calls = 0
    admitted: list[int] = []

    async def waiter(i: int) -> None:
        await ENTRIES[entry](limiter, key)
        admitted.append(i)

    tasks = []
    for i in range(WAITERS):
        tasks.append(asyncio.create_task(waiter(i)))
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert admitted == list(range(WAITERS))
    if kind == "token":
        assert counted.calls == WAITERS
    else:
        assert WAITERS <= counted.calls <= 2 * WAITERS


async def test_a_cancelled_booking_gives_its_slot_back(counted: Counted, key: str) -> None:
    """A TokenBucket waiter cancelled while it sleeps towards its slot refunds it: the next
    waiter books the same slot, not the one after."""
    bucket = arl.TokenBucket("1/2s", backend=counted.backend)
    assert (await bucket.hit(key)).allowed
    first = asyncio.create_task(bucket.acquire(key, wait=True))
    # Until the booking's reply came (a call is counted once over; a fixed pause could end
    # before it on a loaded machine); it then sleeps ~2 s.
    await until(lambda: counted.calls >= 2, what="the booking's reply")
    assert counted.calls == 2  # the hit, then the booking
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    peek = await bucket.peek(key)
    # The slot booked (about 2 s ahead) was given back: the next is about 2 s ahead, not 4.
    assert peek.retry_after <= 2.0


async def test_a_waiter_behind_the_head_times_out_in_the_line(
    counted: Counted, kind: str, key: str
) -> None:
    """A waiter queued behind the head raises RateLimited once its timeout has passed (a
    bound, with a generous margin), and the line goes on without it."""
    # 100 ms on every store: the line must still hold this waiter when its 10 ms are up,
    # even when it comes late after the hit (the window ends 100 ms after it, the second
    # token of a TokenBucket comes 40 ms after it).
    limiter = KINDS[kind](counted.backend, "5/100ms")
    assert (await limiter.hit(key, FULL[kind])).allowed
    head = asyncio.create_task(limiter.acquire(key, wait=True, timeout=30))
    await asyncio.sleep(0)
    started = now()
    with pytest.raises(arl.RateLimited):
        await limiter.acquire(key, wait=True, timeout=0.01)
    assert now() - started < 0.01 + 1.0
    assert (await head).allowed
    assert (await limiter.acquire(key, wait=True, timeout=30)).allowed


async def test_a_blocked_key_keeps_its_waiters_until_the_block_ends(
    counted: Counted, kind: str, key: str
) -> None:
    """Waiters of a blocked key sleep through the block (no polling), then get in."""
    limiter = BLOCKABLE[kind](counted.backend)
    await limiter.block(key, pace(counted.backend, network=0.2, memory=0.1))
    counted.calls = 0
    decisions = await asyncio.gather(
        *(limiter.acquire(key, wait=True, timeout=30) for _ in range(3))
    )
    assert all(d.allowed for d in decisions)
    assert counted.calls <= 2 * 3


# -- across processes ------------------------------------------------------------------------


def workers(redis_url: str, prefix: str, kind: str, n: int, start: float) -> list[Any]:
    command = [sys.executable, str(BENCH), "--worker", redis_url, prefix, kind, "ours"]
    procs = [
        subprocess.Popen(
            [*command, str(n), repr(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for proc, (_, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    return [json.loads(out) for out, _ in outs]


@pytest.mark.slow
@pytest.mark.parametrize("limiter_kind", ["sliding", "token"])
async def test_three_processes_cost_at_most_two_calls_per_admitted_request(
    redis_url: str, limiter_kind: str
) -> None:
    """3 processes x 8 waiters on one used-up key of 20/second (bench_waiting's workers):
    a TokenBucket(burst=1) costs one script call per admitted request, a SlidingWindow at
    most two, and each process admits its own in the order they asked."""
    prefix = f"tw{uuid.uuid4().hex[:10]}"
    start = time.time() + 1.5
    run = asyncio.to_thread(workers, redis_url, prefix, limiter_kind, 8, start)
    async with arl.Backend.from_url(redis_url, prefix=prefix) as backend:
        limiter: arl.Limiter
        if limiter_kind == "sliding":
            limiter = arl.SlidingWindow("20/second", backend=backend)
        else:
            limiter = arl.TokenBucket("20/second", burst=1, backend=backend)
        await limiter.peek("k")
        task = asyncio.ensure_future(run)
        await asyncio.sleep(max(0.0, start - 0.02 - time.time()))
        await limiter.hit("k", 20 if limiter_kind == "sliding" else 1)
        results = await task
        await limiter.reset("k")
    calls = sum(r["calls"] for r in results)
    assert all(r["fifo"] for r in results)
    if limiter_kind == "token":
        assert calls == 3 * 8
    else:
        assert calls <= 2 * 3 * 8
