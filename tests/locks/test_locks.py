"""Locks on every backend: exclusive, fenced, owner-checked, woken on release, renewed while
held, and never left held by a cancellation."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import multiprocessing
import os
import random
import time
from typing import Any

import pytest
import redis.asyncio as aredis
from support import loops
from support.pace import asleep, now, pace, until
from support.servers import RedisServer, free_port

import aioratelimit as arl
from aioratelimit import _keys, _scripts
from aioratelimit._locks import line as _line


def lock_keys(backend: arl.Backend, name: str) -> tuple[str, str]:
    return _keys.lock(backend._head(_keys.LOCK_KIND), name)


def waiting(backend: arl.Backend, name: str) -> int:
    """How many acquires of the lock ``name`` wait in its line in this process."""
    channel = lock_keys(backend, name)[1]
    found = _line._lines.get(asyncio.get_running_loop(), {}).get((backend._notifier, channel, 0))
    return 0 if found is None else len(found.waiters)


async def delete(backend: arl.Backend, *keys: str) -> None:
    await backend._run(_scripts.DELETE, list(keys), ())


# -- mutual exclusion ---------------------------------------------------------------------


async def test_50_tasks_never_overlap(backend: arl.Backend, key: str) -> None:
    """50 tasks doing a non-atomic read-modify-write under the lock lose no update."""
    state = {"counter": 0, "inside": 0, "most": 0}

    async def worker() -> None:
        for _ in range(3):
            async with arl.lock(key, ttl=10, timeout=30, backend=backend):
                state["inside"] += 1
                state["most"] = max(state["most"], state["inside"])
                seen = state["counter"]
                await asyncio.sleep(0)
                state["counter"] = seen + 1
                state["inside"] -= 1

    await asyncio.gather(*(worker() for _ in range(50)))
    assert state["counter"] == 150
    assert state["most"] == 1
    assert not await arl.Lock(key, backend=backend).locked()


async def _process_worker(url: str, name: str, counter: str, tasks: int, rounds: int) -> None:
    client = aredis.Redis.from_url(url)
    try:
        async with arl.Backend.from_url(url, max_connections=4) as backend:

            async def one() -> None:
                for _ in range(rounds):
                    async with arl.lock(name, ttl=10, timeout=60, backend=backend):
                        seen = int(await client.get(counter) or 0)
                        await asyncio.sleep(0.001)
                        await client.set(counter, seen + 1)

            await asyncio.gather(*(one() for _ in range(tasks)))
    finally:
        await client.aclose()


def process_worker(url: str, name: str, counter: str, tasks: int, rounds: int) -> None:
    """One process of the multi-process test (module level, so spawn can import it)."""
    loops.run(_process_worker(url, name, counter, tasks, rounds))


@pytest.mark.slow
def test_4_processes_of_10_tasks_never_overlap(redis_url: str, key: str) -> None:
    """4 processes x 10 tasks incrementing a Redis counter by GET then SET lose no update."""
    counter = f"test:{key}:counter"
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=process_worker, args=(redis_url, key, counter, 10, 3)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        assert int(client.get(counter) or 0) == 4 * 10 * 3
        client.delete(counter)
    finally:
        client.close()


# -- fencing tokens -----------------------------------------------------------------------


async def test_fences_increase_across_holders_expiry_and_deletion(
    backend: arl.Backend, key: str
) -> None:
    """Fencing tokens strictly increase across holders, an expiry, re-acquisitions, and the
    loss of every key (expired, or deleted while held)."""
    lk = arl.Lock(key, ttl=10, backend=backend)
    fences = []
    for _ in range(3):
        lease = await lk.acquire()
        fences.append(lease.fencing_token)
        await lease.release()
    short = arl.Lock(key, ttl=0.05, backend=backend)
    fences.append((await short.acquire()).fencing_token)  # left to expire
    await asyncio.sleep(0.12)
    lease = await lk.acquire(timeout=0)
    fences.append(lease.fencing_token)
    await lease.release()
    held = await lk.acquire(timeout=0)
    fences.append(held.fencing_token)
    await delete(backend, lock_keys(backend, key)[0])  # the lock and its last fence are gone
    lease = await lk.acquire(timeout=0)
    fences.append(lease.fencing_token)
    await lease.release()
    await arl.Lock(key, ttl=0.05, backend=backend).acquire()
    await asyncio.sleep(0.12)  # expired, tombstone and all
    lease = await lk.acquire(timeout=0)
    fences.append(lease.fencing_token)
    await lease.release()
    assert all(a < b for a, b in itertools.pairwise(fences)), fences


async def test_scripts_are_safe_to_send_twice(backend: arl.Backend, key: str) -> None:
    """A re-sent acquire returns the same fence; a re-sent release answers 'already
    released'; another token is refused; a late acquire of a released token takes nothing."""
    k, channel = lock_keys(backend, key)
    wake = [channel, backend._publish_command]
    first = await backend._run(_scripts.LOCK_ACQUIRE, [k], ["a" * 32, 10_000])
    again = await backend._run(_scripts.LOCK_ACQUIRE, [k], ["a" * 32, 10_000])
    assert first[0] == again[0] == 1
    assert first[1] == again[1]
    other = await backend._run(_scripts.LOCK_ACQUIRE, [k], ["b" * 32, 10_000])
    assert other[0] == 0
    assert 9_000 < other[1] <= 10_000  # the holder's PTTL, for the waiter's fallback timer
    assert await backend._run(_scripts.LOCK_EXTEND, [k], ["b" * 32, 10_000]) == 0
    assert await backend._run(_scripts.LOCK_RELEASE, [k], ["b" * 32, 10_000, *wake]) == -1
    assert await backend._run(_scripts.LOCK_EXTEND, [k], ["a" * 32, 10_000]) == 1
    assert await backend._run(_scripts.LOCK_RELEASE, [k], ["a" * 32, 10_000, *wake]) == 1
    assert await backend._run(_scripts.LOCK_RELEASE, [k], ["a" * 32, 10_000, *wake]) == 2
    assert (await backend._run(_scripts.LOCK_ACQUIRE, [k], ["a" * 32, 10_000]))[0] == 0
    assert await backend._run(_scripts.LOCK_LOCKED, [k], ()) == 0
    assert await backend._run(_scripts.LOCK_RELEASE, [k], ["c" * 32, 10_000, *wake]) == 0
    third = await backend._run(_scripts.LOCK_ACQUIRE, [k], ["b" * 32, 10_000])
    assert third[0] == 1
    assert third[1] > first[1]
    await delete(backend, k)


