"""max_hold on every backend: a block holding a lock, a semaphore slot or a rw lease past it
is cancelled as for a lost lease (``LockLost``) and what it held is released, however long
renewal would have kept it."""

from __future__ import annotations

import asyncio

import pytest
from support.pace import pace

import aioratelimit as arl


async def test_max_hold_cancels_a_stuck_block_and_frees_the_lock(
    backend: arl.Backend, key: str
) -> None:
    """Renewed past its ttl until max_hold, then cancelled; the lock is free at once (not
    only when its ttl runs out) and the block saw it held until then."""
    # (a ttl a loaded machine cannot outlast between two renewals: the block must end by
    # max_hold, never by a lost renewal)
    ttl = pace(backend, network=2.0, memory=0.3)
    lk = arl.Lock(key, ttl=30, backend=backend)
    seen: list[bool] = []

    async def stuck() -> None:
        async with arl.lock(key, ttl=ttl, max_hold=ttl * 3, backend=backend):
            while True:  # it would run forever
                seen.append(await lk.locked())
                await asyncio.sleep(ttl / 4)

    with pytest.raises(arl.LockLost, match="max_hold") as info:
        await stuck()
    assert info.value.name == key
    assert len(seen) > 8  # held across several renewals
    assert all(seen)
    assert not await lk.locked()
    await (await lk.acquire(timeout=0)).release()


async def test_max_hold_shorter_than_the_ttl(backend: arl.Backend, key: str) -> None:
    """A max_hold below the ttl ends the block before the first renewal."""
    lk = arl.Lock(key, ttl=30, backend=backend)
    with pytest.raises(arl.LockLost):
        async with arl.lock(key, ttl=30, max_hold=0.1, backend=backend):
            await asyncio.Event().wait()
    assert not await lk.locked()


async def test_max_hold_frees_a_semaphore_slot(backend: arl.Backend, key: str) -> None:
    sem = arl.Semaphore(key, limit=1, ttl=30, backend=backend)
    with pytest.raises(arl.LockLost, match="max_hold"):
        async with arl.semaphore(key, limit=1, ttl=30, max_hold=0.1, backend=backend):
            await asyncio.Event().wait()
    assert await sem.holders() == 0


async def test_a_block_that_ends_in_time_is_untouched(backend: arl.Backend, key: str) -> None:
    async with arl.lock(key, ttl=30, max_hold=30, backend=backend) as lease:
        pass
    with pytest.raises(arl.LockNotOwned):
        await lease.release()  # released by the block's exit, as always
    with pytest.raises(ValueError, match="boom"):
        async with arl.lock(key, ttl=30, max_hold=30, backend=backend):
            raise ValueError("boom")


async def test_an_outer_cancellation_is_not_taken_for_max_hold(
    backend: arl.Backend, key: str
) -> None:
    """A block cancelled from outside before max_hold raises CancelledError, not LockLost."""
    entered = asyncio.Event()

    async def block() -> None:
        async with arl.lock(key, ttl=30, max_hold=30, backend=backend):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(block())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await arl.Lock(key, backend=backend).locked()


def test_bad_max_hold_raises_at_once(key: str) -> None:
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_hold"):
            arl.lock(key, max_hold=bad)
    with pytest.raises(TypeError):
        arl.semaphore(key, max_hold="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="auto_renew"):
        arl.lock(key, auto_renew=False, max_hold=5)
    assert "max_hold=5" in repr(arl.lock(key, max_hold=5))
