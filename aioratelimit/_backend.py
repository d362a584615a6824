"""The backend: one bounded connection pool shared by every primitive, and where redis errors
are translated.

A primitive never talks to redis-py. It hands a ``Script`` with its keys and arguments to
``Backend.run``; the backend's store answers: ``RedisStore`` by EVALSHA through one shared
``redis.asyncio`` client, ``MemoryStore`` by the script's Python twin. Every redis-py error
becomes ``BackendUnavailable`` here, with the original chained.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Protocol

from redis import exceptions as redis_errors

from ._args import check_int, check_seconds
from ._errors import BackendUnavailable
from ._memory import Arg, MemoryStore, Reply
from ._notify import Notifier
from ._scripts import Script

log = logging.getLogger("aioratelimit")

#: Defaults of the pool that ``from_url`` builds.
DEFAULT_MAX_CONNECTIONS = 50
DEFAULT_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0

_SCHEMES = ("redis://", "rediss://", "unix://", "memory://")
_LATER_SCHEMES = ("redis+cluster://", "redis+sentinel://")


class Store(Protocol):
    """What a backend needs from storage: run one script atomically, and close."""

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply: ...

    async def aclose(self) -> None: ...

    @property
    def notifier(self) -> Notifier: ...


RunScript = Callable[[Script, Sequence[str], Sequence[Arg]], Awaitable[Reply]]


class _ScriptClient(Protocol):
    """The slice of ``redis.asyncio.Redis`` (and ``RedisCluster``) that the store uses."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Awaitable[Any]: ...

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Awaitable[Any]: ...

    def aclose(self) -> Awaitable[None]: ...


def _unavailable(exc: BaseException) -> BackendUnavailable:
    """The one translation of a redis-py or socket error."""
    if isinstance(exc, redis_errors.ResponseError):
        return BackendUnavailable(f"Redis answered with an error: {exc}")
    if isinstance(exc, (redis_errors.TimeoutError, asyncio.TimeoutError, TimeoutError)):
        return BackendUnavailable(f"Redis did not answer in time: {exc or type(exc).__name__}")
    return BackendUnavailable(f"Redis is unreachable: {exc or type(exc).__name__}")


_TRANSLATED = (redis_errors.RedisError, OSError, asyncio.TimeoutError)


class RedisStore:
    """Runs scripts by EVALSHA on one shared ``redis.asyncio`` client."""

    __slots__ = ("_client", "_notifier", "_owned")

    def __init__(self, client: _ScriptClient, *, owned: bool) -> None:
        self._client = client
        self._owned = owned
        self._notifier: Notifier | None = None

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        try:
            try:
                return await self._client.evalsha(script.sha, len(keys), *keys, *args)
            except redis_errors.NoScriptError:
                # After SCRIPT FLUSH, a restart or a failover: EVAL runs it and caches it
                # again on the node that owns the keys, inside the same call.
                return await self._client.eval(script.source, len(keys), *keys, *args)
        except _TRANSLATED as exc:
            raise _unavailable(exc) from exc

    @property
    def client(self) -> _ScriptClient:
        return self._client

    @property
    def notifier(self) -> Notifier:
        """The backend's one subscriber, on a dedicated connection outside the pool."""
        if self._notifier is None:
            client = self._client
            self._notifier = Notifier(lambda: _DedicatedPubSub(client))
        return self._notifier

    async def aclose(self) -> None:
        if self._notifier is not None:
            await self._notifier.aclose()
        if self._owned:
            await self._client.aclose()


class _DedicatedPubSub:
    """A redis-py PubSub on its own one-connection pool (so it never takes a pooled slot)."""

    def __init__(self, client: Any) -> None:
        import redis.asyncio as aredis

        pool = client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        # The subscriber idles between messages: no read timeout on its socket.
        kwargs["socket_timeout"] = None
        self._pool = aredis.ConnectionPool(
            connection_class=pool.connection_class, max_connections=1, **kwargs
        )
        self._pubsub: Any = aredis.Redis.from_pool(self._pool).pubsub()

    @property
    def subscribed(self) -> bool:
        return bool(self._pubsub.subscribed)

    async def subscribe(self, channel: str) -> None:
        await self._pubsub.subscribe(channel)

    async def unsubscribe(self, channel: str) -> None:
        await self._pubsub.unsubscribe(channel)

    async def get_message(self, *, ignore_subscribe_messages: bool, timeout: float) -> Any:
        return await self._pubsub.get_message(
            ignore_subscribe_messages=ignore_subscribe_messages, timeout=timeout
        )

    async def aclose(self) -> None:
        try:
            await self._pubsub.aclose()
        finally:
            await self._pool.disconnect()


