"""The wake-up subscriber on a Redis Cluster: SSUBSCRIBE each channel on the master that owns
its slot, one dedicated connection (outside the store's pools) per such master. It
follows a channel's slot when it moves or its master fails. A batch of channels is one
SSUBSCRIBE per slot (a command may name only channels of one slot), written back to back
on each master's connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from redis import exceptions as redis_errors
from redis.crc import key_slot

from .base import translate
from .pubsub import no_retry
from .urls import Address


class Topology(Protocol):
    """What the subscriber asks the cluster store."""

    @property
    def cluster(self) -> Any: ...  # the redis.asyncio.RedisCluster

    async def owner(self, channel: str) -> Address: ...

    def candidates(self, first: Address) -> list[Address]: ...

    def moved(self, slot: int, address: Address) -> None: ...

    def suspect(self, address: Address) -> None: ...


class ShardedPubSub:
    """The Notifier's subscriber on a cluster: SSUBSCRIBE each channel on the master that owns
    its slot, over one dedicated connection per master, read by one task per connection.

    Any failure (a node gone, a MOVED, a slot migrated away under a subscription) surfaces
    from ``get_message``; the Notifier then builds a new subscriber and subscribes every
    channel again, which follows the MOVED hints and avoids the nodes that just failed.
    """

    def __init__(self, store: Topology) -> None:
        self._store = store
        self._nodes: dict[Address, Any] = {}  # redis.asyncio PubSub per master
        self._readers: dict[Address, asyncio.Task[None]] = {}
        self._where: dict[str, Address] = {}
        # channel -> SSUNSUBSCRIBE replies owed to us (any other means its slot moved)
        self._leaving: collections.Counter[str] = collections.Counter()
        self._owed: set[Address] = set()  # nodes probed that sent no message since
        self._inbox: asyncio.Queue[dict[str, Any] | BaseException] = asyncio.Queue()
        self._closed = False

    async def subscribe(self, *channels: str) -> None:
        """SSUBSCRIBE ``channels``, each on the master that owns its slot."""
        owners: dict[Address, list[str]] = {}
        for channel in channels:
            owners.setdefault(await self._store.owner(channel), []).append(channel)
        for owner, owned in owners.items():
            await self._subscribe_on(owner, owned)

    async def _subscribe_on(self, owner: Address, channels: list[str]) -> None:
        error: BaseException | None = None
        for address in self._store.candidates(owner):
            try:
                pubsub = self._node(address)
                for batch in _by_slot(channels):
                    await self._guarded(address, pubsub, pubsub.ssubscribe(*batch))
                if self._nodes.get(address) is not pubsub:
                    raise redis_errors.ConnectionError("the subscriber was closed meanwhile")
                if address not in self._readers:
                    reader = asyncio.get_running_loop().create_task(self._read(address, pubsub))
                    self._readers[address] = reader
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
                # Try another node: it will answer MOVED to the current owner.
                self._store.suspect(address)
                await self._drop(address)
                error = exc
                continue
            for channel in channels:
                self._where[channel] = address
            return
        raise redis_errors.ConnectionError(f"no cluster node took SSUBSCRIBE: {error!r}")

    async def unsubscribe(self, *channels: str) -> None:
        """SUNSUBSCRIBE ``channels`` where they are subscribed."""
        nodes: dict[Address, list[str]] = {}
        for channel in channels:
            address = self._where.pop(channel, None)
            if address is not None:
                nodes.setdefault(address, []).append(channel)
        for address, held in nodes.items():
            pubsub = self._nodes.get(address)
            if pubsub is None:
                continue
            self._leaving.update(held)
            for batch in _by_slot(held):
                await self._guarded(address, pubsub, pubsub.sunsubscribe(*batch))

    async def probe(self) -> None:
        """Raise ``ConnectionError`` if a node connection got no message back since the
        last probe (the Notifier then subscribes everything again); else probe each: one
        of its channels SSUBSCRIBEd again, which the node confirms (no PING: a
        least-privilege ACL user may not run it)."""
        if self._owed:
            raise redis_errors.ConnectionError(f"no answer from {sorted(self._owed)}")
        first: dict[Address, str] = {}
        for channel, address in self._where.items():
            first.setdefault(address, channel)
        for address, channel in first.items():
            pubsub = self._nodes.get(address)
            if pubsub is not None:
                self._owed.add(address)
                await self._guarded(address, pubsub, pubsub.ssubscribe(channel))

    async def get_message(
        self, *, ignore_subscribe_messages: bool, timeout: float
    ) -> dict[str, Any] | None:
        if self._inbox.empty():
            try:
                async with asyncio.timeout(timeout):
                    item = await self._inbox.get()
            except TimeoutError:
                return None
        else:
            item = self._inbox.get_nowait()
        if isinstance(item, BaseException):
            raise item
        kind = item.get("type")
        if kind in ("sunsubscribe", b"sunsubscribe"):
            channel = _text(item.get("channel"))
            if channel is not None and self._leaving[channel] > 0:
                self._leaving[channel] -= 1
                if not self._leaving[channel]:
                    del self._leaving[channel]
                return item  # the reply to our SUNSUBSCRIBE: the notifier counts them
            if channel in self._where:
                # Not asked for: the slot moved to another master under the subscription.
                raise redis_errors.ConnectionError(f"the slot of {channel!r} moved")
            return None
        if ignore_subscribe_messages and kind in ("ssubscribe", b"ssubscribe"):
            return None
        return item

    def _node(self, address: Address) -> Any:
        if self._closed:
            raise redis_errors.ConnectionError("the subscriber is closed")
        pubsub = self._nodes.get(address)
        if pubsub is None:
            pubsub = _dedicated_pubsub(self._store.cluster, address)
            self._nodes[address] = pubsub
        return pubsub

    async def _read(self, address: Address, pubsub: Any) -> None:
        """Forward one node's messages (or the error that ends them) to the inbox."""
        try:
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=False, timeout=None)
                if msg is not None:
                    self._owed.discard(address)  # it answers
                    self._inbox.put_nowait(msg)
        except asyncio.CancelledError:
            raise
        except redis_errors.MovedError as exc:
            self._store.moved(exc.slot_id, (exc.host, int(exc.port)))
            self._inbox.put_nowait(exc)
        except redis_errors.ResponseError as exc:  # a subscription refused: say why
            self._inbox.put_nowait(translate(exc))
        except Exception as exc:
            self._store.suspect(address)
            self._inbox.put_nowait(exc)

    async def _guarded(self, address: Address, pubsub: Any, call: Awaitable[None]) -> None:
        """Run one call on a node's PubSub; if that PubSub was dropped (or this subscriber
        closed) meanwhile, close it again: a socket redis-py opened under the call after
        the drop would be read and closed by nobody."""
        try:
            await call
        finally:
            if self._nodes.get(address) is not pubsub:
                await _close_pubsub(pubsub)

    async def _drop(self, address: Address) -> None:
        reader = self._readers.pop(address, None)
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        pubsub = self._nodes.pop(address, None)
        if pubsub is not None:
            await _close_pubsub(pubsub)

    async def aclose(self) -> None:
        self._closed = True
        for address in list(self._nodes):
            await self._drop(address)
        self._where.clear()