async def test_every_key_written_expires(redis_url: str, key: str) -> None:
    """The lock's one key carries a TTL while held and as a tombstone after release."""
    async with arl.Backend.from_url(redis_url) as backend:
        k, _ = lock_keys(backend, key)
        client: Any = backend._store.client  # type: ignore[attr-defined]
        lease = await arl.Lock(key, ttl=5, backend=backend).acquire()
        assert 0 < await client.pttl(k) <= 5000
        await lease.release()
        assert 0 < await client.pttl(k) <= 5000
        await delete(backend, k)


# -- owner check --------------------------------------------------------------------------


async def test_expired_lease_cannot_touch_the_new_holders_lock(
    backend: arl.Backend, key: str
) -> None:
    """A lease that expired cannot extend or release the lock another holder has taken."""
    old = await arl.Lock(key, ttl=0.05, backend=backend).acquire()
    await asyncio.sleep(0.12)
    lk = arl.Lock(key, ttl=10, backend=backend)
    new = await lk.acquire(timeout=0)
    with pytest.raises(arl.LockNotOwned) as info:
        await old.extend()
    assert info.value.name == key
    with pytest.raises(arl.LockNotOwned):
        await old.release()
    assert await lk.locked()
    await new.extend(5)
    await new.release()
    assert not await lk.locked()


