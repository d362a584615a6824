"""The backend: one bounded connection pool shared by every primitive, and where redis errors
are translated.

A primitive never talks to redis-py. It hands a ``Script`` with its keys and arguments to
``Backend.run``; the backend's store answers: ``RedisStore`` by EVALSHA (on the connections
of ``_connections`` for a pool it builds itself, through the client's own ``evalsha`` for a
client the application passes in), ``MemoryStore`` by the script's Python twin. Every
redis-py error becomes ``BackendUnavailable`` here, with the original chained.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Protocol

from redis import exceptions as redis_errors

from ._args import check_int, check_seconds
from ._connections import Connections, close_without_loop, exchange
from ._errors import BackendUnavailable
from ._memory import Arg, MemoryStore, Reply
from ._notify import Notifier
from ._scripts import Script

log = logging.getLogger("aioratelimit")

#: Defaults of the pool that ``from_url`` builds.
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0

_SCHEMES = (
    "redis://", "rediss://", "unix://", "redis+cluster://", "redis+sentinel://", "memory://"
)  # fmt: skip


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


_timeout_cm: Any = getattr(asyncio, "timeout", None)  # Python 3.11+
_running_loop = asyncio.get_running_loop
#: Deadlines needs Task.uncancel/cancelling (Python 3.11+) to tell its own cancellation apart.
_OWN_DEADLINES = hasattr(asyncio.Task, "uncancel")


def socket_timeout(timeout: float) -> float | None:
    """The socket timeout for pooled connections: none where the store bounds each call
    itself (``Deadlines``, Python 3.11+), else ``timeout``."""
    return None if _OWN_DEADLINES else timeout


def op_timeout(timeout: float) -> float | None:
    """The per-call bound ``RedisStore.run`` applies (the other half of ``socket_timeout``)."""
    return timeout if _OWN_DEADLINES else None


class Deadlines:
    """Bounds every call in flight with ONE timer, not one per call.

    ``asyncio.timeout`` arms a timer and enters a context manager per call (about 5 µs);
    here a call only records its task and deadline. When the earliest deadline passes, the
    timer cancels the overdue tasks; each one is then suspended inside its own call (a task
    is in the table only between its call's first and last await), which turns that
    cancellation into ``TimeoutError``, and an outer cancellation stays a cancellation.
    """

    __slots__ = ("_calls", "_expired", "_handle", "_loop", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._calls: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def enter(self) -> tuple[asyncio.Task[Any], int]:
        """Register the current task's call; returns it and its cancellation count."""
        task = asyncio.current_task()
        assert task is not None
        loop = task.get_loop()
        deadline = loop.time() + self.timeout
        self._calls[task] = deadline
        if self._handle is None or self._loop is not loop:
            self._loop = loop
            self._handle = loop.call_at(deadline, self._check, loop)
        counted: Any = task  # Task.cancelling/uncancel: Python 3.11+ (see _OWN_DEADLINES)
        return task, int(counted.cancelling())

    def leave(self, task: asyncio.Task[Any]) -> None:
        del self._calls[task]
        self._expired.discard(task)

    def expired(self, task: asyncio.Task[Any], cancelling: int) -> bool:
        """Was this CancelledError ours, and ours alone? (Then it is a timeout.)"""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        counted: Any = task
        return int(counted.uncancel()) <= cancelling

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a timer left on a loop this backend no longer runs on
        self._handle = None
        now = loop.time()
        earliest: float | None = None
        for task, deadline in self._calls.items():
            if deadline <= now:
                if task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None:
            self._handle = loop.call_at(earliest, self._check, loop)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


_TRANSLATED = (redis_errors.RedisError, OSError, asyncio.TimeoutError)


class Gate:
    """Lets at most ``size`` calls in at once; the others wait in arrival order.

    ``asyncio.Semaphore`` does the same, but through a coroutine per acquire; a call that
    finds a slot free here pays one integer test (``if gate.free: gate.free -= 1``), and
    ``leave`` hands its slot straight to the oldest live waiter. Invariant: ``free > 0``
    only when no live waiter is queued (a waiter queues only when ``free`` is 0, and a slot
    is added to ``free`` only when no live waiter takes it).
    """

    __slots__ = ("_waiters", "free", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def wait(self, timeout: float) -> None:
        """Wait for a slot, at most ``timeout`` seconds (then ``BackendUnavailable``)."""
        slot: asyncio.Future[None] = _running_loop().create_future()
        self._waiters.append(slot)
        try:
            if _timeout_cm is not None:
                async with _timeout_cm(timeout):
                    await slot
            else:  # Python 3.10
                await asyncio.wait_for(asyncio.shield(slot), timeout)
        except BaseException as exc:
            if slot.done() and not slot.cancelled():
                self.leave()  # handed a slot just as it gave up: pass it on
            else:
                slot.cancel()  # skipped by leave()
            if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                raise BackendUnavailable(
                    f"no pooled connection came free within {timeout} s"
                ) from exc
            raise

    def leave(self) -> None:
        """Give a slot back: to the oldest live waiter, else to ``free``."""
        waiters = self._waiters
        while waiters:
            slot = waiters.popleft()
            if not slot.done():
                slot.set_result(None)
                return
        self.free += 1


class RedisStore:
    """Runs scripts by EVALSHA on one shared ``redis.asyncio`` client."""

    #: The command scripts publish wake-ups with (see ``Backend.publish_command``).
    publish_command = "PUBLISH"

    __slots__ = (
        "_client",
        "_connections",
        "_deadlines",
        "_gate",
        "_gate_timeout",
        "_loop",
        "_notifier",
        "_owned",
    )

    def __init__(
        self,
        client: _ScriptClient,
        *,
        owned: bool,
        max_calls: int | None = None,
        gate_timeout: float = DEFAULT_TIMEOUT,
        op_timeout: float | None = None,
        connections: Connections | None = None,
    ) -> None:
        self._client = client
        # Where scripts run: these connections (a pool this store owns, see _connections),
        # else the client's own execute_command path (a client the application passed in).
        self._connections = connections
        # Bounds each call (send and reply) here when the connections have no socket timeout
        # of their own (see socket_timeout): redis-py sends under asyncio.wait_for whenever a
        # socket timeout is set, which before Python 3.12 starts a task per command and can
        # lose a cancellation.
        self._deadlines = None if op_timeout is None else Deadlines(op_timeout)
        self._owned = owned
        self._notifier: Notifier | None = None
        # Bounds the calls in flight to the pool's size, so the pool never runs out (see
        # Backend.from_url). A free slot costs one non-blocking acquire; redis-py's
        # BlockingConnectionPool costs a Condition, a timeout and a context manager per call.
        self._gate = None if max_calls is None else Gate(max_calls)
        self._gate_timeout = gate_timeout
        # The event loop the connections and the gate serve (see _adopt).
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        # One coroutine frame between the caller and the exchange: this one. Every layer
        # here (gate, deadline, connection) is a plain call, not an awaited helper.
        conns = self._connections
        if conns is not None and _running_loop() is not self._loop:
            self._adopt(_running_loop())
        gate = self._gate
        if gate is not None:
            if gate.free:
                gate.free -= 1
            else:
                await gate.wait(self._gate_timeout)
        deadlines = self._deadlines
        task: asyncio.Task[Any] | None = None
        cancelling = 0
        try:
            if deadlines is not None:
                task, cancelling = deadlines.enter()
            if conns is None:
                return await self._call(script, keys, args)
            conn = conns.take()
            try:
                return await exchange(conn, script, keys, args)
            finally:
                conns.give(conn)
        except asyncio.CancelledError:
            if task is not None and deadlines is not None and deadlines.expired(task, cancelling):
                late = asyncio.TimeoutError(f"no reply within {deadlines.timeout} s")
                raise _unavailable(late) from late
            raise
        except _TRANSLATED as exc:
            raise _unavailable(exc) from exc
        finally:
            if task is not None and deadlines is not None:
                deadlines.leave(task)
            if gate is not None:
                gate.leave()

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve calls on ``loop`` from now on. Connections and a gate made on an earlier
        loop (an application or test suite that runs ``asyncio.run`` more than once with one
        backend) cannot be used on this one: they are dropped, not awaited on a loop that
        has ended. One backend serves one running loop at a time."""
        if self._loop is not None:
            if self._gate is not None:
                self._gate = Gate(self._gate.size)
            assert self._connections is not None
            self._connections.abandon()
        self._loop = loop

    async def _call(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        """The call through a client the application passed in (its own path)."""
        try:
            return await self._client.evalsha(script.sha, len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            # After SCRIPT FLUSH, a restart or a failover: EVAL runs it and caches it
            # again on the node that owns the keys, inside the same call.
            return await self._client.eval(script.source, len(keys), *keys, *args)

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
        if self._deadlines is not None:
            self._deadlines.close()
        if self._notifier is not None:
            await self._notifier.aclose()
        if self._connections is not None:
            if _running_loop() is not self._loop:
                self._adopt(_running_loop())  # closed from a later loop than its last call
            await self._connections.aclose()
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
        self._closed = False

    @property
    def subscribed(self) -> bool:
        return bool(self._pubsub.subscribed)

    async def subscribe(self, channel: str) -> None:
        await self._pubsub.subscribe(channel)
        if self._closed:
            # Closed while it connected (the Notifier dropped it after a failure): the
            # connection opened after aclose(), and nobody will read or close it.
            await self.aclose()
            raise ConnectionError("the subscriber was closed while subscribing")

    async def unsubscribe(self, channel: str) -> None:
        await self._pubsub.unsubscribe(channel)

    async def get_message(self, *, ignore_subscribe_messages: bool, timeout: float) -> Any:
        return await self._pubsub.get_message(
            ignore_subscribe_messages=ignore_subscribe_messages, timeout=timeout
        )

    def abandon(self) -> None:
        """Close the connection of an event loop that has ended, without that loop."""
        self._closed = True
        conn = getattr(self._pubsub, "connection", None)
        if conn is not None:
            close_without_loop(conn)

    async def aclose(self) -> None:
        self._closed = True
        try:
            await self._pubsub.aclose()
        finally:
            await self._pool.disconnect()


class Backend:
    """One store (Redis or memory) and the key prefix shared by every primitive using it.

    ``Backend(client)`` wraps a ``redis.asyncio.Redis``, ``RedisCluster`` or Sentinel master
    client the application already has (it is not closed by ``aclose``);
    ``Backend.from_url(url)`` builds and owns a bounded pool.
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
        self._store: Store = _wrap(client)
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
        keyword arguments go to ``redis.asyncio.ConnectionPool.from_url`` (to ``RedisCluster``
        for ``redis+cluster://``, to ``Sentinel.master_for`` for ``redis+sentinel://``). On a
        cluster, ``max_connections`` bounds the calls in flight through the backend, and so
        the connections to each node.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        check_int(max_connections, "max_connections")
        timeout = check_seconds(timeout, "timeout")
        connect_timeout = check_seconds(connect_timeout, "connect_timeout")
        if url.startswith("memory://"):
            return cls._of(MemoryStore(), prefix=prefix, url=url)
        if url.startswith(("redis+cluster://", "redis+sentinel://")):
            from ._cluster import cluster_store
            from ._sentinel import sentinel_store

            build = cluster_store if url.startswith("redis+cluster://") else sentinel_store
            multi = build(
                url,
                max_connections=max_connections,
                timeout=timeout,
                connect_timeout=connect_timeout,
                **redis_options,
            )
            return cls._of(multi, prefix=prefix, url=url)
        if not url.startswith(_SCHEMES):
            raise ValueError(f"unsupported URL {url!r}: expected one of {', '.join(_SCHEMES)}")
        import redis.asyncio as aredis

        pool = aredis.ConnectionPool.from_url(
            url,
            max_connections=max_connections,
            socket_timeout=socket_timeout(timeout),
            socket_connect_timeout=connect_timeout,
            **_reconnecting(aredis.ConnectionPool, redis_options),
        )
        client = aredis.Redis.from_pool(pool)  # owns the pool: aclose disconnects it
        store = RedisStore(
            client,
            owned=True,
            max_calls=max_connections,
            gate_timeout=timeout,
            op_timeout=op_timeout(timeout),
            connections=Connections(pool.make_connection),
        )
        return cls._of(store, prefix=prefix, url=url)

    @property
    def store(self) -> Store:
        return self._store

    @property
    def notifier(self) -> Notifier:
        """The backend's shared pub/sub subscriber (see ``_notify``)."""
        return self._store.notifier

    @property
    def publish_command(self) -> str:
        """What a script that wakes waiters publishes with, passed to it as an argument:
        ``"SPUBLISH"`` on Redis Cluster (shard-local, heard by ``notifier``), else
        ``"PUBLISH"``. The channel must carry the hash tag of the script's keys."""
        return str(getattr(self._store, "publish_command", "PUBLISH"))

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


def _wrap(client: Any) -> Store:
    """The store for a client the application passes in (never closed by the backend)."""
    from redis.asyncio.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        from ._cluster import ClusterStore

        # Bound calls in flight by the client's per-node pool size, so that pool never
        # fails fast with MaxConnectionsError: callers queue instead.
        size = int(client.get_connection_kwargs().get("max_connections") or 100)
        return ClusterStore(client, owned=False, max_calls=size, gate_timeout=DEFAULT_TIMEOUT)
    return RedisStore(client, owned=False)


def _reconnecting(pool_class: type, options: dict[str, Any]) -> dict[str, Any]:
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
