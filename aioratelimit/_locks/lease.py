"""Leases: one acquisition of a lock or of a semaphore slot, its renewal, and the
``async with`` block that holds it.

A ``Lease`` keeps the acquisition's random token and the resource's ``Names``; only it can
extend or release what it holds. ``Hold`` (``async with arl.lock(...)``) renews the lease in
the background (``Renewal``) and turns a lost lease into the cancellation of the block and
``LockLost``. Every release is safe to send twice (``lua/lock_release.lua`` leaves a
tombstone), so a release whose reply was lost (with a cancellation, or on a connection
reset: ``Backend._run_repeatable``) is sent again, and the repeat's "released before" counts
as the release it repeats.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from .. import _observe
from .._aio import cancel_requested, cancels, finish
from .._args import check_seconds, check_timeout, to_ms
from .._backend import Backend
from .._errors import AioRateLimitError, LockLost, LockNotOwned
from .._public import NoPublicConstructor
from .._scripts import Released, Script
from .._stores.confirm import Replicas

log = logging.getLogger("aioratelimit")

#: Auto-renewal extends the lease every ttl / RENEW_EVERY seconds.
RENEW_EVERY = 3
#: After a failed renewal (Redis unreachable), the next try comes this soon (seconds, at most).
RENEW_RETRY = 0.25

_HELD, _RELEASED, _LOST = "held", "released", "lost"


@dataclass(frozen=True, slots=True)
class Names:
    """What a lock or semaphore is called on one backend, and the scripts of its steps."""

    kind: str  # "lock" or "semaphore", for reprs
    name: str
    #: the keys of the acquire script
    acquire_keys: list[str]
    #: the keys of the release and extend scripts
    owner_keys: list[str]
    #: the wake-up channel (same hash tag) and the command that publishes on it
    channel: str
    publish: str
    release: Script
    extend: Script
    #: what an acquire and an extend wait for (None: nothing)
    replicas: Replicas | None = None
    #: what ``NotReplicated`` says of an acquire that was not confirmed
    acquired: str = ""

    def release_args(self, token: str, ttl: float) -> tuple[str, int, str, str]:
        """The release script's arguments (a tombstone lives as long as the lease would)."""
        return (token, to_ms(ttl), self.channel, self.publish)


def _margin(ttl: float) -> float:
    """How long before the TTL runs out a lease stops counting itself valid: time to cancel
    the block before another holder can get in."""
    return min(ttl / 10, 1.0)


def _one(reply: object) -> bool:
    """Whether an extend script extended (1)."""
    return reply == 1


def released(code: int) -> bool:
    """Whether a release script's answer means the token holds nothing any more."""
    return code == Released.RELEASED or code == Released.RELEASED_BEFORE


