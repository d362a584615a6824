"""Locks and semaphores: owner-checked, fenced, woken on release, renewed, cancellation-safe.

A ``Lock`` or ``Semaphore`` is only a description (name, ttl, backend). Each ``acquire``
draws a fresh random token and returns a ``Lease``: the token lives there and nowhere else,
so two acquisitions never share one, whatever task or thread they run in. Every step is one
script (``lua/lock_*.lua``, ``lua/semaphore_*.lua``) that is safe to send twice: acquiring
again with the token that holds returns the same fence, and releasing leaves a tombstone so a
repeated release is recognised (and a late copy of a cancelled acquire takes nothing).

Waiting: try once; if held, subscribe to the name's wake-up channel (``_notify``: one shared
subscriber per backend, wake-one per process), try again, then sleep until woken or until the
holder's TTL (at most ``FALLBACK_WAIT``) has passed. An acquire that finds another acquire of
the same name in flight in this process subscribes before its first try instead. A waiter
holds no pooled connection.

Cancellation: a cancelled or failed acquire may have reached the server with only its reply
lost, so it is followed by a release with the same token; a cancelled release is sent again.
Both run in a shielded task that the caller waits for, then the cancellation goes on.

``async with lock(...)`` renews the lease in the background (``_Renewal``) and turns a lost
lease into the cancellation of the block and ``LockLost``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import sys
from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from . import _keys, _scripts
from ._args import check_int, check_key, check_seconds, check_timeout, to_ms
from ._backend import Backend, get_backend
from ._errors import AioRateLimitError, LockLost, LockNotOwned, LockTimeout
from ._memory import Arg, Reply
from ._notify import Notifier
from ._scripts import Script

log = logging.getLogger("aioratelimit")

T = TypeVar("T")

#: The longest a waiter sleeps without a wake-up before it tries again (seconds). It covers a
#: lost pub/sub message; a holder that expires wakes nobody, so its waiters sleep its PTTL.
FALLBACK_WAIT = 1.0
#: The shortest sleep between two attempts (seconds).
MIN_WAIT = 0.001
#: Auto-renewal extends the lease every ttl / RENEW_EVERY seconds.
RENEW_EVERY = 3
#: After a failed renewal (Redis unreachable), the next try comes this soon (seconds, at most).
RENEW_RETRY = 0.25

_HELD, _RELEASED, _LOST = "held", "released", "lost"

#: Acquires in flight in this process, per (notifier, channel): a newcomer that finds others
#: subscribes before its first try instead of after it (one script less per acquisition).
_busy: dict[tuple[Notifier, str], int] = {}

#: A resource's names on one backend: the acquire script's keys, the keys of release and
#: extend, how to wake waiters (channel, publish command), and its key in ``_busy``.
_Names = tuple[list[str], list[str], tuple[str, str], tuple[Notifier, str]]

#: Draws the acquisitions' tokens: 128 bits, seeded from the OS and seeded again in a forked
#: child (two processes never draw the same sequence), independent of the ``random`` module's
#: global state. A token only has to be unique, not secret (whoever can read it can run
#: scripts on the server anyway); ``secrets`` would cost a system call per acquisition.
_tokens = random.Random(secrets.randbits(128))
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _tokens.seed(secrets.randbits(128)))


def _new_token(bits: Any = _tokens.getrandbits) -> str:
    """A fresh acquisition token: 32 hex digits."""
    return f"{bits(128):032x}"


def _margin(ttl: float) -> float:
    """How long before the TTL runs out a lease stops counting itself valid: time to cancel
    the block before another holder can get in."""
    return min(ttl / 10, 1.0)


def _wait_time(wait_ms: int) -> float:
    """A waiter's fallback sleep from a script's hint (the holder's PTTL; -1: no TTL)."""
    if wait_ms < 0:
        return FALLBACK_WAIT
    return min(max((wait_ms + 1) / 1000, MIN_WAIT), FALLBACK_WAIT)


async def _complete(coro: Awaitable[T]) -> T:
    """Run ``coro`` in its own task to its end, even if the caller is cancelled meanwhile
    (a cleanup must not stop half-way); such a cancellation is raised once it has finished."""
    task = asyncio.ensure_future(coro)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation wins
        raise cancelled
    return task.result()


if sys.version_info >= (3, 11):

    def _cancels() -> int:
        """How many cancellations of the current task are pending."""
        task = asyncio.current_task()
        return task.cancelling() if task is not None else 0

else:  # pragma: no cover

    def _cancels() -> int:
        return 0  # Python 3.10 does not count them


def _check_cancelled(base: int) -> None:
    """Raise a cancellation requested since ``_cancels()`` was ``base`` that never arrived.

    redis-py sends each command under ``asyncio.wait_for``, which before Python 3.12 returns
    normally when the task is cancelled just as the send completes: the cancellation is
    lost, and an acquire would go on waiting past its caller's timeout. Python 3.11 still
    counts the request, so it is raised here as if it had come during the call.
    """
    if _cancels() > base:
        raise asyncio.CancelledError


async def _within(aw: Awaitable[T], timeout: float) -> T:
    """``aw`` under a time limit (then ``asyncio.TimeoutError``). Not ``asyncio.wait_for``:
    before Python 3.12 that swallows a cancellation arriving as ``aw`` completes."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise asyncio.TimeoutError
    return task.result()


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
        # (backend, (acquire keys, owner keys, (channel, publish command))), built once
        self._cache: tuple[Backend, _Names] | None = None

    @property
    def backend(self) -> Backend:
        return self._backend or get_backend()

    def _build_keys(self, prefix: str) -> tuple[list[str], list[str], str]:
        raise NotImplementedError

    def _keys(self, backend: Backend) -> _Names:
        """The keys of the acquire script, the keys of release/extend, and how to wake."""
        cache = self._cache
        if cache is None or cache[0] is not backend:
            keys, owner_keys, channel = self._build_keys(backend.prefix)
            busy = (backend.notifier, channel)
            names = (keys, owner_keys, (channel, backend.publish_command), busy)
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
        if timeout is not None:
            timeout = check_timeout(timeout)
        backend = self._backend or get_backend()
        names = self._keys(backend)
        token = _new_token()
        ttl = self.ttl
        args = self._acquire_args(token, to_ms(ttl))
        base = _cancels()
        busy = names[3]
        others = _busy.get(busy, 0)
        _busy[busy] = others + 1
        try:
            if timeout != 0 and others:
                # Another acquire of this name runs in this process: the lock is contended.
                # Subscribe first (joining any subscription already open), then one try
                # suffices: a release after it wakes a waiter here.
                sent, reply = await self._wait(backend, names, args, timeout, base)
            else:
                sent = asyncio.get_running_loop().time()
                reply = await self._attempt(backend, names, args, base)
                if reply[0] != 1:
                    if timeout == 0:
                        raise LockTimeout(name=self.name, timeout=timeout)
                    sent, reply = await self._wait(backend, names, args, timeout, base)
        finally:
            left = _busy.pop(busy) - 1
            if left:
                _busy[busy] = left
        return Lease(self, backend, names, token, int(reply[1]), ttl, sent)

    async def _attempt(
        self, backend: Backend, names: _Names, args: Sequence[Arg], base: int
    ) -> Reply:
        """One acquire script; if it fails or is cancelled in flight, release its token."""
        try:
            reply = await backend.run(self._acquire_script, names[0], args)
            _check_cancelled(base)
            return reply
        except BaseException:
            # The script may have run with only its reply lost: release the same token
            # (harmless if it never arrived: the tombstone also bars a late copy of it).
            await _complete(self._cleanup(backend, names, str(args[0])))
            raise

    async def _cleanup(self, backend: Backend, names: _Names, token: str) -> None:
        args = (token, to_ms(self.ttl), *names[2])
        try:
            await backend.run(self._release_script, names[1], args)
        except AioRateLimitError as exc:  # the TTL frees it in the end
            log.debug("aioratelimit: release after a failed acquire of %r: %r", self.name, exc)

    async def _wait(
        self,
        backend: Backend,
        names: _Names,
        args: Sequence[Arg],
        timeout: float | None,
        base: int,
    ) -> tuple[float, Reply]:
        """Subscribe, then try at every wake-up (or fallback timer) until acquired."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        channel = names[2][0]
        notifier = backend.notifier
        sub = notifier.subscribe(channel)
        woken = False
        try:
            async with sub:  # confirmed before the try: a release from now on wakes us
                while True:
                    _check_cancelled(base)  # (one lost while subscribing or sleeping)
                    sent = loop.time()
                    reply = await self._attempt(backend, names, args, base)
                    woken = False
                    if reply[0] == 1:
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

    def _build_keys(self, prefix: str) -> tuple[list[str], list[str], str]:
        key, channel = _keys.lock(prefix, self.name)
        return [key], [key], channel

    async def locked(self) -> bool:
        """Whether anyone holds the lock now."""
        backend = self._backend or get_backend()
        return bool(await backend.run(_scripts.LOCK_LOCKED, self._keys(backend)[1], ()) == 1)

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

    def _build_keys(self, prefix: str) -> tuple[list[str], list[str], str]:
        holders, fences, channel = _keys.semaphore(prefix, self.name)
        return [holders, fences], [holders, fences], channel

    def _acquire_args(self, token: str, ttl_ms: int) -> tuple[Arg, ...]:
        return (token, ttl_ms, self.limit)

    async def holders(self) -> int:
        """How many leases hold a slot now."""
        backend = self._backend or get_backend()
        return int(await backend.run(_scripts.SEMAPHORE_HOLDERS, self._keys(backend)[0][:1], ()))

    async def locked(self) -> bool:
        """Whether all ``limit`` slots are held now (an acquire would wait)."""
        return await self.holders() >= self.limit

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} limit={self.limit} ttl={self.ttl}>"