class Backend:
    """One store (Redis or memory) and the key prefix shared by every primitive using it.

    ``Backend(client)`` wraps a ``redis.asyncio.Redis`` the application already has (it is
    not closed by ``aclose``); ``Backend.from_url(url)`` builds and owns a bounded pool.
    """

    __slots__ = ("_store", "prefix", "run", "url")

    #: ``await backend.run(script, keys, args)``: one script, atomically, in one round trip
    #: (the store's own bound method, so a decision pays no extra call layer).
    run: RunScript

    def __init__(self, client: Any, *, prefix: str = "arl") -> None:
        if client is None:
            raise TypeError("Backend(client) needs a redis.asyncio client; use from_url()")
        if not (hasattr(client, "evalsha") and hasattr(client, "eval")):
            raise TypeError(
                f"Backend(client) needs a redis.asyncio client, not {type(client).__name__}"
            )
        self._store: Store = RedisStore(client, owned=False)
        self.run = self._store.run
        self.prefix = _check_prefix(prefix)
        self.url = "client://"

    @classmethod
    def _of(cls, store: Store, *, prefix: str, url: str) -> Backend:
        self = object.__new__(cls)
        self._store = store
        self.run = store.run
        self.prefix = _check_prefix(prefix)
        self.url = url
        return self

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "arl",
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        **redis_options: Any,
    ) -> Backend:
        """A backend for ``url``, owning its pool.

        ``max_connections`` bounds the pool; when every connection is busy a call waits for
        one. ``timeout`` (seconds) bounds that wait and each reply; ``connect_timeout`` each
        connection attempt. Past either, the call raises ``BackendUnavailable``. Other
        keyword arguments go to ``redis.asyncio.BlockingConnectionPool.from_url``.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        check_int(max_connections, "max_connections")
        timeout = check_seconds(timeout, "timeout")
        connect_timeout = check_seconds(connect_timeout, "connect_timeout")
        if url.startswith("memory://"):
            return cls._of(MemoryStore(), prefix=prefix, url=url)
        if url.startswith(_LATER_SCHEMES):
            raise ValueError(f"{url.split('://')[0]}:// is not supported yet")
        if not url.startswith(_SCHEMES):
            raise ValueError(f"unsupported URL {url!r}: expected one of {', '.join(_SCHEMES)}")
        import redis.asyncio as aredis

        pool = aredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=connect_timeout,
            **redis_options,
        )
        client = aredis.Redis.from_pool(pool)  # owns the pool: aclose disconnects it
        return cls._of(RedisStore(client, owned=True), prefix=prefix, url=url)

    @property
    def store(self) -> Store:
        return self._store

    @property
    def notifier(self) -> Notifier:
        """The backend's shared pub/sub subscriber (see ``_notify``)."""
        return self._store.notifier

    async def aclose(self) -> None:
        """Close the pool this backend owns (a wrapped client is left open)."""
        await self._store.aclose()

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Backend {_redact(self.url)} prefix={self.prefix!r}>"


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if not prefix:
        raise ValueError("prefix must not be empty")
    return prefix


def _redact(url: str) -> str:
    """The URL without a password, for reprs and logs."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


_default: Backend | None = None


def configure(
    url: str | None = None, *, client: Any = None, prefix: str = "arl", **pool_options: Any
) -> Backend:
    """Build a backend and install it as the default every primitive uses.

    With neither ``url`` nor ``client``: ``REDIS_URL`` from the environment, else
    ``memory://``. The previous default is not closed (it may still be in use).
    """
    global _default
    if url is not None and client is not None:
        raise ValueError("configure() takes a url or a client, not both")
    if client is not None:
        if pool_options:
            raise TypeError("pool options apply to a url, not to a client you pass in")
        backend = Backend(client, prefix=prefix)
    else:
        backend = Backend.from_url(url or _env_url(), prefix=prefix, **pool_options)
    _default = backend
    return backend


def get_backend() -> Backend:
    """The configured default backend (built from ``REDIS_URL`` or ``memory://`` on first use)."""
    global _default
    if _default is None:
        _default = Backend.from_url(_env_url())
    return _default


def _env_url() -> str:
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    log.warning(
        "aioratelimit: no backend configured and REDIS_URL is not set; using memory://"
        " (limits, locks and tokens are per process)"
    )
    return "memory://"
