"""Network faults between the library and a real server, made by a proxy (``faultproxy``):
a blackhole, connections reset at random points (mid-reply, mid-batch), a reply swallowed
on a live connection; and faults of the server itself: a restart on the same port, a soak
of cancelled calls, maxmemory, CLIENT PAUSE.

Only the public API is used, so the tests mean the same whatever the transport underneath
(a connection per call, or many callers' commands pipelined on one socket, where a reset or
a lost reply hits a whole batch). Each pins invariants and counts; the only timings are
generous upper bounds ("raises within BOUND") and physical lower bounds (a pause).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import os
import random
import time
import tracemalloc
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from support.faultproxy import FaultProxy, Server, once_healthy, timed
from support.faultproxy import admin as _admin

import aioratelimit as arl

#: The backend's reply timeout and connect timeout in these tests (seconds).
TIMEOUT = 1.0
CONNECT_TIMEOUT = 0.5
#: The longest any one call may take under a fault. A lock acquire pays two round trips
#: (the acquire, then the release of its token in case the acquire ran), each bounded by
#: TIMEOUT; the rest is slack for a loaded 2-core machine.
BOUND = 3 * TIMEOUT + 2.0
#: A call still running after this long hangs: it fails here, not at pytest's timeout.
HANG = 4 * BOUND
#: How long the cancellation soak runs (seconds); ARL_SOAK_SECONDS=60 for a long one.
SOAK_SECONDS = float(os.environ.get("ARL_SOAK_SECONDS", "8"))


@pytest.fixture
def proxy(own_redis: Server) -> Iterator[FaultProxy]:
    """A fault proxy in front of this test's private server, passing to begin with."""
    with FaultProxy(own_redis.port) as p:
        yield p


def _backend(url: str, **options: Any) -> arl.Backend:
    return arl.Backend.from_url(url, timeout=TIMEOUT, connect_timeout=CONNECT_TIMEOUT, **options)


def _stored(server: Server, key: str) -> dict[bytes, bytes | None]:
    """Every Redis key of user key ``key`` with its value, read on the server itself: the
    key layout does not matter beyond the hash tag, which is the user key."""
    with _admin(server) as admin:
        names = list(admin.scan_iter(match=f"*{{{key}}}*", count=1000))
        return {name: admin.get(name) for name in names}


def _count(server: Server, key: str) -> int:
    """The server's counter for user key ``key`` under a one-rate limiter (0: no key)."""
    stored = _stored(server, key)
    assert len(stored) <= 1, stored
    return int(next(iter(stored.values())) or 0) if stored else 0


def _script_calls(server: Server) -> int:
    """EVALSHA and EVAL commands the server ran or rejected, since it started."""
    with _admin(server) as admin:
        stats = admin.info("commandstats")
    total = 0
    for command in ("evalsha", "eval"):
        entry = stats.get(f"cmdstat_{command}", {})
        total += int(entry.get("calls", 0)) + int(entry.get("rejected_calls", 0))
    return total


def _scripts_sent(proxy: FaultProxy) -> int:
    """EVALSHA and EVAL commands that reached the proxy from clients, since it started."""
    commands = proxy.stats().commands
    return commands.get("EVALSHA", 0) + commands.get("EVAL", 0)


def _clients(server: Server) -> int:
    """Connections the server has open, without the one asking."""
    with _admin(server) as admin:
        return int(admin.info("clients")["connected_clients"]) - 1


async def _timed(aw: Awaitable[Any], hang: float = HANG) -> tuple[Any, float]:
    return await timed(aw, hang)


# -- a blackhole ---------------------------------------------------------------------------


