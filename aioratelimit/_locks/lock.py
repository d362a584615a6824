"""Locks and semaphores: owner-checked, fenced, woken on release, renewed, cancellation-safe.

A ``Lock`` or ``Semaphore`` is only a description (name, ttl, backend). Each ``acquire``
draws a fresh random token and returns a ``Lease``: the token lives there and nowhere else,
so two acquisitions never share one, whatever task or thread they run in. Every step is one
script (``lua/lock_*.lua``, ``lua/semaphore_*.lua``) that is safe to send twice: acquiring
again with the token that holds returns the same fence, and releasing leaves a tombstone so a
repeated release is recognised (and a late copy of a cancelled acquire takes nothing).

Waiting: try once; if held, subscribe to the name's wake-up channel (the backend's
``Notifier``: one shared subscriber per backend, wake-one per process), try again, then
sleep until woken or until the holder's TTL (at most ``FALLBACK_WAIT``) has passed. An
acquire that finds another acquire of the same name in flight in this process
(``Notifier.arrive``) subscribes before its first try instead. A waiter holds no
connection while it waits.

Cancellation: a cancelled or failed acquire may have reached the server with only its reply
lost, so it is followed by a release with the same token; a cancelled release is sent again.
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
from collections.abc import Sequence

from .. import _keys, _observe, _scripts
from .._aio import cancel_requested, cancels, finish_within
from .._args import check_int, check_key, check_seconds, check_timeout, to_ms
from .._backend import Backend, get_backend
from .._errors import AioRateLimitError, BackendUnavailable, LockTimeout
from .._scripts import Arg, Reply, Script
from .lease import Hold, Lease, Names

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


class _Resource:
    """What ``Lock`` and ``Semaphore`` share; a subclass names its scripts and keys."""

    __slots__ = ("_backend", "_cache", "name", "ttl")

    _kind: str
    _acquire_script: Script
    _release_script: Script
    _extend_script: Script

    def __init__(self, name: str, ttl: float, backend: Backend | None) -> None:
        self.name = check_key(name, "name")
        self.ttl = check_seconds(ttl, "ttl")
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        self._backend = backend
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
            )
            cache = self._cache = (backend, names)
        return cache[1]

    def _acquire_args(self, token: str, ttl_ms: int) -> tuple[Arg, ...]:
        return (token, ttl_ms)

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
        names = self._names(backend)
        token = _keys.new_token()
        ttl = self.ttl
        args = self._acquire_args(token, to_ms(ttl))
        base = cancels()
        notifier = backend._notifier
        loop = asyncio.get_running_loop()
        # The bound of the whole call (see the module): None waits as long as it takes.
        limit = None if timeout is None else loop.time() + timeout + backend.timeout
        others = notifier.arrive(names.channel)
        bound = asyncio.timeout_at(limit)
        try:
            async with bound:
                if timeout != 0 and others:
                    # Another acquire of this name runs in this process: the lock is
                    # contended. Subscribe first (joining any subscription already open),
                    # then one try suffices: a release after it wakes a waiter here.
                    sent, reply = await self._wait(backend, names, args, timeout, base, limit)
                else:
                    sent = loop.time()
                    reply = await self._attempt(backend, names, args, base, limit)
                    if reply[0] != 1:
                        if timeout == 0:
                            raise LockTimeout(name=self.name, timeout=timeout)
                        sent, reply = await self._wait(backend, names, args, timeout, base, limit)
        except TimeoutError as exc:
            if not bound.expired():
                raise
            raise BackendUnavailable(
                f"Redis did not answer in time: acquiring {self.name!r} took over"
                f" timeout + the backend's timeout ({timeout} + {backend.timeout} s)"
            ) from exc
        finally:
            notifier.depart(names.channel)
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
            reply = await backend._run(self._acquire_script, names.acquire_keys, args)
            cancel_requested(base)
            return reply
        except BaseException:
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
    ) -> tuple[float, Reply]:
        """Subscribe, then try at every wake-up (or fallback timer) until acquired."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        channel = names.channel
        notifier = backend._notifier
        sub = notifier.subscribe(channel)
        woken = False
        try:
            async with sub:  # confirmed before the try: a release from now on wakes us
                while True:
                    cancel_requested(base)  # (one lost while subscribing or sleeping)
                    sent = loop.time()
                    reply = await self._attempt(backend, names, args, base, limit)
                    woken = False
                    if reply[0] == 1:  # {1, fence}: held
                        return sent, reply
                    wait = _wait_time(int(reply[1]))
                    if deadline is not None:
                        left = deadline - loop.time()
                        if left <= 0:
                            raise LockTimeout(name=self.name, timeout=timeout)
                        wait = min(wait, left)
                    woken = await sub.wait(wait)
        finally:
            if woken or sub.woken:
                # We took a wake-up but leave without using it (acquired meanwhile, cancelled,
                # timed out): hand it to the next local waiter rather than let it sleep on.
                notifier.deliver(channel, b"")


