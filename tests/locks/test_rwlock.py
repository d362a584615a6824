"""Read/write locks on every backend: many readers or one writer, writer-preferring,
fenced across both modes, woken on release, renewed, cancel-safe, never reentrant."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from support.pace import until

import aioratelimit as arl
from aioratelimit import _keys, _scripts
from aioratelimit._locks import line as _line
from aioratelimit._locks import rwlock as _rwlock


def rw_keys(backend: arl.Backend, name: str) -> tuple[list[str], str]:
    return _keys.rwlock(backend._head(_keys.RWLOCK_KIND), name)


def writers_waiting(backend: arl.Backend, name: str) -> int:
    """How many write acquires wait in the writers' line here."""
    channel = rw_keys(backend, name)[1]
    lines = _line._lines.get(asyncio.get_running_loop(), {})
    found = lines.get((backend._notifier, channel, 0))
    return 0 if found is None else len(found.waiters)


def readers_waiting(backend: arl.Backend, name: str) -> int:
    """How many read acquires wait here: at the reader gate (or in a line, were they to
    stand in one: what the tests that check they do not must still count)."""
    channel = rw_keys(backend, name)[1]
    gates = _rwlock._gates.get(asyncio.get_running_loop(), {})
    found = gates.get((backend._notifier, channel))
    lines = _line._lines.get(asyncio.get_running_loop(), {})
    line = lines.get((backend._notifier, channel, -1))
    return (0 if found is None else found.waiting) + (0 if line is None else len(line.waiters))


async def delete(backend: arl.Backend, name: str) -> None:
    await backend._run(_scripts.DELETE, rw_keys(backend, name)[0], ())


async def test_readers_share_and_a_writer_is_alone(backend: arl.Backend, key: str) -> None:
    """40 tasks reading or writing at random: never a writer beside anyone, several readers
    at once, and all of them get in."""
    rw = arl.ReadWriteLock(key, ttl=10, backend=backend)
    state = {"readers": 0, "writers": 0, "most_readers": 0, "done": 0}
    rng = random.Random(key)

    async def worker(write: bool) -> None:
        hold = rw.write(timeout=60) if write else rw.read(timeout=60)
        async with hold:
            state["writers" if write else "readers"] += 1
            assert state["writers"] <= 1
            assert state["writers"] == 0 or state["readers"] == 0
            state["most_readers"] = max(state["most_readers"], state["readers"])
            await asyncio.sleep(0.002)
            state["writers" if write else "readers"] -= 1
            state["done"] += 1

    await asyncio.gather(*(worker(rng.random() < 0.25) for _ in range(40)))
    assert state["done"] == 40
    assert state["most_readers"] > 1
    assert not await rw.locked()


async def test_a_waiting_writer_stops_new_readers(backend: arl.Backend, key: str) -> None:
    """Writer-preferring: while a writer waits for a reader, a new reader is refused; the
    writer gets in when the reader leaves, and the readers that waited after it."""
    rw = arl.ReadWriteLock(key, ttl=10, backend=backend)
    first = await rw.acquire_read()
    writer = asyncio.create_task(rw.acquire_write())
    await until(lambda: _waiting_writers(rw), what="the writer's intent")
    with pytest.raises(arl.LockTimeout):
        await asyncio.create_task(rw.acquire_read(timeout=0))
    reader = asyncio.create_task(rw.acquire_read())
    await until(lambda: readers_waiting(backend, key) == 1, what="the reader in line")
    await first.release()
    w = await writer
    assert not reader.done()
    state = await rw.state()
    assert (state.readers, state.writer_fence, state.waiting_writers) == (0, w.fencing_token, 0)
    await w.release()
    r = await reader
    assert r.fencing_token > w.fencing_token > first.fencing_token  # one order, both modes
    await r.release()


async def _waiting_writers(rw: arl.ReadWriteLock) -> bool:
    return (await rw.state()).waiting_writers == 1