async def test_blackhole_bounds_every_call_and_heals(proxy: FaultProxy, key: str) -> None:
    """Under a blackhole every call (hit, lock acquire, consume_token), alone or 50 at once,
    raises BackendUnavailable within BOUND; once the network passes again the same Backend
    answers every next call by itself."""
    async with _backend(proxy.url) as backend:
        limiter = arl.FixedWindow("1000/hour", backend=backend)
        lock = arl.Lock(f"{key}-lock", ttl=5, backend=backend)
        token = await arl.issue_token(backend=backend)
        assert (await limiter.hit(key)).allowed  # a warm connection, which stalls too
        proxy.stall()
        before = proxy.stats()
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "hit": lambda: limiter.hit(key),
            "acquire": lambda: lock.acquire(timeout=TIMEOUT),
            "consume_token": lambda: arl.consume_token(token, backend=backend),
        }
        for name, call in calls.items():
            outcome, took = await _timed(call())
            assert isinstance(outcome, arl.BackendUnavailable), (name, outcome)
            assert took < BOUND, (name, took)
        fifty = asyncio.gather(
            *(limiter.hit(f"{key}-{i}") for i in range(50)), return_exceptions=True
        )
        outcomes, took = await _timed(fifty)
        assert [type(o) for o in outcomes] == [arl.BackendUnavailable] * 50, outcomes
        assert took < BOUND, took
        during = proxy.stats()
        # A blackhole indeed: connections were taken (new ones too), nothing went through.
        assert (during.bytes_up, during.bytes_down) == (before.bytes_up, before.bytes_down)
        assert during.accepted > before.accepted
        proxy.passthrough()
        assert (await limiter.hit(f"{key}-after")).remaining == 999
        lease = await lock.acquire(timeout=BOUND)  # free again, whatever the stalled calls did
        await lease.release()
        fresh = await arl.issue_token(backend=backend)
        assert await arl.consume_token(fresh, backend=backend) is True
        assert await arl.consume_token(fresh, backend=backend) is False


# -- connections reset at random points ----------------------------------------------------


async def test_resets_mid_stream_never_overcount(
    proxy: FaultProxy, own_redis: Server, key: str
) -> None:
    """Hits racing on one key while connections are reset at random points (mid-reply,
    mid-batch, mid-handshake): the server never counts past the limit, the clients never
    saw more admissions than it counted, no two admitted hits saw the same ``remaining``
    (a reply reaching the wrong call would), and no command reached the server twice."""
    limit, workers, per_worker = 200, 40, 40
    calls = workers * per_worker  # 8 x the limit
    async with _backend(proxy.url) as backend:
        limiter = arl.FixedWindow(f"{limit}/minute", backend=backend)
        # The scripts (the batch's too) cached on the server: no NOSCRIPT below.
        await asyncio.gather(*(limiter.peek(key) for _ in range(3)))
        scripts_before = _script_calls(own_redis)
        sent_before = _scripts_sent(proxy)
        # Cuts far enough apart that some writes (a crowd's batch call and its tag) get
        # through: a round of the crowd is about four replies (the first hit alone, then
        # one batch call, each closed by its tag).
        proxy.chaos(random.Random(20240611), replies=(3, 12), into=(0, 64))
        seen: list[arl.Decision] = []
        failures = 0

        async def worker() -> None:
            nonlocal failures
            for _ in range(per_worker):
                try:
                    seen.append(await limiter.hit(key))
                except arl.BackendUnavailable:
                    failures += 1

        done, _ = await _timed(asyncio.gather(*(worker() for _ in range(workers))))
        assert done == [None] * workers, done
        proxy.passthrough()
        stats = proxy.stats()
        count = _count(own_redis, key)
        allowed = [d.remaining for d in seen if d.allowed]
        assert count <= limit
        assert len(allowed) <= count
        assert len(set(allowed)) == len(allowed), sorted(allowed)
        assert all(0 <= r < limit for r in allowed)
        assert _script_calls(own_redis) - scripts_before <= calls
        assert _scripts_sent(proxy) - sent_before <= calls
        # The faults were real, and the test still decided things.
        assert stats.resets >= 10, stats
        assert failures >= 10, failures
        assert len(allowed) >= 10, allowed
        assert failures + len(seen) == calls
        # After the chaos the same Backend answers exactly again.
        after = await limiter.peek(key)
        assert (after.allowed, after.remaining) == (
            (True, limit - count - 1) if count < limit else (False, 0)
        )