class Lock(_Resource):
    """A named distributed lock: at most one holder at a time.

    A description only: it holds no token. ``await lock.acquire()`` returns a ``Lease``;
    ``async with arl.lock(name)`` acquires, renews and releases one.
    """

    __slots__ = ()
    _kind = "lock"
    _acquire_script = _scripts.LOCK_ACQUIRE
    _release_script = _scripts.LOCK_RELEASE
    _extend_script = _scripts.LOCK_EXTEND

    def __init__(self, name: str, ttl: float = 30.0, backend: Backend | None = None) -> None:
        super().__init__(name, ttl, backend)

    def _build_keys(self, backend: Backend) -> tuple[list[str], list[str], str]:
        key, channel = _keys.lock(backend._head(_keys.LOCK_KIND), self.name)
        return [key], [key], channel

    async def locked(self) -> bool:
        """Whether anyone holds the lock now."""
        backend = self._backend or get_backend()
        keys = self._names(backend).owner_keys
        return bool(await backend._run(_scripts.LOCK_LOCKED, keys, ()) == 1)

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} ttl={self.ttl}>"


class Semaphore(_Resource):
    """A named distributed semaphore: at most ``limit`` holders at a time.

    It mirrors ``Lock`` (leases, fences, wake-ups, renewal and cancellation work the same)
    and doubles as a concurrency limiter: ``async with arl.semaphore("api", limit=10)``.
    """

    __slots__ = ("limit",)
    _kind = "semaphore"
    _acquire_script = _scripts.SEMAPHORE_ACQUIRE
    _release_script = _scripts.SEMAPHORE_RELEASE
    _extend_script = _scripts.SEMAPHORE_EXTEND

    def __init__(
        self, name: str, limit: int = 5, ttl: float = 30.0, backend: Backend | None = None
    ) -> None:
        super().__init__(name, ttl, backend)
        self.limit = check_int(limit, "limit")

    def _build_keys(self, backend: Backend) -> tuple[list[str], list[str], str]:
        holders, fences, channel = _keys.semaphore(backend._head(_keys.SEMAPHORE_KIND), self.name)
        return [holders, fences], [holders, fences], channel

    def _acquire_args(self, token: str, ttl_ms: int) -> tuple[Arg, ...]:
        return (token, ttl_ms, self.limit)

    async def holders(self) -> int:
        """How many leases hold a slot now."""
        backend = self._backend or get_backend()
        keys = self._names(backend).acquire_keys[:1]
        return int(await backend._run(_scripts.SEMAPHORE_HOLDERS, keys, ()))

    async def locked(self) -> bool:
        """Whether all ``limit`` slots are held now (an acquire would wait)."""
        return await self.holders() >= self.limit

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} limit={self.limit} ttl={self.ttl}>"


def lock(
    name: str,
    ttl: float = 30.0,
    timeout: float | None = None,
    auto_renew: bool = True,
    backend: Backend | None = None,
) -> Hold:
    """``async with arl.lock(name) as lease:`` runs the block holding the lock ``name``.

    ``ttl``: seconds the lock lives without renewal. ``timeout``: seconds to wait for it
    (``None`` forever, ``0`` one try), then ``LockTimeout``. With ``auto_renew`` the lease is
    extended every ttl/3 while the block runs; if it is lost anyway, the block is cancelled
    and ``LockLost`` raised out of the ``async with``.
    """
    return Hold._create(Lock(name, ttl, backend), timeout, auto_renew)


def semaphore(
    name: str,
    limit: int = 5,
    ttl: float = 30.0,
    timeout: float | None = None,
    auto_renew: bool = True,
    backend: Backend | None = None,
) -> Hold:
    """``async with arl.semaphore(name, limit=5) as lease:`` runs the block as one of at most
    ``limit`` holders; otherwise exactly like ``lock``."""
    return Hold._create(Semaphore(name, limit, ttl, backend), timeout, auto_renew)
