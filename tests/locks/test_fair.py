"""Fair locks on every backend: waiters get the lock in the order they came, across
processes; a release wakes the next waiter alone; a waiter that gives up leaves the queue at
once, one that vanished is skipped after its heartbeat; fenced, renewed, cancel-safe."""

from __future__ import annotations

import asyncio
import functools
import random
import signal
import sys
from typing import Any

import pytest
from support.pace import until

import aioratelimit as arl
from aioratelimit import _keys, _scripts


def fair_keys(backend: arl.Backend, name: str) -> tuple[list[str], str]:
    return _keys.fair(backend._head(_keys.FAIR_KIND), name)


async def queue_in_order(
    backend: arl.Backend, name: str, count: int, *, heartbeat: float = 30.0, first: int = 0
) -> tuple[list[asyncio.Task[arl.Lease]], list[int]]:
    """``count`` waiters, each started once the one before is in the queue; each appends
    its number to the returned list when it gets the lock, and holds it until released."""
    order: list[int] = []
    lock = arl.FairLock(name, ttl=30, backend=backend, heartbeat=heartbeat)

    async def waiter(i: int) -> arl.Lease:
        lease = await lock.acquire(timeout=120)
        order.append(i)
        return lease

    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(waiter(i)))
        await until(functools.partial(_waiting, lock, first + i + 1), what=f"waiter {i} queued")
    return tasks, order


async def _waiting(lock: arl.FairLock, n: int) -> bool:
    return await lock.waiters() == n


async def release_in_turn(tasks: list[asyncio.Task[arl.Lease]]) -> None:
    for task in tasks:
        await (await task).release()


async def test_waiters_get_it_in_arrival_order(backend: arl.Backend, key: str) -> None:
    holder = await arl.FairLock(key, backend=backend).acquire()
    tasks, order = await queue_in_order(backend, key, 12)
    await holder.release()
    await release_in_turn(tasks)
    assert order == list(range(12))
    assert not await arl.FairLock(key, backend=backend).locked()


async def test_arrival_order_holds_across_two_processes(redis_url: str, key: str) -> None:
    """Two Backend objects (two connections, two subscribers: two processes as far as the
    server can tell) queue alternately; the order is the arrival order."""
    async with arl.Backend.from_url(redis_url) as one, arl.Backend.from_url(redis_url) as two:
        holder = await arl.FairLock(key, backend=one).acquire()
        order: list[int] = []

        async def waiter(i: int, backend: arl.Backend) -> None:
            lease = await arl.FairLock(key, backend=backend).acquire(timeout=60)
            order.append(i)
            await lease.release()

        watch = arl.FairLock(key, backend=one)
        tasks = []
        for i in range(10):
            tasks.append(asyncio.create_task(waiter(i, one if i % 3 else two)))
            await until(functools.partial(_waiting, watch, i + 1), what=f"waiter {i} queued")
        await holder.release()
        await asyncio.gather(*tasks)
        assert order == list(range(10))


@pytest.mark.parametrize("where", ["memory", "redis"])
async def test_a_release_wakes_the_next_waiter_alone(where: str, redis_url: str, key: str) -> None:
    """With 8 waiters asleep (their heartbeat far off), each release is followed by exactly
    one acquire call: the next waiter's; nobody else wakes."""
    calls: list[str] = []
    url = "memory://" if where == "memory" else redis_url
    async with arl.Backend.from_url(url, on_call=lambda c: calls.append(c.script)) as backend:
        holder = await arl.FairLock(key, backend=backend).acquire()
        tasks, order = await queue_in_order(backend, key, 8, heartbeat=600)
        calls.clear()
        await holder.release()
        for i, task in enumerate(tasks):
            lease = await task
            assert calls.count("fair_acquire") == i + 1, calls
            await lease.release()
        assert order == list(range(8))


