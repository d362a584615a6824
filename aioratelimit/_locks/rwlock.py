"""Read/write locks: many readers or one writer, writer-preferring, fenced across both modes.

A ``ReadWriteLock`` is a description, as a ``Lock`` is; its two sides are ``_Resource``s
(``lock``) on the same keys (``lua/rwlock_*.lua``: a semaphore's holders and fences, and the
waiting writers' intents), so acquiring, waiting, renewal, wake-ups and cancellation work as
they do for a lock. Each side waits in a line of its own in this process: readers try at once
beside one another whenever nobody of theirs waits (as semaphore acquires do), and after a
writer the readers waiting here go in one after the other, each trying as soon as the one
before got in, without waiting for a release; a writer waits in the writers' line, whose head
alone asks the server.

Writer-preferring: a writer refused because the lock is held records its intent (renewed at
every try, which comes at least every ``FALLBACK_WAIT``), and no new reader gets in while an
intent lives; the intent goes when the writer gets the lock, gives up (timeout, cancellation:
a release of its token) or, if it vanished, after ``INTENT_TTL`` (or its ttl if longer).

Not reentrant, and no upgrade from read to write: a task that holds a lease of a read/write
lock (from ``read``/``write``/``acquire_*`` of any ``ReadWriteLock`` of that name and backend)
and asks for it again in either mode would wait for itself (a writer waits for every reader,
and its intent then stops the reader it would need): that is refused with ``RuntimeError``
before any call. A task it starts is not refused (it may read beside it) but must not be
waited for while its parent holds the lock: it could wait for a writer that waits for the
parent.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, NamedTuple

from .. import _keys, _scripts
from .._args import check_timeout, to_ms
from .._backend import Backend, get_backend
from .._scripts import Arg
from .lease import _HELD, Hold, Lease
from .lock import FALLBACK_WAIT, _Resource

#: The least a waiting writer's intent lives without a try (seconds): a head retries at
#: least every ``FALLBACK_WAIT``, so three of them cover a retry delayed by a slow call.
INTENT_TTL = 3 * FALLBACK_WAIT

#: The read/write leases the running task acquired, to refuse an acquire that would wait for
#: itself; released or lost leases are dropped as met. A task inherits its creator's, marked
#: with the task that acquired them: only that one is refused (a child task may read beside
#: its parent: it only waits for the parent if a writer comes between them).
_held: contextvars.ContextVar[tuple[tuple[asyncio.Task[Any] | None, Lease], ...]] = (
    contextvars.ContextVar("aioratelimit_rwlock_held", default=())
)


class _Side(_Resource):
    """One mode of a read/write lock: the resource its leases hold."""

    __slots__ = ("_mode",)
    _kind = "rwlock"
    _acquire_script = _scripts.RWLOCK_ACQUIRE
    _release_script = _scripts.RWLOCK_RELEASE
    _extend_script = _scripts.SEMAPHORE_EXTEND  # (reads the same holders and fences)

    def __init__(self, name: str, ttl: float, backend: Backend | None, mode: str) -> None:
        super().__init__(name, ttl, backend)
        self._mode = mode

    def _build_keys(self, backend: Backend) -> tuple[list[str], list[str], str]:
        keys, channel = _keys.rwlock(backend._head(_keys.RWLOCK_KIND), self.name)
        return keys, keys, channel

    def _acquire_args(self, token: str, ttl_ms: int, waits: bool) -> tuple[Arg, ...]:
        intent = to_ms(max(self.ttl, INTENT_TTL)) if waits and self._mode == "w" else 0
        return (token, ttl_ms, self._mode, intent)

    async def acquire(self, timeout: float | None = None) -> Lease:
        backend = self._backend or get_backend()
        channel = self._names(backend).channel
        task = asyncio.current_task()
        held = tuple(entry for entry in _held.get() if entry[1]._state is _HELD)
        if any(t is task and lease._names.channel == channel for t, lease in held):
            raise RuntimeError(
                f"this task already holds the read/write lock {self.name!r}: it is not"
                " reentrant and a read lease cannot be upgraded (release it first)"
            )
        lease = await super().acquire(timeout)
        _held.set((*held, (task, lease)))
        return lease

    def __repr__(self) -> str:
        side = "read" if self._mode == "r" else "write"
        return f"<ReadWriteLock {self.name!r} {side} ttl={self.ttl}>"


class _ReadSide(_Side):
    __slots__ = ()
    _exclusive = False

    def _line_limit(self) -> int:
        return -1  # (its own line, apart from the writers')


class _WriteSide(_Side):
    __slots__ = ()
    _exclusive = True
    _withdraw = True


class RWState(NamedTuple):
    """A read/write lock as seen now (``ReadWriteLock.state``)."""

    #: leases holding it to read
    readers: int
    #: the writer's fencing token, or 0 when no writer holds it
    writer_fence: int
    #: seconds the writer's hold still lasts without renewal (None: no writer)
    writer_ttl: float | None
    #: writers (one per waiting process) whose intent stops new readers
    waiting_writers: int


class ReadWriteLock:
    """A named distributed read/write lock: many readers or one writer, writer-preferring.

    ``async with rw.read():`` / ``async with rw.write():`` acquire, renew and release a lease
    as ``arl.lock`` does; ``acquire_read``/``acquire_write`` return the ``Lease``. Fencing
    tokens increase across every acquisition in either mode. Not reentrant, no upgrade.
    """

    __slots__ = ("_read", "_write")

    def __init__(self, name: str, ttl: float = 30.0, backend: Backend | None = None) -> None:
        self._read = _ReadSide(name, ttl, backend, "r")
        self._write = _WriteSide(name, ttl, backend, "w")

    @property
    def name(self) -> str:
        return self._read.name

    @property
    def ttl(self) -> float:
        return self._read.ttl

    @property
    def backend(self) -> Backend:
        return self._read.backend

    def read(
        self,
        *,
        timeout: float | None = None,
        auto_renew: bool = True,
        max_hold: float | None = None,
    ) -> Hold:
        """``async with rw.read() as lease:`` runs the block as one of the readers; the
        options are ``arl.lock``'s."""
        return Hold._create(self._read, check_timeout(timeout), auto_renew, max_hold)

    def write(
        self,
        *,
        timeout: float | None = None,
        auto_renew: bool = True,
        max_hold: float | None = None,
    ) -> Hold:
        """``async with rw.write() as lease:`` runs the block as the one writer (no reader
        holds meanwhile); the options are ``arl.lock``'s."""
        return Hold._create(self._write, check_timeout(timeout), auto_renew, max_hold)

    async def acquire_read(self, timeout: float | None = None) -> Lease:
        """Wait to read and return the ``Lease`` (``timeout`` as ``Lock.acquire``'s)."""
        return await self._read.acquire(timeout)

    async def acquire_write(self, timeout: float | None = None) -> Lease:
        """Wait to write and return the ``Lease`` (``timeout`` as ``Lock.acquire``'s)."""
        return await self._write.acquire(timeout)

    async def state(self) -> RWState:
        """Its readers, writer and waiting writers now (never a token)."""
        backend = self._read.backend
        keys = self._read._names(backend).acquire_keys
        readers, fence, ttl_ms, waiting = await backend._run(_scripts.RWLOCK_STATE, keys, ())
        ttl = None if int(ttl_ms) < 0 else int(ttl_ms) / 1000
        return RWState(int(readers), int(fence), ttl, int(waiting))

    async def locked(self) -> bool:
        """Whether anyone holds it now, to read or to write."""
        found = await self.state()
        return found.readers > 0 or found.writer_ttl is not None

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self.name!r} ttl={self.ttl}>"