async def test_release_twice_raises_not_owned(backend: arl.Backend, key: str) -> None:
    """A second release of the same lease raises LockNotOwned (as docs/locks.md says, and
    as redis-py's Lock and asyncio.Lock do) and changes nothing: a lock taken since by
    another stays held; extend after it is refused too. Leaving ``async with lease`` after
    a release by hand is not an error."""
    lk = arl.Lock(key, backend=backend)
    lease = await lk.acquire()
    assert "held" in repr(lease)
    await lease.release()
    other = await lk.acquire(timeout=0)
    with pytest.raises(arl.LockNotOwned) as info:
        await lease.release()
    assert info.value.name == key
    assert "released" in repr(lease)
    assert await lk.locked()
    with pytest.raises(arl.LockNotOwned):
        await lease.extend()
    async with other:
        await other.release()
    assert not await lk.locked()
    async with arl.lock(key, backend=backend) as held:
        await held.release()  # by hand: the block's exit does not release it again
    assert not await lk.locked()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_a_release_whose_reply_is_lost_is_sent_again_on_every_backend(
    backend: arl.Backend, key: str, kind: str
) -> None:
    """On every backend (the cluster routes the resend as any call): the first release
    runs on the server and its reply is lost (BackendUnavailable instead): the release is
    sent again, answers "released before", and ``release()`` returns normally; the lock
    is free at once. (The proxy tests in test_fault_recovery cut real connections.)"""
    resource: arl.Lock | arl.Semaphore = (
        arl.Lock(key, ttl=30, backend=backend)
        if kind == "lock"
        else arl.Semaphore(key, limit=1, ttl=30, backend=backend)
    )
    lease = await resource.acquire(timeout=0)
    run = backend._run
    sent: list[Any] = []

    async def lossy(script: _scripts.Script, keys: Any, args: Any) -> Any:
        reply = await run(script, keys, args)
        if script.name.endswith("_release"):
            sent.append(reply)
            if len(sent) == 1:
                raise arl.BackendUnavailable("the reply was lost (injected)")
        return reply

    backend._run = lossy
    try:
        await lease.release()
    finally:
        backend._run = run
    assert sent == [_scripts.Released.RELEASED, _scripts.Released.RELEASED_BEFORE]
    again = await resource.acquire(timeout=0)
    await again.release()


async def test_expired_lease_release_raises_not_owned(backend: arl.Backend, key: str) -> None:
    """Releasing a lease that expired (nobody took it) raises LockNotOwned."""
    lease = await arl.Lock(key, ttl=0.05, backend=backend).acquire()
    await asyncio.sleep(0.12)
    with pytest.raises(arl.LockNotOwned):
        await lease.release()


async def test_lease_is_a_context_manager(backend: arl.Backend, key: str) -> None:
    """``async with await lock.acquire()`` releases on exit; each acquisition has its token."""
    lk = arl.Lock(key, backend=backend)
    async with await lk.acquire() as lease:
        assert await lk.locked()
        assert lease.name == key
    assert not await lk.locked()
    a = await lk.acquire()
    await a.release()
    b = await lk.acquire()
    await b.release()
    assert a._token != b._token
    assert b.fencing_token > a.fencing_token


# -- timeouts -----------------------------------------------------------------------------


async def test_timeout_zero_tries_once(backend: arl.Backend, key: str) -> None:
    """timeout=0 acquires a free lock and raises LockTimeout at once on a held one."""
    lk = arl.Lock(key, backend=backend)
    lease = await lk.acquire(timeout=0)
    start = now()
    with pytest.raises(arl.LockTimeout) as info:
        await lk.acquire(timeout=0)
    assert now() - start < 1.0
    assert (info.value.name, info.value.timeout) == (key, 0)
    with pytest.raises(arl.LockTimeout):
        async with arl.lock(key, timeout=0, backend=backend):
            pass
    await lease.release()


async def test_timeout_waits_then_raises(backend: arl.Backend, key: str) -> None:
    """A waiter gives up with LockTimeout once its timeout has passed, not before."""
    lk = arl.Lock(key, backend=backend)
    lease = await lk.acquire()
    timeout = pace(backend, network=0.3, memory=0.1)  # (a bound: a stall only lengthens it)
    start = now()
    with pytest.raises(arl.LockTimeout) as info:
        await lk.acquire(timeout=timeout)
    assert timeout - 0.01 <= now() - start < 5  # (uvloop's timers: 1 ms resolution)
    assert info.value.timeout == timeout
    await lease.release()
    assert not await lk.locked()