async def test_resets_never_let_two_hold_a_lock(proxy: FaultProxy, key: str) -> None:
    """Tasks contending for one lock while connections are reset at random points: never
    two holders at once, and the fences of the granted acquisitions strictly increase in
    the order they were granted."""
    async with _backend(proxy.url) as backend:
        lock = arl.Lock(key, ttl=1, backend=backend)  # a lost release frees it soon
        # Cuts far enough apart that some writes (a batch and its tag) get through.
        proxy.chaos(random.Random(1789), replies=(8, 40), into=(0, 40))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4.0
        holder: int | None = None
        overlaps = 0
        fences: list[int] = []
        errors: list[BaseException] = []

        async def worker(me: int) -> None:
            nonlocal holder, overlaps
            while loop.time() < deadline:
                try:
                    lease = await lock.acquire(timeout=2 * TIMEOUT)
                except (arl.BackendUnavailable, arl.LockTimeout):
                    continue
                if holder is not None:
                    overlaps += 1
                holder = me
                fences.append(lease.fencing_token)
                await asyncio.sleep(0)
                holder = None
                try:
                    await lease.release()
                except (arl.BackendUnavailable, arl.LockNotOwned) as exc:
                    errors.append(exc)  # the TTL frees it

        done, _ = await _timed(asyncio.gather(*(worker(i) for i in range(6))))
        assert done == [None] * 6, done
        proxy.passthrough()
        assert overlaps == 0
        assert all(a < b for a, b in itertools.pairwise(fences)), fences
        assert len(fences) >= 5, fences  # (a lost release costs its 1 s TTL)
        assert proxy.stats().resets >= 3
        # And the lock is whole afterwards (the try on a connection that chaos had already
        # doomed may fail alone; an acquire whose reply was lost holds it for its 1 s ttl).
        lease = await once_healthy(lambda: lock.acquire(timeout=BOUND), BOUND)
        await lease.release()


# -- a reply swallowed on a live connection ------------------------------------------------


async def test_a_dropped_reply_fails_only_its_own_call(
    proxy: FaultProxy, own_redis: Server, key: str
) -> None:
    """The reply to one of 12 concurrent hits is swallowed, the connection left open: no
    call ever gets another's answer. The calls whose replies can no longer be told apart
    (the lost one, and at most the others written with it) raise BackendUnavailable within
    BOUND; every call that answers answers for its own key; nothing is sent twice (each
    key counted once more, as many scripts ran as calls were made); and afterwards every
    answer is its own key's again."""
    limit, n = 100, 12
    keys = [f"{key}-{i}" for i in range(n)]
    async with _backend(proxy.url) as backend:
        limiter = arl.FixedWindow(f"{limit}/hour", backend=backend)
        # Key i starts at i hits: an answer shows which key it was decided for.
        for i, k in enumerate(keys[1:], start=1):
            await limiter.hit(k, cost=i)
        await asyncio.gather(*(limiter.peek(k) for k in keys))  # connections warm
        scripts_before = _script_calls(own_redis)
        sent_before = _scripts_sent(proxy)
        proxy.drop_reply(commands={"EVALSHA", "EVAL"})
        outcomes = await asyncio.gather(*(_timed(limiter.hit(k)) for k in keys))
        stats = proxy.stats()
        assert stats.dropped == 1
        lost = [i for i, (o, _) in enumerate(outcomes) if not isinstance(o, arl.Decision)]
        assert lost, outcomes
        for i in lost:
            outcome, took = outcomes[i]
            assert isinstance(outcome, arl.BackendUnavailable), outcome
            assert took < BOUND, took
        for i, (o, _) in enumerate(outcomes):
            if i not in lost:
                assert (o.allowed, o.remaining) == (True, limit - i - 1), (i, o)
        # Each script call written once and run once (a crowd's calls may carry several
        # decisions each: batched, as many as n calls or fewer).
        ran = _script_calls(own_redis) - scripts_before
        assert ran == _scripts_sent(proxy) - sent_before <= n
        # The lost call ran (only its reply was lost), once, like every other.
        for i, k in enumerate(keys):
            assert _count(own_redis, k) == i + 1, (i, k)
        # And the backend stays in step: every next answer is its own key's.
        again = await asyncio.gather(*(limiter.hit(k) for k in keys))
        assert [d.remaining for d in again] == [limit - i - 2 for i in range(n)]


# -- a restart on the same port ------------------------------------------------------------


