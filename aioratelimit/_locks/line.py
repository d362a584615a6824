"""The line of a lock's waiters in this process: only its head asks the server.

Without it every waiter of a held lock would keep a subscription of its own and try again at
every wake-up and every fallback timer: 10,000 waiters cost some 10,000 script calls a
second, and leaving a list of N waiters cost O(N). Instead the acquires of one name (of one
name and ``limit`` for a semaphore: each admits itself below its own limit) waiting in one
process stand in one line, first come first served:

- **Joining and leaving cost O(1)**, wherever a waiter stands (an ordered dict of futures);
  a waiter behind the head holds no subscription and no timer but its own timeout's, and
  sends nothing: cancelled or timed out there, it has nothing to clean up. A head whose
  timeout ends while it sleeps gives up then, without another try.
- **Only the head tries.** It holds the line's one subscription to the name's wake-up
  channel (kept while the line has waiters, so a release between two heads is not lost),
  tries, and sleeps until a release wakes it or its fallback timer ends. Acquired (or
  leaving), it hands the head to the next waiter, which goes on from where it left off
  (``resume_at``): a release costs one try per process, whoever waits. After a semaphore
  slot was taken the next head tries at once, so the line drains as long as tries succeed
  (several slots freed at once are taken one after the other, one try each, plus the one
  refused try that ends the run); after the lock was taken it first sleeps until a release
  (or the fallback timer of the new holder's TTL): nobody else can get it before.
- **Uncontended acquires cost what they did.** The head of an empty line tries before it
  subscribes (refused, it subscribes and tries again). A semaphore acquire that finds
  nobody waiting tries at once, beside any others, and joins the line only if refused: a
  semaphore with free slots admits concurrent acquires in parallel.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Hashable

from .._stores.notify import Notifier
from .._stores.subscription import Subscription


class Line:
    """The waiters of one name in this process, head first, and what they share."""

    __slots__ = ("_key", "_lines", "resume_at", "sub", "subscribed", "trying", "waiters")

    def __init__(self, lines: dict[Hashable, Line], key: Hashable, sub: Subscription) -> None:
        self._lines = lines
        self._key = key
        #: the waiters, as an ordered set (O(1) to join, to leave and to find the head); a
        #: waiter's future is set when it becomes the head (True) or gives up (False)
        self.waiters: collections.OrderedDict[asyncio.Future[bool], None] = (
            collections.OrderedDict()
        )
        #: semaphore acquires trying outside the line (it was empty when they came)
        self.trying = 0
        #: the line's subscription to the wake-up channel, entered by a head
        self.sub = sub
        self.subscribed = False
        #: (loop time) when the head's next try is due unless a wake-up comes first; a new
        #: head goes on from there: None, it tries at once
        self.resume_at: float | None = None

    def join(self) -> asyncio.Future[bool]:
        """Stand at the end of the line; see ``turn``."""
        me: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if not self.waiters:
            me.set_result(True)
        self.waiters[me] = None
        return me

    async def turn(self, me: asyncio.Future[bool], deadline: float | None) -> bool:
        """Wait until ``me`` is the head (True), or until the loop time ``deadline`` (False).

        Timed out by a timer that sets the future, not by a cancellation: 30,000 waiters
        that give up together unwind in well under half the time."""
        if not me.done():
            loop = asyncio.get_running_loop()
            timer = None if deadline is None else loop.call_at(deadline, _give_up, me)
            try:
                await me
            finally:
                if timer is not None:
                    timer.cancel()
        return me.result()

    def leave(self, me: asyncio.Future[bool]) -> None:
        """Leave the line (acquired, timed out, cancelled, failed); the head hands over."""
        waiters = self.waiters
        head = next(iter(waiters)) is me
        del waiters[me]
        if head and waiters:
            after = next(iter(waiters))
            if not after.done():  # (done: it gave up, and hands over as it leaves in turn)
                after.set_result(True)
        self.close_if_idle()

    def close_if_idle(self) -> None:
        """Nobody waits or tries any more: drop the subscription and the line."""
        if self.waiters or self.trying:
            return
        if self.subscribed:
            self.subscribed = False
            self.sub.close()
        if self._lines.get(self._key) is self:
            del self._lines[self._key]

    def __repr__(self) -> str:
        return (
            f"<Line {self.sub.channel!r} waiters={len(self.waiters)} trying={self.trying}"
            f" subscribed={self.subscribed}>"
        )


def _give_up(me: asyncio.Future[bool]) -> None:
    if not me.done():
        me.set_result(False)


#: per event loop: (notifier, channel, limit) -> its line
_lines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Line]] = (
    weakref.WeakKeyDictionary()
)


def line(notifier: Notifier, channel: str, limit: int) -> Line:
    """The line of ``channel`` (and ``limit``, 0 for a lock) on ``notifier`` in the running
    loop, made if there is none."""
    loop = asyncio.get_running_loop()
    lines = _lines.get(loop)
    if lines is None:
        lines = _lines[loop] = {}
    key = (notifier, channel, limit)
    found = lines.get(key)
    if found is None:
        found = lines[key] = Line(lines, key, notifier.subscribe(channel))
    return found
