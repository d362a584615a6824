"""The backend: one store shared by every primitive, its key prefix, and the default.

A primitive never talks to redis-py. It hands a ``Script`` with its keys and arguments to
``Backend._run``; the backend's store answers (``_stores``): a Redis store by EVALSHA, the
memory store by the script's Python twin. ``Backend.from_url`` picks the store by the URL's
scheme; ``Backend(client)`` wraps a client the application already has. Each backend also
holds the deployment's secret (``Keyring``), which keys the digests its primitives store.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any

from . import _keys
from ._args import check_int, check_seconds, check_text
from ._errors import BackendUnavailable
from ._keys import UNKEYED, Keyring, resolve_secret
from ._scripts import Arg, OnCall, Reply, Script
from ._stores.base import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_TIMEOUT,
    Store,
)
from ._stores.confirm import Replicas, refuse
from ._stores.notify import Notifier
from ._stores.urls import CLUSTER_SCHEMES, SENTINEL_SCHEMES, check_scheme, parse_error, redact
from ._stores.wrap import wrap

log = logging.getLogger("aioratelimit")

RunScript = Callable[[Script, Sequence[str], Sequence[Arg]], Awaitable[Reply]]

#: How many times ``_run_repeatable`` sends a script in all, at most.
RESEND_TRIES = 4
#: Its first pause between two tries (seconds), doubled after each.
RESEND_PAUSE = 0.02


_NO_REPLICAS = "memory:// has no replicas: replicas= and aof= need a Redis backend"


class Backend:
    """One store (Redis or memory) and the key prefix shared by every primitive using it.

    ``Backend(client)`` wraps a ``redis.asyncio.Redis``, ``RedisCluster`` or Sentinel master
    client the application already has (it is not closed by ``aclose``);
    ``Backend.from_url(url)`` builds and owns a bounded pool.

    ``secret`` is the deployment's secret (at least 16 bytes, the same in every process
    using the deployment), or a list of them, newest first, while one is rotated: it keys
    the digests the backend's primitives store instead of a value (a token's subject, a
    credential header). Without it, ``AIORATELIMIT_SECRET`` from the environment
    (comma-separated, newest first), else none: the digests are then plain SHA-256.

    A backend built by ``from_url`` serves one running event loop at a time: the
    connections it opened on a loop are closed when that loop shuts down (``asyncio.run``,
    ``asyncio.Runner``, ``uvloop.run``, pytest-asyncio), and a later loop gets fresh ones.
    A call from another thread's loop while the one it serves still runs raises
    ``BackendError`` (memory:// serves every thread; docs/deployment.md shows how a sync
    framework calls the library).
    """

    # What the primitives use (``_run``, ``_run_repeatable``, ``_notifier``, ``_head``...) is
    # private: their types are the package's own, and the public surface is the constructor,
    # ``from_url``, ``prefix``, ``url``, ``timeout``, ``aclose`` and ``async with``.
    __slots__ = (
        "__weakref__",
        "_heads",
        "_keyring",
        "_run",
        "_store",
        "_tasks",
        "prefix",
        "timeout",
        "url",
    )

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "arl",
        secret: str | bytes | Sequence[str | bytes] | None = None,
    ) -> None:
        if client is None:
            raise TypeError("Backend(client) needs a redis.asyncio client; use from_url()")
        keyring = resolve_secret(secret)
        self._setup(wrap(client), prefix, "client://", DEFAULT_TIMEOUT, keyring)

    def _setup(self, store: Store, prefix: str, url: str, timeout: float, keyring: Keyring) -> None:
        self._store = store
        #: ``await backend._run(script, keys, args)``: one script, atomically, in one round
        #: trip (the store's own bound method, so a decision pays no extra call layer)
        self._run: RunScript = store.run
        self.prefix = _check_prefix(prefix)
        self.url = url
        #: what bounds one call (seconds): the ``timeout`` of ``from_url``; for a client
        #: passed in, the default (its own socket timeouts bound its calls)
        self.timeout = timeout
        #: (kind, name) -> the start of that primitive's keys here: the one cache of key
        #: heads, filled by ``_head`` (a hot path may read it first: a dict hit is cheaper
        #: than the call)
        self._heads: dict[tuple[str, str | None], str] = {}
        #: the deployment's secret(s): ``_keyring.digest(purpose, data)`` is the digest to
        #: store for a value that must not be stored as it is (keyed by the newest secret;
        #: a plain SHA-256 without one), ``_keyring.digests(...)`` the digests it may have
        #: been stored under before a rotation, newest first
        self._keyring = keyring
        #: calls running in the background (a reservation's settlement): ``drain`` and
        #: ``aclose`` wait for them
        self._tasks: set[asyncio.Task[Any]] = set()

    def _spawn(self, call: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``call`` in the background on the running loop, tracked until it ends (it
        must report its own failures: nobody awaits it but ``drain``)."""
        task = asyncio.get_running_loop().create_task(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        """Wait until every call this backend runs in the background has ended (each
        ``Reservation.settle`` so far, and those they started meanwhile); ``aclose`` does
        first. A failed one was logged and reported already: nothing is raised here."""
        # Waits on the tasks not done yet: a task done whose discard has not run yet (its
        # callbacks come a loop step later) must not make this loop spin without yielding.
        while pending := [task for task in self._tasks if not task.done()]:
            await asyncio.wait(pending)

    @classmethod
    def _of(
        cls,
        store: Store,
        *,
        prefix: str,
        url: str,
        timeout: float = DEFAULT_TIMEOUT,
        keyring: Keyring = UNKEYED,
    ) -> Backend:
        self = object.__new__(cls)
        self._setup(store, prefix, url, timeout, keyring)
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
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        on_call: OnCall | None = None,
        secret: str | bytes | Sequence[str | bytes] | None = None,
        batch: bool = True,
        **redis_options: Any,
    ) -> Backend:
        """A backend for ``url``, owning its connections.

        Every call goes over ONE multiplexed connection per server (the calls issued in one
        event-loop iteration are written together), plus one for wake-ups.
        ``max_in_flight`` bounds the calls in flight through the backend: past it, a call
        waits for one to finish. ``timeout`` (seconds) bounds that wait and each reply;
        ``connect_timeout`` each connection attempt. Past either, the call raises
        ``BackendUnavailable``. ``max_connections`` bounds the connections redis-py opens
        for the backend (wake-ups, cluster topology and routing). ``on_call`` is called
        with a ``ScriptCall`` after every script call (instrumentation: it names the
        script and the server, never a key; a decision that went in a batch is reported
        on its own, from its call to its reply). ``secret``: the deployment's secret (see
        the class). ``batch``: the decisions issued together (in one event-loop iteration,
        for one server) go as one script call, each decided exactly as if alone (see
        docs/performance.md); False sends one call per decision. Other keyword arguments
        are connection settings as redis-py takes them (``ssl_ca_certs``, ``client_name``,
        ...), and on a Sentinel URL the sentinels' own TLS settings (``sentinel_ssl``,
        ``sentinel_ssl_ca_certs``, ...: docs/deployment.md).
        """
        check_scheme(url)
        keyring = resolve_secret(secret)
        check_int(max_connections, "max_connections")
        check_int(max_in_flight, "max_in_flight")
        if type(batch) is not bool:
            raise TypeError(f"batch must be True or False, not {batch!r}")
        if on_call is not None and not callable(on_call):
            raise TypeError(f"on_call must be a callable, not {type(on_call).__name__}")
        timeout = check_seconds(timeout, "timeout")
        connect_timeout = check_seconds(connect_timeout, "connect_timeout")
        if url.startswith("memory://"):
            from ._stores.memory.store import memory_options

            cap = memory_options(url).get("max_keys")  # memory://?max_keys=...
            return memory_backend(
                prefix=prefix, timeout=timeout, on_call=on_call, max_keys=cap, secret=secret
            )
        build: Callable[..., Store]
        if url.startswith(CLUSTER_SCHEMES):
            from ._stores.cluster import cluster_store as build
        elif url.startswith(SENTINEL_SCHEMES):
            from ._stores.sentinel import sentinel_store as build
        else:
            from ._stores.standalone import standalone_store as build
        try:
            store = build(
                url,
                max_connections=max_connections,
                timeout=timeout,
                connect_timeout=connect_timeout,
                max_in_flight=max_in_flight,
                on_call=on_call,
                batch=batch,
                **redis_options,
            )
        except ValueError as exc:  # not chained: the parser's own words may quote a password
            raise ValueError(parse_error(url, exc)) from None
        return cls._of(store, prefix=prefix, url=url, timeout=timeout, keyring=keyring)

    async def _run_repeatable(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg]
    ) -> Reply:
        """``_run`` a script that is safe to send twice (``script.repeatable``: a release),
        sent again when its reply was lost (``BackendUnavailable``: a reset, a reply that
        never came), up to ``RESEND_TRIES`` times in all and for at most ``timeout``
        seconds after the first failure; then the last failure is raised (and logged).
        A release lost on a reset would otherwise hold the lock for its whole TTL.

        So it returns within twice ``timeout`` (the first try's bound, then the resends'),
        whatever the network does. A resend of a release that did arrive answers
        "released before": the caller sees the outcome of the first.
        """
        if not script.repeatable:
            raise ValueError(f"{script.name} is not safe to send twice")
        try:
            return await self._run(script, keys, args)
        except BackendUnavailable as exc:
            failure: BackendUnavailable = exc
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        pause = RESEND_PAUSE
        for tries in range(2, RESEND_TRIES + 1):
            if deadline - loop.time() <= pause:
                break
            await asyncio.sleep(pause)
            pause *= 2
            try:
                async with asyncio.timeout_at(deadline):
                    reply = await self._run(script, keys, args)
            except BackendUnavailable as exc:
                failure = exc
            except TimeoutError as exc:
                failure = BackendUnavailable(f"Redis did not answer {script.name} in time")
                failure.__cause__ = exc
                break
            else:
                log.debug("aioratelimit: %s answered at try %d", script.name, tries)
                return reply
        log.warning("aioratelimit: gave up sending %s again: %s", script.name, failure)
        raise failure

    def _check_replicas(self, replicas: Replicas | None) -> None:
        """``ValueError`` before any I/O if this backend cannot confirm writes as asked."""
        if replicas is not None:  # (memory:// has no replicas, and no ``confirm_refusal``)
            refuse(replicas, getattr(self._store, "confirm_refusal", _NO_REPLICAS), self.timeout)

    async def _run_write(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        replicas: Replicas | None,
        wrote: Callable[[Reply], bool],
        what: str,
    ) -> Reply:
        """``_run``; with ``replicas``, the script and its WAIT in one write on a connection
        of their own (``_stores.confirm``), and ``NotReplicated`` when the script wrote
        (``wrote(reply)``) and was not confirmed: the caller gives back what it took."""
        if replicas is None:
            return await self._run(script, keys, args)
        self._check_replicas(replicas)
        confirmed = self._store.run_confirmed  # type: ignore[attr-defined]  # (checked above)
        reply, waited = await confirmed(script, keys, args, replicas)
        if wrote(reply):
            failure = replicas.check(waited, what)
            if failure is not None:
                raise failure
        return reply

    @property
    def _notifier(self) -> Notifier:
        """The backend's shared pub/sub subscriber (see ``_stores.notify``)."""
        return self._store.notifier

    @property
    def _publish_command(self) -> str:
        """What a script that wakes waiters publishes with, passed to it as an argument:
        ``"SPUBLISH"`` on Redis Cluster (shard-local, heard by ``_notifier``), else
        ``"PUBLISH"``. The channel must carry the hash tag of the script's keys."""
        return self._store.publish_command

    def _head(self, kind: str, name: str | None = None) -> str:
        """The constant start of a primitive's keys on this backend (``_keys.head``),
        built once per (kind, name): the one cache of key heads."""
        heads = self._heads
        head = heads.get((kind, name))
        if head is None:
            head = heads[kind, name] = _keys.head(self.prefix, kind, name)
        return head

    async def aclose(self) -> None:
        """Wait for the calls running in the background (``drain``: each is bounded by
        twice ``timeout``), then close the pool this backend owns (a wrapped client is
        left open). A backend a test installed (``aioratelimit.testing``) is left open
        while it is installed: the app's own shutdown closing "its" backend must not close
        the test's."""
        if self is _default and _test_installed:
            log.debug("aioratelimit: aclose() of the installed test backend: left open")
            return
        await self.drain()  # a settlement started before the close still reaches the store
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
        return f"<Backend {redact(self.url)} prefix={self.prefix!r}>"