async def test_a_cancelled_waiter_leaves_the_queue_at_once(backend: arl.Backend, key: str) -> None:
    lock = arl.FairLock(key, backend=backend)
    holder = await lock.acquire()
    tasks, order = await queue_in_order(backend, key, 3)
    tasks[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert await lock.waiters() == 2  # gone as the cancellation completed
    with pytest.raises(arl.LockTimeout):
        await lock.acquire(timeout=0.05)
    assert await lock.waiters() == 2  # the timed-out one too
    await holder.release()
    await release_in_turn([tasks[0], tasks[2]])
    assert order == [0, 2]


async def test_random_cancellations_leave_nothing_behind(backend: arl.Backend, key: str) -> None:
    """120 waiting and holding blocks cancelled at random moments: after each round the
    lock is free, the queue empty, and nothing raised but the cancellations."""
    lock = arl.FairLock(key, backend=backend)
    rng = random.Random(key)

    async def use() -> None:
        async with arl.fair_lock(key, backend=backend):
            await asyncio.sleep(rng.random() / 500)

    for _ in range(6):
        tasks = [asyncio.create_task(use()) for _ in range(20)]
        await asyncio.sleep(rng.random() / 100)
        for task in tasks:
            if rng.random() < 0.6:
                task.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        assert [e for e in ended if not isinstance(e, (type(None), asyncio.CancelledError))] == []
        assert not await lock.locked()
        assert await lock.waiters() == 0
    await (await lock.acquire(timeout=0)).release()


async def test_a_try_once_never_jumps_the_queue(backend: arl.Backend, key: str) -> None:
    """timeout=0 is refused while anyone waits, even with the lock free, and never queues;
    once the waiter leaves the queue it gets in."""
    lock = arl.FairLock(key, backend=backend)
    keys, channel = fair_keys(backend, key)
    token = _keys.new_token()
    holder = await lock.acquire()
    queued = await backend._run(_scripts.FAIR_ACQUIRE, keys, (token, 30_000, 30_000))
    assert queued[0] == 0
    await holder.release()  # free now, and the queue's head is that token
    with pytest.raises(arl.LockTimeout):
        await lock.acquire(timeout=0)
    assert await lock.waiters() == 1
    assert not await lock.locked()
    await backend._run(
        _scripts.FAIR_RELEASE, keys, (token, 1000, channel, backend._publish_command)
    )
    assert await lock.waiters() == 0
    await (await lock.acquire(timeout=0)).release()


async def test_a_vanished_waiter_is_skipped_after_its_heartbeat(
    backend: arl.Backend, key: str
) -> None:
    """A waiter that queued first and never asked again (what a crashed process leaves)
    keeps its place until its heartbeat deadline; then the one behind gets the lock."""
    lock = arl.FairLock(key, backend=backend, heartbeat=0.3)
    holder = await lock.acquire()
    keys, _ = fair_keys(backend, key)
    ghost = await backend._run(_scripts.FAIR_ACQUIRE, keys, (_keys.new_token(), 30_000, 300))
    assert ghost[0] == 0
    tasks, order = await queue_in_order(backend, key, 1, heartbeat=0.3, first=1)
    await holder.release()  # wakes the ghost, which never comes
    lease = await tasks[0]
    assert order == [0]
    assert await lock.waiters() == 0
    await lease.release()


CRASHING_WAITER = """
import asyncio, sys
import aioratelimit as arl

async def main():
    async with arl.Backend.from_url(sys.argv[1]) as backend:
        lock = arl.FairLock(sys.argv[2], backend=backend, heartbeat=float(sys.argv[3]))
        await lock.acquire()

asyncio.run(main())
"""


@pytest.mark.real_time
async def test_a_killed_process_waiting_is_skipped(redis_url: str, key: str) -> None:
    """A process that queues first and is killed (SIGKILL: no cleanup at all) is skipped
    once its heartbeat runs out; the waiter behind it gets the lock."""
    async with arl.Backend.from_url(redis_url) as backend:
        lock = arl.FairLock(key, backend=backend, heartbeat=0.6)
        holder = await lock.acquire()
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CRASHING_WAITER, redis_url, key, "0.6"
        )
        try:
            await until(lambda: _waiting(lock, 1), what="the child queued", within=60)
        finally:
            child.send_signal(signal.SIGKILL)
            await child.wait()
        tasks, order = await queue_in_order(backend, key, 1, heartbeat=0.6, first=1)
        await holder.release()
        lease = await tasks[0]
        assert order == [0]
        await lease.release()


async def test_fences_renewal_and_max_hold(backend: arl.Backend, key: str) -> None:
    lock = arl.FairLock(key, ttl=0.6, backend=backend)
    async with arl.fair_lock(key, ttl=0.6, backend=backend) as first:
        for _ in range(5):
            await asyncio.sleep(0.3)
            assert await lock.locked()
    second = await lock.acquire(timeout=0)
    assert second.fencing_token > first.fencing_token
    await second.release()
    with pytest.raises(arl.LockNotOwned):
        await second.release()
    with pytest.raises(arl.LockLost, match="max_hold"):
        async with arl.fair_lock(key, max_hold=0.1, backend=backend):
            await asyncio.Event().wait()
    assert not await lock.locked()


async def test_every_key_written_expires(redis_url: str, key: str) -> None:
    async with arl.Backend.from_url(redis_url) as backend:
        keys, _ = fair_keys(backend, key)
        client: Any = backend._store.client  # type: ignore[attr-defined]
        holder = await arl.FairLock(key, ttl=5, backend=backend).acquire()
        tasks, _order = await queue_in_order(backend, key, 1, heartbeat=3)
        for k in keys:
            assert 0 < await client.pttl(k) <= 5000
        await holder.release()
        await release_in_turn(tasks)
        assert 0 < await client.pttl(keys[0]) <= 30_000
        await backend._run(_scripts.DELETE, keys, ())


def test_bad_arguments_raise_at_once(key: str) -> None:
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="heartbeat"):
            arl.FairLock(key, heartbeat=bad)
        with pytest.raises(ValueError, match="ttl"):
            arl.FairLock(key, ttl=bad)
    with pytest.raises(TypeError):
        arl.FairLock(key, heartbeat="3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_hold"):
        arl.fair_lock(key, max_hold=-1)
    assert key in repr(arl.FairLock(key))