async def _close_pubsub(pubsub: Any) -> None:
    """Close a dedicated PubSub and the one-connection pool under it."""
    with contextlib.suppress(Exception):
        await pubsub.aclose()
    with contextlib.suppress(Exception):
        await pubsub.connection_pool.disconnect()


def _dedicated_pubsub(cluster: Any, address: Address) -> Any:
    """A PubSub on its own one-connection pool to one node, with the cluster's credentials."""
    import redis.asyncio as aredis

    kwargs = {
        k: v
        for k, v in cluster.get_connection_kwargs().items()
        if k not in ("max_connections", "response_callbacks", "retry")
    }
    kwargs.update(host=address[0], port=address[1])
    # The subscriber idles between messages: no read timeout. No silent reconnect either:
    # a failure must reach the Notifier, which re-subscribes on the current owner.
    kwargs["socket_timeout"] = None
    kwargs["retry"] = no_retry()
    pool = aredis.ConnectionPool(max_connections=1, **kwargs)
    return aredis.Redis.from_pool(pool).pubsub()


def _by_slot(channels: Iterable[str]) -> list[list[str]]:
    """``channels`` grouped by hash slot, the most one SSUBSCRIBE or SUNSUBSCRIBE may name."""
    slots: dict[int, list[str]] = {}
    for channel in channels:
        slots.setdefault(key_slot(channel.encode()), []).append(channel)
    return list(slots.values())


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None
