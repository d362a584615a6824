"""Redis Sentinel: a store on whichever server the sentinels name as the master.

``redis+sentinel://host:port[,host:port...]/service_name`` lists the sentinels. The client is
redis-py's Sentinel master client: every new connection asks the sentinels for the current
master, and a connection that finds its server demoted (READONLY) is dropped, so after a
failover the same backend reaches the promoted replica. Calls are bounded and queued by the
gate of ``RedisStore``, exactly as on a standalone server; the wake-up subscriber follows the
master the same way (its connection class is the Sentinel-managed one).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import unquote, urlsplit

from ._backend import RedisStore, _DedicatedPubSub
from ._cluster import parse_hosts
from ._connections import Connections
from ._notify import Notifier


class SentinelStore(RedisStore):
    """A ``RedisStore`` on a Sentinel master client, also closing the sentinel connections."""

    __slots__ = ("_sentinel",)

    def __init__(self, client: Any, sentinel: Any, *, max_calls: int, gate_timeout: float) -> None:
        # Scripts run on connections of the client's pool class (Sentinel-managed: each one
        # asks the sentinels for the master when it connects, and drops itself when it finds
        # its server demoted), one pre-packed EVALSHA each, never resent (_connections).
        super().__init__(
            client,
            owned=True,
            max_calls=max_calls,
            gate_timeout=gate_timeout,
            connections=Connections(client.connection_pool.make_connection),
        )
        self._sentinel = sentinel

    @property
    def notifier(self) -> Notifier:
        """The wake-up subscriber, on a dedicated connection to the current master."""
        if self._notifier is None:
            client = self._client
            self._notifier = Notifier(lambda: _SentinelPubSub(client))
        return self._notifier

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self._sentinel.aclose()


class _SentinelPubSub(_DedicatedPubSub):
    """The dedicated subscriber, without redis-py's reconnect-and-resubscribe: when the
    master fails, the error reaches the Notifier, which builds a new subscriber whose
    connection asks the sentinels for the promoted master."""

    def __init__(self, client: Any) -> None:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        super().__init__(client)
        self._pool.connection_kwargs["retry"] = Retry(NoBackoff(), 0)


def _serialized_sentinel(hosts: list[tuple[str, int]], **kwargs: Any) -> Any:
    """redis-py's asyncio ``Sentinel`` with ``discover_master`` run one call at a time.

    It moves the sentinel that answered to the front of its list by index after an await;
    concurrent calls (every new connection during a failover makes one) swap with stale
    indexes, so one sentinel client ends up twice in the list and another is lost: no longer
    asked, and never closed by ``aclose`` (its sockets leak)."""
    from redis.asyncio.sentinel import Sentinel

    class _Sentinel(Sentinel):
        _lock: asyncio.Lock | None = None

        async def discover_master(self, service_name: str) -> Any:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                return await super().discover_master(service_name)

    return _Sentinel(hosts, **kwargs)  # type: ignore[no-untyped-call]


def sentinel_store(
    url: str, *, max_connections: int, timeout: float, connect_timeout: float, **options: Any
) -> SentinelStore:
    """The store for ``redis+sentinel://host:port[,host:port...]/service_name``."""
    parts = urlsplit(url)
    service = unquote(parts.path.strip("/"))
    if not service or "/" in service or parts.query or parts.fragment:
        raise ValueError(
            "a redis+sentinel:// URL names the sentinels and one service: "
            "redis+sentinel://host:port,host:port/service_name"
        )
    hosts, username, password = parse_hosts(parts.netloc, 26379)
    # Credentials in the URL are the master's; the sentinels get the same timeouts only.
    sentinel = _serialized_sentinel(
        hosts,
        sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": connect_timeout},
    )
    client = sentinel.master_for(
        service,
        username=username,
        password=password,
        max_connections=max_connections,
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
        **options,
    )
    return SentinelStore(client, sentinel, max_calls=max_connections, gate_timeout=timeout)