async def test_waiter_gets_an_expired_lock(backend: arl.Backend, key: str) -> None:
    """A holder that never releases is replaced once its TTL runs out (no wake-up needed)."""
    await arl.Lock(key, ttl=0.2, backend=backend).acquire()
    start = now()
    lease = await arl.Lock(key, backend=backend).acquire(timeout=5)
    assert 0.1 < now() - start < 3
    await lease.release()


async def test_bad_arguments_raise_before_any_io(key: str) -> None:
    """Bad names, ttls, timeouts and flags raise ValueError/TypeError at once."""
    for bad_ttl in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ttl"):
            arl.Lock(key, ttl=bad_ttl)
    with pytest.raises(ValueError, match="name"):
        arl.Lock("")
    with pytest.raises(TypeError):
        arl.Lock(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        arl.lock(key, auto_renew="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        arl.lock(key, timeout=-1)
    with pytest.raises(TypeError):
        arl.Lock(key, backend="redis://")  # type: ignore[arg-type]
    async with arl.Backend.from_url("memory://") as backend:
        lease = await arl.Lock(key, backend=backend).acquire()
        with pytest.raises(ValueError, match="ttl"):
            await lease.extend(0)
        with pytest.raises(ValueError, match="timeout"):
            await arl.Lock(key, backend=backend).acquire(timeout=float("nan"))
        await lease.release()


# -- wake-ups -----------------------------------------------------------------------------


async def test_release_wakes_a_waiter_at_once(backend: arl.Backend, key: str) -> None:
    """A waiter gets the lock well before its fallback timer (1 s) after the release."""
    lk = arl.Lock(key, ttl=30, backend=backend)
    handoffs = []
    for _ in range(3):
        holder = await lk.acquire()
        got = asyncio.get_running_loop().create_future()

        async def wait(got: asyncio.Future[float] = got) -> None:
            lease = await lk.acquire(timeout=10)
            got.set_result(now())
            await lease.release()

        waiter = asyncio.create_task(wait())
        await asleep(backend)  # the waiter has tried, subscribed and sleeps
        released = now()
        await holder.release()
        handoffs.append(await got - released)
        await waiter
    assert min(handoffs) < 0.5, handoffs


async def test_50_waiters_share_a_pool_of_4(redis_url: str, key: str) -> None:
    """50 waiters on a backend of 4 connections all get their turn, and other calls still
    get a connection while they wait (a waiter holds none)."""
    async with arl.Backend.from_url(redis_url, max_connections=4, timeout=3) as backend:
        lk = arl.Lock(key, ttl=30, backend=backend)
        holder = await lk.acquire()
        done = []

        async def waiter(i: int) -> None:
            async with arl.lock(key, ttl=30, timeout=60, backend=backend):
                done.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(50)]
        await asleep(backend)  # the line's head has tried, subscribed and sleeps ...
        await until(lambda: waiting(backend, key) == 50, what="50 waiters in line")  # ... all
        limiter = arl.FixedWindow("1000/minute", backend=backend)
        for _ in range(10):
            assert (await asyncio.wait_for(limiter.hit(key), 2)).allowed
        assert done == []
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert sorted(done) == list(range(50))
        assert not await lk.locked()


# -- cancellation -------------------------------------------------------------------------


async def test_500_random_cancellations_leave_nothing_held(backend: arl.Backend, key: str) -> None:
    """Acquires cancelled at random points (or cut by the caller's timeout), on a free or a
    held lock, never leave the lock held by them: checked at once, with a 60 s ttl."""
    rng = random.Random(1234)
    lk = arl.Lock(key, ttl=60, backend=backend)
    acquired = 0
    for i in range(500):
        holder = await lk.acquire() if i % 2 else None
        if i % 5 == 4:
            try:
                lease = await asyncio.wait_for(lk.acquire(), rng.random() * 0.002)
            except TimeoutError:
                lease = None
        else:
            task = asyncio.create_task(lk.acquire())
            for _ in range(rng.randrange(6)):
                await asyncio.sleep(0)
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.001)
            task.cancel()
            try:
                lease = await task
            except asyncio.CancelledError:
                lease = None
        if lease is not None:  # it got there before the cancellation
            assert holder is None
            acquired += 1
            await lease.release()
        if holder is not None:
            assert await lk.locked()
            await holder.release()  # raises LockNotOwned if a cancelled one had taken it
        assert not await lk.locked(), i
    assert acquired < 400


