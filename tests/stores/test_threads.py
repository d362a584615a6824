"""One backend used from several threads, each with an event loop of its own: what a sync
framework does (Flask's threads, Django's sync views, ``async_to_sync``) when it calls
``asyncio.run(limiter.hit(...))`` on the shared default backend.

A Redis backend serves one running loop at a time. A call from another loop while the one
it serves still runs is refused with ``BackendError`` naming the fix, before anything is
sent, and the loop it serves carries on undisturbed (its connection, its subscriber, its
waiters): never a ``CancelledError`` or a closed connection that the caller did not cause.
memory:// has no connection to hand over: it serves every thread, its scripts atomic, its
wake-ups delivered to a waiter on any thread's loop.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from support.core_calls import WOKEN_WITHIN
from support.pace import asleep

import aioratelimit as arl

T = TypeVar("T")

#: What the refusal says (the start of the reason, and the fix).
REFUSED = r"in use on another event loop, which still runs .*Backend\.from_url inside"


class LoopThread:
    """An event loop running in a thread of its own until ``close``, with ``run`` to have
    it run a coroutine for the calling thread (asyncio.run's shutdown at the end)."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(),))
        self.thread.start()
        self._ready.wait(10)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop: asyncio.Future[None] = self.loop.create_future()
        self._ready.set()
        await self._stop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set_result, None)
        self.thread.join(30)


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    try:
        yield thread
    finally:
        thread.close()


def outcome(call: Coroutine[Any, Any, object]) -> str:
    """What ``asyncio.run(call)`` came to in this thread: its result's kind, or the error."""
    try:
        result = asyncio.run(call)
    except BaseException as exc:  # CancelledError included: that is what is counted
        return f"{type(exc).__name__}: {exc}"
    return type(result).__name__


@pytest.mark.parametrize("deployment", ["redis", "cluster", "sentinel"])
def test_a_call_from_another_loop_while_the_served_one_runs_is_refused(
    request: pytest.FixtureRequest, deployment: str, loop_thread: LoopThread, key: str
) -> None:
    """While the loop a backend serves runs in another thread, a call through
    ``asyncio.run`` here is ``BackendError`` naming the fix (reported to ``on_call`` as
    such), nothing is counted for it, and the serving loop's calls go on."""
    url = str(request.getfixturevalue(f"{deployment}_url"))
    calls: list[arl.ScriptCall] = []
    backend = arl.Backend.from_url(url, on_call=calls.append)
    limiter = arl.FixedWindow("10/minute", backend=backend)
    try:
        assert loop_thread.run(limiter.hit(key)).remaining == 9
        with pytest.raises(arl.BackendError, match=REFUSED):
            asyncio.run(limiter.hit(key))
        assert loop_thread.run(limiter.hit(key)).remaining == 8
    finally:
        loop_thread.run(backend.aclose())
    errors = [type(call.error).__name__ if call.error else None for call in calls]
    assert errors == [None, "BackendError", None]


@pytest.mark.parametrize("deployment", ["redis", "sentinel"])
def test_the_served_loops_waiters_are_not_disturbed(
    request: pytest.FixtureRequest, deployment: str, loop_thread: LoopThread, key: str
) -> None:
    """A lock acquire from another loop while a waiter of the served loop sleeps on its
    subscription is refused (it would subscribe first: the notifier refuses it too), and
    that waiter is still woken at the release, through the subscriber it had."""
    backend = arl.Backend.from_url(str(request.getfixturevalue(f"{deployment}_url")))
    lk = arl.Lock(key, ttl=30, backend=backend)

    async def hold_and_wait() -> tuple[arl.Lease, asyncio.Task[arl.Lease]]:
        lease = await lk.acquire()
        waiter = asyncio.create_task(lk.acquire(timeout=10))
        await asleep(backend, waiter=waiter)
        return lease, waiter

    async def hand_over(lease: arl.Lease, waiter: asyncio.Task[arl.Lease]) -> float:
        loop = asyncio.get_running_loop()
        released = loop.time()
        await lease.release()
        second = await waiter
        took = loop.time() - released
        await second.release()
        return took

    try:
        lease, waiter = loop_thread.run(hold_and_wait())
        with pytest.raises(arl.BackendError, match=REFUSED):
            asyncio.run(lk.acquire(timeout=1))
        assert loop_thread.run(hand_over(lease, waiter)) < WOKEN_WITHIN
    finally:
        loop_thread.run(backend.aclose())


def test_a_hundred_threads_sharing_the_default_backend_see_no_cancellation(
    redis_url: str, key: str
) -> None:
    """A hundred threads each calling ``asyncio.run(limiter.hit(...))`` on one shared
    backend (a thread pool serving a sync framework): every call is admitted or refused
    with the ``BackendError`` naming the fix; none raises a ``CancelledError`` or a
    ``BackendUnavailable`` that another thread's loop caused."""
    backend = arl.Backend.from_url(redis_url)
    limiter = arl.FixedWindow("1000/minute", backend=backend)
    try:
        with ThreadPoolExecutor(max_workers=100) as pool:
            outcomes = list(pool.map(lambda _: outcome(limiter.hit(key)), range(100)))
    finally:
        asyncio.run(backend.aclose())
    counts = collections.Counter(o.split(":")[0] for o in outcomes)
    assert set(counts) <= {"Decision", "BackendError"}, counts
    assert all("another event loop" in o for o in outcomes if o.startswith("BackendError"))
    assert counts["Decision"] >= 1


def test_memory_serves_every_thread(key: str) -> None:
    """memory:// serves threads at once: a hundred threads' hits are counted exactly (each
    script atomic), and a lock released on one thread's loop wakes a waiter sleeping on
    another's at once, even under asyncio's debug mode (no call of another thread's loop)."""
    backend = arl.Backend.from_url("memory://")
    limiter = arl.FixedWindow("60/minute", backend=backend)
    with ThreadPoolExecutor(max_workers=100) as pool:
        outcomes = list(pool.map(lambda _: asyncio.run(limiter.hit(key)).allowed, range(100)))
    assert (outcomes.count(True), outcomes.count(False)) == (60, 40)

    lk = arl.Lock(key, ttl=30, backend=backend)
    holder, waiter_thread = LoopThread(), LoopThread()
    for each in (holder, waiter_thread):
        each.loop.call_soon_threadsafe(each.loop.set_debug, True)
    try:
        lease = holder.run(lk.acquire())

        async def wait() -> asyncio.Task[arl.Lease]:
            task = asyncio.create_task(lk.acquire(timeout=10))
            await asleep(backend, waiter=task)
            return task

        waiter = waiter_thread.run(wait())

        async def woken() -> float:
            loop = asyncio.get_running_loop()
            started = loop.time()
            second = await waiter
            took = loop.time() - started
            await second.release()
            return took

        done = asyncio.run_coroutine_threadsafe(woken(), waiter_thread.loop)
        holder.run(lease.release())
        assert done.result(10) < WOKEN_WITHIN
    finally:
        holder.close()
        waiter_thread.close()