async def test_restart_on_the_same_port_fails_each_connection_at_most_once(
    own_redis: Server, key: str
) -> None:
    """A restart on the same port while the Backend is idle costs at most one
    BackendUnavailable per connection it had open (all calls after it: 12 in a row, then
    16 at once), then the same Backend decides on the emptied server as on a new one."""
    async with _backend(own_redis.url) as backend:
        limiter = arl.FixedWindow("5/hour", backend=backend)
        await asyncio.gather(*(limiter.peek(f"{key}-{i}") for i in range(8)))
        assert [(await limiter.hit(key)).remaining for _ in range(3)] == [4, 3, 2]
        opened = _clients(own_redis)
        assert opened >= 1
        await asyncio.to_thread(own_redis.restart)  # the loop runs on, as in an application
        outcomes: list[Any] = [(await _timed(limiter.hit(key)))[0] for _ in range(12)]
        outcomes += await asyncio.gather(
            *(limiter.hit(f"{key}-{i}") for i in range(16)), return_exceptions=True
        )
        failed = [o for o in outcomes if not isinstance(o, arl.Decision)]
        assert all(isinstance(o, arl.BackendUnavailable) for o in failed), failed
        assert len(failed) <= opened, (failed, opened)
        final = [await limiter.hit(f"{key}-final") for _ in range(6)]
        assert [(d.allowed, d.remaining) for d in final] == [
            (True, 4), (True, 3), (True, 2), (True, 1), (True, 0), (False, 0)
        ]  # fmt: skip


# -- a soak of cancelled calls -------------------------------------------------------------


async def test_cancellation_soak_leaves_nothing_behind(
    own_redis: Server, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """For SOAK_SECONDS, 16 tasks hit, hold a lock and issue and consume tokens, ~10 % of
    the calls cancelled at a random point: the server never holds more than 2 x
    max_connections + 1 connections (besides the one asking), memory after the warm-up
    stays flat (traced, from one quiet moment to another: under 512 KiB), every pool slot
    comes back, and nothing is left behind: no task, no 'Task was destroyed', no unclosed
    socket."""
    max_connections, workers = 8, 16
    # The pool, the lock subscriber, and as many again for sockets the client closed that
    # the server has not reaped yet when it is asked (the inspector is not counted).
    bound = 2 * max_connections + 1
    rng = random.Random(4242)
    loop = asyncio.get_running_loop()
    loop_errors: list[dict[str, Any]] = []
    previous_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: loop_errors.append(context))
    tasks_before = asyncio.all_tasks()
    caplog.set_level(logging.WARNING, logger="asyncio")
    counts = {"done": 0, "cancelled": 0}
    connections: list[int] = []
    memory: list[int] = []
    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            backend = arl.Backend.from_url(
                own_redis.url, max_connections=max_connections, timeout=5, connect_timeout=5
            )
            limiter = arl.FixedWindow("1000000/hour", backend=backend)

            async def hit() -> None:
                await limiter.hit(f"{key}-{rng.randrange(20)}")

            async def hold() -> None:
                name = f"{key}-lock-{rng.randrange(3)}"
                try:
                    async with arl.lock(name, ttl=5, timeout=2, backend=backend):
                        await asyncio.sleep(0)
                except arl.LockTimeout:
                    counts["lock timeouts"] = counts.get("lock timeouts", 0) + 1

            async def token() -> None:
                issued = await arl.issue_token(backend=backend)
                assert await arl.consume_token(issued, backend=backend)

            ops = (hit, hit, hit, hold, token)

            async def worker(end: float) -> None:
                while loop.time() < end:
                    op = rng.choice(ops)
                    if rng.random() >= 0.1:
                        await op()
                        counts["done"] += 1
                        continue
                    task = asyncio.ensure_future(op())
                    for _ in range(rng.randrange(6)):  # a random point of its way
                        await asyncio.sleep(0)
                    if rng.random() < 0.5:
                        await asyncio.sleep(rng.random() * 0.002)
                    task.cancel()
                    outcome = (await asyncio.gather(task, return_exceptions=True))[0]
                    assert outcome is None or isinstance(outcome, asyncio.CancelledError), outcome
                    counts["cancelled"] += 1

            async def sample(end: float) -> None:
                while loop.time() < end:
                    await asyncio.sleep(0.25)
                    connections.append(await asyncio.to_thread(_clients, own_redis))
                    memory.append(tracemalloc.get_traced_memory()[0])

            async def run(seconds: float) -> int:
                """Soak for ``seconds``; then, all quiet, the memory traced."""
                end = loop.time() + seconds
                jobs = asyncio.gather(*(worker(end) for _ in range(workers)), sample(end))
                done, _ = await _timed(jobs, hang=seconds + HANG)
                assert done == [None] * (workers + 1), done
                gc.collect()
                return tracemalloc.get_traced_memory()[0]

            warm_up = min(2.0, SOAK_SECONDS / 4)
            baseline = await run(warm_up)
            grown = await run(SOAK_SECONDS - warm_up) - baseline
            # Every pool slot came back: three times as many calls as the pool holds at once.
            await asyncio.gather(*(limiter.peek(f"{key}-{i}") for i in range(3 * max_connections)))
            await backend.aclose()
            for _ in range(3):
                await asyncio.sleep(0)
            gc.collect()
        leftover = {t for t in asyncio.all_tasks() - tasks_before if not t.done()}
        current = asyncio.current_task()
        assert current is not None
        leftover.discard(current)
    finally:
        tracemalloc.stop()
        loop.set_exception_handler(previous_handler)
    assert counts["cancelled"] >= 20, counts
    assert counts["done"] >= 200, counts
    assert connections, "no sample taken"
    assert max(connections) <= bound, connections
    assert grown < 512 * 1024, (grown, memory)
    assert not leftover, leftover
    assert not loop_errors, loop_errors
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "destroyed" in m or "nclosed" in m], messages