class Lease:
    """One acquisition of a lock or of a semaphore slot; only it can extend or release it.

    ``fencing_token`` strictly increases across every acquisition of the name: pass it to
    the resource you protect and have it refuse a token lower than one it has already seen.
    """

    __slots__ = (
        "_backend",
        "_names",
        "_resource",
        "_sent",
        "_state",
        "_token",
        "fencing_token",
        "name",
        "ttl",
    )

    def __init__(
        self,
        resource: _Resource,
        backend: Backend,
        names: _Names,
        token: str,
        fence: int,
        ttl: float,
        sent: float,
    ) -> None:
        self._resource = resource
        self._backend = backend
        self._names = names
        self._token = token
        #: strictly increasing across all holders of this name
        self.fencing_token = fence
        self.name = resource.name
        #: the TTL (seconds) the lease was last acquired or extended with
        self.ttl = ttl
        # loop time at which the last successful acquire/extend was sent: the server's
        # expiry is no earlier than _sent + ttl
        self._sent = sent
        self._state = _HELD

    async def extend(self, ttl: float | None = None) -> None:
        """Hold on for ``ttl`` seconds from now (default: the lease's ttl).

        Raises ``LockNotOwned`` if the lease no longer holds (expired, released or taken).
        """
        ttl = self.ttl if ttl is None else check_seconds(ttl, "ttl")
        if self._state is not _HELD:
            raise LockNotOwned(name=self.name)
        sent = asyncio.get_running_loop().time()
        base = _cancels()
        reply = await self._backend.run(
            self._resource._extend_script, self._names[1], (self._token, to_ms(ttl))
        )
        _check_cancelled(base)
        if reply != 1:
            if self._state is _HELD:
                self._state = _LOST
            raise LockNotOwned(name=self.name)
        self.ttl, self._sent = ttl, sent

    async def release(self) -> None:
        """Give the lock (or slot) back and wake a waiter.

        Raises ``LockNotOwned`` if the lease no longer held it. Releasing twice is not an
        error; a cancelled release is completed before the cancellation goes on.
        """
        if self._state is not _HELD:
            if self._state is _RELEASED:
                return
            raise LockNotOwned(name=self.name)
        script = self._resource._release_script
        keys = self._names[1]
        args = (self._token, to_ms(self.ttl), *self._names[2])
        base = _cancels()
        try:
            code = await self._backend.run(script, keys, args)
            _check_cancelled(base)
        except asyncio.CancelledError:
            # Its reply was lost with the cancellation: send it again (a repeat is
            # recognised), shielded, and only then let the cancellation go on.
            try:
                code = await _complete(self._backend.run(script, keys, args))
            except AioRateLimitError as exc:
                log.debug("aioratelimit: release of %r after a cancellation: %r", self.name, exc)
            else:
                self._state = _RELEASED if code == 1 or code == 2 else _LOST
            raise
        if code == 1 or code == 2:
            self._state = _RELEASED
            return
        self._state = _LOST
        raise LockNotOwned(name=self.name)

    async def _discard(self) -> None:
        """Release whatever this token may still hold, ignoring the outcome (a lost lease)."""
        args = (self._token, to_ms(self.ttl), *self._names[2])
        try:
            code = await self._backend.run(self._resource._release_script, self._names[1], args)
        except AioRateLimitError as exc:
            log.debug("aioratelimit: release of lost lease %r: %r", self.name, exc)
            return
        if code == 1 or code == 2:
            self._state = _RELEASED

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockNotOwned:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        kind = self._resource._kind
        return f"<Lease {kind} {self.name!r} fence={self.fencing_token} {self._state}>"


