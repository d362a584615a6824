"""Semaphores on every backend: never more than ``limit`` holders, fenced, owner-checked,
woken on release, renewed while held, and never left held by a cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from typing import Any

import pytest
from support.pace import asleep, now, pace

import aioratelimit as arl
from aioratelimit import _keys, _scripts


def sem_keys(backend: arl.Backend, name: str) -> tuple[str, str, str]:
    return _keys.semaphore(backend._head(_keys.SEMAPHORE_KIND), name)


async def test_never_more_than_limit_holders(backend: arl.Backend, key: str) -> None:
    """30 tasks on a semaphore of 3: at most 3 inside at once (by a local count and by the
    server's count), and all of them get in."""
    sem = arl.Semaphore(key, limit=3, backend=backend)
    state = {"inside": 0, "most": 0, "done": 0, "server_most": 0}

    async def worker() -> None:
        for _ in range(2):
            async with arl.semaphore(key, limit=3, ttl=10, timeout=30, backend=backend):
                state["inside"] += 1
                state["most"] = max(state["most"], state["inside"])
                state["server_most"] = max(state["server_most"], await sem.holders())
                await asyncio.sleep(0.005)
                state["inside"] -= 1
                state["done"] += 1

    await asyncio.gather(*(worker() for _ in range(30)))
    assert state["done"] == 60
    assert state["most"] == 3
    assert state["server_most"] <= 3
    assert await sem.holders() == 0
    assert not await sem.locked()


async def test_fences_increase_across_holders_expiry_and_deletion(
    backend: arl.Backend, key: str
) -> None:
    """Fencing tokens strictly increase across holders, expiry and a deleted fence hash."""
    sem = arl.Semaphore(key, limit=2, ttl=10, backend=backend)
    a = await sem.acquire()
    b = await sem.acquire()
    await a.release()
    c = await sem.acquire()
    short = await arl.Semaphore(key, limit=3, ttl=0.05, backend=backend).acquire()
    await asyncio.sleep(0.12)
    d = await arl.Semaphore(key, limit=3, backend=backend).acquire(timeout=0)
    await b.release()
    await c.release()
    await d.release()
    await backend._run(_scripts.DELETE, [sem_keys(backend, key)[1]], ())
    e = await sem.acquire(timeout=0)
    await e.release()
    fences = [x.fencing_token for x in (a, b, c, short, d, e)]
    assert all(x < y for x, y in itertools.pairwise(fences)), fences


async def test_full_semaphore_times_out(backend: arl.Backend, key: str) -> None:
    """timeout=0 on a full semaphore raises at once; a timeout raises after waiting."""
    sem = arl.Semaphore(key, limit=2, backend=backend)
    held = [await sem.acquire(timeout=0), await sem.acquire(timeout=0)]
    assert await sem.locked()
    with pytest.raises(arl.LockTimeout) as info:
        await sem.acquire(timeout=0)
    assert info.value.name == key
    timeout = pace(backend, network=0.2, memory=0.1)  # (a bound: a stall only lengthens it)
    start = now()
    with pytest.raises(arl.LockTimeout):
        async with arl.semaphore(key, limit=2, timeout=timeout, backend=backend):
            pass
    assert timeout - 0.01 <= now() - start < 5  # (uvloop's timers: 1 ms resolution)
    for lease in held:
        await lease.release()
    assert await sem.holders() == 0


async def test_release_wakes_a_waiter_at_once(backend: arl.Backend, key: str) -> None:
    """A waiter on a full semaphore gets the slot well before its 1 s fallback timer."""
    sem = arl.Semaphore(key, limit=1, ttl=30, backend=backend)
    handoffs = []
    for _ in range(3):
        holder = await sem.acquire()
        waiter = asyncio.create_task(sem.acquire(timeout=10))
        await asleep(backend)  # the waiter has tried, subscribed and sleeps
        released = now()
        await holder.release()
        lease = await waiter
        handoffs.append(now() - released)
        await lease.release()
    assert min(handoffs) < 0.5, handoffs


async def test_expired_slot_is_freed_and_its_lease_refused(backend: arl.Backend, key: str) -> None:
    """An expired holder no longer counts; its lease can neither extend nor release; a
    second release of a released lease raises LockNotOwned too."""
    sem = arl.Semaphore(key, limit=1, backend=backend)
    old = await arl.Semaphore(key, limit=1, ttl=0.05, backend=backend).acquire()
    await asyncio.sleep(0.12)
    new = await sem.acquire(timeout=0)
    with pytest.raises(arl.LockNotOwned):
        await old.extend()
    with pytest.raises(arl.LockNotOwned):
        await old.release()
    assert await sem.holders() == 1
    await new.extend(5)
    await new.release()
    with pytest.raises(arl.LockNotOwned):
        await new.release()  # released already: it holds nothing
    assert await sem.holders() == 0


async def test_scripts_are_safe_to_send_twice(backend: arl.Backend, key: str) -> None:
    """A re-sent acquire returns the same fence and takes no second slot; a re-sent release
    answers 'already released'; a late acquire of a released token takes nothing."""
    holders, fences, channel = sem_keys(backend, key)
    keys = [holders, fences]
    wake = [channel, backend._publish_command]
    first = await backend._run(_scripts.SEMAPHORE_ACQUIRE, keys, ["a" * 32, 10_000, 2])
    again = await backend._run(_scripts.SEMAPHORE_ACQUIRE, keys, ["a" * 32, 10_000, 2])
    assert (first[0], again[0], first[1]) == (1, 1, again[1])
    assert await backend._run(_scripts.SEMAPHORE_HOLDERS, keys[:1], ()) == 1
    second = await backend._run(_scripts.SEMAPHORE_ACQUIRE, keys, ["b" * 32, 10_000, 2])
    assert second[0] == 1
    full = await backend._run(_scripts.SEMAPHORE_ACQUIRE, keys, ["c" * 32, 10_000, 2])
    assert full[0] == 0
    assert 9_000 < full[1] <= 10_000  # until the soonest holder expires
    assert await backend._run(_scripts.SEMAPHORE_EXTEND, keys, ["c" * 32, 10_000]) == 0
    assert await backend._run(_scripts.SEMAPHORE_EXTEND, keys, ["a" * 32, 10_000]) == 1
    assert await backend._run(_scripts.SEMAPHORE_RELEASE, keys, ["a" * 32, 10_000, *wake]) == 1
    assert await backend._run(_scripts.SEMAPHORE_RELEASE, keys, ["a" * 32, 10_000, *wake]) == 2
    assert (await backend._run(_scripts.SEMAPHORE_ACQUIRE, keys, ["a" * 32, 10_000, 2]))[0] == 0
    assert await backend._run(_scripts.SEMAPHORE_RELEASE, keys, ["d" * 32, 10_000, *wake]) == 0
    assert await backend._run(_scripts.SEMAPHORE_HOLDERS, keys[:1], ()) == 1
    await backend._run(_scripts.DELETE, keys, ())


async def test_every_key_written_expires(redis_url: str, key: str) -> None:
    """The holders ZSET and the fences hash carry a TTL while held and after release."""
    async with arl.Backend.from_url(redis_url) as backend:
        holders, fences, _ = sem_keys(backend, key)
        client: Any = backend._store.client  # type: ignore[attr-defined]
        lease = await arl.Semaphore(key, ttl=5, backend=backend).acquire()
        assert 0 < await client.pttl(holders) <= 5000
        assert 0 < await client.pttl(fences) <= 5000
        await lease.release()
        assert 0 < await client.pttl(holders) <= 5000
        assert 0 < await client.pttl(fences) <= 5000
        await backend._run(_scripts.DELETE, [holders, fences], ())


async def test_a_call_prunes_a_bounded_number_of_expired_members(redis_url: str, key: str) -> None:
    """5,000 expired tombstones (as many releases within a ttl leave) and 30 expired
    holders: each script call removes at most 100 of them, however many expired, and
    answers as if they were all gone (the slots are free, the tokens unknown)."""
    async with arl.Backend.from_url(redis_url) as backend:
        holders, fences, _ = sem_keys(backend, key)
        client: Any = backend._store.client  # type: ignore[attr-defined]
        seconds, micros = await client.time()
        past = seconds * 1000 + micros // 1000 - 1000  # a second ago, on the server's clock
        await client.zadd(holders, {f"t{i:04d}": -past for i in range(5_000)})
        await client.zadd(holders, {f"h{i:02d}": past for i in range(30)})
        await client.hset(fences, mapping={f"h{i:02d}": 1 for i in range(30)})
        await client.pexpire(holders, 60_000)
        await client.pexpire(fences, 60_000)
        sem = arl.Semaphore(key, limit=1, ttl=30, backend=backend)
        assert await sem.holders() == 0  # (a read: it prunes nothing)
        assert await client.zcard(holders) == 5_030
        lease = await sem.acquire(timeout=0)  # the expired holders hold no slot
        assert await client.zcard(holders) == 5_030 - 100 + 1
        assert await client.hlen(fences) == 2  # '#' and the new holder's: theirs went first
        assert await client.zscore(holders, "h00") is None  # the holders went first
        await lease.release()
        assert await client.zcard(holders) == 5_030 - 200 + 1
        # A tombstone that expired answers as no tombstone: a release of its token now
        # is "not held" (and writes a new one), not "released before".
        stale = "t0000"  # (equal scores: ZREVRANGEBYSCORE prunes t4999 first, t0000 last)
        assert await client.zscore(holders, stale) == -past
        code = await backend._run(
            _scripts.SEMAPHORE_RELEASE, [holders, fences], (stale, 5_000, "ch", "PUBLISH")
        )
        assert code == 0
        assert await client.zcard(holders) == 5_030 - 300 + 1
        await backend._run(_scripts.DELETE, [holders, fences], ())


async def test_200_random_cancellations_leave_no_slot_held(backend: arl.Backend, key: str) -> None:
    """Acquires cancelled at random points, on a free or a full semaphore, never leave a slot
    held by them: checked at once, with a 60 s ttl."""
    rng = random.Random(99)
    sem = arl.Semaphore(key, limit=2, ttl=60, backend=backend)
    for i in range(200):
        full = [await sem.acquire(), await sem.acquire()] if i % 2 else []
        task = asyncio.create_task(sem.acquire())
        for _ in range(rng.randrange(6)):
            await asyncio.sleep(0)
        task.cancel()
        lease = None
        with contextlib.suppress(asyncio.CancelledError):
            lease = await task
        if lease is not None:
            assert not full
            await lease.release()
        for held in full:
            await held.release()
        assert await sem.holders() == 0, i


async def test_lost_slot_cancels_the_block(backend: arl.Backend, key: str) -> None:
    """If the holders are wiped while a block runs, renewal fails, the block is cancelled
    and LockLost is raised."""

    entered = asyncio.Event()

    async def wipe() -> None:
        await entered.wait()  # only once the slot is held (as in test_locks.py)
        await backend._run(_scripts.DELETE, list(sem_keys(backend, key)[:2]), ())

    async def block() -> None:
        async with arl.semaphore(key, limit=2, ttl=0.6, backend=backend):
            entered.set()
            await asyncio.sleep(10)

    wiper = asyncio.create_task(wipe())
    start = now()
    with pytest.raises(arl.LockLost):
        await block()
    await wiper
    assert now() - start < 5


async def test_renewal_keeps_the_slot(backend: arl.Backend, key: str) -> None:
    """With auto_renew, a slot stays held through two and a half ttls of work."""
    # Renewed every third of the ttl, lost if a renewal comes later than a tenth before
    # its end: 227 ms late on memory:// (a call takes microseconds), 340 ms on a network.
    ttl = pace(backend, network=0.6, memory=0.4)
    sem = arl.Semaphore(key, limit=1, backend=backend)
    async with arl.semaphore(key, limit=1, ttl=ttl, backend=backend):
        for _ in range(3):
            await asyncio.sleep(ttl * 2.5 / 3)
            assert await sem.holders() == 1
    assert await sem.holders() == 0


async def test_bad_arguments_raise_before_any_io(key: str) -> None:
    """A non-positive or non-integer limit, or a bad ttl, raises at once."""
    with pytest.raises(ValueError, match="limit"):
        arl.Semaphore(key, limit=0)
    with pytest.raises(TypeError, match="limit"):
        arl.Semaphore(key, limit=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit"):
        arl.semaphore(key, limit=True)
    with pytest.raises(ValueError, match="ttl"):
        arl.semaphore(key, ttl=-1)
    assert "limit=4" in repr(arl.Semaphore(key, limit=4))
