"""Waiting for a rate limit (``acquire(wait=True)``, ``async with limiter(key, wait=True)``,
``@limiter.limit(wait=True)``) in one or two script calls per admitted request.

Sleeping ``retry_after`` and trying again, every waiter at once, costs a retry storm: the
waiters of a key wake together and all but one are denied again (a TokenBucket of burst 1
took 30 script calls per admitted request across 3 processes). Two remedies:

- **A TokenBucket books its slot.** Its script (``lua/token_bucket.lua`` with
  ``max_wait_us``) moves the TAT on for a hit that will conform within the waiter's
  timeout and answers when: the waiter sleeps once and goes. One call per admitted
  request, first come first served across every process (the order Redis sees). A waiter
  cancelled in its sleep gives its slot back (``token_bucket_refund.lua``).
- **The windows queue per key.** In each process, the waiters of one key form a line
  (FIFO); only its head calls the script: it sleeps ``retry_after`` and tries again; once
  admitted it leaves, and the next head tries at once. Waiters behind the head cost
  nothing; an admitted request costs its hit, plus about one denied try of the head per
  moment capacity comes back (per process).
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from typing import Any, Protocol

from ._aio import finish
from ._errors import RateLimited
from ._rates import Decision

#: Added to every wait for ``retry_after`` (seconds): loops whose timers have millisecond
#: resolution (uvloop) wake up to 1 ms early, which would cost a denied try and another sleep.
TIMER_SLACK = 0.001

#: The longest booking asked for by a waiter without a timeout (µs; about 31 years).
NO_LIMIT_US = 10**15


class _Line:
    """The waiters of one key in this process, head first, and the head's last decision."""

    __slots__ = ("last", "waiters")

    def __init__(self) -> None:
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.last: Decision | None = None


#: per event loop: (backend, the key's first Redis key) -> its line of waiters
_lines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, str], _Line]] = (
    weakref.WeakKeyDictionary()
)


class Waitable(Protocol):
    """What waiting needs of a ``Limiter`` (``_ratelimit`` imports this module, not back)."""

    _reserves: bool
    _hit_mode: int

    @property
    def backend(self) -> Any: ...

    def _keys(self, backend: Any, key: str) -> list[str]: ...

    async def _decide(self, key: str, cost: int, mode: int, *extra: int) -> Decision: ...

    async def refund(self, key: str, cost: int = 1) -> int: ...


async def wait(limiter: Waitable, key: str, cost: int, timeout: float | None) -> Decision:
    """Admit ``cost`` for ``key`` once the limiter allows, within ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    if limiter._reserves:
        return await _booked(limiter, key, cost, deadline, timeout)
    return await _queued(limiter, key, cost, deadline, timeout)


def _timed_out(key: str, timeout: float | None, decision: Decision) -> RateLimited:
    return RateLimited(f"rate limited: {key!r} (timeout {timeout} s)", decision=decision)


async def _booked(
    limiter: Waitable, key: str, cost: int, deadline: float | None, timeout: float | None
) -> Decision:
    loop = asyncio.get_running_loop()
    while True:
        left = NO_LIMIT_US if deadline is None else int((deadline - loop.time()) * 1e6)
        decision = await limiter._decide(key, cost, 1, max(left, 0))
        if decision.allowed and decision.retry_after == 0:
            return decision
        if decision.allowed:
            # Booked: the hit is counted for then; sleep once. Cancelled meanwhile, the
            # slot is given back (the booking's reply arrived, so the refund is exact).
            try:
                await asyncio.sleep(decision.retry_after + TIMER_SLACK)
            except asyncio.CancelledError:
                await finish(limiter.refund(key, cost))
                raise
            return Decision(
                True, decision.limit, decision.remaining, decision.reset_after, 0.0, cost
            )
        # Denied: the slot is beyond the timeout, or the key is blocked.
        if deadline is not None and loop.time() + decision.retry_after > deadline:
            raise _timed_out(key, timeout, decision)
        await asyncio.sleep(decision.retry_after + TIMER_SLACK)


async def _queued(
    limiter: Waitable, key: str, cost: int, deadline: float | None, timeout: float | None
) -> Decision:
    loop = asyncio.get_running_loop()
    lines = _lines.get(loop)
    if lines is None:
        lines = _lines[loop] = {}
    backend = limiter.backend
    name = (id(backend), limiter._keys(backend, key)[0])
    decision: Decision | None = None
    line = lines.get(name)
    if line is None:
        # No one waits for this key here: try at once (most calls are admitted).
        decision = await limiter._decide(key, cost, limiter._hit_mode)
        if decision.allowed:
            return decision
        line = lines.get(name)  # (another waiter may have started one meanwhile)
        if line is None:
            line = lines[name] = _Line()
            line.last = decision
    else:
        decision = line.last
    waiters = line.waiters
    me: asyncio.Future[None] = loop.create_future()
    waiters.append(me)
    try:
        if waiters[0] is not me:
            # Behind others: wait to be the head, within the timeout.
            try:
                async with asyncio.timeout_at(deadline):
                    await me
            except TimeoutError:
                last = line.last or decision
                assert last is not None  # the line's first waiter was denied once
                raise _timed_out(key, timeout, last) from None
            decision = None
        while True:
            if decision is None:
                decision = line.last = await limiter._decide(key, cost, limiter._hit_mode)
                if decision.allowed:
                    return decision
            if deadline is not None and loop.time() + decision.retry_after > deadline:
                raise _timed_out(key, timeout, decision)
            await asyncio.sleep(decision.retry_after + TIMER_SLACK)
            decision = None
    finally:
        # Leave the line; the next waiter becomes its head and tries at once.
        if waiters and waiters[0] is me:
            waiters.popleft()
            if waiters and not waiters[0].done():
                waiters[0].set_result(None)
        else:
            waiters.remove(me)
        if not waiters and lines.get(name) is line:
            del lines[name]
