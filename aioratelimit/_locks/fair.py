"""Fair locks: waiters served in the order they came, across processes, and only the next
one woken.

A ``FairLock`` is a ``Lock`` (same value, fence, tombstones, renewal and release) whose
waiters stand in a queue in Redis (``lua/fair_*.lua``: arrival numbers and heartbeat
deadlines, beside the lock's key, under one hash tag). The lock goes to whoever heads the
queue when it is free; a release wakes that one alone, on a channel of its own (the prefix
``:wake:`` plus its token), so a release costs one wake-up and one try whatever the number
of waiters, and no waiter here stands in a process-local line: each one is in the queue
itself, which keeps the order across processes.

Each waiter asks again every ``heartbeat / 3`` seconds (and at once when woken), which
renews its place; one that stops asking (its process crashed or hangs) is dropped
``heartbeat`` seconds after its last try at most, and the waiter behind it (asking on its
own timer) gets the lock at its next try: a vanished waiter delays the others by at most
``heartbeat`` + ``heartbeat / 3``. A waiter that gives up (timeout, cancellation) leaves the
queue at once (a release of its token, which also wakes the next one if the lock is free).
``acquire(timeout=0)`` tries once and never queues: it is refused while anyone waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .. import _keys, _scripts
from .._aio import cancel_requested
from .._args import check_seconds, to_ms
from .._backend import Backend, get_backend
from .._errors import LockTimeout
from .._scripts import Arg, Reply
from .._stores.confirm import DEFAULT_REPLICAS_TIMEOUT
from .lease import Hold, Names
from .lock import MIN_WAIT, _Resource

#: How long a waiter keeps its place without asking again (seconds), by default.
HEARTBEAT = 3.0


class FairLock(_Resource):
    """A named distributed lock whose waiters get it in the order they asked, across
    processes (first come, first served), each woken alone when its turn comes.

    ``ttl`` as for ``Lock``; ``heartbeat``: seconds a waiter keeps its place in the queue
    without asking again (it asks every third of it): a waiter that vanished is skipped
    after that long at most. ``async with arl.fair_lock(name)`` acquires, renews and
    releases a lease as ``arl.lock`` does.
    """

    __slots__ = ("heartbeat",)
    _kind = "fair_lock"
    _exclusive = True
    _withdraw = True
    _acquire_script = _scripts.FAIR_ACQUIRE
    _release_script = _scripts.FAIR_RELEASE
    _extend_script = _scripts.LOCK_EXTEND  # (reads the lock's key, the first)

    def __init__(
        self,
        name: str,
        ttl: float = 30.0,
        backend: Backend | None = None,
        *,
        heartbeat: float = HEARTBEAT,
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
        aof: bool = False,
    ) -> None:
        super().__init__(name, ttl, backend, replicas, replicas_timeout, aof)
        self.heartbeat = check_seconds(heartbeat, "heartbeat")

    def _build_keys(self, backend: Backend) -> tuple[list[str], list[str], str]:
        keys, channel = _keys.fair(backend._head(_keys.FAIR_KIND), self.name)
        return keys, keys, channel

    def _acquire_args(self, token: str, ttl_ms: int, waits: bool) -> tuple[Arg, ...]:
        return (token, ttl_ms, to_ms(self.heartbeat) if waits else 0)

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
        """Ask (which queues it), then wait on its own channel, asking again when woken or
        every heartbeat/3, until it gets the lock or ``timeout`` has passed. The first try
        comes before it subscribes (no wait: no subscription); refused, it subscribes and
        asks again at once, so a wake-up sent meanwhile is not lost."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        every = self.heartbeat / 3
        bound.reschedule(limit)
        sent = loop.time()
        reply = await self._attempt(backend, names, args, base, limit)
        if reply[0] == 1:
            return sent, reply
        async with backend._notifier.subscribe(names.channel + str(args[0])) as sub:
            while True:
                sent = loop.time()
                reply = await self._attempt(backend, names, args, base, limit)
                if reply[0] == 1:
                    return sent, reply
                bound.reschedule(None)  # (no call in flight while it sleeps)
                hint = int(reply[1])
                sleep = every if hint < 0 else min(max((hint + 1) / 1000, MIN_WAIT), every)
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        raise LockTimeout(name=self.name, timeout=timeout)
                    if left < sleep:
                        # The timeout ends first: only a wake-up makes a try worth it.
                        if not await sub.wait(left):
                            raise LockTimeout(name=self.name, timeout=timeout)
                        cancel_requested(base)
                        bound.reschedule(limit)
                        continue
                await sub.wait(sleep)
                cancel_requested(base)
                bound.reschedule(limit)

    async def locked(self) -> bool:
        """Whether anyone holds the lock now."""
        backend = self._backend or get_backend()
        keys = self._names(backend).owner_keys[:1]
        return bool(await backend._run(_scripts.LOCK_LOCKED, keys, ()) == 1)

    async def waiters(self) -> int:
        """How many waiters keep their place in the queue now (in every process)."""
        backend = self._backend or get_backend()
        keys = self._names(backend).owner_keys
        return int((await backend._run(_scripts.FAIR_STATE, keys, ()))[3])

    def __repr__(self) -> str:
        return f"<FairLock {self.name!r} ttl={self.ttl} heartbeat={self.heartbeat}>"


def fair_lock(
    name: str,
    ttl: float = 30.0,
    timeout: float | None = None,
    auto_renew: bool = True,
    backend: Backend | None = None,
    *,
    heartbeat: float = HEARTBEAT,
    max_hold: float | None = None,
    replicas: int = 0,
    replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    aof: bool = False,
) -> Hold:
    """``async with arl.fair_lock(name) as lease:`` runs the block holding the fair lock
    ``name``, once every waiter that came before has had it; otherwise like ``arl.lock``
    (``replicas=`` too)."""
    lock = FairLock(
        name,
        ttl,
        backend,
        heartbeat=heartbeat,
        replicas=replicas,
        replicas_timeout=replicas_timeout,
        aof=aof,
    )
    return Hold._create(lock, timeout, auto_renew, max_hold)
