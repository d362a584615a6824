"""Locks and semaphores: owner-checked, fenced, woken on release, renewed, cancellation-safe.

A ``Lock`` or ``Semaphore`` is only a description (name, ttl, backend). Each ``acquire``
draws a fresh random token and returns a ``Lease``: the token lives there and nowhere else,
so two acquisitions never share one, whatever task or thread they run in. Every step is one
script (``lua/lock_*.lua``, ``lua/semaphore_*.lua``) that is safe to send twice: acquiring
again with the token that holds returns the same fence, and releasing leaves a tombstone so a
repeated release is recognised (and a late copy of a cancelled acquire takes nothing).

Waiting (``line``): the acquires of one name waiting in one process stand in one line, and
only its head asks the server. Subscribed to the name's wake-up channel (the backend's
``Notifier``: one shared subscriber per backend), the head tries, then sleeps until a release
wakes it or the holder's TTL (at most ``FALLBACK_WAIT``) has passed, which covers a lost
message and a holder that expires. The head of an empty line tries once before it
subscribes; a semaphore acquire that finds nobody waiting tries at once, beside any other.
The waiters behind the head send nothing; joining and leaving the line cost O(1). A waiter
holds no connection while it waits.

Cancellation: a cancelled or failed acquire may have reached the server with only its reply
lost, so it is followed by a release with the same token (unless it provably never left: its
connection was refused); a cancelled release is sent again.
Both run in a shielded task that the caller waits for, then the cancellation goes on. A
release whose reply was lost is sent again too (``Backend._run_repeatable``).

Bounds: an acquire with ``timeout=t`` returns or raises within ``t`` plus the backend's
``timeout`` (one call in flight when ``t`` passes), whatever the network does; past that it
raises ``BackendUnavailable``, and a cleanup release still under way runs on by itself.

What an acquisition gives back, a ``Lease``, and the ``async with`` block that renews it
live in ``lease``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence

from .. import _keys, _observe, _scripts
from .._aio import cancel_requested, cancels, finish_within
from .._args import check_int, check_key, check_seconds, check_timeout, to_ms
from .._backend import Backend, get_backend
from .._errors import AioRateLimitError, BackendUnavailable, LockTimeout
from .._scripts import Arg, Reply, Script
from .._stores import confirm
from .._stores.confirm import DEFAULT_REPLICAS_TIMEOUT, replicas_option
from . import line as _line
from .lease import Lease, Names

log = logging.getLogger("aioratelimit")

#: The longest a waiter sleeps without a wake-up before it tries again (seconds). It covers a
#: lost pub/sub message; a holder that expires wakes nobody, so its waiters sleep its PTTL.
FALLBACK_WAIT = 1.0
#: The shortest sleep between two attempts (seconds).
MIN_WAIT = 0.001


def _wait_time(wait_ms: int) -> float:
    """A waiter's fallback sleep from a script's hint (the holder's PTTL; -1: no TTL)."""
    if wait_ms < 0:
        return FALLBACK_WAIT
    return min(max((wait_ms + 1) / 1000, MIN_WAIT), FALLBACK_WAIT)


def _never_sent(exc: BaseException) -> bool:
    """Whether a failed call provably never reached the server: the backend's own
    transport could not connect (refused, or no such host). It raises those socket errors
    as they come and never sends a call twice; redis-py wraps them in errors of its own,
    and a client passed in may have sent the call before a retry failed that way: those
    prove nothing. Nor does a timeout: a reply that never came times out the same way."""
    return isinstance(exc, BackendUnavailable) and isinstance(
        exc.__cause__, (ConnectionRefusedError, socket.gaierror)
    )


def _took(reply: Reply) -> bool:
    """Whether an acquire script took the lock or a slot (``{1, fence}``)."""
    return bool(reply[0] == 1)


class _Resource:
    """What ``Lock`` and ``Semaphore`` share; a subclass names its scripts and keys."""

    __slots__ = ("_backend", "_cache", "_replicas", "name", "ttl")

    _kind: str
    #: only one holder at a time (a lock): after one waiter of the line took it, the next
    #: sleeps until a release before it tries
    _exclusive: bool
    _acquire_script: Script
    _release_script: Script
    _extend_script: Script
    #: a refused try leaves a mark that must go when it gives up (a writer's intent): a
    #: timed-out or cancelled wait is followed by a release of its token, as a failed try is
    _withdraw = False

    def __init__(
        self,
        name: str,
        ttl: float,
        backend: Backend | None,
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
        aof: bool = False,
    ) -> None:
        self.name = check_key(name, "name")
        self.ttl = check_seconds(ttl, "ttl")
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        self._backend = backend
        # What every acquire and extend waits for (``_stores.confirm``; None: nothing).
        self._replicas = replicas_option(replicas, replicas_timeout, aof)
        if backend is not None:
            backend._check_replicas(self._replicas)
        # (backend, its names), built once per backend
        self._cache: tuple[Backend, Names] | None = None

    @property
    def backend(self) -> Backend:
        return self._backend or get_backend()

    def _build_keys(self, backend: Backend) -> tuple[list[str], list[str], str]:
        raise NotImplementedError

    def _names(self, backend: Backend) -> Names:
        """The resource's keys, channel and scripts on ``backend``."""
        cache = self._cache
        if cache is None or cache[0] is not backend:
            keys, owner_keys, channel = self._build_keys(backend)
            names = Names(
                self._kind,
                self.name,
                keys,
                owner_keys,
                channel,
                backend._publish_command,
                self._release_script,
                self._extend_script,
                self._replicas,
                f"{self._kind} {self.name!r} was given back",
            )
            cache = self._cache = (backend, names)
        return cache[1]

    def _acquire_args(self, token: str, ttl_ms: int, waits: bool) -> tuple[Arg, ...]:
        """The acquire script's arguments; ``waits``: not a single try (timeout=0)."""
        return (token, ttl_ms)

    def _line_limit(self) -> int:
        """What sets the line's waiters apart besides the name: a semaphore's ``limit``."""
        return 0

    async def acquire(self, timeout: float | None = None) -> Lease:
        """Wait for the lock (or a slot) and return the ``Lease`` that holds it.

        ``timeout``: seconds to wait (``None`` waits forever, ``0`` tries once); then
        ``LockTimeout``. The lease does not renew itself: ``extend`` it, or use
        ``async with arl.lock(...)`` / ``arl.semaphore(...)`` for automatic renewal.
        """
        if _observe.recorder is not None:
            return await _observe.acquire(self._kind, self._acquire(timeout))
        return await self._acquire(timeout)

    async def _acquire(self, timeout: float | None) -> Lease:
        if timeout is not None:
            timeout = check_timeout(timeout)
        backend = self._backend or get_backend()
        backend._check_replicas(self._replicas)  # (the default backend: checked here)
        names = self._names(backend)
        token = _keys.new_token()
        ttl = self.ttl
        args = self._acquire_args(token, to_ms(ttl), timeout != 0)
        base = cancels()
        loop = asyncio.get_running_loop()
        # The bound of the whole call (see the module): None waits as long as it takes. It
        # is armed while the acquire talks to the server, not while it waits in line.
        limit = None if timeout is None else loop.time() + timeout + backend.timeout
        bound = asyncio.timeout_at(limit if timeout == 0 else None)
        try:
            async with bound:
                if timeout == 0:
                    sent = loop.time()
                    reply = await self._attempt(backend, names, args, base, limit)
                    if reply[0] != 1:
                        raise LockTimeout(name=self.name, timeout=timeout)
                else:
                    sent, reply = await self._wait(
                        backend, names, args, timeout, base, limit, bound
                    )
        except TimeoutError as exc:
            if not bound.expired():
                raise
            raise BackendUnavailable(
                f"Redis did not answer in time: acquiring {self.name!r} took over"
                f" timeout + the backend's timeout ({timeout} + {backend.timeout} s)"
            ) from exc
        except (LockTimeout, asyncio.CancelledError):
            if self._withdraw and timeout != 0:
                # Gave up waiting: take back the mark its refused tries left (shielded,
                # within the backend's timeout; the mark's own TTL covers the rest).
                await finish_within(self._cleanup(backend, names, token), backend.timeout)
            raise
        return Lease._create(backend, names, token, int(reply[1]), ttl, sent)

    async def _attempt(
        self,
        backend: Backend,
        names: Names,
        args: Sequence[Arg],
        base: int,
        limit: float | None,
    ) -> Reply:
        """One acquire script; if it fails or is cancelled in flight, release its token
        (waiting for that at most until ``limit``, the acquire's bound)."""
        try:
            # With ``replicas``, an acquire that took it and was not confirmed raises
            # NotReplicated, and is given back (released) below like a lost reply.
            script, keys, what = self._acquire_script, names.acquire_keys, names.acquired
            reply = await backend._run_write(script, keys, args, names.replicas, _took, what)
            cancel_requested(base)
            return reply
        except BaseException as exc:
            if _never_sent(exc):
                raise  # nothing to take back (an outage: no release, resends nor wait)
            # The script may have run with only its reply lost: release the same token
            # (harmless if it never arrived: the tombstone also bars a late copy of it).
            # Waited for at most the backend's timeout (or what is left of the acquire's
            # bound); resends past that run on by themselves.
            left = backend.timeout if limit is None else limit - asyncio.get_running_loop().time()
            await finish_within(self._cleanup(backend, names, str(args[0])), left)
            raise

    async def _cleanup(self, backend: Backend, names: Names, token: str) -> None:
        args = names.release_args(token, self.ttl)
        try:
            await backend._run_repeatable(names.release, names.owner_keys, args)
        except AioRateLimitError as exc:  # the TTL frees it in the end
            log.debug("aioratelimit: release after a failed acquire of %r: %r", self.name, exc)

    async def _wait(
        self,
        backend: Backend,
        names: Names,
        args: Sequence[Arg],
        timeout: float | None,
        base: int,
        limit: float | None,
        bound: asyncio.Timeout,
    ) -> tuple[float, Reply]:
        """Wait in the name's line in this process (``line``) and try as its head until
        acquired. A semaphore nobody here waits for is tried at once first, beside any
        other try (its slots may be free); a lock is tried at once by the head of an
        empty line. ``bound`` (ending at ``limit``) is armed while it talks to the server:
        behind others it sends nothing, and its timer alone ends its wait there."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        queue = _line.line(backend._notifier, names.channel, self._line_limit())
        quick = False
        if self._exclusive:
            quick = not queue.waiters
        elif not queue.waiters:
            queue.trying += 1  # (keeps the line while it tries: it may join it next)
            bound.reschedule(limit)
            try:
                sent = loop.time()
                reply = await self._attempt(backend, names, args, base, limit)
            except BaseException:
                queue.trying -= 1
                queue.close_if_idle()
                raise
            queue.trying -= 1
            if reply[0] == 1:
                queue.close_if_idle()
                return sent, reply
        me = queue.join()
        try:
            if not me.done():
                # Behind others: wait to be the head, within the timeout (sending nothing).
                bound.reschedule(None)
                if not await queue.turn(me, deadline):
                    raise LockTimeout(name=self.name, timeout=timeout)
            bound.reschedule(limit)
            return await self._head(backend, names, args, queue, quick, timeout, base, limit)
        finally:
            queue.leave(me)

    async def _head(
        self,
        backend: Backend,
        names: Names,
        args: Sequence[Arg],
        queue: _line.Line,
        quick: bool,
        timeout: float | None,
        base: int,
        limit: float | None,
    ) -> tuple[float, Reply]:
        """The head of the line: subscribed, try at every wake-up (or fallback timer)
        until acquired, or until ``timeout`` (from the acquire's start) has passed.
        ``quick``: it came to an empty line, and tries once before it subscribes."""
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else limit - backend.timeout
        sub = queue.sub
        # Where the head before left off: its next try was due then (None: at once).
        resume = queue.resume_at
        while True:
            if resume is not None:
                now = loop.time()
                if deadline is not None and deadline < resume:
                    # The timeout ends first: only a wake-up makes a try worth it.
                    if not await sub.wait(deadline - now):
                        raise LockTimeout(name=self.name, timeout=timeout)
                else:
                    await sub.wait(resume - now)  # (a wake-up pending is used up too)
            cancel_requested(base)  # (one lost while subscribing or sleeping)
            if not queue.subscribed and not quick:
                # Confirmed before the try: a release from now on wakes the line's head.
                await sub.__aenter__()
                queue.subscribed = True
            sent = loop.time()
            reply = await self._attempt(backend, names, args, base, limit)
            if reply[0] == 1:  # {1, fence}: held
                # The next head tries at once for a semaphore (more slots may be free),
                # for a lock only once woken by its release (or at the holder's TTL).
                held = self._exclusive and queue.subscribed
                queue.resume_at = loop.time() + _wait_time(int(args[1])) if held else None
                return sent, reply
            if quick:
                quick = False  # refused: subscribe, and try again at once
                continue
            resume = queue.resume_at = loop.time() + _wait_time(int(reply[1]))


class Lock(_Resource):
    """A named distributed lock: at most one holder at a time.

    A description only: it holds no token. ``await lock.acquire()`` returns a ``Lease``;
    ``async with arl.lock(name)`` acquires, renews and releases one.
    """

    __slots__ = ()
    _kind = "lock"
    _exclusive = True
    _acquire_script = _scripts.LOCK_ACQUIRE
    _release_script = _scripts.LOCK_RELEASE
    _extend_script = _scripts.LOCK_EXTEND

    def __init__(
        self,
        name: str,
        ttl: float = 30.0,
        backend: Backend | None = None,
        *,
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
        aof: bool = False,
    ) -> None:
        super().__init__(name, ttl, backend, replicas, replicas_timeout, aof)

    def _build_keys(self, backend: Backend) -> tuple[list[str], list[str], str]:
        key, channel = _keys.lock(backend._head(_keys.LOCK_KIND), self.name)
        return [key], [key], channel

    async def locked(self) -> bool:
        """Whether anyone holds the lock now."""
        backend = self._backend or get_backend()
        keys = self._names(backend).owner_keys
        return bool(await backend._run(_scripts.LOCK_LOCKED, keys, ()) == 1)

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} ttl={self.ttl}{confirm.shown(self._replicas)}>"


class Semaphore(_Resource):
    """A named distributed semaphore: at most ``limit`` holders at a time.

    It mirrors ``Lock`` (leases, fences, wake-ups, renewal and cancellation work the same)
    and doubles as a concurrency limiter: ``async with arl.semaphore("api", limit=10)``.
    """

    __slots__ = ("limit",)
    _kind = "semaphore"
    _exclusive = False
    _acquire_script = _scripts.SEMAPHORE_ACQUIRE
    _release_script = _scripts.SEMAPHORE_RELEASE
    _extend_script = _scripts.SEMAPHORE_EXTEND

    def __init__(
        self,
        name: str,
        limit: int = 5,
        ttl: float = 30.0,
        backend: Backend | None = None,
        *,
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
        aof: bool = False,
    ) -> None:
        super().__init__(name, ttl, backend, replicas, replicas_timeout, aof)
        self.limit = check_int(limit, "limit")

    def _build_keys(self, backend: Backend) -> tuple[list[str], list[str], str]:
        holders, fences, channel = _keys.semaphore(backend._head(_keys.SEMAPHORE_KIND), self.name)
        return [holders, fences], [holders, fences], channel

    def _acquire_args(self, token: str, ttl_ms: int, waits: bool) -> tuple[Arg, ...]:
        return (token, ttl_ms, self.limit)

    def _line_limit(self) -> int:
        return self.limit

    async def holders(self) -> int:
        """How many leases hold a slot now."""
        backend = self._backend or get_backend()
        keys = self._names(backend).acquire_keys[:1]
        return int(await backend._run(_scripts.SEMAPHORE_HOLDERS, keys, ()))

    async def locked(self) -> bool:
        """Whether all ``limit`` slots are held now (an acquire would wait)."""
        return await self.holders() >= self.limit

    def __repr__(self) -> str:
        shown = confirm.shown(self._replicas)
        return f"<Semaphore {self.name!r} limit={self.limit} ttl={self.ttl}{shown}>"
