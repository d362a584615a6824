"""Redis Sentinel: a store on whichever server the sentinels name as the master.

``redis+sentinel://host:port[,host:port...]/service_name`` lists the sentinels. Scripts run
on the store's own multiplexed connection (``RedisStore``, never resent); every new
connection first asks the sentinels for the current master, and a connection whose server
answers READONLY (demoted) or breaks is dropped, so after a failover the same backend
reaches the promoted replica. The wake-up subscriber follows the master through redis-py's
Sentinel-managed connection class, without redis-py's silent retry.

TLS (``rediss+sentinel://``, or any TLS option) is every connection's: the master's (the
scripts' and the subscriber's) and the sentinels' (discovery). The sentinels take the same
settings unless ``sentinel_ssl`` (False: plain TCP to them) or a ``sentinel_ssl_*`` option
(``sentinel_ssl_ca_certs``...: that one setting, for the sentinels only) says otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from .._scripts import OnCall
from .endpoint import TLS_NAMES, Endpoint, endpoint, tls_context, tls_options
from .pubsub import DedicatedPubSub
from .standalone import OnLoop, RedisStore
from .urls import parse_hosts, tls_query


class SentinelStore(RedisStore):
    """A ``RedisStore`` on the master the sentinels name, asked anew at every connect."""

    __slots__ = ("_sentinel",)

    def __init__(self, client: Any, sentinel: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._sentinel = sentinel

    def _subscriber(self) -> DedicatedPubSub:
        return DedicatedPubSub(self._client, retry=False)

    async def _retire(self, on: OnLoop) -> None:
        try:
            await super()._retire(on)
        finally:
            # The sentinels' own connections (master discovery) belong to the loop too.
            await self._sentinel.aclose()

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self._sentinel.aclose()


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

    build: Callable[..., Any] = _Sentinel  # redis-py types its constructor from 8.2, not 8.1
    return build(hosts, **kwargs)


def _sentinel_tls(tls: bool, options: dict[str, Any]) -> dict[str, Any]:
    """The TLS settings of the connections to the sentinels, as redis-py's keyword
    arguments (``{}``: plain TCP), taking ``sentinel_ssl`` and every ``sentinel_ssl_*``
    option out of ``options``. By default the sentinels are spoken to as the data servers
    are (``tls``, the same TLS options); ``sentinel_ssl`` turns TLS to them on or off, and
    each ``sentinel_ssl_<name>`` replaces ``ssl_<name>`` for them."""
    on = options.pop("sentinel_ssl", None)
    own = {
        name.removeprefix("sentinel_"): options.pop(name)
        for name in [n for n in options if n.startswith("sentinel_ssl_")]
    }
    unknown = sorted(f"sentinel_{name}" for name in own if name not in TLS_NAMES)
    if unknown:
        raise TypeError(f"unsupported Sentinel TLS option(s) {unknown}")
    if on is None:
        on = tls or bool(own)
    elif not isinstance(on, bool):
        raise TypeError(f"sentinel_ssl must be True or False, not {type(on).__name__}")
    if not on:
        if own:
            raise TypeError(f"Sentinel TLS options {sorted(own)} with sentinel_ssl=False")
        return {}
    settings = {**tls_options(options), **own}
    tls_context(settings)  # a certificate file that cannot be read fails here, before I/O
    return {"ssl": True, **settings}


def sentinel_store(
    url: str,
    *,
    max_connections: int,
    timeout: float,
    connect_timeout: float,
    max_in_flight: int,
    on_call: OnCall | None = None,
    batch: bool = True,
    **options: Any,
) -> SentinelStore:
    """The store for ``redis+sentinel://host:port[,host:port...]/service_name``."""
    parts = urlsplit(url)
    service = unquote(parts.path.strip("/"))
    if not service or "/" in service or parts.fragment:
        raise ValueError(
            "a redis+sentinel:// URL names the sentinels and one service, and TLS options"
            " only: redis+sentinel://host:port,host:port/service_name"
        )
    options = {**tls_query(parts.query, sentinel=True), **options}
    tls = parts.scheme == "rediss+sentinel" or bool(tls_options(options))
    own = _sentinel_tls(tls, options)  # takes the sentinel_ options out of ``options``
    hosts, username, password = parse_hosts(parts.netloc, 26379)
    # Credentials in the URL are the master's; the sentinels get the same timeouts, and TLS.
    master = endpoint(None, {"username": username, "password": password, **options}, tls=tls)
    sentinel = _serialized_sentinel(
        hosts,
        sentinel_kwargs={
            "socket_timeout": timeout,
            "socket_connect_timeout": connect_timeout,
            **own,
        },
    )
    # redis-py's master client serves the wake-up subscriber (its connections ask the
    # sentinels for the master too); scripts go over the store's own connection.
    client = sentinel.master_for(
        service,
        username=username,
        password=password,
        max_connections=max_connections,
        socket_timeout=None,
        socket_connect_timeout=connect_timeout,
        **({"ssl": True} if tls else {}),
        **options,
    )

    async def resolve() -> Endpoint:
        host, port = await sentinel.discover_master(service)
        return master.at(str(host), int(port))

    return SentinelStore(
        client,
        sentinel,
        endpoint=master,
        max_in_flight=max_in_flight,
        timeout=timeout,
        connect_timeout=connect_timeout,
        on_call=on_call,
        resolve=resolve,
        batch=batch,
    )
