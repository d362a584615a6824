"""The wake-up subscriber of a standalone or Sentinel store: one redis-py (for a valkey
client passed in, valkey-py) PubSub on a dedicated one-connection pool, so it never takes
one of the store's connections.

The backend's ``Notifier`` (``notify``) drives it from two tasks: one sends (subscribe and
unsubscribe, many channels a command; probes), one reads messages. On any failure (or a
probe left unanswered) it closes this one and builds a new one, which connects afresh (to
the promoted master, behind Sentinel).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from .base import REDIS_PY, ClientErrors, translate

T = TypeVar("T")


def no_retry(family: str = "redis") -> Any:
    """The client library's asyncio ``Retry`` that never retries: a subscriber's failure
    must reach the Notifier, which builds a new one where the channel lives now (its
    synchronous ``Retry`` only ever worked by accident, and redis-py 8.2 warns on it)."""
    backoff = importlib.import_module(f"{family}.backoff")
    retries = importlib.import_module(f"{family}.asyncio.retry")
    return retries.Retry(backoff.NoBackoff(), 0)


class DedicatedPubSub:
    """A PubSub on its own one-connection pool, of the client's own library: redis-py's
    (``family="redis"``), or valkey-py's (``"valkey"``, whose errors are ``errors``)."""

    def __init__(
        self,
        client: Any,
        *,
        retry: bool = True,
        family: str = "redis",
        errors: ClientErrors = REDIS_PY,
    ) -> None:
        aredis = importlib.import_module(f"{family}.asyncio")
        self._errors = errors
        self._refused: Any = importlib.import_module(f"{family}.exceptions").ResponseError

        pool = client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        # The subscriber idles between messages: no read timeout on its socket.
        kwargs["socket_timeout"] = None
        if not retry:
            # No silent reconnect-and-resubscribe: the failure must reach the Notifier,
            # whose new subscriber asks the sentinels for the current master.
            kwargs["retry"] = no_retry(family)
        self._pool = aredis.ConnectionPool(
            connection_class=pool.connection_class, max_connections=1, **kwargs
        )
        client_class = aredis.Redis if family == "redis" else aredis.Valkey
        self._pubsub: Any = client_class.from_pool(self._pool).pubsub()
        self._closed = False
        self._owed = False  # a probe sent and no message since

    async def subscribe(self, *channels: str) -> None:
        """SUBSCRIBE ``channels`` in one command (the first connects); the server's
        confirmations come through ``get_message``."""
        await self._guarded(self._pubsub.subscribe(*channels))
        if self._closed:
            raise ConnectionError("the subscriber was closed while subscribing")

    async def unsubscribe(self, *channels: str) -> None:
        if channels:  # (none would mean every channel to the server)
            await self._guarded(self._pubsub.unsubscribe(*channels))

    async def probe(self) -> None:
        """Raise ``ConnectionError`` if the last probe got no message back since; else send
        a new one: SUBSCRIBE again a channel it holds, which the server confirms (a PING
        would need a permission a least-privilege ACL user lacks)."""
        if self._owed:
            raise ConnectionError("the subscriber's connection stopped answering")
        # A channel it holds and is not leaving: SUBSCRIBE of one being left would hold it
        # on the server again after its UNSUBSCRIBE.
        leaving = self._pubsub.pending_unsubscribe_channels
        held = next((c for c in self._pubsub.channels if c not in leaving), None)
        if held is not None:
            self._owed = True
            await self._guarded(self._pubsub.subscribe(held))

    async def get_message(self, *, ignore_subscribe_messages: bool, timeout: float) -> Any:
        try:
            msg = await self._guarded(
                self._pubsub.get_message(
                    ignore_subscribe_messages=ignore_subscribe_messages, timeout=timeout
                )
            )
        except self._refused as exc:  # the server refused a subscription: say why
            raise translate(exc, None, self._errors) from exc
        if msg is not None:
            self._owed = False  # it answers
        return msg

    async def _guarded(self, call: Awaitable[T]) -> T:
        """Run one redis-py call; if the subscriber was closed meanwhile, close again.

        The Notifier closes a subscriber after a failure while another of its tasks may be
        inside a call on it (the reader in ``get_message``, a SUBSCRIBE connecting), and
        redis-py opens a new connection by itself when one breaks under a call (its retry,
        its reads). Such a socket opened after ``aclose`` would be read and closed by
        nobody; closing here, after the call, is what leaves none behind."""
        try:
            return await call
        finally:
            if self._closed:
                with contextlib.suppress(Exception):  # the call's own outcome matters more
                    await self._shut()

    async def aclose(self) -> None:
        self._closed = True
        await self._shut()

    async def _shut(self) -> None:
        # No TLS goodbye: redis-py waits for one at most connect_timeout and then leaves
        # the transport half-closed, and a loop shutting down never finishes it (its socket
        # is then left to the garbage collector). Abort the stream first; redis-py offers no
        # public way, so its stream is read here, defensively (absent: the old behaviour).
        writer = getattr(getattr(self._pubsub, "connection", None), "_writer", None)
        transport = getattr(writer, "transport", None)
        if transport is not None:
            transport.abort()
        try:
            await self._pubsub.aclose()
        finally:
            await self._pool.disconnect()