# -- the server says no, or waits ----------------------------------------------------------


async def test_maxmemory_refuses_writes_whole(own_redis: Server, key: str) -> None:
    """At maxmemory with noeviction a writing call (hit, lock acquire, issue_token) raises
    BackendError with the server's message (it names maxmemory), a peek still answers, nothing is
    half-written (a two-rate hit moves neither counter, a new key is not created), and
    once memory is allowed again the same Backend writes."""
    async with _backend(own_redis.url) as backend:
        limiter = arl.FixedWindow("5/minute", "20/hour", backend=backend)
        assert (await limiter.hit(key)).remaining == 4  # both counters at 1
        lock = arl.Lock(f"{key}-lock", backend=backend)
        with _admin(own_redis) as admin:
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)
            try:
                writes: dict[str, Callable[[], Awaitable[Any]]] = {
                    "hit": lambda: limiter.hit(key),
                    "hit-new": lambda: limiter.hit(f"{key}-new"),
                    "acquire": lambda: lock.acquire(timeout=0),
                    "issue_token": lambda: arl.issue_token(backend=backend),
                }
                for name, call in writes.items():
                    outcome, took = await _timed(call())
                    assert isinstance(outcome, arl.BackendError), (name, repr(outcome))
                    assert "maxmemory" in str(outcome), (name, outcome)
                    assert took < BOUND
                assert (await limiter.peek(key)).remaining == 3  # a hit would leave 3 of 5
            finally:
                admin.config_set("maxmemory", 0)
        assert list(_stored(own_redis, key).values()) == [b"1", b"1"]
        assert _stored(own_redis, f"{key}-new") == {}
        assert _stored(own_redis, f"{key}-lock") == {}
        assert (await limiter.hit(key)).remaining == 3
        lease = await lock.acquire(timeout=0)
        await lease.release()


async def test_client_pause_is_waited_out_or_bounded(own_redis: Server, key: str) -> None:
    """CLIENT PAUSE shorter than ``timeout``: calls wait it out and all succeed. A pause of
    writes longer than ``timeout``: BackendUnavailable within BOUND, the server ran the
    stalled hit at most once, and after UNPAUSE the same Backend answers."""
    async with arl.Backend.from_url(own_redis.url, timeout=2.5, connect_timeout=1) as backend:
        limiter = arl.FixedWindow("100/hour", backend=backend)
        assert (await limiter.hit(key)).remaining == 99
        with _admin(own_redis) as admin:
            admin.execute_command("CLIENT", "PAUSE", 500, "ALL")
            started = time.monotonic()
            decisions = await asyncio.gather(*(limiter.hit(key) for _ in range(5)))
            waited = time.monotonic() - started
            assert sorted(d.remaining for d in decisions) == [94, 95, 96, 97, 98]
            assert waited > 0.2  # they did wait (the pause can only end after ~0.5 s)

            admin.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")  # scripts included
            try:
                outcome, took = await _timed(limiter.hit(key))
                assert isinstance(outcome, arl.BackendUnavailable), repr(outcome)
                assert took < BOUND
            finally:
                admin.execute_command("CLIENT", "UNPAUSE")
        after = await limiter.hit(key)
        assert after.remaining in (93, 92)  # 92: the timed-out hit ran when the pause ended
        assert _count(own_redis, key) == 100 - after.remaining