class _Renewal:
    """Background renewal of one lease, tied to the task that holds it.

    No task runs until the first renewal is due (a short block costs one timer). Then every
    ttl/3 the lease is extended; the lease counts as valid until the last successful
    extend was *sent* plus ttl, less a margin. If an extend is refused, or Redis cannot be
    reached before that deadline, or the loop was blocked past it, the owner task is
    cancelled once and ``lost`` is set.
    """

    __slots__ = ("_handle", "_lease", "_loop", "_owner", "lost", "task")

    def __init__(self, lease: Lease, owner: asyncio.Task[Any]) -> None:
        self._lease = lease
        self._owner = owner
        self._loop = asyncio.get_running_loop()
        self.task: asyncio.Task[None] | None = None
        self.lost = False
        self._handle = self._loop.call_at(lease._sent + lease.ttl / RENEW_EVERY, self._start)

    def _start(self) -> None:
        self.task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        lease, loop = self._lease, self._loop
        retry_at: float | None = None
        while lease._state == _HELD:
            ttl = lease.ttl
            deadline = lease._sent + ttl - _margin(ttl)
            due = lease._sent + ttl / RENEW_EVERY if retry_at is None else retry_at
            now = loop.time()
            if now >= deadline:
                break
            if now < due:
                await asyncio.sleep(min(due, deadline) - now)
                continue
            try:
                await _within(lease.extend(), deadline - now)
                retry_at = None
            except LockNotOwned:
                break
            except Exception as exc:  # BackendUnavailable, our timeout: retry until the deadline
                log.debug("aioratelimit: renewal of %r failed: %r", lease.name, exc)
                retry_at = loop.time() + min(ttl / 10, RENEW_RETRY)
        if lease._state == _RELEASED:
            return  # released by hand inside the block: nothing is lost
        lease._state = _LOST
        self.lost = True
        self._owner.cancel()

    def stop(self) -> bool:
        """Stop renewing; True if the lease was lost (and the owner cancelled for it)."""
        self._handle.cancel()
        if self.task is not None:
            self.task.cancel()
        return self.lost