async def test_cancelled_acquire_whose_script_ran_is_released(
    own_redis: RedisServer, key: str
) -> None:
    """An acquire cancelled while its script waits on a frozen server (so it runs, but its
    reply is never read) is released with the same token once the server answers."""
    async with arl.Backend.from_url(own_redis.url, timeout=10) as backend:
        lk = arl.Lock(key, ttl=60, backend=backend)
        await lk.locked()  # connect and load nothing: the connection is ready
        own_redis.pause()
        try:
            task = asyncio.create_task(lk.acquire())
            await asyncio.sleep(0.2)  # the EVALSHA is in the server's socket
            task.cancel()
            await asyncio.sleep(0.2)
            assert not task.done()  # it waits for the shielded release
        finally:
            own_redis.resume()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await lk.locked()
        lease = await lk.acquire(timeout=0)
        await lease.release()


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_an_acquire_that_never_reached_the_server_sends_no_release(
    kind: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """During an outage (nothing listens: every connect is refused), a failed acquire
    never left the process, so no release follows it: one script call each, no resends
    and no warning about them."""
    calls: list[str] = []
    url = f"redis://127.0.0.1:{free_port()}"
    # (A backend timeout of 10 s: a loaded machine never turns a refusal into a timeout.)
    async with arl.Backend.from_url(url, timeout=10, on_call=lambda c: calls.append(c.script)) as b:
        res = arl.Lock(key, backend=b) if kind == "lock" else arl.Semaphore(key, backend=b)
        for timeout in (0, 1, None):
            with pytest.raises(arl.BackendUnavailable):
                await res.acquire(timeout=timeout)
    assert calls == [f"{kind}_acquire"] * 3
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_caller_timeout_around_acquire_releases(own_redis: RedisServer, key: str) -> None:
    """``asyncio.wait_for`` around an acquire on a frozen server ends in TimeoutError with
    the lock left free once the server answers again."""
    async with arl.Backend.from_url(own_redis.url, timeout=10) as backend:
        lk = arl.Lock(key, ttl=60, backend=backend)
        await lk.locked()
        own_redis.pause()
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, own_redis.resume)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lk.acquire(), 0.2)
        finally:
            own_redis.resume()
        assert not await lk.locked()


async def test_cancelled_release_completes(backend: arl.Backend, key: str) -> None:
    """A release cancelled mid-flight still frees the lock before the cancellation goes on."""
    lk = arl.Lock(key, ttl=60, backend=backend)
    for spins in range(1, 5):  # (a task cancelled before its first step never starts)
        lease = await lk.acquire()
        task = asyncio.create_task(lease.release())
        for _ in range(spins):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task  # (it may have finished before the cancellation)
        assert not await lk.locked()


async def test_outer_cancellation_of_the_block_is_not_swallowed(
    backend: arl.Backend, key: str
) -> None:
    """Cancelling the task running ``async with lock()`` propagates CancelledError (not
    LockLost) and releases the lock."""
    entered = asyncio.Event()
    leases: list[arl.Lease] = []

    ttl = pace(backend, network=1.0, memory=0.3)

    async def body() -> None:
        async with arl.lock(key, ttl=ttl, backend=backend) as lease:
            leases.append(lease)
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await entered.wait()
    # A renewal has run (every third of the ttl): the lease's last extend was sent after its
    # acquire (a fixed pause could end before the renewal on a loaded machine).
    acquired = leases[0]._sent
    await until(lambda: leases[0]._sent != acquired, what="a renewal")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await arl.Lock(key, backend=backend).locked()


async def test_block_exception_propagates_and_releases(backend: arl.Backend, key: str) -> None:
    """An exception in the block goes on unchanged and the lock is released."""
    with pytest.raises(KeyError):
        async with arl.lock(key, backend=backend):
            raise KeyError("boom")
    assert not await arl.Lock(key, backend=backend).locked()


# -- renewal and LockLost -----------------------------------------------------------------


