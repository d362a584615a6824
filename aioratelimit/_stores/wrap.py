"""A store for a client the application already has (``Backend(client)``)."""

from __future__ import annotations

from typing import Any

from .base import DEFAULT_TIMEOUT, Store

#: What ``Backend(client)`` takes (anything else is a TypeError at once).
_CLIENTS = (
    "redis.asyncio.Redis (fakeredis.FakeAsyncRedis too), redis.asyncio.RedisCluster or"
    " valkey.asyncio.Valkey"
)


def wrap(client: Any) -> Store:
    """The store for a client the application passes in (never closed by the backend):
    redis-py's asyncio ``Redis`` (or a subclass: fakeredis's, Sentinel's ``master_for``),
    its ``RedisCluster``, or valkey-py's asyncio ``Valkey``."""
    import redis.asyncio as aredis
    from redis.asyncio.cluster import RedisCluster

    named = f"{type(client).__module__}.{type(client).__qualname__}"
    if type(client).__module__.split(".")[0] == "valkey":
        import valkey.asyncio

        if isinstance(client, valkey.asyncio.Valkey):
            from .standalone import ClientStore

            return ClientStore(client, family="valkey")
        raise TypeError(
            f"Backend(client) takes {_CLIENTS}, not {named} (a Valkey cluster: pass a"
            " redis+cluster:// URL to Backend.from_url)"
        )
    if not isinstance(client, (aredis.Redis, RedisCluster)):
        hint = (
            " (a synchronous client: use its redis.asyncio twin)" if hasattr(client, "eval") else ""
        )
        raise TypeError(f"Backend(client) takes {_CLIENTS}, not {named}{hint}")
    if isinstance(client, RedisCluster):
        from .cluster import ClusterStore

        # Bound calls in flight by the client's per-node pool size, so that pool never
        # fails fast with MaxConnectionsError: callers queue instead.
        size = int(client.get_connection_kwargs().get("max_connections") or 100)
        return ClusterStore(client, owned=False, max_calls=size, timeout=DEFAULT_TIMEOUT)
    from .standalone import ClientStore

    return ClientStore(client)