def _withdraw_cancel(task: asyncio.Task[Any]) -> bool:
    """Take back the one cancellation ``_Renewal`` requested on ``task``; True unless
    somebody else has cancelled it too (then that cancellation must go on)."""
    if sys.version_info >= (3, 11):
        return task.uncancel() == 0
    return True  # Python 3.10 cannot tell two cancellations apart


class _Hold:
    """``async with arl.lock(...) as lease`` / ``arl.semaphore(...)``: acquire on entry,
    renew while the block runs, release on exit; a lost lease ends the block with
    ``LockLost``."""

    __slots__ = ("_auto_renew", "_lease", "_owner", "_renewal", "_resource", "_timeout")

    def __init__(self, resource: _Resource, timeout: float | None, auto_renew: bool) -> None:
        if not isinstance(auto_renew, bool):
            raise TypeError(f"auto_renew must be a bool, not {type(auto_renew).__name__}")
        self._resource = resource
        self._timeout = check_timeout(timeout)
        self._auto_renew = auto_renew
        self._lease: Lease | None = None
        self._renewal: _Renewal | None = None
        self._owner: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> Lease:
        if self._lease is not None:
            raise RuntimeError(f"{self!r} is already entered")
        lease = await self._resource.acquire(self._timeout)
        self._lease = lease
        if self._auto_renew:
            owner = asyncio.current_task()
            assert owner is not None  # we run inside a task
            self._owner = owner
            self._renewal = _Renewal(lease, owner)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, renewal, owner = self._lease, self._renewal, self._owner
        self._lease = self._renewal = self._owner = None
        if lease is None:
            return
        lost = renewal.stop() if renewal is not None else False
        cancelled: asyncio.CancelledError | None = None
        failure: AioRateLimitError | None = None
        try:
            if lost:
                # Free it if this token still holds it after all; also where the
                # cancellation we requested lands if the block ended before it did.
                await _complete(lease._discard())
            else:
                await lease.release()
        except asyncio.CancelledError as exc_:
            cancelled = exc_
        except AioRateLimitError as exc_:  # LockNotOwned, BackendUnavailable
            failure = exc_
        if renewal is not None and renewal.task is not None and not renewal.task.done():
            # Let the stopped renewal task finish (one loop turn) so nothing is left pending.
            await asyncio.wait([renewal.task])
        if lost and owner is not None and _withdraw_cancel(owner):
            # The cancellation was ours: the block ran without the lock. Its own exception
            # (other than the cancellation we caused) goes on; otherwise LockLost.
            if exc_type is None or issubclass(exc_type, asyncio.CancelledError):
                raise LockLost(name=lease.name) from None
            return
        if cancelled is not None:
            raise cancelled
        if failure is not None and exc_type is None:
            if isinstance(failure, LockNotOwned):
                # Without renewal (or before it noticed) the lease ran out under the block.
                raise LockLost(name=lease.name) from failure
            raise failure

    def __repr__(self) -> str:
        return f"<hold of {self._resource!r} auto_renew={self._auto_renew}>"


def lock(
    name: str,
    ttl: float = 30.0,
    timeout: float | None = None,
    auto_renew: bool = True,
    backend: Backend | None = None,
) -> _Hold:
    """``async with arl.lock(name) as lease:`` runs the block holding the lock ``name``.

    ``ttl``: seconds the lock lives without renewal. ``timeout``: seconds to wait for it
    (``None`` forever, ``0`` one try), then ``LockTimeout``. With ``auto_renew`` the lease is
    extended every ttl/3 while the block runs; if it is lost anyway, the block is cancelled
    and ``LockLost`` raised out of the ``async with``.
    """
    return _Hold(Lock(name, ttl, backend), timeout, auto_renew)


def semaphore(
    name: str,
    limit: int = 5,
    ttl: float = 30.0,
    timeout: float | None = None,
    auto_renew: bool = True,
    backend: Backend | None = None,
) -> _Hold:
    """``async with arl.semaphore(name, limit=5) as lease:`` runs the block as one of at most
    ``limit`` holders; otherwise exactly like ``lock``."""
    return _Hold(Semaphore(name, limit, ttl, backend), timeout, auto_renew)