class Lease(metaclass=NoPublicConstructor):
    """One acquisition of a lock or of a semaphore slot; only it can extend or release it.

    ``fencing_token`` strictly increases across every acquisition of the name: pass it to
    the resource you protect and have it refuse a token lower than one it has already seen.
    Handed out by ``Lock.acquire``, ``Semaphore.acquire`` and ``async with arl.lock(...)``
    (``Lease._create``: what it is made of is internal).
    """

    __slots__ = ("_backend", "_names", "_sent", "_state", "_token", "fencing_token", "name", "ttl")

    def __init__(
        self, backend: Backend, names: Names, token: str, fence: int, ttl: float, sent: float
    ) -> None:
        self._backend = backend
        self._names = names
        self._token = token
        #: strictly increasing across all holders of this name
        self.fencing_token = fence
        self.name = names.name
        #: the TTL (seconds) the lease was last acquired or extended with
        self.ttl = ttl
        # loop time at which the last successful acquire/extend was sent: the server's
        # expiry is no earlier than _sent + ttl
        self._sent = sent
        self._state = _HELD

    async def extend(self, ttl: float | None = None) -> None:
        """Hold on for ``ttl`` seconds from now (default: the lease's ttl).

        Raises ``LockNotOwned`` if the lease no longer holds (expired, released or taken).
        With ``replicas=``, ``NotReplicated`` if the extension was not confirmed: it stands
        on the master, but the lease counts only on the last confirmed one (its renewal
        tries again until then).
        """
        ttl = self.ttl if ttl is None else check_seconds(ttl, "ttl")
        if self._state is not _HELD:
            raise LockNotOwned(name=self.name)
        sent = asyncio.get_running_loop().time()
        base = cancels()
        names = self._names
        args = (self._token, to_ms(ttl))
        run = self._backend._run_write
        what = "the extension stands on the master; the lease counts on the last confirmed"
        reply = await run(names.extend, names.owner_keys, args, names.replicas, _one, what)
        cancel_requested(base)
        if reply != 1:
            if self._state is _HELD:
                self._state = _LOST
            raise LockNotOwned(name=self.name)
        self.ttl, self._sent = ttl, sent

    async def release(self) -> None:
        """Give the lock (or slot) back and wake a waiter.

        Raises ``LockNotOwned`` if the lease no longer held it: it expired, was taken
        over, or was released already by this lease. A release whose reply was lost is
        sent again (a few times, within the backend's ``timeout``), and a repeat that finds
        its first copy arrived counts as the release; ``BackendUnavailable`` only when no
        try got through. A cancelled release is completed before the cancellation goes on.
        """
        if self._state is not _HELD:
            raise LockNotOwned(name=self.name)
        names = self._names
        args = names.release_args(self._token, self.ttl)
        run = self._backend._run_repeatable
        base = cancels()
        try:
            code = await run(names.release, names.owner_keys, args)
            cancel_requested(base)
        except asyncio.CancelledError:
            # Its reply was lost with the cancellation: send it again (a repeat is
            # recognised), shielded, and only then let the cancellation go on.
            try:
                code = await finish(run(names.release, names.owner_keys, args))
            except AioRateLimitError as exc:
                log.debug("aioratelimit: release of %r after a cancellation: %r", self.name, exc)
            else:
                self._state = _RELEASED if released(code) else _LOST
            raise
        if released(code):
            self._state = _RELEASED
            return
        self._state = _LOST
        raise LockNotOwned(name=self.name)

    async def _discard(self) -> None:
        """Release whatever this token may still hold, ignoring the outcome (a lost lease)."""
        names = self._names
        args = names.release_args(self._token, self.ttl)
        try:
            code = await self._backend._run_repeatable(names.release, names.owner_keys, args)
        except AioRateLimitError as exc:
            log.debug("aioratelimit: release of lost lease %r: %r", self.name, exc)
            return
        if released(code):
            self._state = _RELEASED

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state is _RELEASED:
            return  # released by hand inside the block
        try:
            await self.release()
        except LockNotOwned:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        kind = self._names.kind
        return f"<Lease {kind} {self.name!r} fence={self.fencing_token} {self._state}>"


class Renewal:
    """Background renewal of one lease, tied to the task that holds it.

    No task runs until the first renewal is due (a short block costs one timer). Then every
    ttl/3 the lease is extended; the lease counts as valid until the last successful
    extend was *sent* plus ttl, less a margin. If an extend is refused, or Redis cannot be
    reached before that deadline, or the loop was blocked past it, the owner task is
    cancelled once and ``lost`` is set. ``max_hold`` (seconds from the acquire) ends the
    renewal the same way: a stuck holder cannot keep the lease forever.
    """

    __slots__ = ("_end", "_handle", "_lease", "_loop", "_owner", "expired", "lost", "task")

    def __init__(self, lease: Lease, owner: asyncio.Task[Any], max_hold: float | None) -> None:
        self._lease = lease
        self._owner = owner
        self._loop = asyncio.get_running_loop()
        self.task: asyncio.Task[None] | None = None
        self.lost = False
        #: lost because max_hold passed (not refused, nor unreachable)
        self.expired = False
        #: (loop time) when the hold ends whatever the renewals: the acquire was sent no
        #: later than ``_sent``, so the holder never keeps it past max_hold
        self._end = None if max_hold is None else lease._sent + max_hold
        first = lease._sent + lease.ttl / RENEW_EVERY
        if self._end is not None and self._end < first:
            first = self._end
        self._handle = self._loop.call_at(first, self._start)

    def _start(self) -> None:
        self.task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        lease, loop = self._lease, self._loop
        retry_at: float | None = None
        end = self._end
        while lease._state == _HELD:
            ttl = lease.ttl
            deadline = lease._sent + ttl - _margin(ttl)
            if end is not None and end < deadline:
                deadline = end  # max_hold: no renewal past it, the block ends there
            due = lease._sent + ttl / RENEW_EVERY if retry_at is None else retry_at
            now = loop.time()
            if now >= deadline:
                break
            if now < due:
                await asyncio.sleep(min(due, deadline) - now)
                continue
            kind = lease._names.kind
            try:
                async with asyncio.timeout(deadline - now):
                    await lease.extend()
                retry_at = None
            except LockNotOwned:
                _observe.renewal(kind, _observe.REFUSED)
                break
            except Exception as exc:  # BackendUnavailable, our timeout: retry until the deadline
                log.debug("aioratelimit: renewal of %r failed: %r", lease.name, exc)
                _observe.renewal(kind, _observe.FAILED)
                retry_at = loop.time() + min(ttl / 10, RENEW_RETRY)
            else:
                _observe.renewal(kind, _observe.RENEWED)  # outside the try: never a failure
        if lease._state == _RELEASED:
            return  # released by hand inside the block: nothing is lost
        if end is not None and loop.time() >= end:
            self.expired = True
        lease._state = _LOST
        self.lost = True
        _observe.lost(lease._names.kind)
        self._owner.cancel()

    def stop(self) -> bool:
        """Stop renewing; True if the lease was lost (and the owner cancelled for it)."""
        self._handle.cancel()
        if self.task is not None:
            self.task.cancel()
        return self.lost


