"""``lock()`` and ``semaphore()``: a ``Lock`` or a ``Semaphore`` held for the length of an
``async with`` block (a ``Hold``: acquired on entry, renewed while the block runs, released
on the way out)."""

from __future__ import annotations

from .._backend import Backend
from .._stores.confirm import DEFAULT_REPLICAS_TIMEOUT
from .lease import Hold
from .lock import Lock, Semaphore


def lock(
    name: str,
    ttl: float = 30.0,
    timeout: float | None = None,
    auto_renew: bool = True,
    backend: Backend | None = None,
    *,
    replicas: int = 0,
    replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    aof: bool = False,
    max_hold: float | None = None,
) -> Hold:
    """``async with arl.lock(name) as lease:`` runs the block holding the lock ``name``.

    ``ttl``: seconds the lock lives without renewal. ``timeout``: seconds to wait for it
    (``None`` forever, ``0`` one try), then ``LockTimeout``. With ``auto_renew`` the lease is
    extended every ttl/3 while the block runs; if it is lost anyway, the block is cancelled
    and ``LockLost`` raised out of the ``async with``. ``max_hold``: seconds after which
    renewal stops and the block is cancelled (``LockLost``) and the lock released, however
    long the block would run (``None``: no bound; needs ``auto_renew``).

    ``replicas=N``: every acquire and renewal waits until N replicas have the write
    (``WAIT``, at most ``replicas_timeout`` seconds, below the backend's ``timeout``);
    ``aof=True``: until it is in the master's append-only file and N replicas' too
    (``WAITAOF``, Redis 7.2+). An acquire that is not confirmed gives the lock back and
    raises ``NotReplicated`` (docs/locks.md says what it guards against and what not).
    ``ValueError`` on memory://, which has no replicas.
    """
    lock = Lock(name, ttl, backend, replicas=replicas, replicas_timeout=replicas_timeout, aof=aof)
    return Hold._create(lock, timeout, auto_renew, max_hold)


def semaphore(
    name: str,
    limit: int = 5,
    ttl: float = 30.0,
    timeout: float | None = None,
    auto_renew: bool = True,
    backend: Backend | None = None,
    *,
    replicas: int = 0,
    replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    aof: bool = False,
    max_hold: float | None = None,
) -> Hold:
    """``async with arl.semaphore(name, limit=5) as lease:`` runs the block as one of at most
    ``limit`` holders; otherwise exactly like ``lock`` (``replicas=`` and ``max_hold`` too)."""
    resource = Semaphore(
        name, limit, ttl, backend, replicas=replicas, replicas_timeout=replicas_timeout, aof=aof
    )
    return Hold._create(resource, timeout, auto_renew, max_hold)