async def test_readers_here_never_queue_behind_each_other(backend: arl.Backend, key: str) -> None:
    """While readers hold, 30 more get in at once (none waits in line); 30 readers that
    waited for a writer all get in once it leaves, the writer line untouched."""
    rw = arl.ReadWriteLock(key, ttl=10, backend=backend)
    holding = await rw.acquire_read()
    leases = await asyncio.gather(*(asyncio.create_task(rw.acquire_read(0)) for _ in range(30)))
    assert (await rw.state()).readers == 31
    for lease in [holding, *leases]:
        await lease.release()
    w = await rw.acquire_write()
    readers = [asyncio.create_task(rw.acquire_read(timeout=60)) for _ in range(30)]
    await until(lambda: readers_waiting(backend, key) == 30, what="30 readers in line")
    assert writers_waiting(backend, key) == 0
    await w.release()
    leases = await asyncio.gather(*readers)
    assert (await rw.state()).readers == 30
    for lease in leases:
        await lease.release()


async def test_readers_waiting_for_a_writer_all_try_at_once(redis_url: str, key: str) -> None:
    """When the writer leaves, the readers waiting here try side by side (many acquires in
    flight at once), not one after another as a lock's line would."""
    async with arl.Backend.from_url(redis_url) as backend:
        rw = arl.ReadWriteLock(key, ttl=10, backend=backend)
        w = await rw.acquire_write()
        readers = [asyncio.create_task(rw.acquire_read(timeout=60)) for _ in range(20)]
        await until(lambda: readers_waiting(backend, key) == 20, what="20 readers waiting")
        flight = {"now": 0, "most": 0}
        original = backend._run

        async def counted(script: Any, keys: Any, args: Any) -> Any:
            if script is not _scripts.RWLOCK_ACQUIRE:
                return await original(script, keys, args)
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])
            try:
                return await original(script, keys, args)
            finally:
                flight["now"] -= 1

        backend._run = counted
        try:
            await w.release()
            leases = await asyncio.gather(*readers)
        finally:
            backend._run = original
        assert flight["most"] > 1
        assert (await rw.state()).readers == 20
        for lease in leases:
            await lease.release()


async def test_a_cancelled_or_timed_out_writer_withdraws_its_intent(
    backend: arl.Backend, key: str
) -> None:
    """A writer that gives up waiting (cancelled, or its timeout) takes its intent back at
    once: readers get in again without waiting for the intent to expire."""
    rw = arl.ReadWriteLock(key, ttl=10, backend=backend)
    reader = await rw.acquire_read()
    writer = asyncio.create_task(rw.acquire_write())
    await until(lambda: _waiting_writers(rw), what="the writer's intent")
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert (await rw.state()).waiting_writers == 0
    (await asyncio.create_task(rw.acquire_read(timeout=0)))  # not refused
    with pytest.raises(arl.LockTimeout):
        await asyncio.create_task(rw.acquire_write(timeout=0.05))
    assert (await rw.state()).waiting_writers == 0
    await reader.release()
    await delete(backend, key)


async def test_random_cancellations_leave_nothing_behind(backend: arl.Backend, key: str) -> None:
    """120 reads and writes, waiting and holding, cancelled at random moments: afterwards
    nobody holds it, no writer's intent is left, and a writer gets it at once."""
    rw = arl.ReadWriteLock(key, ttl=30, backend=backend)
    rng = random.Random(key)

    async def use(write: bool) -> None:
        async with rw.write() if write else rw.read():
            await asyncio.sleep(rng.random() / 200)

    for _ in range(6):
        tasks = [asyncio.create_task(use(rng.random() < 0.3)) for _ in range(20)]
        await asyncio.sleep(rng.random() / 100)
        for task in tasks:
            if rng.random() < 0.6:
                task.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        assert [e for e in ended if not isinstance(e, (type(None), asyncio.CancelledError))] == []
        assert await rw.state() == arl.RWState(0, 0, None, 0)
    await (await rw.acquire_write(timeout=0)).release()


