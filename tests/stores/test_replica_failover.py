"""A Sentinel failover that loses a lock, forced, and what ``replicas=`` does about it.

A master with two replicas and three sentinels. The write is made certain to be lost: the
replica that will be promoted stops replicating just before client A acquires (``REPLICAOF
NO ONE``: it keeps every earlier write, none later), and the other replica can never be
promoted (``replica-priority 0``). Then the master is killed by its PID, the sentinels
promote the detached replica, and client B acquires the same lock there while A still
believes it holds it. The checker (support/holds.py) reads the overlaps from the holds
both clients recorded on their own monotonic clock:

- without the option: one overlap (A's hold and B's);
- ``replicas=2`` (every replica): A's acquire is not confirmed (one of two), so it is
  given back and raises ``NotReplicated``: A never holds, no overlap;
- ``replicas=1``: what remains. The replica that acknowledged (priority 0) is not the one
  promoted: A's acquire is confirmed, yet the promoted replica never had it: one overlap.
  WAIT is not consensus.

Each case starts a group of its own (the failover spends it). The long run, with clients in
a loop and the master killed again and again, is benchmarks/failover_holds.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from support.cluster_fixtures import SERVICE, SentinelDeployment, wait_until
from support.holds import Hold, Run

import aioratelimit as arl

pytestmark = [pytest.mark.slow, pytest.mark.sentinel]

#: How long a failover may take to finish, at most (seconds; it takes 2 to 4).
PROMOTION = 30.0


@pytest.fixture
def group() -> Iterator[SentinelDeployment]:
    """A master, two replicas (the second never promoted), three sentinels."""
    deployment = SentinelDeployment(replicas=2)
    deployment.replicas[1].extra += ("--replica-priority", "0")
    deployment.start()
    try:
        yield deployment
    finally:
        deployment.stop()


def _promoted(group: SentinelDeployment, port: int) -> bool:
    """Whether every sentinel names the server on ``port`` as the master, and it says so."""
    try:
        for sentinel in group.sentinels:
            with sentinel.client() as client:
                _host, named = client.execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
                )
            if int(named) != port:
                return False
        with redis.Redis(port=port, socket_timeout=1) as client:
            return bool(client.info("replication")["role"] == "master")
    except (redis.RedisError, OSError, RuntimeError):
        return False


async def acquire_after_failover(lock: arl.Lock) -> arl.Lease:
    """``lock`` acquired on the new master: a call that finds no master yet (a sentinel
    still switching) is made again, until ``PROMOTION`` has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROMOTION
    while True:
        try:
            return await lock.acquire(timeout=PROMOTION)
        except arl.BackendUnavailable:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def lose_the_lock(group: SentinelDeployment, replicas: int) -> Run:
    """Client A acquires (with ``replicas``, unless 0) on a master whose promotable replica has
    stopped replicating; the master is killed; client B acquires on the promoted replica;
    then A releases. What both recorded."""
    run = Run(f"replicas={replicas}" if replicas else "no option")
    name = f"jepsen-{uuid.uuid4().hex[:8]}"
    promoted = group.replicas[0]
    with promoted.client() as admin:
        admin.execute_command("REPLICAOF", "NO", "ONE")  # keeps all it has, gets no more
    a = arl.Backend.from_url(group.url)
    b = arl.Backend.from_url(group.url)
    try:
        lease: arl.Lease | None = None
        try:
            lease = await arl.Lock(name, ttl=60, backend=a, replicas=replicas).acquire(timeout=0)
        except arl.NotReplicated as exc:
            run.error(exc)
        start_a = time.monotonic()
        group.master.kill()  # SIGKILL by PID
        await asyncio.to_thread(
            wait_until, lambda: _promoted(group, promoted.port), PROMOTION, "the promotion"
        )
        run.failovers += 1
        taken = await acquire_after_failover(arl.Lock(name, ttl=60, backend=b))
        start_b = time.monotonic()
        if lease is not None:
            end_a = time.monotonic()  # A gives it up only now
            try:
                await lease.release()
            except arl.AioRateLimitError as exc:  # LockNotOwned: the key is B's there
                run.error(exc)
            run.holds.append(Hold(start_a, end_a, "A", lease.fencing_token))
        end_b = time.monotonic()
        await taken.release()
        run.holds.append(Hold(start_b, end_b, "B", taken.fencing_token))
    finally:
        await a.aclose()
        await b.aclose()
    return run


async def test_the_failover_loses_the_lock_without_the_option(
    group: SentinelDeployment,
) -> None:
    run = await lose_the_lock(group, 0)
    (overlap,) = run.overlaps
    assert (overlap.first.client, overlap.second.client) == ("A", "B")
    # Fences are drawn from the server's clock: the promoted replica's is still higher,
    # so a fenced resource would stop A once B has written.
    assert overlap.fenced
    assert run.errors == {"LockNotOwned": 1}


async def test_confirmed_by_every_replica_nothing_is_lost(group: SentinelDeployment) -> None:
    run = await lose_the_lock(group, 2)
    assert run.errors == {"NotReplicated": 1}  # given back: A never held it
    assert [h.client for h in run.holds] == ["B"]
    assert run.overlaps == []


async def test_a_replica_that_acknowledged_but_was_not_promoted(
    group: SentinelDeployment,
) -> None:
    """What remains: WAIT counts replicas, it does not choose the one promoted."""
    run = await lose_the_lock(group, 1)
    assert len(run.overlaps) == 1
