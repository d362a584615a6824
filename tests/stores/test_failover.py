"""Failover on real deployments: a master is SIGKILLed while limiter hits, lock acquisitions
and token consumptions run through one Backend, and the same Backend carries on once a
replica is promoted.

Each deployment kind (a 3+3 Redis Cluster, a Sentinel group) is started privately for this
module, so the shared session deployments stay healthy. The scenario runs once per kind (a
module fixture) and records every call; the tests below each assert one property of that
record. Every call is bounded (a generous 20 s guard; a call that hits it is a hang).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from support.cluster_fixtures import RedisClusterDeployment, SentinelDeployment
from test_cluster import publish

import aioratelimit as arl
from aioratelimit._stores.subscription import Subscription

pytestmark = pytest.mark.slow

#: A call that takes longer than this is recorded as a hang.
GUARD = 20.0
#: Each primitive must succeed this many times after the promotion, on the same Backend.
AFTER = 10
#: The whole scenario gives up after this long (seconds).
DEADLINE = 60.0

#: Outcomes that are answers, not failures: a lock whose key the failover lost (or that could
#: not be renewed through the window), or that is held by a lease whose release the failover
#: swallowed, is reported as such.
LOCK_ANSWERS = (arl.LockLost, arl.LockNotOwned, arl.LockTimeout)
LOCK_NAMES = {exc.__name__ for exc in LOCK_ANSWERS}


@dataclass
class Record:
    """Everything one primitive's workers saw."""

    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    others: list[str] = field(default_factory=list)  # unexpected exceptions, repr'd
    longest: float = 0.0
    after: int = 0  # successes that started after the promotion


@dataclass
class Report:
    kind: str
    records: dict[str, Record]
    fences: list[int]
    killed_at: float
    promoted_at: float | None
    finished: bool
    #: after the recovery: seconds until a waiter on the failed shard heard a publish
    woken_after: float | None


class Workload:
    """Runs the primitives in loops, classifying every call, until stopped."""

    def __init__(self, backend: arl.Backend, name: str) -> None:
        self.backend = backend
        self.name = name
        self.records = {p: Record() for p in ("limiter", "lock", "tokens", "waiters")}
        self.fences: list[int] = []
        self.promoted_at: float | None = None
        self.stop = asyncio.Event()

    async def call(self, what: str, op: Callable[[], Awaitable[Any]]) -> Any:
        record = self.records[what]
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(op(), GUARD)
        except TimeoutError:
            record.outcomes["hang"] += 1
            return None
        except arl.BackendUnavailable:
            record.outcomes["BackendUnavailable"] += 1
            return None
        except LOCK_ANSWERS as exc:
            record.outcomes[type(exc).__name__] += 1
            return None
        except Exception as exc:
            record.outcomes["other"] += 1
            record.others.append(repr(exc))
            return None
        finally:
            record.longest = max(record.longest, time.monotonic() - started)
        record.outcomes["ok"] += 1
        if self.promoted_at is not None and started > self.promoted_at:
            record.after += 1
        return result

    async def limiter(self, keys: list[str]) -> None:
        limiter = arl.FixedWindow("1000000/hour", backend=self.backend)
        i = 0
        while not self.stop.is_set():
            await self.call("limiter", functools.partial(limiter.hit, keys[i % len(keys)]))
            i += 1
            await asyncio.sleep(0.005)

    async def fenced_lock(self) -> None:
        """One worker, so its fences are in acquisition order."""
        lk = arl.Lock(self.name, ttl=1.0, backend=self.backend)
        while not self.stop.is_set():
            lease = await self.call("lock", lambda: lk.acquire(timeout=5.0))
            if lease is not None:
                self.fences.append(lease.fencing_token)
                await self.call("lock", lease.release)
            await asyncio.sleep(0.005)

    async def contended_lock(self, name: str) -> None:
        """Two of these share a lock, so one waits on the other's wake-up."""
        while not self.stop.is_set():

            async def hold() -> None:
                async with arl.lock(name, ttl=1.0, timeout=5.0, backend=self.backend):
                    await asyncio.sleep(0.01)

            await self.call("waiters", hold)
            await asyncio.sleep(0.005)

    async def tokens(self) -> None:
        while not self.stop.is_set():
            token = await self.call("tokens", lambda: arl.issue_token(ttl=60, backend=self.backend))
            if token is not None:
                consumed = await self.call(
                    "tokens", functools.partial(arl.consume_token, token, backend=self.backend)
                )
                if consumed is False:
                    self.records["tokens"].others.append("a fresh token was not consumed")
            await asyncio.sleep(0.005)

    def done(self) -> bool:
        return self.promoted_at is not None and all(r.after >= AFTER for r in self.records.values())