async def test_a_vanished_writers_intent_expires(backend: arl.Backend, key: str) -> None:
    """A writer that records its intent and is never heard from again (a crashed process)
    stops new readers only until its intent expires."""
    rw = arl.ReadWriteLock(key, ttl=10, backend=backend)
    reader = await rw.acquire_read()
    keys = rw_keys(backend, key)[0]
    reply = await backend._run(_scripts.RWLOCK_ACQUIRE, keys, (_keys.new_token(), 10_000, "w", 300))
    assert reply[0] == 0
    assert (await rw.state()).waiting_writers == 1
    with pytest.raises(arl.LockTimeout):
        await asyncio.create_task(rw.acquire_read(timeout=0))
    late = await asyncio.create_task(rw.acquire_read(timeout=30))  # in once the intent expires
    assert (await rw.state()).waiting_writers == 0
    await late.release()
    await reader.release()


async def test_reentry_and_upgrade_are_refused_before_any_call(
    backend: arl.Backend, key: str
) -> None:
    """A task asking again for a rw lock it holds, in either mode, would wait for itself:
    RuntimeError, nothing sent; another task may read beside it."""
    rw = arl.ReadWriteLock(key, ttl=10, backend=backend)
    calls: list[Any] = []
    async with rw.read():
        before = await rw.state()
        original = backend._run

        async def counted(*args: Any) -> Any:
            calls.append(args)
            return await original(*args)

        backend._run = counted
        try:
            with pytest.raises(RuntimeError, match="upgraded"):
                async with rw.write(timeout=0):
                    pass
            with pytest.raises(RuntimeError, match="reentrant"):
                await arl.ReadWriteLock(key, backend=backend).acquire_read(timeout=0)
        finally:
            backend._run = original
        assert calls == []
        assert await rw.state() == before
        other = await asyncio.create_task(rw.acquire_read(timeout=0))
        await other.release()
    async with rw.write():  # released: the task may take it again
        pass


async def test_renewal_keeps_a_write_lease_and_fences_increase(
    backend: arl.Backend, key: str
) -> None:
    """A renewed writer keeps it through three ttls; the next reader's fence is greater."""
    rw = arl.ReadWriteLock(key, ttl=0.6, backend=backend)
    async with rw.write() as lease:
        for _ in range(6):
            await asyncio.sleep(0.3)
            with pytest.raises(arl.LockTimeout):
                await asyncio.create_task(rw.acquire_read(timeout=0))
    r = await rw.acquire_read(timeout=0)
    assert r.fencing_token > lease.fencing_token
    await r.release()
    with pytest.raises(arl.LockNotOwned):
        await r.release()


async def test_max_hold_ends_a_read_block(backend: arl.Backend, key: str) -> None:
    """max_hold ends a read block (LockLost) and frees its share."""
    rw = arl.ReadWriteLock(key, ttl=10, backend=backend)
    with pytest.raises(arl.LockLost, match="max_hold"):
        async with rw.read(max_hold=0.2):
            await asyncio.Event().wait()
    assert not await rw.locked()


async def test_every_key_written_expires(redis_url: str, key: str) -> None:
    """Holders, fences and intents all carry a TTL."""
    async with arl.Backend.from_url(redis_url) as backend:
        keys = rw_keys(backend, key)[0]
        client: Any = backend._store.client  # type: ignore[attr-defined]
        rw = arl.ReadWriteLock(key, ttl=5, backend=backend)
        reader = await rw.acquire_read()
        writer = asyncio.create_task(rw.acquire_write())
        await until(lambda: _waiting_writers(rw), what="the writer's intent")
        for k in keys:
            assert 0 < await client.pttl(k) <= 5000
        await reader.release()
        await (await writer).release()
        for k in keys[:2]:
            assert 0 < await client.pttl(k) <= 5000
        await delete(backend, key)


async def test_bad_arguments_raise_before_any_io(key: str) -> None:
    with pytest.raises(ValueError, match="ttl"):
        arl.ReadWriteLock(key, ttl=0)
    with pytest.raises(ValueError, match="name"):
        arl.ReadWriteLock("")
    rw = arl.ReadWriteLock(key)
    with pytest.raises(ValueError, match="timeout"):
        rw.read(timeout=-1)
    with pytest.raises(ValueError, match="max_hold"):
        rw.write(max_hold=0)
    with pytest.raises(TypeError):
        rw.read(auto_renew=1)  # type: ignore[arg-type]
    assert key in repr(rw)
