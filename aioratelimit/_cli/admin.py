"""What an operator reads and forces (the ``aioratelimit`` command): the typed entry points
of the scripts that show a lock's holder, a semaphore's holders, an idempotency key's
state and a server's facts, and the one that frees a lock whose holder crashed.

Every read is a script that writes nothing; none of them ever sends a holder's token or an
owner's token back (they would let the reader release what it does not hold), and a stored
idempotency result only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _keys, _scripts
from .._args import check_key, from_us
from .._backend import Backend
from .._idempotency.store import IdempotencyStore
from .._limits.limiter import Limiter
from .._locks.fair import FairLock
from .._locks.leader import Leader
from .._locks.lock import Lock, Semaphore
from .._scripts import IdemState


def _ttl(pttl_ms: int) -> float | None:
    """A PTTL reply in seconds; ``None`` for a key without an expiry (-1) or missing (-2)."""
    return pttl_ms / 1000 if pttl_ms >= 0 else None


async def blocked_for(limiter: Limiter, key: str) -> tuple[float, int]:
    """How long ``limiter.block(key, ...)`` still denies ``key`` (seconds, 0.0 when no block
    runs) and the server clock (µs) it was read at (``limiter_blocked``: reads only)."""
    check_key(key)
    backend = limiter.backend
    head = backend._head(limiter._kind, limiter.name)
    block = _keys.block(head, key, limiter._tag(key))  # (under its hash_tag=, if made with one)
    left, now = await backend._run(_scripts.LIMITER_BLOCKED, [block], ())
    return from_us(int(left)), int(now)


@dataclass(frozen=True, slots=True)
class Holder:
    """One holder of a lock or of a semaphore slot."""

    fence: int  # its fencing token
    ttl: float | None  # seconds its hold still lasts (None: no TTL)


@dataclass(frozen=True, slots=True)
class LockState:
    """A lock now: its holder, or None and the last holder's fence (0: none known)."""

    holder: Holder | None
    last_fence: int


async def lock_state(lock: Lock) -> LockState:
    """Who holds ``lock`` now (``lock_holder``: reads only)."""
    backend = lock.backend
    held, fence, pttl = await backend._run(
        _scripts.LOCK_HOLDER, lock._names(backend).owner_keys, ()
    )
    holder = Holder(int(fence), _ttl(int(pttl))) if held == 1 else None
    return LockState(holder, int(fence))


@dataclass(frozen=True, slots=True)
class LeaderState:
    """A leader election now: whether someone leads, the epoch and identity of its leader
    (or of the last one, after a resignation: 0 and b"" when none is on record), and how
    long the term (or that record) still lasts (None: no TTL)."""

    leads: bool
    epoch: int
    identity: bytes
    ttl: float | None


async def leader_state(leader: Leader) -> LeaderState:
    """Who leads ``leader`` now, or led it last (``leader_state``: reads only)."""
    backend, names = leader._backend()
    leads, epoch, pttl, who = await backend._run(_scripts.LEADER_STATE, names.owner_keys, ())
    identity = who if isinstance(who, bytes) else str(who).encode()
    return LeaderState(leads == 1, int(epoch), identity, _ttl(int(pttl)))


async def semaphore_state(sem: Semaphore) -> list[Holder]:
    """The live holders of ``sem``, soonest to expire first (``semaphore_list``)."""
    backend = sem.backend
    reply = await backend._run(_scripts.SEMAPHORE_LIST, sem._names(backend).acquire_keys, ())
    pairs = [int(v) for v in reply]
    return [Holder(pairs[i], pairs[i + 1] / 1000) for i in range(0, len(pairs), 2)]


async def fair_state(lock: FairLock) -> tuple[LockState, int]:
    """A fair lock's holder and how many waiters keep their place (``fair_state``)."""
    backend = lock.backend
    held, fence, pttl, waiters = await backend._run(
        _scripts.FAIR_STATE, lock._names(backend).owner_keys, ()
    )
    holder = Holder(int(fence), _ttl(int(pttl))) if held == 1 else None
    return LockState(holder, int(fence)), int(waiters)


async def force_release(lock: Lock, fence: int | None = None) -> int | None:
    """Free ``lock`` whatever token holds it, waking its waiters as a release does
    (``lock_force_release``); with ``fence``, only if its holder is still that one.
    Returns the fence of the holder it freed, or None when it freed nothing (nobody held
    it, or another holder than ``fence`` does): then nothing was written."""
    backend = lock.backend
    names = lock._names(backend)
    expected = "" if fence is None else str(fence)
    released, freed = await backend._run(
        _scripts.LOCK_FORCE_RELEASE, names.owner_keys, (names.channel, names.publish, expected)
    )
    return int(freed) if released == 1 else None


@dataclass(frozen=True, slots=True)
class IdempotencyState:
    """An idempotency key now (``IdemState``), how long its record lives, how long the
    running call's lease still runs, and its stored result when it was asked for."""

    state: IdemState
    ttl: float | None
    lease_left: float
    result: bytes | None


async def idempotency_state(
    key: str, *, backend: Backend, name: str | None = None, with_result: bool = False
) -> IdempotencyState:
    """The record of idempotency ``key`` under ``name`` (``idem_state``: reads only)."""
    check_key(key)
    record, _ = IdempotencyStore(backend, name=name)._keys(backend, key)
    code, pttl, left, result = await backend._run(
        _scripts.IDEM_STATE, (record,), ("1" if with_result else "0",)
    )
    state = IdemState(int(code))
    if isinstance(result, str):
        result = result.encode()
    shown = bytes(result) if with_result and state is IdemState.COMPLETED else None
    return IdempotencyState(state, _ttl(int(pttl)), from_us(int(left)), shown)


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What ``server_check`` learns from the server that owns a probe key."""

    time_us: int  # its clock (TIME)
    version: str  # INFO's redis_version ('' if a script cannot run INFO, or memory://)
    mode: str  # INFO's redis_mode: standalone, cluster, sentinel ('' as above)
    undeclared_keys: bool  # whether a script may touch a key it did not declare


#: The kind of key ``server_check`` probes (it never writes one).
PROBE_KIND = "doctor"


async def server_facts(backend: Backend, tag: str) -> ServerFacts:
    """Ask the server that owns hash tag ``tag`` (``server_check``: reads only)."""
    head = backend._head(PROBE_KIND)
    keys = (_keys.tagged(head, tag, ":declared"),)
    reply = await backend._run(
        _scripts.SERVER_CHECK, keys, (_keys.tagged(head, tag, ":undeclared"),)
    )
    seconds, micros, version, mode, undeclared = reply

    def text(value: object) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    return ServerFacts(
        int(seconds) * 1_000_000 + int(micros), text(version), text(mode), undeclared == 1
    )
