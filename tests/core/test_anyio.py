"""anyio interop: the cancellation guarantees under anyio's cancel scopes, which cancel a
task again at every await until it leaves the scope (Starlette and FastAPI run us so).

500 random cancellations (``anyio.move_on_after``, ``anyio.fail_after``, a task group
whose scope a sibling cancels) land anywhere in acquire, hold and release of a lock and a
semaphore, manual and ``async with``, alone and contended, and in ``@idempotent`` calls:
afterwards nothing is held (the lock is free, every semaphore slot can be taken at once,
every idempotency key runs or replays). On memory:// and a real server, on anyio's asyncio
backend (the loop pytest-asyncio runs).
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import anyio
import pytest

import aioratelimit as arl

#: one operation to cancel (anyio's task groups take coroutine functions)
Op = Callable[[], Coroutine[Any, Any, None]]
CANCELLATIONS = 500
LIMIT = 2


async def cancelled(rng: random.Random, op: Op) -> None:
    """Run ``op`` under one of anyio's ways to cancel it, after a random delay (none, a
    loop turn, or up to a few ms: inside acquire, hold or release)."""
    delay = rng.choice([0.0, 0.0001, rng.uniform(0, 0.004), rng.uniform(0, 0.004)])
    how = rng.randrange(3)
    if how == 0:
        with anyio.move_on_after(delay):
            await op()
    elif how == 1:
        try:
            with anyio.fail_after(delay):
                await op()
        except TimeoutError:
            pass
    else:

        async def cancel(scope: anyio.CancelScope) -> None:
            await anyio.sleep(delay)
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(op)
            tg.start_soon(cancel, tg.cancel_scope)


def hold(rng: random.Random) -> Op:
    async def held() -> None:
        await anyio.sleep(rng.choice([0, 0, 0.001, 0.003]))

    return held


def lock_ops(backend: arl.Backend, name: str, rng: random.Random) -> list[Op]:
    lk = arl.Lock(name, ttl=30, backend=backend)

    async def block() -> None:
        async with arl.lock(name, ttl=30, timeout=2, backend=backend):
            await hold(rng)()

    async def manual() -> None:
        lease = await lk.acquire(timeout=2)
        try:
            await hold(rng)()
        finally:
            await lease.release()

    async def contended() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(block)
            tg.start_soon(manual)

    return [block, manual, contended]


def semaphore_ops(backend: arl.Backend, name: str, rng: random.Random) -> list[Op]:
    sem = arl.Semaphore(name, limit=LIMIT, ttl=30, backend=backend)

    async def block() -> None:
        async with arl.semaphore(name, limit=LIMIT, ttl=30, timeout=2, backend=backend):
            await hold(rng)()

    async def manual() -> None:
        lease = await sem.acquire(timeout=2)
        try:
            await hold(rng)()
        finally:
            await lease.release()

    async def crowd() -> None:  # more holders than slots: some wait
        async with anyio.create_task_group() as tg:
            for op in (block, manual, block):
                tg.start_soon(op)

    return [block, manual, crowd]


async def free(backend: arl.Backend, lock: str, semaphore: str) -> None:
    """Nothing held: the lock and every slot can be taken at once (a release the
    cancellation left to finish in the background is given the backend's timeout)."""
    with anyio.fail_after(10):
        while await arl.Lock(lock, backend=backend).locked():  # noqa: ASYNC110 (a server's state)
            await anyio.sleep(0.01)
    lease = await arl.Lock(lock, ttl=30, backend=backend).acquire(timeout=0)
    await lease.release()
    sem = arl.Semaphore(semaphore, limit=LIMIT, ttl=30, backend=backend)
    leases = [await sem.acquire(timeout=10) for _ in range(LIMIT)]
    for lease in leases:
        await lease.release()


@pytest.fixture
async def backend(store_url: str) -> AsyncIterator[arl.Backend]:
    async with arl.Backend.from_url(store_url) as b:
        yield b


async def test_random_cancellations_leave_no_lock_or_slot_held(backend: arl.Backend) -> None:
    rng = random.Random(20261201)
    lock, semaphore = f"L-{uuid.uuid4().hex}", f"S-{uuid.uuid4().hex}"
    ops = lock_ops(backend, lock, rng) + semaphore_ops(backend, semaphore, rng)
    for _ in range(CANCELLATIONS):
        await cancelled(rng, rng.choice(ops))
    await free(backend, lock, semaphore)


async def test_random_cancellations_of_idempotent_calls_leave_no_key_held(
    backend: arl.Backend,
) -> None:
    """A cancelled ``@idempotent`` call frees its key: afterwards a call with each key runs
    (or replays a result stored before), never IdempotencyInProgress."""
    rng = random.Random(1201)
    prefix = uuid.uuid4().hex
    runs: list[int] = []

    @arl.idempotent(key=lambda n: f"{prefix}:{n}", backend=backend)
    async def charge(n: int) -> int:
        await hold(rng)()
        await anyio.sleep(rng.choice([0, 0.002]))
        runs.append(n)
        return n

    keys = range(20)
    for _ in range(CANCELLATIONS):
        n = rng.choice(keys)

        async def call(n: int = n) -> None:
            with contextlib.suppress(arl.IdempotencyInProgress):  # a call still holds it
                await charge(n)

        await cancelled(rng, call)
    with anyio.fail_after(20):
        for n in keys:
            while True:
                try:
                    assert await charge(n) == n
                    break
                except arl.IdempotencyInProgress:  # a cancelled call's release still on its way
                    await anyio.sleep(0.01)