def memory_backend(
    *,
    prefix: str = "arl",
    clock: Callable[[], int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    on_call: OnCall | None = None,
    secret: str | bytes | Sequence[str | bytes] | None = None,
    max_keys: int | None = None,
) -> Backend:
    """A backend on a new, empty in-process store (``memory://``): the one place that builds
    one. ``clock`` (microseconds since the epoch, as Redis ``TIME`` answers) replaces the
    wall clock: ``aioratelimit.testing.ManualClock`` moves only when a test says so;
    ``on_call`` is reported every script call, as ``from_url``'s; ``secret`` is the
    deployment's secret, as ``from_url``'s. ``max_keys`` caps the keys the store holds
    (``memory://?max_keys=``): past it, a call that would create a key raises
    ``BackendError`` and changes nothing (no key is evicted to make room)."""
    from ._stores.memory.store import MemoryStore, ObservedMemoryStore

    keyring = resolve_secret(secret)
    if on_call is None:
        store = MemoryStore(clock, max_keys=max_keys)
    else:
        store = ObservedMemoryStore(on_call, clock, max_keys=max_keys)
    return Backend._of(store, prefix=prefix, url="memory://", timeout=timeout, keyring=keyring)


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if not prefix:
        raise ValueError("prefix must not be empty")
    if not prefix.isascii():
        check_text(prefix, "prefix")
    return prefix


_default: Backend | None = None
#: Whether ``_default`` was installed by a test (``install_test_default``): while it is,
#: ``configure()`` returns it rather than replacing it, and its ``aclose()`` does nothing.
_test_installed = False


def configure(
    url: str | None = None,
    *,
    client: Any = None,
    prefix: str = "arl",
    secret: str | bytes | Sequence[str | bytes] | None = None,
    **pool_options: Any,
) -> Backend:
    """Build a backend and install it as the default every primitive uses.

    With neither ``url`` nor ``client``: ``REDIS_URL`` from the environment, else
    ``memory://``. ``secret``: the deployment's secret (see ``Backend``; without it,
    ``AIORATELIMIT_SECRET``). The previous default is not closed (it may still be in use).

    While a test has installed a backend of its own (``aioratelimit.testing``: its
    fixtures, ``default_backend()``), that backend wins: ``configure()`` checks its
    arguments, builds nothing and returns it, so an app that configures itself at start-up
    (a FastAPI lifespan) runs on the test's store and clock, and never reaches the server
    that ``url`` or ``REDIS_URL`` names.
    """
    global _default
    if url is not None and client is not None:
        raise ValueError("configure() takes a url or a client, not both")
    if _test_installed and _default is not None:
        if url is not None:
            check_scheme(url)
        resolve_secret(secret)  # a bad secret is refused here too
        log.debug("aioratelimit: configure() during a test: the test's backend stays")
        return _default
    if client is not None:
        if pool_options:
            raise TypeError("pool options apply to a url, not to a client you pass in")
        backend = Backend(client, prefix=prefix, secret=secret)
    else:
        backend = Backend.from_url(url or _env_url(), prefix=prefix, secret=secret, **pool_options)
    _default = backend
    return backend


def get_backend() -> Backend:
    """The configured default backend (built from ``REDIS_URL`` or ``memory://`` on first use)."""
    global _default
    if _default is None:
        _default = Backend.from_url(_env_url())
    return _default


def swap_default(backend: Backend | None) -> Backend | None:
    """Install ``backend`` as the default and return the one it replaces; ``None`` leaves
    none, so the next use builds it again from ``REDIS_URL`` (else memory://). Either way
    no test backend is installed any more (``configure`` replaces the default again). For
    ``aioratelimit.testing``; an application calls ``configure``."""
    global _default, _test_installed
    previous, _default, _test_installed = _default, backend, False
    return previous


DefaultState = tuple["Backend | None", bool]


def install_test_default(backend: Backend) -> DefaultState:
    """Install ``backend`` as the default a test runs on, which ``configure()`` returns
    rather than replaces and ``aclose()`` leaves open until ``restore_default`` is given the
    state this returns (the default and whether it was a test's, before)."""
    global _default, _test_installed
    previous = _default, _test_installed
    _default, _test_installed = backend, True
    return previous


def restore_default(state: DefaultState) -> None:
    """Put back the default (and whether a test installed it) that ``install_test_default``
    replaced."""
    global _default, _test_installed
    _default, _test_installed = state


def _env_url() -> str:
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    log.warning(
        "aioratelimit: no backend configured and REDIS_URL is not set; using memory://"
        " (limits, locks and tokens are per process)"
    )
    return "memory://"