async def test_renewal_keeps_a_lock_through_several_ttls_of_work(
    backend: arl.Backend, key: str
) -> None:
    """With auto_renew, a lock stays held through two and a half ttls of work (as the
    semaphore's slot in test_semaphore.py); nobody else gets it."""
    # Renewed every third of the ttl, lost if a renewal comes later than a tenth before
    # its end: 227 ms late on memory:// (a call takes microseconds), 340 ms on a network.
    ttl = pace(backend, network=0.6, memory=0.4)
    lk = arl.Lock(key, ttl=ttl, backend=backend)
    async with arl.lock(key, ttl=ttl, backend=backend) as lease:
        for _ in range(6):
            await asyncio.sleep(ttl * 2.5 / 6)
            with pytest.raises(arl.LockTimeout):
                await lk.acquire(timeout=0)
        fence = lease.fencing_token
    assert not await lk.locked()
    assert (await lk.acquire()).fencing_token > fence


async def test_lock_taken_by_another_cancels_the_block(backend: arl.Backend, key: str) -> None:
    """If the key is deleted and another client takes the lock, the renewal notices, the
    block is cancelled and LockLost is raised; the other holder keeps its lock."""
    thief: list[arl.Lease] = []
    entered = asyncio.Event()

    async def steal() -> None:
        # Only once the block holds the lock: a fixed pause lost the race to a slow first
        # acquire on a loaded cluster (the delete came first, the thief found it held).
        await entered.wait()
        await delete(backend, lock_keys(backend, key)[0])
        thief.append(await arl.Lock(key, ttl=30, backend=backend).acquire(timeout=0))

    ttl = pace(backend, network=1.0, memory=0.3)  # the next renewal notices, ttl/3 later

    async def block() -> None:
        async with arl.lock(key, ttl=ttl, backend=backend):
            entered.set()
            await asyncio.sleep(10)
            raise AssertionError("the block ran to its end")

    start = now()
    stealer = asyncio.create_task(steal())
    with pytest.raises(arl.LockLost) as info:
        await block()
    await stealer
    assert info.value.name == key
    assert now() - start < 5
    assert await arl.Lock(key, backend=backend).locked()
    await thief[0].release()  # still the thief's: the lost block did not release it


async def test_blocking_pause_longer_than_ttl_raises_lock_lost(
    backend: arl.Backend, key: str
) -> None:
    """A block that blocks the event loop longer than the ttl is cancelled at its next await
    and LockLost is raised."""

    ttl = pace(backend, network=0.5, memory=0.2)  # (entering the block takes microseconds)

    async def block() -> None:
        async with arl.lock(key, ttl=ttl, backend=backend):
            # (the point: the loop cannot renew; on memory:// the lock expires on this
            # process's clock, across a network on the server's)
            time.sleep(ttl + pace(backend, network=0.3, memory=0.1))  # noqa: ASYNC251
            await asyncio.sleep(10)

    start = now()
    with pytest.raises(arl.LockLost):
        await block()
    assert now() - start < 5


async def test_unreachable_server_raises_lock_lost_before_expiry(
    own_redis: RedisServer, key: str
) -> None:
    """When Redis stops answering, the block is cancelled with LockLost before the ttl ends
    on the server."""
    async with arl.Backend.from_url(own_redis.url, timeout=0.5) as backend:
        loop = asyncio.get_running_loop()
        times: list[float] = []

        async def block() -> None:
            async with arl.lock(key, ttl=3, backend=backend):
                times.append(loop.time())
                own_redis.pause()
                try:
                    await asyncio.sleep(10)
                finally:
                    times.append(loop.time())

        try:
            with pytest.raises(arl.LockLost):
                await block()
        finally:
            own_redis.resume()
        assert times[1] - times[0] < 3  # the block stopped before the server-side expiry


async def test_without_auto_renew_an_expired_block_raises_lock_lost(
    backend: arl.Backend, key: str
) -> None:
    """With auto_renew=False, a block that outlives its ttl ends with LockLost on exit."""
    with pytest.raises(arl.LockLost):
        async with arl.lock(key, ttl=0.05, auto_renew=False, backend=backend):
            await asyncio.sleep(0.15)


async def test_release_by_hand_inside_the_block_stops_renewal(
    backend: arl.Backend, key: str
) -> None:
    """Releasing the lease inside the block is fine: no LockLost, renewal stops."""
    ttl = pace(backend, network=0.3, memory=0.15)
    async with arl.lock(key, ttl=ttl, backend=backend) as lease:
        await lease.release()
        await asyncio.sleep(ttl + 0.1)  # three renewals would have come
    assert not await arl.Lock(key, backend=backend).locked()


