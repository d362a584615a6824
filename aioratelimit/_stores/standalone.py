"""One Redis server: the store ``Backend.from_url`` builds for ``redis://``, ``rediss://`` and
``unix://`` (and, with the master named by the sentinels, for ``redis+sentinel://``), and the
store for a client the application passes in.

``RedisStore`` runs each script on one multiplexed connection of its own (``wire.Link``): a
call takes one of ``max_in_flight`` slots at the gate (waiting at most ``timeout`` when all
are taken), hands its script to the connection's ``batch.Batcher`` (a pre-packed EVALSHA
of its own when nothing is in flight, else one decision of a batch call), and awaits its
reply; the wire bounds the reply by ``timeout``. On NOSCRIPT it sends EVAL for that call
alone.

The event-loop contract: a store serves one running event loop at a time. What it opened on
a loop (the connection, the gate's queue) is closed on that loop when the loop shuts down
(``_aio.Keeper``: asyncio.run, asyncio.Runner, uvloop.run and pytest-asyncio cancel every
pending task first) or when the store is closed. A call from another loop (the next
``asyncio.run`` of an application or a test suite) starts afresh there, once the loop
served so far has stopped; while it still runs (another thread's), the call is refused
with ``BackendError`` (``loops``).

``ClientStore`` runs scripts through the client's own ``evalsha``/``eval``: that client's
pool, timeouts and event-loop rules are the application's.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._aio import Gate, Keeper
from .._errors import BackendError
from .._scripts import BATCH, Arg, OnCall, Reply, Script
from .base import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    REDIS_PY,
    TRANSLATED,
    observed,
    translate,
    valkey_errors,
)
from .batch import Batcher
from .confirm import ConfirmPool, Replicas
from .endpoint import Endpoint, check_server, endpoint
from .loops import check_free
from .notify import Notifier
from .pubsub import DedicatedPubSub
from .resp import pack
from .wire import Link, ReplyError

_running_loop = asyncio.get_running_loop


class _OnClient:
    """What a store on one redis-py client has: the client, and the backend's wake-up
    subscriber on a dedicated connection outside the pool."""

    publish_command = "PUBLISH"

    __slots__ = ("_bound", "_client", "_notifier")

    def __init__(
        self, client: Any, bound: float = DEFAULT_CONNECT_TIMEOUT + DEFAULT_TIMEOUT
    ) -> None:
        self._client = client
        self._notifier: Notifier | None = None
        # What bounds the subscriber's connect and SUBSCRIBE (connect_timeout + timeout).
        self._bound = bound

    @property
    def client(self) -> Any:
        return self._client

    @property
    def notifier(self) -> Notifier:
        if self._notifier is None:
            self._notifier = Notifier(self._subscriber, bound=self._bound)
        return self._notifier

    def _subscriber(self) -> DedicatedPubSub:
        return DedicatedPubSub(self._client)

    async def aclose(self) -> None:
        if self._notifier is not None:
            await self._notifier.aclose()


class OnLoop:
    """What a store opened on one event loop: its connection, its gate, and the pool of
    connections for confirmed writes (``confirm``: made by the first)."""

    __slots__ = ("batcher", "confirms", "gate", "keeper", "link", "loop")

    def __init__(self, link: Link, size: int, batch: bool) -> None:
        self.loop = _running_loop()
        self.link = link
        self.gate = Gate(size)
        self.batcher = Batcher(BATCH, enabled=batch)
        self.keeper: Keeper | None = None
        self.confirms: ConfirmPool | None = None


class RedisStore(_OnClient):
    """Runs scripts by pre-packed EVALSHA on a multiplexed connection of its own."""

    __slots__ = (
        "_adopting",
        "_batch",
        "_connect_timeout",
        "_on",
        "_on_call",
        "_resolve",
        "_size",
        "_timeout",
        "endpoint",
        "run",
    )

    #: ``await store.run(script, keys, args)``: ``_call``, or ``_observed`` with a hook
    #: (chosen once: a store without a hook pays nothing for it).
    run: Callable[[Script, Sequence[str], Sequence[Arg]], Awaitable[Reply]]

    def __init__(
        self,
        client: Any,
        endpoint: Endpoint,
        *,
        max_in_flight: int,
        timeout: float,
        connect_timeout: float,
        on_call: OnCall | None = None,
        resolve: Callable[[], Awaitable[Endpoint]] | None = None,
        batch: bool = True,
    ) -> None:
        #: the redis-py client the wake-up subscriber connects with (closed with the store)
        super().__init__(client, connect_timeout + timeout)
        self.endpoint = endpoint
        self._resolve = resolve  # where the server is, asked anew at each connect (Sentinel)
        self._size = max_in_flight
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._on_call = on_call
        self._batch = batch  # whether decisions batch (``_stores.batch``)
        self._on: OnLoop | None = None
        self._adopting = threading.Lock()
        self.run = self._call if on_call is None else self._observed

    async def _call(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        on = self._on
        if on is None or on.loop is not _running_loop():
            on = self._adopt()
        gate = on.gate
        if gate.free:
            gate.free -= 1
        else:
            await gate.wait(self._timeout)
        try:
            wire = on.link.open or await on.link.wire()
            reply = await on.batcher.send(wire, script, keys, args)
            if type(reply) is ReplyError:
                reply = await self._answered(on, script, keys, args, reply)
            return reply
        except TRANSLATED as exc:
            raise translate(exc, script) from exc
        finally:
            gate.leave()

    async def _answered(
        self, on: OnLoop, script: Script, keys: Sequence[str], args: Sequence[Arg], error: Any
    ) -> Reply:
        """An error reply: NOSCRIPT (after SCRIPT FLUSH, a restart or a failover) is answered
        by EVAL of this call alone, which also caches the script; READONLY (the server was
        demoted) drops the connection so the next call finds the master; anything else is
        raised."""
        message = str(error)
        if message.startswith("NOSCRIPT"):
            wire = on.link.open or await on.link.wire()
            reply = await wire.send(pack(script.eval_head, keys, args))
            if type(reply) is not ReplyError:
                return reply
            error = reply
        elif message.startswith("READONLY"):
            on.link.drop(error)
        raise error

    #: What ``Backend`` refuses ``replicas=`` with (None: this store confirms writes).
    confirm_refusal: str | None = None

    async def run_confirmed(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], replicas: Replicas
    ) -> tuple[Reply, Any]:
        """The script and WAIT in one write on a connection of the pool for confirmed
        writes (``confirm``), never the shared wire: WAIT blocks its connection."""
        on = self._on
        if on is None or on.loop is not _running_loop():
            on = self._adopt()
        pool = on.confirms
        if pool is None:
            pool = on.confirms = ConfirmPool(
                self._where, timeout=self._timeout, connect_timeout=self._connect_timeout
            )
        call = self._confirmed(on, pool, script, keys, args, replicas)
        if self._on_call is None:
            return await call
        both: tuple[Reply, Any] = await observed(self._on_call, script, call, self._server)
        return both

    async def _confirmed(
        self,
        on: OnLoop,
        pool: ConfirmPool,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        replicas: Replicas,
    ) -> tuple[Reply, Any]:
        try:
            reply, waited = await pool.run(script, keys, args, replicas)
            if type(reply) is ReplyError:
                if str(reply).startswith("READONLY"):
                    on.link.drop(reply)  # demoted: the shared wire finds the master too
                raise reply
            return reply, waited
        except TRANSLATED as exc:
            raise translate(exc, script) from exc

    async def _where(self) -> Endpoint:
        """Where a new connection goes: the Sentinel master now, else the endpoint."""
        return self.endpoint if self._resolve is None else await self._resolve()

    async def _observed(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        """``run``, reported to the ``on_call`` hook once it is over."""
        assert self._on_call is not None
        return await observed(self._on_call, script, self._call(script, keys, args), self._server)

    def _server(self) -> str:
        on = self._on
        return (on.link if on is not None else self).endpoint.address

    def _adopt(self) -> OnLoop:
        """Serve the running loop from now on (see the module's event-loop contract),
        unless the loop served so far still runs (``loops.check_free``)."""
        with self._adopting:  # two threads' loops may come at once
            old = self._on
            if old is not None and old.loop is _running_loop():
                return old
            check_free(None if old is None else old.loop)
            if old is not None and old.keeper is not None:
                old.keeper.close_soon()  # its loop has stopped (closed already, mostly)
            link = Link(
                self.endpoint,
                timeout=self._timeout,
                connect_timeout=self._connect_timeout,
                resolve=self._resolve,
            )
            on = self._on = OnLoop(link, self._size, self._batch)
            on.keeper = Keeper(lambda: self._retire(on))
            return on

    async def _retire(self, on: OnLoop) -> None:
        if self._on is on:
            self._on = None  # the next call on this loop (if any) starts afresh
        on.link.close()
        if on.confirms is not None:
            on.confirms.clear()
        await asyncio.sleep(0)  # the transport closes its socket on the next loop turn

    async def aclose(self) -> None:
        await super().aclose()
        on, self._on = self._on, None
        if on is not None and on.keeper is not None:
            if on.loop is _running_loop():
                # The calls in flight finish first (a NOSCRIPT one sends its EVAL too).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._timeout):
                        await on.gate.idle()
            await on.keeper.aclose()  # it closes the connection (on its own loop)
        await self._client.aclose()


class ClientStore(_OnClient):
    """Runs scripts through a client the application passed in (never closed by us).

    Its first call checks the server once (``check_server``: a bare HELLO, which changes
    nothing on the client's connection, and TIME); a refused server is asked again by the
    next call."""

    __slots__ = ("_checked", "_errors", "_family")

    def __init__(self, client: Any, *, family: str = "redis") -> None:
        super().__init__(client)
        self._checked = False
        self._family = family  # the client's library: "redis" (redis-py) or "valkey"
        self._errors = REDIS_PY if family == "redis" else valkey_errors()

    def _subscriber(self) -> DedicatedPubSub:
        return DedicatedPubSub(self._client, family=self._family, errors=self._errors)

    async def _check(self, client: Any) -> None:
        try:
            hello = await client.execute_command("HELLO")
        except self._errors.replies as exc:
            message = str(exc).lower()
            if "unknown command" not in message and "wrong number" not in message:
                raise
            hello = None  # older than 6.2 (6.0 needs HELLO's protocol version)
        check_server(_named(client), hello, await client.execute_command("TIME"))
        self._checked = True

    confirm_refusal: str | None = None

    async def run_confirmed(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], replicas: Replicas
    ) -> tuple[Reply, Any]:
        """The script and WAIT as one pipeline (one write, on one connection of the
        client's pool, which WAIT blocks meanwhile)."""
        client = self._client
        errors = self._errors
        try:
            if not self._checked:
                await self._check(client)
            for sha in (True, False):
                pipe = client.pipeline(transaction=False)
                if sha:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                else:
                    pipe.eval(script.source, len(keys), *keys, *args)
                pipe.execute_command(*replicas.args())
                reply, waited = await pipe.execute(raise_on_error=False)
                if not isinstance(reply, errors.noscript):
                    break
            if isinstance(reply, BaseException):
                raise reply
            return reply, waited
        except errors.translated as exc:
            raise translate(exc, script, errors) from exc

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        client = self._client
        errors = self._errors
        try:
            if not self._checked:
                await self._check(client)
            try:
                return await client.evalsha(script.sha, len(keys), *keys, *args)
            except errors.noscript:
                # After SCRIPT FLUSH, a restart or a failover: EVAL runs it and caches it
                # again on the server, inside the same call.
                return await client.eval(script.source, len(keys), *keys, *args)
        except errors.translated as exc:
            raise translate(exc, script, errors) from exc
        except UnicodeDecodeError as exc:
            raise BackendError(
                f"a reply of script {script.name} is not UTF-8 and the client passed to"
                " Backend() decodes replies (decode_responses=True): pass a client without"
                " it (aioratelimit decodes what it reads itself)"
            ) from exc
        except RuntimeError as exc:
            if "different loop" not in str(exc) and "loop is closed" not in str(exc).lower():
                raise
            raise BackendError(
                "the client passed to Backend() belongs to another event loop (its"
                f" connections were opened there: {exc}); make the client, and its Backend,"
                " on the loop that uses them (e.g. inside the function asyncio.run runs)"
            ) from exc


def _named(client: Any) -> str:
    """What a passed-in client's server is called in an error: its host and port."""
    try:
        kwargs = client.connection_pool.connection_kwargs
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    except AttributeError:
        return "the server"


def standalone_store(
    url: str,
    *,
    max_connections: int,
    timeout: float,
    connect_timeout: float,
    max_in_flight: int,
    on_call: OnCall | None = None,
    batch: bool = True,
    **options: Any,
) -> RedisStore:
    """The store for a ``redis://``, ``rediss://`` or ``unix://`` URL (it owns its client).

    Scripts go over one connection of the store's own (``max_connections`` only bounds
    it); the wake-up subscriber uses a redis-py client with the same settings.
    """
    import redis.asyncio as aredis

    where = endpoint(url, options)  # checks the options before anything connects
    pool = aredis.ConnectionPool.from_url(
        url,
        max_connections=max_connections,
        socket_timeout=None,
        socket_connect_timeout=connect_timeout,
        **options,
    )
    client = aredis.Redis.from_pool(pool)  # owns the pool: aclose disconnects it
    return RedisStore(
        client,
        where,
        max_in_flight=max_in_flight,
        timeout=timeout,
        connect_timeout=connect_timeout,
        on_call=on_call,
        batch=batch,
    )
