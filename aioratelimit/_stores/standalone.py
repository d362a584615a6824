"""One Redis server: the store ``Backend.from_url`` builds for ``redis://``, ``rediss://`` and
``unix://`` (and, with a Sentinel-managed connection class, for ``redis+sentinel://``), and
the store for a client the application passes in.

``RedisStore`` runs each script on connections of its own (``wire``): a call waits at the
gate for one of ``max_connections`` slots, checks out a connection, writes one pre-packed
EVALSHA, reads one reply; the deadline timer bounds the whole call by ``timeout``.

The event-loop contract: a store serves one running event loop at a time. What it opened on
a loop (connections, the gate's queue, the timer) is closed on that loop when the loop shuts
down (``_aio.Keeper``: asyncio.run, asyncio.Runner, uvloop.run and pytest-asyncio
cancel every pending task first) or when the store is closed. A call from another loop
(the next ``asyncio.run`` of an application or a test suite) starts afresh there.

``ClientStore`` runs scripts through the client's own ``evalsha``/``eval``: that client's
pool, timeouts and event-loop rules are the application's.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from redis import exceptions as redis_errors

from .._aio import Deadlines, Gate, Keeper
from .._notify import Notifier
from .._scripts import Arg, Reply, Script
from .base import TRANSLATED, unavailable
from .pubsub import DedicatedPubSub
from .wire import Connections, exchange

_running_loop = asyncio.get_running_loop


class ScriptClient(Protocol):
    """The slice of ``redis.asyncio.Redis`` (and ``RedisCluster``) a store uses."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Awaitable[Any]: ...

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Awaitable[Any]: ...

    def aclose(self) -> Awaitable[None]: ...


class OnLoop:
    """What a store opened on one event loop."""

    __slots__ = ("connections", "deadlines", "gate", "keeper", "loop")

    def __init__(self, make: Callable[[], Any], size: int, timeout: float) -> None:
        self.loop = _running_loop()
        self.connections = Connections(make)
        self.gate = Gate(size)
        self.deadlines = Deadlines(timeout)
        self.keeper: Keeper | None = None

    async def aclose(self) -> None:
        self.deadlines.close()
        await self.connections.aclose()


class _OnClient:
    """What a store on one redis-py client has: the client, and the backend's wake-up
    subscriber on a dedicated connection outside the pool."""

    publish_command = "PUBLISH"

    __slots__ = ("_client", "_notifier")

    def __init__(self, client: Any) -> None:
        self._client = client
        self._notifier: Notifier | None = None

    @property
    def client(self) -> Any:
        return self._client

    @property
    def notifier(self) -> Notifier:
        if self._notifier is None:
            self._notifier = Notifier(self._subscriber)
        return self._notifier

    def _subscriber(self) -> DedicatedPubSub:
        return DedicatedPubSub(self._client)

    async def aclose(self) -> None:
        if self._notifier is not None:
            await self._notifier.aclose()


class RedisStore(_OnClient):
    """Runs scripts by pre-packed EVALSHA on connections of its own, bounded and translated."""

    __slots__ = ("_make", "_on", "_size", "_timeout")

    def __init__(
        self, client: Any, make: Callable[[], Any], *, max_calls: int, timeout: float
    ) -> None:
        #: the redis-py client the connections' settings come from (closed with the store)
        super().__init__(client)
        self._make = make  # a new, unconnected redis.asyncio Connection
        self._size = max_calls
        self._timeout = timeout
        self._on: OnLoop | None = None

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        # One coroutine frame between the caller and the exchange: this one. Every layer
        # here (gate, deadline, connection) is a plain call, not an awaited helper.
        on = self._on
        if on is None or on.loop is not _running_loop():
            on = self._adopt()
        gate = on.gate
        if gate.free:
            gate.free -= 1
        else:
            await gate.wait(self._timeout)
        deadlines = on.deadlines
        task, cancelling = deadlines.enter()
        try:
            conns = on.connections
            conn = conns.take()
            try:
                return await exchange(conn, script, keys, args)
            finally:
                conns.give(conn)
        except asyncio.CancelledError:
            if deadlines.expired(task, cancelling):
                late = TimeoutError(f"no reply within {deadlines.timeout} s")
                raise unavailable(late) from late
            raise
        except TRANSLATED as exc:
            raise unavailable(exc) from exc
        finally:
            deadlines.leave(task)
            gate.leave()

    def _adopt(self) -> OnLoop:
        """Serve the running loop from now on (see the module's event-loop contract)."""
        old = self._on
        if old is not None and old.keeper is not None:
            old.keeper.close_soon()  # its loop ended (closed already), or runs elsewhere
        on = self._on = OnLoop(self._make, self._size, self._timeout)
        on.keeper = Keeper(lambda: self._retire(on))
        return on

    async def _retire(self, on: OnLoop) -> None:
        if self._on is on:
            self._on = None  # the next call on this loop (if any) starts afresh
        await on.aclose()

    async def aclose(self) -> None:
        await super().aclose()
        on, self._on = self._on, None
        if on is not None and on.keeper is not None:
            await on.keeper.aclose()  # it closes the connections
        await self._client.aclose()


class ClientStore(_OnClient):
    """Runs scripts through a client the application passed in (never closed by us)."""

    __slots__ = ()

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        client = self._client
        try:
            try:
                return await client.evalsha(script.sha, len(keys), *keys, *args)
            except redis_errors.NoScriptError:
                # After SCRIPT FLUSH, a restart or a failover: EVAL runs it and caches it
                # again on the server, inside the same call.
                return await client.eval(script.source, len(keys), *keys, *args)
        except TRANSLATED as exc:
            raise unavailable(exc) from exc


def standalone_store(
    url: str, *, max_connections: int, timeout: float, connect_timeout: float, **options: Any
) -> RedisStore:
    """The store for a ``redis://``, ``rediss://`` or ``unix://`` URL (it owns its client).

    Connections have no socket timeout of their own: the store's deadline timer bounds
    each call (send and reply) by ``timeout``; ``connect_timeout`` bounds each connect.
    """
    import redis.asyncio as aredis

    pool = aredis.ConnectionPool.from_url(
        url,
        max_connections=max_connections,
        socket_timeout=None,
        socket_connect_timeout=connect_timeout,
        **reconnecting(aredis.ConnectionPool, options),
    )
    client = aredis.Redis.from_pool(pool)  # owns the pool: aclose disconnects it
    return RedisStore(client, pool.make_connection, max_calls=max_connections, timeout=timeout)


def reconnecting(pool_class: type, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with redis-py's maintenance notifications off unless asked for.

    redis-py 8 turns them on ("auto") for every RESP3 pool, and such a pool skips its check
    of a pooled connection on checkout, so after a server restart the first call on each
    stale connection fails with "Connection closed by server" instead of reconnecting
    (the regression redis/redis-py#4260 fixes). Off, the pool reconnects on checkout again.
    """
    if "maint_notifications_config" in options:
        return options
    if "maint_notifications_config" not in inspect.signature(pool_class).parameters:
        return options  # a redis-py without them: nothing to turn off
    from redis.maint_notifications import MaintNotificationsConfig

    return {**options, "maint_notifications_config": MaintNotificationsConfig(enabled=False)}