# -- the memory twins ---------------------------------------------------------------------


def _script_calls(
    kind: str, backend: arl.Backend, name: str
) -> dict[str, tuple[Any, list[str], list[Any]]]:
    """The scripts of a lock or semaphore named ``name`` and their keys and fixed arguments."""
    if kind == "lock":
        k, channel = _keys.lock(backend._head(_keys.LOCK_KIND), name)
        keys = [k]
        return {
            "acquire": (_scripts.LOCK_ACQUIRE, keys, [60_000]),
            "release": (_scripts.LOCK_RELEASE, keys, [60_000, channel, backend._publish_command]),
            "extend": (_scripts.LOCK_EXTEND, keys, [60_000]),
            "state": (_scripts.LOCK_LOCKED, keys, []),
        }
    holders, fences, channel = _keys.semaphore(backend._head(_keys.SEMAPHORE_KIND), name)
    keys = [holders, fences]
    return {
        "acquire": (_scripts.SEMAPHORE_ACQUIRE, keys, [60_000, 2]),
        "release": (
            _scripts.SEMAPHORE_RELEASE,
            keys,
            [60_000, channel, backend._publish_command],
        ),
        "extend": (_scripts.SEMAPHORE_EXTEND, keys, [60_000]),
        "state": (_scripts.SEMAPHORE_HOLDERS, keys[:1], []),
    }


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_memory_twins_answer_like_the_lua_scripts(
    redis_url: str, key: str, kind: str
) -> None:
    """400 random acquires, releases and extends by a few tokens get the same answers from
    the Lua scripts and from memory://; fences repeat and increase alike on both."""
    rng = random.Random(kind)
    tokens = [c * 32 for c in "abcd"]
    async with (
        arl.Backend.from_url(redis_url) as real,
        arl.Backend.from_url("memory://") as twin,
    ):
        sides = {"redis": real, "memory": twin}
        calls = {side: _script_calls(kind, b, key) for side, b in sides.items()}
        issued: dict[str, dict[str, int]] = {side: {} for side in sides}
        last: dict[str, int] = dict.fromkeys(sides, 0)
        for step in range(400):
            op = rng.choice(["acquire", "acquire", "release", "extend", "state"])
            token = rng.choice(tokens)
            answers: dict[str, object] = {}
            for side, b in sides.items():
                script, keys, extra = calls[side][op]
                args = extra if op == "state" else [token, *extra]
                reply = await b._run(script, keys, args)
                if op == "acquire":
                    got, value = int(reply[0]), int(reply[1])
                    again = False
                    if got:
                        again = issued[side].get(token) == value
                        if not again:
                            assert value > last[side], (side, step)
                            last[side] = value
                            issued[side][token] = value
                    answers[side] = (got, again)
                else:
                    answers[side] = int(reply)
            assert answers["redis"] == answers["memory"], (step, op, token, answers)
        await delete(real, *calls["redis"]["acquire"][1])


# -- tokens -------------------------------------------------------------------------------


def test_tokens_are_unique_and_not_tied_to_the_global_random() -> None:
    """128-bit URL-safe tokens, all distinct, free of the lock values' markers; seeding the
    ``random`` module changes nothing."""
    random.seed(0)
    first = [_keys.new_token() for _ in range(1000)]
    random.seed(0)
    second = [_keys.new_token() for _ in range(1000)]
    assert len(set(first + second)) == 2000
    assert all(len(base64.urlsafe_b64decode(t + "==")) == 16 for t in first)
    assert not any(set(t) & set(":~{}%") for t in first)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_draws_other_tokens_than_its_parent() -> None:
    """A forked child's next token is not the parent's next token (a generator state copied
    by fork would make them equal)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next token and leave at once
        os.write(write, _keys.new_token().encode())
        os._exit(0)
    os.close(write)
    try:
        os.waitpid(pid, 0)
        child = os.read(read, 64).decode()
    finally:
        os.close(read)
    assert len(child) == 22
    assert child != _keys.new_token()