def _withdraw_cancel(task: asyncio.Task[Any]) -> bool:
    """Take back the one cancellation ``Renewal`` requested on ``task``; True unless
    somebody else has cancelled it too (then that cancellation must go on)."""
    return task.uncancel() == 0


class Acquirable(Protocol):
    """What ``Hold`` acquires: a ``Lock``, a ``Semaphore``, a ``FairLock`` or one side of a
    ``ReadWriteLock``."""

    async def acquire(self, timeout: float | None = None) -> Lease: ...


class Hold(metaclass=NoPublicConstructor):
    """``async with arl.lock(...) as lease`` / ``arl.semaphore(...)``: acquire on entry,
    renew while the block runs, release on exit; a lost lease ends the block with
    ``LockLost``; past ``max_hold`` too. Made by ``arl.lock``, ``arl.semaphore``,
    ``arl.fair_lock`` and ``ReadWriteLock.read``/``write`` (``Hold._create``)."""

    __slots__ = (
        "_auto_renew",
        "_lease",
        "_max_hold",
        "_owner",
        "_renewal",
        "_resource",
        "_timeout",
    )

    def __init__(
        self,
        resource: Acquirable,
        timeout: float | None,
        auto_renew: bool,
        max_hold: float | None = None,
    ) -> None:
        if not isinstance(auto_renew, bool):
            raise TypeError(f"auto_renew must be a bool, not {type(auto_renew).__name__}")
        if max_hold is not None:
            max_hold = check_seconds(max_hold, "max_hold")
            if not auto_renew:
                # Without renewal the TTL already bounds the hold: nothing would enforce it.
                raise ValueError("max_hold bounds the renewal: it needs auto_renew=True")
        self._resource = resource
        self._timeout = check_timeout(timeout)
        self._auto_renew = auto_renew
        self._max_hold = max_hold
        self._lease: Lease | None = None
        self._renewal: Renewal | None = None
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
            self._renewal = Renewal(lease, owner, self._max_hold)
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
                await finish(lease._discard())
            elif lease._state is not _RELEASED:  # (not released by hand in the block)
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
                if renewal is not None and renewal.expired:
                    raise LockLost(
                        f"{lease.name!r} was held for max_hold ({self._max_hold} s): the"
                        " block was cancelled and the lease released",
                        name=lease.name,
                    ) from None
                raise LockLost(name=lease.name) from None
            return
        if cancelled is not None:
            raise cancelled
        if failure is not None and exc_type is None:
            if isinstance(failure, LockNotOwned):
                # Without renewal (or before it noticed) the lease ran out under the block.
                _observe.lost(lease._names.kind)
                raise LockLost(name=lease.name) from failure
            raise failure

    def __repr__(self) -> str:
        held = "" if self._max_hold is None else f" max_hold={self._max_hold}"
        return f"<hold of {self._resource!r} auto_renew={self._auto_renew}{held}>"
