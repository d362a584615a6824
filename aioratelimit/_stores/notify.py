"""Wake-ups: one shared pub/sub subscriber per backend, fanned out to local subscriptions.

Scripts that free something (a lock release, an idempotent call completing) PUBLISH on a
channel named in ``_keys``; waiters subscribe to that channel here instead of polling. A
backend has ONE subscriber connection (never a pooled one), read by one background task;
a waiter holds no connection while it waits. A message wakes every local subscription of
its channel; a lock's waiters share one subscription per line (``_locks.line``), so a
release wakes one waiter per process. A lost message is covered by the caller's own
fallback timer.

Bounded: a new subscription waits for the server's confirmation at most ``CONFIRM_TIMEOUT``
(the SUBSCRIBE itself, and the connect before it, run in the background, bounded by
``bound``: a server that accepts connections and never answers hangs nobody). A subscriber
that stops answering (a half-open connection: no error, no message) is noticed by a probe
every ``check_every`` seconds (``probe()``: a channel it holds subscribed again, which the
server confirms; unlike PING it needs no ACL permission the subscriber lacks): one still
unanswered at the next is taken for a broken connection, and every channel is subscribed
again on a new one.

Usage, race-free because the subscription is confirmed before the retry::

    async with backend._notifier.subscribe(channel) as sub:
        while not await try_once():
            await sub.wait(timeout)          # True when woken, False on timeout
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

from .._errors import BackendError

log = logging.getLogger("aioratelimit")

#: How long a new subscription waits for the server's confirmation before going on anyway
#: (the caller's fallback timer then covers a release it might miss).
CONFIRM_TIMEOUT = 1.0
#: How often the subscriber is probed (seconds); an unanswered probe is noticed at the next.
CHECK_EVERY = 5.0
#: What bounds the subscriber's connect and one SUBSCRIBE when the store names nothing.
DEFAULT_BOUND = 7.0

PubSubFactory = Callable[[], Any]  # returns a redis.asyncio PubSub (or a compatible object)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Subscription:
    """One local listener on one channel; ``wait()`` returns True once per message
    delivered since it last returned (messages in between count once)."""

    __slots__ = ("_notifier", "_waiter", "channel", "message", "woken")

    def __init__(self, notifier: Notifier, channel: str) -> None:
        self._notifier = notifier
        self.channel = channel
        #: a message was delivered that ``wait`` has not returned yet (read, never set,
        #: outside this module: a plain attribute, the deny cache reads it on every answer)
        self.woken = False
        # The future ``wait`` sleeps on (a plain future: unlike asyncio.wait_for before
        # Python 3.12, awaiting it never swallows a cancellation that comes with a message).
        self._waiter: asyncio.Future[None] | None = None
        #: the payload of the last message delivered to this listener
        self.message: bytes | None = None

    def _wake(self, payload: bytes) -> None:
        self.message = payload
        self.woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float | None) -> bool:
        """Wait for a message (one already delivered counts); False after ``timeout`` s."""
        if not self.woken:
            if timeout is not None and timeout <= 0:
                return False
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            if not self.woken:
                return False
        self.woken = False
        return True

    def close(self) -> None:
        """Stop listening (``__aexit__`` without the await; closing twice is harmless)."""
        self._notifier._remove(self)

    async def __aenter__(self) -> Subscription:
        try:
            await self._notifier._add(self)
        except BaseException:  # cancelled while subscribing: leave no dead listener behind
            self._notifier._remove(self)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._notifier._remove(self)

    def __repr__(self) -> str:
        return f"<Subscription {self.channel!r} woken={self.woken}>"


class Notifier:
    """Routes published messages to local subscriptions.

    ``factory`` builds the one pub/sub connection (Redis); ``None`` means messages come
    from the same process (memory://), delivered synchronously by ``deliver``.
    """

    __slots__ = (
        "_bound",
        "_closed",
        "_confirmed",
        "_factory",
        "_loop",
        "_pubsub",
        "_reader",
        "_subs",
        "_tasks",
        "_wanted",
        "check_every",
        "epoch",
    )

    def __init__(
        self, factory: PubSubFactory | None = None, *, bound: float = DEFAULT_BOUND
    ) -> None:
        self._factory = factory
        # The longest a subscriber's connect and SUBSCRIBE (or probe) may take (seconds):
        # the store's connect_timeout + timeout.
        self._bound = bound
        #: seconds between two probes of the subscriber (see the module)
        self.check_every = CHECK_EVERY
        # channel -> its local subscriptions, as an ordered set (O(1) to join and to leave)
        self._subs: dict[str, dict[Subscription, None]] = {}
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self._wanted = asyncio.Event() if factory is not None else None
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        # The event loop the reader, the subscriber connection and the futures belong to.
        self._loop: asyncio.AbstractEventLoop | None = None
        #: counts the subscriber connections lost (or given up): a listener that must not
        #: miss a message (the deny cache) trusts only what it learned in the same epoch
        self.epoch = 0

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

    # -- subscription bookkeeping ----------------------------------------------------------

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve subscriptions on ``loop``. The reader task, the subscriber connection and
        the confirmation futures of an earlier loop (an application or a test suite that
        runs ``asyncio.run`` more than once) are of no use here: the reader closed the
        connection when that loop shut down (it is cancelled then, like every task); start
        afresh on this one."""
        if self._loop is not None:
            self._pubsub = None
            self._reader = None
            self._tasks = set()
            self._confirmed = {}
            self._wanted = asyncio.Event()
        self._loop = loop

    async def _add(self, sub: Subscription) -> None:
        loop = asyncio.get_running_loop()
        if self._factory is not None and loop is not self._loop:
            self._adopt(loop)
        self._subs.setdefault(sub.channel, {})[sub] = None
        if self._factory is None or self._closed:
            return
        confirmed = self._confirmed.get(sub.channel)
        if confirmed is None:
            confirmed = asyncio.get_running_loop().create_future()
            self._confirmed[sub.channel] = confirmed
            # In the background: a connect or a SUBSCRIBE that gets no answer must not hold
            # the waiter past CONFIRM_TIMEOUT (the SUBSCRIBE is bounded by itself). Started
            # before the reader, so that the reader finds its subscriber being built and
            # does not build a second one.
            self._spawn(self._send("subscribe", sub.channel))
            self._ensure_reader()
        # asyncio.wait neither cancels the shared future on timeout nor, unlike wait_for
        # before Python 3.12, swallows our own cancellation when both happen at once.
        await asyncio.wait((confirmed,), timeout=CONFIRM_TIMEOUT)
        if confirmed.done() and not confirmed.cancelled():
            refused = confirmed.exception()
            if refused is not None:  # the server said no (an ACL without SUBSCRIBE)
                raise BackendError(str(refused)) from refused

    def _remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.channel)
        if subs is None or subs.pop(sub, False) is False:
            return
        if not subs:
            del self._subs[sub.channel]
            fut = self._confirmed.pop(sub.channel, None)
            if fut is not None and not fut.done():
                fut.cancel()
            if self._pubsub is not None and not self._closed:
                # Fire and forget: a stale server-side subscription only costs ignored messages.
                self._spawn(self._send("unsubscribe", sub.channel))

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, command: str, channel: str) -> None:
        if self._closed or (self._pubsub is None and command != "subscribe"):
            return
        try:
            async with asyncio.timeout(self._bound):
                fresh = self._pubsub is None
                if fresh:
                    assert self._factory is not None
                    self._pubsub = self._factory()
                await getattr(self._pubsub, command)(channel)
                if fresh:
                    # A new connection (after a failure): every channel still waited on
                    # needs subscribing on it, not only this one, or the reader would not
                    # resubscribe.
                    for other in [c for c in self._subs if c != channel]:
                        fut = self._confirmed.get(other)
                        if fut is None or fut.done():
                            self._confirmed[other] = asyncio.get_running_loop().create_future()
                        await self._pubsub.subscribe(other)
            if command == "subscribe" and self._wanted is not None:
                self._wanted.set()
        except Exception as exc:  # the reader reconnects; waiters have fallback timers
            log.debug("aioratelimit: pub/sub %s %s failed: %r", command, channel, exc)
            if command == "subscribe":
                await self._drop_pubsub()

    # -- the reader task -------------------------------------------------------------------

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    async def _read_loop(self) -> None:
        try:
            await self._read_messages()
        finally:
            # Cancelled by aclose, or by the shutdown of the loop (the subscriber's
            # connection belongs to it): close the connection while the loop still runs.
            await self._drop_pubsub()

    async def _read_messages(self) -> None:
        backoff = 0.05
        assert self._wanted is not None
        loop = asyncio.get_running_loop()
        # The subscriber last probed, and when to probe it next.
        probed: Any = None
        check_at = 0.0
        while not self._closed:
            try:
                if self._pubsub is None and self._subs:
                    await self._resubscribe()
                pubsub = self._pubsub
                if pubsub is None or not self._wanted.is_set():
                    # Nothing subscribed yet (or the SUBSCRIBE is still under way).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await self._wanted.wait()
                    continue
                if pubsub is not probed:  # a new subscriber: its first probe is due later
                    probed = pubsub
                    check_at = loop.time() + self.check_every
                wait = min(1.0, max(check_at - loop.time(), 0.0))
                msg = await pubsub.get_message(ignore_subscribe_messages=False, timeout=wait)
                backoff = 0.05
                if msg is not None:
                    self._dispatch(msg)
                if loop.time() >= check_at:
                    # Raises if the last probe got no answer (half-open: no error, no
                    # message): the except below starts over on a new connection.
                    async with asyncio.timeout(self._bound):
                        await pubsub.probe()
                    check_at = loop.time() + self.check_every
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The subscriber connection broke (server restart, failover): start over with
                # a new one. Waiters meanwhile rely on their fallback timers. A refusal is
                # told to the subscriptions waiting for their confirmation instead.
                if isinstance(exc, BackendError):
                    for fut in self._confirmed.values():
                        if not fut.done():
                            fut.set_exception(exc)
                log.debug("aioratelimit: pub/sub reader error, reconnecting: %r", exc)
                await self._drop_pubsub()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _resubscribe(self) -> None:
        for channel in list(self._subs):
            fut = self._confirmed.get(channel)
            if fut is None or fut.done():
                self._confirmed[channel] = asyncio.get_running_loop().create_future()
            await self._send("subscribe", channel)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        channel = msg.get("channel")
        if isinstance(kind, bytes):
            kind = kind.decode()
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "replace")
        if not isinstance(channel, str):
            return
        if kind in ("subscribe", "ssubscribe"):
            fut = self._confirmed.get(channel)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif kind in ("message", "smessage"):
            data = msg.get("data")
            self.deliver(channel, data if isinstance(data, (bytes, str)) else b"")

    async def _drop_pubsub(self) -> None:
        self.epoch += 1
        if self._wanted is not None:
            self._wanted.clear()
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def aclose(self) -> None:
        """Stop the reader and close the subscriber connection; wake every waiter."""
        loop = asyncio.get_running_loop()
        if self._factory is not None and self._loop is not None and loop is not self._loop:
            self._adopt(loop)  # closed from a later loop than its last subscription
        self._closed = True
        pending = list(self._tasks)
        reader, self._reader = self._reader, None
        if reader is not None:
            pending.append(reader)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(BaseException):
                await task
        await self._drop_pubsub()
        for subs in list(self._subs.values()):
            for sub in list(subs):
                sub._wake(b"")
