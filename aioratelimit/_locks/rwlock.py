"""Read/write locks: many readers or one writer, writer-preferring, fenced across both modes.

A ``ReadWriteLock`` is a description, as a ``Lock`` is; its two sides are ``_Resource``s
(``lock``) on the same keys (``lua/rwlock_*.lua``: a semaphore's holders and fences, and the
waiting writers' intents), so acquiring, renewal, wake-ups and cancellation work as they do
for a lock. Writers wait in a line in this process as a lock's waiters do (only its head
asks the server). Readers
never queue behind each other: a reader tries at once, beside any other; refused (a writer
holds it or waits), it waits at the process's reader gate (``_Gate``), where one reader
sleeps on the wake-up channel for all of them, and when a writer leaves (a release says
``WRITER_LEFT``) every reader waiting there tries at once, side by side. A reader's release
wakes no reader (it cannot let one in), so readers waiting for a writer cost the server
one try per fallback timer, not one per release.

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
import weakref
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

from .. import _keys, _scripts
from .._aio import cancel_requested
from .._args import check_timeout, to_ms
from .._backend import Backend, get_backend
from .._errors import LockTimeout
from .._scripts import Arg, Reply
from .._stores.confirm import DEFAULT_REPLICAS_TIMEOUT
from .._stores.notify import Notifier
from .._stores.subscription import Subscription
from .lease import _HELD, Hold, Lease, Names
from .lock import FALLBACK_WAIT, _Resource, _wait_time

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


#: ``replicas``, ``replicas_timeout`` and ``aof`` of a read/write lock (as ``Lock`` takes them)
Replicated = tuple[int, float, bool]


class _Side(_Resource):
    """One mode of a read/write lock: the resource its leases hold."""

    __slots__ = ("_mode",)
    _kind = "rwlock"
    _acquire_script = _scripts.RWLOCK_ACQUIRE
    _release_script = _scripts.RWLOCK_RELEASE
    _extend_script = _scripts.SEMAPHORE_EXTEND  # (reads the same holders and fences)

    def __init__(
        self, name: str, ttl: float, backend: Backend | None, mode: str, confirmed: Replicated
    ) -> None:
        super().__init__(name, ttl, backend, *confirmed)
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
        """Try at once, beside any other reader; refused (a writer holds it or waits), wait
        at the process's reader gate (``_Gate``) and try again each time it opens, until
        admitted or ``timeout`` has passed. ``bound`` (ending at ``limit``) is armed while
        it talks to the server."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        bound.reschedule(limit)
        sent = loop.time()
        reply = await self._attempt(backend, names, args, base, limit)
        if reply[0] == 1:
            return sent, reply
        gate = _gate(backend._notifier, names.channel)
        gate.waiting += 1
        try:
            while True:
                if gate.leader is None:
                    # The gate's one sleeper: subscribed (confirmed before its next try), it
                    # tries on its fallback timer and opens the gate for all when a writer
                    # leaves (or its own try got in).
                    gate.leader = me = asyncio.current_task()
                    try:
                        if not gate.subscribed:
                            await gate.sub.__aenter__()
                            gate.subscribed = True
                        sent, reply = await self._lead(backend, names, args, base, limit, deadline)
                    finally:
                        # In (the others try now), out of time, cancelled or failed: the
                        # others try, and one of those still refused takes over.
                        if gate.leader is me:
                            gate.leader = None
                        gate.open()
                    if reply[0] == 1:
                        return sent, reply
                    raise LockTimeout(name=self.name, timeout=timeout)
                bound.reschedule(None)
                if not await gate.wait(deadline):
                    raise LockTimeout(name=self.name, timeout=timeout)
                cancel_requested(base)
                bound.reschedule(limit)
                sent = loop.time()
                reply = await self._attempt(backend, names, args, base, limit)
                if reply[0] == 1:
                    return sent, reply
        finally:
            gate.leave()

    async def _lead(
        self,
        backend: Backend,
        names: Names,
        args: Sequence[Arg],
        base: int,
        limit: float | None,
        deadline: float | None,
    ) -> tuple[float, Reply]:
        """The leader's loop: try, then sleep until a writer's release (``WRITER_LEFT``)
        opens the gate or the fallback timer ends; its reply when it got in, or the last
        refusal once ``deadline`` has passed."""
        loop = asyncio.get_running_loop()
        gate = _gate(backend._notifier, names.channel)
        while True:
            sent = loop.time()
            reply = await self._attempt(backend, names, args, base, limit)
            if reply[0] == 1:
                return sent, reply
            wake = loop.time() + _wait_time(int(reply[1]))
            while True:
                end = wake if deadline is None else min(wake, deadline)
                now = loop.time()
                if end <= now:
                    break
                if await gate.sub.wait(end - now) and gate.sub.message == WRITER_LEFT:
                    gate.open()  # every reader waiting here may get in: all try at once
                    break
            cancel_requested(base)
            if deadline is not None and loop.time() >= deadline:
                return sent, reply


