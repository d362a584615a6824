"""How long a conformance test waits on the store's clock, by where the store is.

A test that lets a window run out or a lease come due waits for it in real time, and its
windows must be long enough to hold the calls made inside them. Across a network (redis,
cluster, sentinel) those calls take milliseconds each and the margins suit that; on
memory:// a call takes microseconds and nothing stands between a call and its answer but
this process, so a test may choose a shorter window there. Each test says both values
where it uses them, and why the shorter one still holds its margin: a wait that fails the
test when this process stalls keeps at least 200 ms of slack on memory:// too. (On
memory:// the waits themselves cost no real time: the test runs on a virtual clock,
virtual_clock.py, whose loop jumps over them; a stall still counts on it, so the margins
hold there as they do in real time.)

A test that times a wake-up waits for the waiter to fall asleep (``asleep``) rather than
for a fixed pause, on every backend; one that needs another task, process or request to
have reached some state waits ``until`` it has. A test that times a wait reads ``now()``,
the running loop's clock, which is the one the library waits on (virtual or not), rather
than the monotonic clock.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aioratelimit as arl

T = TypeVar("T")


def now() -> float:
    """The running loop's clock (seconds): what a test times a wait on."""
    return asyncio.get_running_loop().time()


def on_memory(backend: arl.Backend) -> bool:
    """Whether ``backend`` is the in-process store (memory://)."""
    return backend.url.startswith("memory://")


def pace(backend: arl.Backend, *, network: T, memory: T) -> T:
    """``memory`` on the in-process store, else ``network``."""
    return memory if on_memory(backend) else network


async def until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    what: str = "the condition",
    within: float = 10.0,
    every: float = 0.005,
) -> None:
    """Return once ``condition()`` (a plain or an async predicate) holds; fail the test if
    it has not within ``within`` seconds: for a state that nothing signals, read every
    ``every`` seconds, instead of a fixed pause a loaded machine may outlast."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        met = condition()
        if inspect.isawaitable(met):
            met = await met
        if met:
            return
        assert loop.time() < deadline, f"{what}: not within {within} s"
        await asyncio.sleep(every)


async def asleep(
    backend: arl.Backend,
    *,
    count: int = 1,
    waiter: asyncio.Future[Any] | None = None,
    within: float = 10.0,
) -> None:
    """Return once ``count`` waiters on ``backend`` sleep on their subscriptions (each has
    tried and subscribed: a subscription is confirmed, or given up on, before anyone sleeps
    on it), or once ``waiter``, the task that waits, has ended without sleeping (an error):
    what a test that times a wake-up waits for, instead of a fixed pause that may end
    before the waiters sleep or long after."""
    subs = backend._notifier._subs

    def asleep_or_ended() -> bool:
        if waiter is not None and waiter.done():
            return True
        return sum(sub._waiter is not None for each in subs.values() for sub in each) >= count

    # (the notifier sets no event when a waiter falls asleep: its state is read every ms)
    await until(
        asleep_or_ended,
        what=f"{count} waiters asleep on {backend!r}",
        within=within,
        every=0.001,
    )
