"""Waiting for a lock or a semaphore at scale: the waiters of one name in one process
stand in one line where only the head asks the server, so the server's load does not grow
with the waiters, joining and leaving cost the same with 30,000 waiters as with one, the
line is first come first served, and a run of freed semaphore slots drains it one try each.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence

import pytest
from support.pace import asleep, until

import aioratelimit as arl
from aioratelimit import _keys
from aioratelimit._locks import line as _line
from aioratelimit._locks import lock as _lock
from aioratelimit._scripts import Arg, Reply, Script

ACQUIRE_SCRIPTS = ("lock_acquire", "semaphore_acquire")


class Calls:
    """The script calls a backend made, by script (its ``on_call`` hook)."""

    def __init__(self) -> None:
        self.by_script: collections.Counter[str] = collections.Counter()

    def __call__(self, call: arl.ScriptCall) -> None:
        self.by_script[call.script] += 1

    @property
    def acquires(self) -> int:
        return sum(self.by_script[name] for name in ACQUIRE_SCRIPTS)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def fallback(monkeypatch: pytest.MonkeyPatch) -> float:
    """A waiter's fallback timer of 50 ms instead of 1 s: each waiter that polled would
    poll 20 times a second."""
    monkeypatch.setattr(_lock, "FALLBACK_WAIT", 0.05)
    return 0.05


def resource(kind: str, name: str, backend: arl.Backend) -> arl.Lock | arl.Semaphore:
    if kind == "lock":
        return arl.Lock(name, ttl=60, backend=backend)
    return arl.Semaphore(name, limit=1, ttl=60, backend=backend)


def channel(res: arl.Lock | arl.Semaphore, backend: arl.Backend) -> str:
    if isinstance(res, arl.Semaphore):
        return _keys.semaphore(backend._head(_keys.SEMAPHORE_KIND), res.name)[2]
    return _keys.lock(backend._head(_keys.LOCK_KIND), res.name)[1]


def line_of(res: arl.Lock | arl.Semaphore, backend: arl.Backend) -> _line.Line | None:
    """The line of ``res`` in this process, if it has one."""
    limit = res.limit if isinstance(res, arl.Semaphore) else 0
    key = (backend._notifier, channel(res, backend), limit)
    return _line._lines.get(asyncio.get_running_loop(), {}).get(key)


async def in_line(res: arl.Lock | arl.Semaphore, backend: arl.Backend, count: int) -> None:
    """Return once ``count`` acquires wait in the line of ``res`` and its head sleeps."""
    await until(
        lambda: (found := line_of(res, backend)) is not None and len(found.waiters) == count,
        what=f"{count} waiters in line",
    )
    await asleep(backend)


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_waiters_on_a_held_name_cost_one_try_per_fallback_period(
    store_url: str, key: str, kind: str, calls: Calls, fallback: float
) -> None:
    """1,000 waiters on a held lock (or full semaphore), with a fallback timer of 50 ms,
    cost the server one try per period between them, not one per waiter (20,000 a
    second), and hold one subscription between them."""
    async with arl.Backend.from_url(store_url, on_call=calls) as backend:
        res = resource(kind, key, backend)
        holder = await res.acquire(timeout=0)
        waiters = [asyncio.ensure_future(res.acquire()) for _ in range(1000)]
        await in_line(res, backend, 1000)
        assert len(backend._notifier._subs[channel(res, backend)]) == 1
        before = calls.acquires
        await asyncio.sleep(10 * fallback)
        tries = calls.acquires - before
        assert 1 <= tries <= 10 + 3, tries  # (uvloop's timers may fire early by 1 ms)
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert line_of(res, backend) is None
        assert channel(res, backend) not in backend._notifier._subs
        await holder.release()
        assert not await res.locked()


async def test_30000_waiters_that_give_up_end_within_their_bound(
    store_url: str, key: str, calls: Calls
) -> None:
    """30,000 acquires with timeout=2 on a held lock all end in LockTimeout (none runs
    past timeout + the backend's timeout into BackendUnavailable), and only the head of
    their line ever asked the server: a few tries, not one or two per waiter."""
    async with arl.Backend.from_url(store_url, on_call=calls) as backend:
        lock = arl.Lock(key, ttl=60, backend=backend)
        holder = await lock.acquire(timeout=0)
        outcomes = await asyncio.gather(
            *(lock.acquire(timeout=2) for _ in range(30_000)), return_exceptions=True
        )
        kinds = collections.Counter(type(outcome).__name__ for outcome in outcomes)
        assert kinds == {"LockTimeout": 30_000}, kinds
        assert calls.acquires <= 1 + 2 + 2 / _lock.FALLBACK_WAIT + 2, calls.by_script
        assert line_of(lock, backend) is None
        await holder.release()


async def test_the_line_is_first_come_first_served(backend: arl.Backend, key: str) -> None:
    """Waiters get a held lock in the order they came, whoever left the line in between
    (every other one gives up from the middle of it)."""
    lock = arl.Lock(key, ttl=30, backend=backend)
    holder = await lock.acquire(timeout=0)
    order: list[int] = []

    async def wait(i: int) -> None:
        async with arl.lock(key, ttl=30, timeout=30, backend=backend):
            order.append(i)

    waiters = [asyncio.ensure_future(wait(i)) for i in range(20)]
    await in_line(lock, backend, 20)
    for i in range(1, 20, 2):
        waiters[i].cancel()
    await asyncio.gather(*waiters[1::2], return_exceptions=True)
    await holder.release()
    await asyncio.gather(*waiters[::2])
    assert order == list(range(0, 20, 2))


async def test_freed_slots_drain_the_line_one_try_each(
    backend: arl.Backend, key: str, calls: Calls
) -> None:
    """Three slots of a full semaphore freed at once admit the first three waiters of its
    line, each with one try after the head before it got in, and the refused try that ends
    the run (plus one per wake-up still pending): never a try per waiter."""
    inner = backend._run

    async def run(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        calls.by_script[script.name] += 1
        return await inner(script, keys, args)

    backend._run = run
    sem = arl.Semaphore(key, limit=3, ttl=30, backend=backend)
    held = [await sem.acquire(timeout=0) for _ in range(3)]
    admitted: list[int] = []
    waiters = [asyncio.ensure_future(sem.acquire(timeout=30)) for _ in range(30)]

    def admit(i: int) -> Callable[[asyncio.Future[arl.Lease]], None]:
        return lambda _: admitted.append(i)

    for i, waiter in enumerate(waiters):
        waiter.add_done_callback(admit(i))
    await in_line(sem, backend, 30)
    before = calls.acquires
    await asyncio.gather(*(lease.release() for lease in held))
    await until(lambda: len(admitted) == 3, what="three waiters admitted")
    await asleep(backend)  # the next head, refused, sleeps
    assert sorted(admitted) == [0, 1, 2]
    assert 3 + 1 <= calls.acquires - before <= 3 + 1 + 3, calls.by_script
    assert await sem.holders() == 3
    for waiter in waiters[3:]:
        waiter.cancel()
    await asyncio.gather(*waiters[3:], return_exceptions=True)
    for waiter in waiters[:3]:
        await (await waiter).release()
    assert await sem.holders() == 0
