"""Waiting for a rate limit (``acquire(wait=True)``, ``async with limiter(key, wait=True)``,
``@limiter.limit(wait=True)``) in one or two script calls per admitted request.

Sleeping ``retry_after`` and trying again, every waiter at once, costs a retry storm: the
waiters of a key wake together and all but one are denied again (a TokenBucket of burst 1
took 30 script calls per admitted request across 3 processes), and whichever process asks
first takes all the capacity there is. Instead:

- **One line per key and process.** The waiters of one key in one process form a line,
  first come first served; only its head calls the script. Once admitted, it leaves and
  the next head tries at once; waiters behind it cost nothing. Each process has one try
  in flight per key, so the processes' tries alternate at the server and capacity is
  shared between them about evenly.
- **A TokenBucket's head books its slot.** Its script (``lua/token_bucket.lua`` with
  ``max_wait_us``) moves the TAT on for a hit that will conform within the head's
  timeout and answers when: the head sleeps once, then leaves the line. One call per
  admitted request; the next head books when the previous slot comes, so each process
  holds one booking at a time and the slots go round the processes. A head cancelled in
  its sleep gives its slot back (``token_bucket_refund.lua``).
- **A window's head sleeps ``retry_after``** and tries again: an admitted request costs
  its hit, plus about one denied try per moment capacity comes back (per process).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import weakref
from collections.abc import Awaitable, Callable, Hashable

from .._aio import finish
from .._errors import RateLimited
from .._rates import Decision

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


#: per event loop: the line's name (its limiter's, for one key) -> its line of waiters
_lines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, _Line]] = (
    weakref.WeakKeyDictionary()
)

#: ``attempt(key, cost, booking_us)``: one try of the limiter; a limiter that books (a
#: TokenBucket) may book a slot up to ``booking_us`` ahead, and answers when it falls.
Attempt = Callable[[str, int, int], Awaitable[Decision]]
#: ``refund(key, cost)``: give back a booked slot (the waiter was cancelled before it).
Refund = Callable[[str, int], Awaitable[int]]


async def wait(
    attempt: Attempt,
    refund: Refund,
    name: Hashable,
    key: str,
    cost: int,
    timeout: float | None,
) -> Decision:
    """Admit ``cost`` for ``key`` once ``attempt`` allows, within ``timeout`` seconds;
    ``name`` names the line of waiters (one per limiter, key and backend)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    lines = _lines.get(loop)
    if lines is None:
        lines = _lines[loop] = {}
    line = lines.get(name)
    if line is None:
        line = lines[name] = _Line()
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
                raise _timed_out(key, timeout, line.last) from None
        return await _head(attempt, refund, line, key, cost, deadline, timeout)
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


async def _head(
    attempt: Attempt,
    refund: Refund,
    line: _Line,
    key: str,
    cost: int,
    deadline: float | None,
    timeout: float | None,
) -> Decision:
    """The head of the line: try, and sleep until the try can succeed, until admitted."""
    loop = asyncio.get_running_loop()
    while True:
        left = NO_LIMIT_US if deadline is None else int((deadline - loop.time()) * 1e6)
        decision = await attempt(key, cost, max(left, 0))
        line.last = decision
        if decision.allowed:
            if decision.retry_after == 0:
                return decision
            # Booked: the hit is counted for then; sleep once. Cancelled meanwhile, the
            # slot is given back (the booking's reply arrived, so the refund is exact).
            try:
                await asyncio.sleep(decision.retry_after + TIMER_SLACK)
            except asyncio.CancelledError:
                await finish(refund(key, cost))
                raise
            # (The booking's decision, admitted now: its policy, if any, kept.)
            return dataclasses.replace(decision, retry_after=0.0, granted=cost)
        # Denied: a TokenBucket's slot is beyond the timeout, or the key is blocked, or a
        # window is full until retry_after.
        if deadline is not None and loop.time() + decision.retry_after > deadline:
            raise _timed_out(key, timeout, decision)
        await asyncio.sleep(decision.retry_after + TIMER_SLACK)


def _timed_out(key: str, timeout: float | None, decision: Decision | None) -> RateLimited:
    if decision is None:  # timed out in the line before the head's first answer
        decision = Decision(False, 0, 0, 0.0, 0.0, 0)
    return RateLimited(f"rate limited: {key!r} (timeout {timeout} s)", decision=decision)
