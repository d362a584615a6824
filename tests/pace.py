"""How long a conformance test waits on the store's clock, by where the store is.

A test that lets a window run out or a lease come due waits for it in real time, and its
windows must be long enough to hold the calls made inside them. Across a network (redis,
cluster, sentinel) those calls take milliseconds each and the margins suit that; on
memory:// a call takes microseconds and nothing stands between a call and its answer but
this process, so a test may choose a shorter window there (``pytest -m memory`` is the
lane that must be quick). Each test says both values where it uses them, and why the
shorter one still holds its margin: a wait that fails the test when this process stalls
keeps at least 200 ms of slack on memory:// too.

A test that times a wake-up waits for the waiter to fall asleep (``asleep``) rather than
for a fixed pause, on every backend.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import aioratelimit as arl

T = TypeVar("T")


def on_memory(backend: arl.Backend) -> bool:
    """Whether ``backend`` is the in-process store (memory://)."""
    return backend.url.startswith("memory://")


def pace(backend: arl.Backend, *, network: T, memory: T) -> T:
    """``memory`` on the in-process store, else ``network``."""
    return memory if on_memory(backend) else network


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
    subs = backend.notifier._subs
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    # (the notifier sets no event when a waiter falls asleep: its state is read every ms)
    while sum(sub._waiter is not None for each in subs.values() for sub in each) < count:
        if waiter is not None and waiter.done():
            return
        assert loop.time() < deadline, f"not {count} waiters asleep on {backend!r} in {within} s"
        await asyncio.sleep(0.001)
