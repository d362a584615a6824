"""The local deny cache of a limiter: "``(key, cost)`` is denied until t", answered here.

A denied decision says the cost cannot be admitted for ``retry_after`` seconds; while no
one resets (or refunds, or unblocks) the key, a hit before then would be denied again, so
it is answered from memory with the same ``Decision`` shape (``retry_after`` counting
down, ``source="cache"``) and no round trip. The deadline is taken from the moment the
call was SENT (before the script ran), so the cache never denies past the instant Redis
would admit.

Exact across processes, through the backend's pub/sub (``_notify``): while a key has an
entry, a watcher task is subscribed to its invalidation channel (``_keys.rate_channel``),
which ``lua/rate_invalidate.lua`` tells on every reset. A denial is trusted only if its
call was sent after that subscription was confirmed, and only while the subscriber
connection that confirmed it lives (``Notifier.epoch``): a message lost with a connection
can never leave a stale denial behind. In this process ``forget`` works at once, and a
``gen`` counter keeps a denial that was in flight across a ``forget`` out of the cache.

Bounded: at most ``size`` keys (an LRU, O(1) per operation), each with one watcher (one
channel subscription) that leaves once the key's last denial is older than ``linger``.
Concurrent hits on a cached key whose denial has just run out share ONE call (a single
flight): if it is denied, so are they, at the same instant, so a flood on one key costs
one script call per retry window per process.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .._rates import Decision, new_decision
from .._stores.notify import Notifier
from .._stores.subscription import Subscription

#: The cache's clock (seconds): when a call was sent, until when a denial holds. Not the
#: loop's: uvloop's ``loop.time()`` has millisecond resolution, and this one is cheaper.
clock = time.monotonic


class Denial:
    """One cost's denial: when its call was sent, until when it holds (``clock``), the
    decision (its ``reset_after`` runs from ``sent`` too), and whether it may be trusted
    (sent after the key's subscription was confirmed).

    Its answers count down by the millisecond: within one millisecond every hit gets the
    same ``Decision``, made for the start of that millisecond: its ``retry_after`` is never
    short, and long by under 1 ms. Under a flood that makes the answer a dict lookup and a
    comparison: building a ``Decision`` cost more than all the rest of the cached path
    (about 3 of 5 µs per cached denial on the shared machine, 1.3-2.7 µs in all after)."""

    __slots__ = ("answer", "decision", "next", "sent", "trusted", "until")

    def __init__(self, decision: Decision, sent: float, trusted: bool) -> None:
        self.decision = decision
        self.sent = sent
        self.until = sent + decision.retry_after
        self.trusted = trusted
        #: the answer for the millisecond ``refresh`` made it for, and when it runs out
        self.answer = decision
        self.next = 0.0

    def refresh(self, ms: int) -> None:
        """Make the answer for millisecond ``ms``."""
        at = ms / 1000  # the start of this millisecond: <= now
        d = self.decision
        reset_after = d.reset_after - (at - self.sent)
        self.next = (ms + 1) / 1000
        self.answer = new_decision(
            False,
            d.limit,
            d.remaining,
            reset_after if reset_after > 0 else 0.0,
            self.until - at,
            "cache",
        )


class Entry:
    """What the cache holds for one key: its denials by cost, the watcher's state, and the
    calls in flight that concurrent hits may share."""

    __slots__ = ("armed_at", "denials", "epoch", "flights", "sub", "watcher")

    def __init__(self) -> None:
        self.denials: dict[int, Denial] = {}
        #: when (``clock``) the subscription was confirmed (None: not yet, nothing trusted)
        self.armed_at: float | None = None
        self.epoch = -1
        self.watcher: asyncio.Task[None] | None = None
        #: its subscription: a message delivered to it voids the entry even before the
        #: watcher task has run
        self.sub: Subscription | None = None
        self.flights: dict[int, asyncio.Future[Decision | None]] = {}


class DenyCache:
    """An LRU of ``Entry`` by user key, for one limiter."""

    __slots__ = ("backend", "entries", "gen", "linger", "notifier", "size")

    def __init__(self, size: int, linger: float) -> None:
        self.size = size
        #: how long a key stays subscribed after its last denial ran out (s)
        self.linger = linger
        #: by user key, least recently used first (read directly by the hot path)
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        #: bumped by every ``forget``: a denial sent before one is never stored
        self.gen = 0
        #: the backend the entries were learned on (a new default backend clears them),
        #: and its notifier
        self.backend: Any = None
        self.notifier: Notifier | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def answer(self, key: str, cost: int) -> Decision | None:
        """The cached denial of ``cost`` for ``key`` (a str and an int: the caller's type
        tests), if it still holds and can be trusted; else None. The hot path under
        attack, flat on purpose (no call but the clock's while this millisecond's answer is
        made already): about 0.7 µs per cached denial."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        denial = entry.denials.get(cost)
        if denial is None:
            return None
        now = clock()
        if now >= denial.until or not denial.trusted:
            return None
        sub, notifier = entry.sub, self.notifier
        if (sub is not None and sub.woken) or notifier is None or entry.epoch != notifier.epoch:
            # Told to forget (the watcher has not run yet), or the subscriber reconnected
            # since the entry was armed (a message may have been lost with it).
            self.forget(key)
            return None
        self.entries.move_to_end(key)
        if now >= denial.next:
            denial.refresh(int(now * 1000))
        return denial.answer

    def remember(
        self,
        key: str,
        cost: int,
        decision: Decision,
        sent: float,
        gen: int,
        watch: Callable[[str, Entry], asyncio.Task[None]],
    ) -> None:
        """Keep ``decision`` (a denial of a call sent at ``sent``, when ``gen`` was current)."""
        if gen != self.gen:
            return  # a forget happened while it was in flight
        entries = self.entries
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = Entry()
            entry.watcher = watch(key, entry)
            if len(entries) > self.size:
                _, old = entries.popitem(last=False)
                _stop(old)
        else:
            entries.move_to_end(key)
        armed = entry.armed_at
        entry.denials[cost] = Denial(decision, sent, armed is not None and sent >= armed)

    def forget(self, key: str) -> None:
        """Drop what is known of ``key`` now (a reset, a refund, a block, a message)."""
        self.gen += 1
        entry = self.entries.pop(key, None)
        if entry is not None:
            _stop(entry)

    def drop(self, key: str, entry: Entry) -> None:
        """The watcher of ``entry`` is leaving: remove the entry if it is still the key's."""
        if self.entries.get(key) is entry:
            del self.entries[key]

    def use(self, backend: Any) -> None:
        """Serve ``backend`` from now on (what was learned on another one is dropped)."""
        self.clear()
        self.backend = backend
        self.notifier = backend._notifier

    def clear(self) -> None:
        self.gen += 1
        entries, self.entries = self.entries, OrderedDict()
        for entry in entries.values():
            _stop(entry)

    def __repr__(self) -> str:
        return f"<DenyCache keys={len(self.entries)}/{self.size}>"


def _stop(entry: Entry) -> None:
    watcher = entry.watcher
    if watcher is not None and not watcher.done():
        watcher.cancel()
    for flight in entry.flights.values():
        if not flight.done():
            flight.set_result(None)


def start_watch(
    cache: DenyCache, notifier: Notifier, channel: str, key: str, entry: Entry
) -> asyncio.Task[None]:
    """Subscribe ``entry`` to ``channel`` (at once in-process) and start its watcher."""
    loop = asyncio.get_running_loop()
    sub = entry.sub = notifier.subscribe(channel)
    if notifier.attach(sub):  # memory://: it hears every reset from now on
        entry.epoch = notifier.epoch
        entry.armed_at = clock()
    return loop.create_task(_watch(cache, notifier, sub, key, entry))


async def _watch(
    cache: DenyCache, notifier: Notifier, sub: Subscription, key: str, entry: Entry
) -> None:
    """The watcher of one key: subscribed to its channel while the key has denials, it
    forgets the key on a message, and leaves ``linger`` s after the last denial ran out."""
    try:
        if entry.armed_at is None:
            await sub.__aenter__()
            if notifier.confirmed(sub.channel):
                entry.epoch = notifier.epoch
                entry.armed_at = clock()
        while True:
            last = max((d.until for d in entry.denials.values()), default=0.0)
            left = last + cache.linger - clock()
            if left <= 0:
                break
            if await sub.wait(left):
                cache.forget(key)
                break
    except Exception:  # a refused or broken subscription: the key is simply not cached
        pass
    finally:
        await sub.__aexit__(None, None, None)
        cache.drop(key, entry)