async def run_scenario(
    kind: str,
    url: str,
    limiter_keys: list[str],
    lock_name: str,
    kill: Callable[[], None],
    promoted: Callable[[], bool],
) -> Report:
    backend = arl.Backend.from_url(url, timeout=2.0, connect_timeout=1.0)
    work = Workload(backend, lock_name)
    waiters_name = f"{lock_name}-w"
    tasks = [
        asyncio.create_task(work.limiter(limiter_keys)),
        asyncio.create_task(work.fenced_lock()),
        asyncio.create_task(work.contended_lock(waiters_name)),
        asyncio.create_task(work.contended_lock(waiters_name)),
        asyncio.create_task(work.tokens()),
    ]
    finished = False
    woken_after = None
    # A waiter on the victim's shard, subscribed before the kill and kept across it.
    probe = f"arl:probe:{{{lock_name}}}:wake"
    sub = backend._notifier.subscribe(probe)
    await sub.__aenter__()
    try:
        await asyncio.sleep(1.0)  # every primitive running before the kill
        # ...and each has succeeded (a loaded machine may need longer: the fences would
        # then all come from after the kill, and "across the failover" go untested).
        ready = time.monotonic() + 30
        while not all(r.outcomes["ok"] for r in work.records.values()):
            assert time.monotonic() < ready, {k: r.outcomes for k, r in work.records.items()}
            await asyncio.sleep(0.05)
        killed_at = time.monotonic()
        await asyncio.to_thread(kill)
        deadline = killed_at + DEADLINE
        while time.monotonic() < deadline:
            if work.promoted_at is None and await asyncio.to_thread(promoted):
                work.promoted_at = time.monotonic()
            if work.done():
                finished = True
                break
            await asyncio.sleep(0.1)
        if finished:
            woken_after = await wake_probe(backend, lock_name, probe, sub)
    finally:
        await sub.__aexit__(None, None, None)
        work.stop.set()
        await asyncio.wait(tasks, timeout=GUARD + 5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await backend.aclose()
    return Report(
        kind, work.records, work.fences, killed_at, work.promoted_at, finished, woken_after
    )


async def wake_probe(
    backend: arl.Backend, tag: str, channel: str, sub: Subscription
) -> float | None:
    """Publish on the failed shard's channel (again every 0.2 s) until the waiter subscribed
    before the kill hears it (its subscriber had to find the promoted master); None after
    10 s."""
    started = time.monotonic()
    while time.monotonic() - started < 10.0:
        with contextlib.suppress(arl.BackendUnavailable):
            await publish(backend, tag, channel)
        if await sub.wait(0.2):
            return time.monotonic() - started
    return None


def _cluster_promoted(cluster: RedisClusterDeployment, slot: int, victim: int) -> bool:
    try:
        for port in cluster.live_ports():
            with redis.Redis(port=port, socket_timeout=1) as client:
                if client.cluster("info")["cluster_state"] != "ok":
                    return False
        return cluster.master_for_slot(slot) != victim
    except (redis.RedisError, OSError):
        return False


@pytest.fixture(scope="module")
def cluster_failover() -> Iterator[Report]:
    """The scenario on a private cluster: the master of the lock's slot is killed."""
    cluster = RedisClusterDeployment().start()
    try:
        lock_name = f"fo-{uuid.uuid4().hex[:8]}"
        slot = key_slot(lock_name.encode())
        victim = cluster.master_for_slot(slot)
        # Half the limiter keys on the victim's slot, the rest wherever they fall.
        keys = [lock_name] * 4 + [uuid.uuid4().hex for _ in range(12)]
        yield asyncio.run(
            run_scenario(
                "cluster",
                cluster.url,
                keys,
                lock_name,
                kill=cluster.node(victim).kill,
                promoted=lambda: _cluster_promoted(cluster, slot, victim),
            )
        )
    finally:
        cluster.stop()


def _sentinel_promoted(group: SentinelDeployment, victim: int) -> bool:
    try:
        port = group.master_port()
        if port == victim:
            return False
        with redis.Redis(port=port, socket_timeout=1) as client:
            return bool(client.info("replication")["role"] == "master")
    except (redis.RedisError, OSError, RuntimeError):
        return False


@pytest.fixture(scope="module")
def sentinel_failover() -> Iterator[Report]:
    """The scenario on a private Sentinel group: its master is killed."""
    group = SentinelDeployment().start()
    try:
        victim = group.master_port()
        lock_name = f"fo-{uuid.uuid4().hex[:8]}"
        keys = [uuid.uuid4().hex for _ in range(8)]
        yield asyncio.run(
            run_scenario(
                "sentinel",
                group.url,
                keys,
                lock_name,
                kill=group.master.kill,
                promoted=lambda: _sentinel_promoted(group, victim),
            )
        )
    finally:
        group.stop()


@pytest.fixture(params=["cluster", "sentinel"])
def deployment(request: pytest.FixtureRequest) -> str:
    """Each deployment kind the scenario runs on (conftest marks the test by it)."""
    return str(request.param)


@pytest.fixture
def report(deployment: str, request: pytest.FixtureRequest) -> Report:
    """The record of the failover scenario on each deployment kind."""
    result: Report = request.getfixturevalue(f"{deployment}_failover")
    window = None if result.promoted_at is None else result.promoted_at - result.killed_at
    print(
        f"\n{result.kind}: promoted {window and round(window, 2)} s after the kill;"
        f" probe woken after {result.woken_after and round(result.woken_after, 2)} s"
    )
    for name, record in result.records.items():
        print(f"  {name}: {dict(record.outcomes)} longest {record.longest:.2f} s")
    return result


def test_a_replica_is_promoted_and_every_primitive_recovers(report: Report) -> None:
    """After the kill a replica is promoted, and limiter hits, lock acquisitions (fenced and
    contended) and token issue/consume all succeed again on the same Backend."""
    assert report.promoted_at is not None, "no replica was promoted"
    afters = {name: r.after for name, r in report.records.items()}
    assert report.finished, f"not every primitive recovered: successes after promotion {afters}"


def test_failures_surface_only_as_backend_unavailable(report: Report) -> None:
    """During the window every failure is BackendUnavailable (or a lock answering for a lock
    the failover lost); no other exception type, no hang."""
    for name, record in report.records.items():
        assert record.others == [], f"{name}: {record.others[:5]}"
        assert set(record.outcomes) <= {"ok", "BackendUnavailable", *LOCK_NAMES}, (
            name,
            record.outcomes,
        )
        assert record.outcomes["hang"] == 0, (name, record.outcomes)


def test_wake_ups_reach_waiters_after_the_failover(report: Report) -> None:
    """The backend's subscriber finds the promoted master: a waiter subscribed on the failed
    shard's channel before the kill is woken by a script's publish after the recovery."""
    assert report.finished
    assert report.woken_after is not None, "the waiter never heard a publish"
    assert report.woken_after < 10.0


def test_every_call_is_bounded(report: Report) -> None:
    """No call took longer than a few timeouts (2 s each), even while the master was gone."""
    longest = {name: round(r.longest, 2) for name, r in report.records.items()}
    assert max(longest.values()) < 12.0, longest


def test_fences_strictly_increase_across_the_failover(report: Report) -> None:
    """The fencing tokens of one lock, in acquisition order, strictly increase across the
    failover, although the promoted replica may have missed the last fence writes."""
    fences = report.fences
    assert len(fences) > 2 * AFTER
    assert all(a < b for a, b in itertools.pairwise(fences)), [
        (a, b) for a, b in itertools.pairwise(fences) if a >= b
    ]
