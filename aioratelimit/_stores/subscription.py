"""One local listener on one wake-up channel: what a waiter holds while it sleeps.

The ``Notifier`` (``notify``) fans each message of its one subscriber out to the
``Subscription``s of the channel; a waiter sleeps in ``wait`` until one arrives or its
timeout passes. A message may come from another thread (memory:// serves every thread's
loop): the waiter is then woken on its own loop.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Protocol


class Owner(Protocol):
    """What a subscription asks of its notifier: to be added to and removed from it."""

    async def _add(self, sub: Subscription) -> None: ...

    def _remove(self, sub: Subscription) -> None: ...


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Subscription:
    """One local listener on one channel; ``wait()`` returns True once per message
    delivered since it last returned (messages in between count once)."""

    __slots__ = ("_notifier", "_waiter", "channel", "message", "woken")

    def __init__(self, notifier: Owner, channel: str) -> None:
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
            loop = waiter.get_loop()
            if loop is _running_loop():
                waiter.set_result(None)
            else:  # memory:// serves several threads' loops: wake it on its own
                loop.call_soon_threadsafe(_expire, waiter)

    async def wait(self, timeout: float | None) -> bool:
        """Wait for a message (one already delivered counts); False after ``timeout`` s."""
        if not self.woken:
            if timeout is not None and timeout <= 0:
                return False
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            if self.woken:  # delivered from another thread meanwhile (memory://)
                waiter.set_result(None)
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
