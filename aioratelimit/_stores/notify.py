"""Wake-ups: one shared pub/sub subscriber per backend, fanned out to local subscriptions.

Scripts that free something (a lock release, a completed idempotent call, a limit's reset)
PUBLISH on a channel named in ``_keys``; whoever waits for it subscribes to that channel here
instead of polling. A backend has ONE subscriber (on a Cluster, one connection per master
that owns a channel), never a pooled connection: a waiter holds no connection while it
waits. A message wakes every local subscription of its channel (a lock's waiters share one
per line, ``_locks.line``); a lost one is covered by the caller's own fallback timer.

Batched, never rebuilt for a channel: the first local subscription to a channel queues it,
and one writer task sends every channel queued meanwhile in one SUBSCRIBE (``BATCH`` at
most), then the channels nobody holds any more in one UNSUBSCRIBE (a channel taken again
before it went out stays subscribed); one reader task reads. Only a failure (a broken
connection, an unanswered probe) builds a new subscriber, after a pause that doubles with
each failure in a row, and every channel held is subscribed again on it. A subscription is
confirmed by the reply to a SUBSCRIBE sent after the last UNSUBSCRIBE of its channel
(``confirmed``), and only while the subscriber that confirmed it lives (``epoch``).

Bounded: a new subscription waits for its confirmation at most ``CONFIRM_TIMEOUT``, and the
subscriber's connect and each batch take at most ``bound`` (a server that accepts connections
and never answers hangs nobody). A half-open subscriber (no error, no message) is noticed by
a probe every ``check_every`` seconds (a channel it holds subscribed again, which the server
confirms; unlike PING it needs no ACL permission): one unanswered at the next is a failure.

Usage, race-free because the subscription is confirmed before the retry::

    async with backend._notifier.subscribe(channel) as sub:
        while not await try_once():
            await sub.wait(timeout)          # True when woken, False on timeout
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from .._errors import BackendError
from .loops import check_free
from .subscription import Subscription

log = logging.getLogger("aioratelimit")

#: How long a new subscription waits for the server's confirmation before going on anyway
#: (the caller's fallback timer then covers a message it might miss).
CONFIRM_TIMEOUT = 1.0
#: How often the subscriber is probed (seconds); an unanswered probe is noticed at the next.
CHECK_EVERY = 5.0
#: What bounds the subscriber's connect and one batch when the store names nothing.
DEFAULT_BOUND = 7.0
#: The most channels one SUBSCRIBE or UNSUBSCRIBE names (a burst of 30,000 new channels is
#: 30 commands of some 40 kB each, written back to back).
BATCH = 1000
#: The pause before a new subscriber after a failure, doubled for each in a row (seconds).
FIRST_PAUSE, MAX_PAUSE = 0.05, 1.0
#: The longest one read waits (seconds) before the reader looks at the subscriber again.
READ_WAIT = 1.0


class Subscriber(Protocol):
    """What the notifier drives: a redis-py PubSub of its own (``pubsub``), or one
    connection per master on a cluster (``cluster_pubsub``)."""

    async def subscribe(self, *channels: str) -> None: ...

    async def unsubscribe(self, *channels: str) -> None: ...

    async def probe(self) -> None: ...

    async def get_message(self, *, ignore_subscribe_messages: bool, timeout: float) -> Any: ...

    async def aclose(self) -> None: ...


class Notifier:
    """Routes published messages to local subscriptions.

    ``factory`` builds the subscriber (Redis); ``None`` means messages come from the same
    process (memory://), delivered synchronously by ``deliver``.
    """

    __slots__ = (
        "_adopting",
        "_bound",
        "_closed",
        "_confirmed",
        "_factory",
        "_joining",
        "_leaving",
        "_loop",
        "_pause",
        "_pubsub",
        "_reader",
        "_ready",
        "_retry_at",
        "_subs",
        "_unsubscribing",
        "_work",
        "_writer",
        "check_every",
        "epoch",
    )

    def __init__(
        self, factory: Callable[[], Subscriber] | None = None, *, bound: float = DEFAULT_BOUND
    ) -> None:
        self._factory = factory
        # The longest the subscriber's connect and one batch (or probe) may take (seconds):
        # the store's connect_timeout + timeout.
        self._bound = bound
        #: seconds between two probes of the subscriber (see the module)
        self.check_every = CHECK_EVERY
        # channel -> its local subscriptions, as an ordered set (O(1) to join and to leave)
        self._subs: dict[str, dict[Subscription, None]] = {}
        self._closed = False
        # The event loop the tasks, the subscriber and the futures belong to.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._adopting = threading.Lock()
        #: counts the subscribers lost (or given up): a listener that must not miss a
        #: message (the deny cache) trusts only what it learned in the same epoch
        self.epoch = 0
        self._fresh()

    def _fresh(self) -> None:
        """No subscriber, nothing sent, no task: the state of a new loop."""
        self._pubsub: Subscriber | None = None
        # channel -> set once the server confirmed it (for every channel held here)
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        # Channels to SUBSCRIBE, and to UNSUBSCRIBE, with the next batch (ordered sets).
        self._joining: dict[str, None] = {}
        self._leaving: dict[str, None] = {}
        # channel -> UNSUBSCRIBE replies not read yet: a SUBSCRIBE reply read before them
        # answered a SUBSCRIBE older than that UNSUBSCRIBE, and confirms nothing.
        self._unsubscribing: collections.Counter[str] = collections.Counter()
        self._work = asyncio.Event()  # something to send (or a subscriber to build)
        self._ready = asyncio.Event()  # the subscriber has connected: the reader may read
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pause = FIRST_PAUSE
        self._retry_at = 0.0  # no new subscriber before (loop time): after a failure

    @property
    def closed(self) -> bool:
        """Closed (``aclose``): its listeners were woken one last time."""
        return self._closed

    def subscribe(self, channel: str) -> Subscription:
        """A subscription to enter with ``async with`` before the attempt it guards."""
        return Subscription(self, channel)

    def confirmed(self, channel: str) -> bool:
        """Is ``channel`` subscribed on the server now (always, in-process)? A subscription
        whose confirmation timed out or was refused is not."""
        if self._factory is None:
            return True
        fut = self._confirmed.get(channel)
        return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None

    def attach(self, sub: Subscription) -> bool:
        """Add ``sub`` now, without waiting, if messages come from this process (True: it
        hears every message from here on); else False, and ``async with sub`` it."""
        if self._factory is not None:
            return False
        self._subs.setdefault(sub.channel, {})[sub] = None
        return True

    def deliver(self, channel: str, payload: bytes | str = b"") -> None:
        """Hand one published message to every local subscription of ``channel``."""
        subs = self._subs.get(channel)
        if not subs:
            return
        data = payload.encode() if isinstance(payload, str) else payload
        for sub in subs:
            sub._wake(data)

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve subscriptions on ``loop``, afresh: the tasks, subscriber and futures of an
        earlier loop (``asyncio.run`` more than once) are of no use (its writer closed the
        subscriber when it shut down); every channel still held is queued for this one."""
        if self._loop is not None:
            self._fresh()
            for channel in self._subs:
                self._confirmed[channel] = loop.create_future()
                self._joining[channel] = None
        self._loop = loop

    async def _add(self, sub: Subscription) -> None:
        channel = sub.channel
        loop = asyncio.get_running_loop()
        if self._factory is not None and loop is not self._loop:
            with self._adopting:  # two threads' loops may come at once
                if loop is not self._loop:
                    check_free(self._loop)  # refused while the loop served so far runs
                    self._adopt(loop)
        self._subs.setdefault(channel, {})[sub] = None
        if self._factory is None or self._closed:
            return
        confirmed = self._confirmed.get(channel)
        if confirmed is None:
            confirmed = self._confirmed[channel] = loop.create_future()
            self._joining[channel] = None
            self._work.set()
        elif channel in self._leaving:
            del self._leaving[channel]  # its UNSUBSCRIBE never went out: still subscribed
        self._start()
        # asyncio.wait neither cancels the shared future on timeout nor, unlike wait_for
        # before Python 3.12, swallows our own cancellation when both happen at once.
        await asyncio.wait((confirmed,), timeout=CONFIRM_TIMEOUT)
        if confirmed.done() and not confirmed.cancelled():
            refused = confirmed.exception()
            if refused is not None:  # the server said no (an ACL without SUBSCRIBE)
                raise BackendError(str(refused)) from refused

    def _remove(self, sub: Subscription) -> None:
        channel = sub.channel
        subs = self._subs.get(channel)
        if subs is None or subs.pop(sub, False) is False:
            return
        if subs:
            return
        del self._subs[channel]
        if self._factory is None or self._closed:
            return
        if self._joining.pop(channel, False) is None:
            # Its SUBSCRIBE never went out: nothing to take back on the server.
            fut = self._confirmed.pop(channel, None)
            if fut is not None:  # (None only after its loop closed)
                fut.cancel()
        elif channel in self._confirmed:
            # A stale subscription on the server would only cost ignored messages; the
            # UNSUBSCRIBE goes with the next batch, unless the channel is taken again first.
            self._leaving[channel] = None
            self._work.set()

    def _start(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    # -- the writer task: builds the subscriber, sends batches and probes ---------------------

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        check_at: float | None = None  # when to probe the current subscriber
        try:
            while not self._closed:
                wait = None if check_at is None else check_at - loop.time()
                if not self._work.is_set() and (wait is None or wait > 0):
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._work.wait()
                self._work.clear()
                subscriber = self._pubsub
                if subscriber is None:
                    check_at = None
                    if not self._joining:
                        continue  # nothing to subscribe: no connection needed
                    await asyncio.sleep(max(self._retry_at - loop.time(), 0.0))
                    if self._closed or not self._joining:
                        continue
                try:
                    if subscriber is None:
                        assert self._factory is not None
                        subscriber = self._pubsub = self._factory()
                    async with asyncio.timeout(self._bound):
                        await self._send(subscriber)
                        if check_at is None:
                            check_at = loop.time() + self.check_every
                        elif loop.time() >= check_at:
                            # Raises if the last probe got no answer (half-open: no error,
                            # no message): the subscriber is then built anew.
                            await subscriber.probe()
                            check_at = loop.time() + self.check_every
                except Exception as exc:
                    check_at = None
                    await self._fail(subscriber, exc)
                    self._work.set()  # (also when none could be built: try again)
        finally:
            # Cancelled by aclose, or by the shutdown of the loop (the subscriber's
            # connection belongs to it): close it while the loop still runs.
            await self._drop(self._pubsub)

    async def _send(self, subscriber: Subscriber) -> None:
        """Send what is queued: SUBSCRIBE in batches, then UNSUBSCRIBE in batches."""
        while self._joining or self._leaving:
            if self._joining:
                batch = list(itertools.islice(self._joining, BATCH))
                for channel in batch:
                    del self._joining[channel]
                await subscriber.subscribe(*batch)
                self._ready.set()  # connected: there is something to read
            elif self._leaving:
                batch = list(itertools.islice(self._leaving, BATCH))
                for channel in batch:
                    del self._leaving[channel]
                    self._confirmed.pop(channel).cancel()
                    # Counted before the send: the reader may read the reply meanwhile.
                    self._unsubscribing[channel] += 1
                await subscriber.unsubscribe(*batch)

    # -- the reader task -------------------------------------------------------------------

    async def _read_loop(self) -> None:
        while not self._closed:
            if not self._ready.is_set():
                # Read only a subscriber that has connected (checked with no await between
                # the test and the read: one built after a failure may still be connecting).
                await self._ready.wait()
                continue
            subscriber = self._pubsub
            assert subscriber is not None  # (_ready is cleared with it)
            try:
                msg = await subscriber.get_message(
                    ignore_subscribe_messages=False, timeout=READ_WAIT
                )
            except Exception as exc:
                await self._fail(subscriber, exc)
                continue
            if msg is not None:
                self._dispatch(msg)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        channel = msg.get("channel")
        if isinstance(kind, bytes):
            kind = kind.decode()
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "replace")
        if not isinstance(channel, str):
            return
        if kind in ("message", "smessage"):
            data = msg.get("data")
            self.deliver(channel, data if isinstance(data, (bytes, str)) else b"")
        elif kind in ("subscribe", "ssubscribe"):
            self._pause = FIRST_PAUSE  # the subscriber works
            if self._unsubscribing.get(channel):
                return  # the reply to a SUBSCRIBE sent before an UNSUBSCRIBE of it
            fut = self._confirmed.get(channel)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif kind in ("unsubscribe", "sunsubscribe"):
            self._unsubscribing[channel] -= 1
            if self._unsubscribing[channel] <= 0:
                del self._unsubscribing[channel]

    async def _fail(self, subscriber: Subscriber | None, exc: Exception) -> None:
        """``subscriber`` (None: not built) failed: build a new one after a pause. Waiters
        meanwhile rely on their fallback timers."""
        if subscriber is not self._pubsub:
            return  # told already (by the other task)
        if isinstance(exc, BackendError):
            # A refusal (an ACL without SUBSCRIBE) is told to the subscriptions waiting.
            for fut in self._confirmed.values():
                if not fut.done():
                    fut.set_exception(exc)
        log.debug("aioratelimit: pub/sub subscriber failed, reconnecting: %r", exc)
        loop = asyncio.get_running_loop()
        self._retry_at = loop.time() + self._pause
        self._pause = min(self._pause * 2, MAX_PAUSE)
        await self._drop(subscriber)

    async def _drop(self, subscriber: Subscriber | None) -> None:
        """Forget ``subscriber`` (if still the current one) and close it; every channel
        held is queued for the next one, unconfirmed until it confirms it."""
        if subscriber is None or subscriber is not self._pubsub:
            return
        self._pubsub = None
        self.epoch += 1
        self._ready.clear()
        self._leaving.clear()  # nothing is subscribed on a new connection
        self._unsubscribing.clear()
        loop = self._loop
        for channel in [c for c in self._confirmed if c not in self._subs]:
            self._confirmed.pop(channel).cancel()  # was leaving: nothing to take back now
        for channel in self._subs:
            old = self._confirmed.get(channel)
            if old is None or old.done():
                if old is not None and not old.cancelled():
                    old.exception()  # retrieved: a refusal was told to who waited then
                if loop is not None and not loop.is_closed():
                    self._confirmed[channel] = loop.create_future()
            self._joining[channel] = None
        if self._joining:
            self._work.set()
        with contextlib.suppress(Exception):
            await subscriber.aclose()

    async def aclose(self) -> None:
        """Stop the tasks and close the subscriber; wake every listener."""
        loop = asyncio.get_running_loop()
        if self._factory is not None and self._loop is not None and loop is not self._loop:
            self._adopt(loop)  # closed from a later loop than its last subscription
        self._closed = True
        tasks = [t for t in (self._writer, self._reader) if t is not None]
        self._writer = self._reader = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._drop(self._pubsub)
        for subs in list(self._subs.values()):
            for sub in list(subs):
                sub._wake(b"")