class _WriteSide(_Side):
    __slots__ = ()
    _exclusive = True
    _withdraw = True


#: What a release publishes when a writer (or a waiting writer's intent) left: only then
#: may readers refused before get in (a reader's release publishes nothing else).
WRITER_LEFT = b"w"


class _Gate:
    """The readers of one rw lock waiting in this process: one of them (the leader) sleeps
    on the wake-up channel and tries on its fallback timer; when a writer leaves (or the
    leader got in) it opens the gate and every reader waiting here tries at once, side by
    side, instead of one after another. A reader's release wakes no reader (its message
    is not ``WRITER_LEFT``): the waiters then send nothing."""

    __slots__ = ("_gates", "_key", "_opened", "leader", "sub", "subscribed", "waiting")

    def __init__(self, gates: dict[Hashable, _Gate], key: Hashable, sub: Subscription) -> None:
        self._gates = gates
        self._key = key
        self.sub = sub
        self.subscribed = False
        #: the reader that sleeps on ``sub`` (None: the next to wait takes over)
        self.leader: asyncio.Task[Any] | None = None
        self.waiting = 0
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def open(self) -> None:
        """Let every reader waiting at the gate try (a new gate for the next round)."""
        opened = self._opened
        self._opened = asyncio.get_running_loop().create_future()
        if not opened.done():
            opened.set_result(None)

    async def wait(self, deadline: float | None) -> bool:
        """Wait for the gate to open (True), or until the loop time ``deadline`` (False)."""
        # (asyncio.wait: a waiter cancelled here must not cancel the future all share)
        opened = self._opened
        left = None if deadline is None else deadline - asyncio.get_running_loop().time()
        if left is not None and left <= 0:
            return False
        done, _ = await asyncio.wait([opened], timeout=left)
        return bool(done)

    def leave(self) -> None:
        self.waiting -= 1
        if self.waiting == 0:
            if self.subscribed:
                self.subscribed = False
                self.sub.close()
            if self._gates.get(self._key) is self:
                del self._gates[self._key]

    def __repr__(self) -> str:
        return f"<reader gate {self.sub.channel!r} waiting={self.waiting}>"


#: per event loop: (notifier, channel) -> its reader gate
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, _Gate]] = (
    weakref.WeakKeyDictionary()
)


def _gate(notifier: Notifier, channel: str) -> _Gate:
    loop = asyncio.get_running_loop()
    gates = _gates.get(loop)
    if gates is None:
        gates = _gates[loop] = {}
    key = (notifier, channel)
    found = gates.get(key)
    if found is None:
        found = gates[key] = _Gate(gates, key, notifier.subscribe(channel))
    return found


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
        # ``replicas=``: each acquire in either mode, and each renewal, confirmed as a lock's
        confirmed = (replicas, replicas_timeout, aof)
        self._read = _ReadSide(name, ttl, backend, "r", confirmed)
        self._write = _WriteSide(name, ttl, backend, "w", confirmed)

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
