"""Recovery from network faults, made by a proxy (``faultproxy``) in front of a private
real server:

1. a release whose reply (or request) is lost is sent again, so one reset does not keep a
   lock, a semaphore slot or an idempotency key held for its whole ttl; nor does one that
   hits the cleanup release after a lost acquire reply;
2. a contended acquire never hangs on a server that accepts connections and never answers
   (the wake-up subscriber's connect and SUBSCRIBE are bounded);
3. an acquire with ``timeout=t`` returns or raises within ``t`` + the backend's timeout
   (+ a margin for a loaded machine), whatever the network does;
4. a half-open subscriber (no error, no message) is noticed by its probes and subscribed
   again, and waiters get their wake-ups again;
5. a subscriber closed while its reader is inside a call on it leaves no socket open (the
   socket redis-py reconnects under that call is closed too).

The cluster's and Sentinel's nodes advertise their own addresses, so the proxy stands in
front of a standalone server only; what differs there (the cluster's subscriber probes one
connection per master) is checked on every backend by the healthy-subscriber test.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from support.faultproxy import FaultProxy, Server, once_healthy, timed
from support.faultproxy import admin as _admin
from support.pace import asleep, pace

import aioratelimit as arl
from aioratelimit import _scripts
from aioratelimit._idempotency.store import Claimed, IdempotencyStore, InProgress
from aioratelimit._stores.pubsub import DedicatedPubSub

#: The backend's reply timeout and connect timeout in these tests (seconds).
TIMEOUT = 1.0
CONNECT_TIMEOUT = 0.5
#: What a bound may overrun by on a loaded 2-core machine (seconds).
MARGIN = 0.75
#: A call still running after this long hangs: it fails here, not at pytest's timeout.
HANG = 15.0


@pytest.fixture
def proxy(own_redis: Server) -> Iterator[FaultProxy]:
    """A fault proxy in front of this test's private server, passing to begin with."""
    with FaultProxy(own_redis.port) as p:
        yield p


def _backend(url: str) -> arl.Backend:
    return arl.Backend.from_url(url, timeout=TIMEOUT, connect_timeout=CONNECT_TIMEOUT)


async def _timed(aw: Awaitable[Any], hang: float = HANG) -> tuple[Any, float]:
    return await timed(aw, hang)


async def _until(check: Callable[[], bool], what: str, within: float = HANG) -> None:
    """Wait (polling) until ``check()`` holds; fail after ``within`` seconds."""
    end = time.monotonic() + within
    while not check():
        assert time.monotonic() < end, f"never happened: {what}"
        await asyncio.sleep(0.005)


RESOURCES: dict[str, Callable[[str, arl.Backend], arl.Lock | arl.Semaphore]] = {
    "lock": lambda name, backend: arl.Lock(name, ttl=30, backend=backend),
    "semaphore": lambda name, backend: arl.Semaphore(name, limit=1, ttl=30, backend=backend),
}

#: A release's reply lost three ways: an RST just before it (the script ran), an RST in
#: the middle of it, and the reply swallowed on a live connection (no answer, then the
#: connection is dropped after TIMEOUT).
FAULTS: dict[str, Callable[[FaultProxy], None]] = {
    "reset-before-reply": lambda p: p.reset_after(replies=1, into=0),
    "reset-mid-reply": lambda p: p.reset_after(replies=1, into=2),
    "reply-dropped": lambda p: p.drop_reply(commands={"EVALSHA", "EVAL"}),
}


# -- 1. a lost release is sent again ------------------------------------------------------


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("kind", sorted(RESOURCES))
async def test_a_release_whose_reply_is_lost_is_sent_again(
    proxy: FaultProxy, key: str, kind: str, fault: str
) -> None:
    """The reply of a release of a ttl=30 lock (or semaphore slot) is lost: the release
    returns normally all the same (the repeat's 'released before' is absorbed), the lease
    reads released, and the lock is free at once for another acquire (timeout=0)."""
    async with _backend(proxy.url) as backend:
        resource = RESOURCES[kind](key, backend)
        warm = await resource.acquire(timeout=0)  # the scripts cached: no NOSCRIPT below
        await warm.release()
        lease = await resource.acquire(timeout=0)
        FAULTS[fault](proxy)
        outcome, _ = await _timed(lease.release())
        assert outcome is None, repr(outcome)
        stats = proxy.stats()
        assert stats.resets + stats.dropped == 1, stats  # the fault was real
        assert "released" in repr(lease)
        again = await resource.acquire(timeout=0)
        with pytest.raises(arl.LockNotOwned):
            await lease.release()  # released already: a second release is refused
        await again.release()


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_an_idempotency_release_whose_reply_is_lost_is_sent_again(
    proxy: FaultProxy, key: str, fault: str
) -> None:
    """The reply of an idempotency release is lost: the release returns all the same, and
    the key can be claimed again at once (not after its 30 s lease)."""
    async with _backend(proxy.url) as backend:
        store = IdempotencyStore(backend, lease=30)
        warm = await store.claim(f"{key}-warm")  # the scripts cached: no NOSCRIPT below
        assert isinstance(warm, Claimed)
        await store.release(warm)
        claimed = await store.claim(key)
        assert isinstance(claimed, Claimed)
        FAULTS[fault](proxy)
        outcome, _ = await _timed(store.release(claimed))
        assert not isinstance(outcome, BaseException), repr(outcome)
        again = await store.claim(key)
        assert isinstance(again, Claimed), again
        await store.release(again)


@pytest.mark.parametrize("kind", sorted(RESOURCES))
async def test_a_lost_acquire_reply_then_a_lost_cleanup_request_frees_the_lock(
    proxy: FaultProxy, key: str, kind: str
) -> None:
    """The reply of an acquire is swallowed (the script ran: the lock is held), and the
    cleanup release that follows never reaches the server (its connection is closed
    first): the cleanup is sent again, and the ttl=30 lock is free within a few seconds
    for another acquire."""
    async with _backend(proxy.url) as backend:
        resource = RESOURCES[kind](key, backend)
        lease = await resource.acquire(timeout=0)  # a warm connection, the scripts cached
        await lease.release()
        evals = proxy.stats().commands.get("EVAL", 0)
        proxy.drop_reply(commands={"EVALSHA", "EVAL"})
        accepted = proxy.stats().accepted
        attempt = asyncio.ensure_future(_timed(resource.acquire(timeout=0)))
        await _until(lambda: proxy.stats().dropped == 1, "the acquire's reply dropped")
        proxy.refuse()
        # The cleanup's first try opens a new connection, which ends before the server.
        await _until(lambda: proxy.stats().accepted > accepted, "the cleanup's connection")
        proxy.passthrough()
        outcome, _ = await attempt
        assert isinstance(outcome, arl.BackendUnavailable), repr(outcome)
        assert proxy.stats().commands.get("EVAL", 0) == evals  # (the acquire ran: no NOSCRIPT)
        # Free long before its ttl of 30 s (``once_healthy``: a connect that races the
        # proxy's switch back to passthrough may be reset before it sent anything).
        lease = await once_healthy(lambda: resource.acquire(timeout=3 * TIMEOUT), 3 * TIMEOUT)
        await lease.release()


async def test_under_random_resets_no_hold_ends_in_lock_timeout(
    proxy: FaultProxy, key: str
) -> None:
    """60 holds of a ttl=30 lock in a row, connections reset at random points all along.
    A hold may fail with BackendUnavailable (its acquire's or release's connection reset)
    but never with LockTimeout: no hold leaks (without the resent release, about half of
    them did)."""
    outcomes: dict[str, int] = {"held": 0, "unavailable": 0, "timeout": 0}
    async with _backend(proxy.url) as backend:
        proxy.chaos(random.Random(15), replies=(3, 12), into=(0, 40))
        for _ in range(60):
            try:
                async with arl.lock(key, ttl=30, timeout=3 * TIMEOUT, backend=backend):
                    await asyncio.sleep(0)
                outcomes["held"] += 1
            except arl.BackendUnavailable:
                outcomes["unavailable"] += 1
            except arl.LockTimeout:
                outcomes["timeout"] += 1
                break  # a leaked hold: every later one would wait out 3 s too
        proxy.passthrough()
        resets = proxy.stats().resets
        assert outcomes["timeout"] == 0, (outcomes, resets)
        assert resets >= 10, resets  # the faults were real
        assert outcomes["held"] >= 10, outcomes
        lease = await arl.Lock(key, backend=backend).acquire(timeout=0)
        await lease.release()


# -- 2. a contended acquire never hangs ----------------------------------------------------


@pytest.mark.parametrize("timeout", [1.0, None])
async def test_a_contended_acquire_never_hangs_on_a_server_that_never_answers(
    proxy: FaultProxy, key: str, timeout: float | None
) -> None:
    """Two concurrent acquires of one lock in one process, against a server that accepts
    connections and never answers (the second subscribes to wake-ups first): both end,
    with timeout=1 within timeout + the backend's timeout (+ MARGIN), without a timeout
    within the subscription's 1 s and 2 x the backend's timeout (a try, then the wait for
    its cleanup release); once the server answers again the same backend acquires at
    once."""
    # (Without a timeout three waits end back to back, each exactly at its bound: twice
    # the margin for a loaded machine. Before the fix one call hung until HANG.)
    bound = 1.0 + 2 * TIMEOUT + 2 * MARGIN if timeout is None else timeout + TIMEOUT + MARGIN
    async with _backend(proxy.url) as backend:
        proxy.stall()  # before any connection: the subscriber's connect stalls too
        lock = arl.Lock(key, backend=backend)
        outcomes = await asyncio.gather(*(_timed(lock.acquire(timeout)) for _ in range(2)))
        for outcome, took in outcomes:
            assert isinstance(outcome, (arl.BackendUnavailable, arl.LockTimeout)), outcome
            assert took < bound, took
        proxy.passthrough()
        lease = await lock.acquire(timeout=3 * TIMEOUT)
        await lease.release()


# -- 3. every acquire bounded by timeout + the backend's timeout ---------------------------


@pytest.mark.parametrize("timeout", [0.0, 0.5, 1.5])
@pytest.mark.parametrize("kind", sorted(RESOURCES))
async def test_an_acquire_under_a_blackhole_ends_within_its_bound(
    proxy: FaultProxy, key: str, kind: str, timeout: float
) -> None:
    """Under a blackhole (on a warm connection), acquire(timeout=t) of a free lock or
    semaphore raises BackendUnavailable within t + the backend's timeout (+ MARGIN), also
    when the cleanup release after its failed try gets no answer either."""
    async with _backend(proxy.url) as backend:
        resource = RESOURCES[kind](key, backend)
        await resource.locked()
        proxy.stall()
        outcome, took = await _timed(resource.acquire(timeout=timeout))
        assert isinstance(outcome, arl.BackendUnavailable), repr(outcome)
        assert took < timeout + TIMEOUT + MARGIN, took
        proxy.passthrough()


@pytest.mark.parametrize("kind", sorted(RESOURCES))
async def test_a_waiter_caught_by_a_blackhole_ends_within_its_bound(
    proxy: FaultProxy, key: str, kind: str
) -> None:
    """A waiter (the lock held by another) with timeout=1.5 when the blackhole starts ends
    within 1.5 + the backend's timeout (+ MARGIN); a release under the blackhole raises
    BackendUnavailable within twice the backend's timeout (its first try, then the
    resends)."""
    async with _backend(proxy.url) as backend:
        resource = RESOURCES[kind](key, backend)
        holder = await resource.acquire(timeout=0)
        waiter = asyncio.ensure_future(_timed(resource.acquire(timeout=1.5)))
        await asleep(backend, waiter=waiter)  # it waits, subscribed (not still on its way)
        proxy.stall()
        outcome, took = await waiter
        assert isinstance(outcome, (arl.BackendUnavailable, arl.LockTimeout)), repr(outcome)
        assert took < 1.5 + TIMEOUT + MARGIN, took
        outcome, took = await _timed(holder.release())
        assert isinstance(outcome, arl.BackendUnavailable), repr(outcome)
        assert took < 2 * TIMEOUT + MARGIN, took
        proxy.passthrough()


async def test_an_idempotency_waiter_caught_by_a_blackhole_ends_within_its_bound(
    proxy: FaultProxy, key: str
) -> None:
    """A ``wait(timeout=1.5)`` for a key another owner holds, when the blackhole starts,
    ends within 1.5 + the backend's timeout (+ MARGIN): its claim gets no answer, and the
    cleanup release after it is waited for only within that bound."""
    async with _backend(proxy.url) as backend:
        store = IdempotencyStore(backend, lease=30)
        holder = await store.claim(key)
        assert isinstance(holder, Claimed)
        waiter = asyncio.ensure_future(_timed(store.wait(key, timeout=1.5)))
        await asleep(backend, waiter=waiter)  # it waits, subscribed (not still on its way)
        proxy.stall()
        outcome, took = await waiter
        assert isinstance(outcome, (arl.BackendUnavailable, InProgress)), repr(outcome)
        assert took < 1.5 + TIMEOUT + MARGIN, took
        proxy.passthrough()


# -- 4. a half-open subscriber is noticed --------------------------------------------------


async def test_a_half_open_subscriber_is_noticed_and_subscribed_again(
    proxy: FaultProxy, own_redis: Server, key: str
) -> None:
    """The subscriber's connection goes half-open (nothing passes either way, no error):
    its unanswered probe is noticed, every channel is subscribed again on a new connection,
    and a message published after that wakes the waiter (not its fallback timer)."""
    channel = f"{key}-channel"
    async with _backend(proxy.url) as backend:
        notifier = backend._notifier
        notifier.check_every = 0.2
        with _admin(own_redis) as admin:
            async with notifier.subscribe(channel) as sub:
                admin.publish(channel, b"one")
                assert await sub.wait(HANG) is True
                assert proxy.stall_subscribers() == 1
                before = proxy.stats().commands.get("SUBSCRIBE", 0)
                await _until(
                    lambda: proxy.stats().commands.get("SUBSCRIBE", 0) > before,
                    "a SUBSCRIBE on a new connection",
                )
                # The old connection still counts on the server: wait for the new one too.
                await _until(
                    lambda: admin.pubsub_numsub(channel)[0][1] >= 2, "the new subscription"
                )
                await asyncio.sleep(0.05)  # its confirmation read
                admin.publish(channel, b"two")
                assert await sub.wait(HANG) is True
                assert sub.message == b"two"


async def test_probes_keep_a_healthy_subscriber(
    backend: arl.Backend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On every backend, probing the subscriber often (every 0.1 s) while a waiter waits
    never takes a healthy subscriber for a broken one (each connection's answer is
    counted: on a cluster, one per master), and the release still wakes the waiter."""
    caplog.set_level(logging.DEBUG, logger="aioratelimit")
    backend._notifier.check_every = 0.1
    lock = arl.Lock(key, ttl=30, backend=backend)
    holder = await lock.acquire(timeout=0)
    waiter = asyncio.ensure_future(lock.acquire(timeout=HANG))
    await asleep(backend, waiter=waiter)  # the release below must wake it, not find it trying
    # Several probes answered: on memory:// each is answered in this process, at once.
    await asyncio.sleep(pace(backend, network=0.8, memory=0.35))
    await holder.release()
    lease = await waiter
    await lease.release()
    broken = [r.getMessage() for r in caplog.records if "reconnecting" in r.getMessage()]
    assert not broken, broken


# -- 5. a subscriber closed mid-call leaves no socket ------------------------------------


async def test_a_subscriber_closed_under_its_reader_leaves_no_socket_open(
    proxy: FaultProxy,
) -> None:
    """The Notifier closes a subscriber after a failure while its reader task may still be
    inside ``get_message`` on it. redis-py reconnects a connection that broke under a read
    by itself: that new socket must not outlive the closed subscriber (nobody would read or
    close it; the garbage collector would, with a ResourceWarning)."""
    import redis.asyncio as aredis

    client = aredis.Redis.from_url(proxy.url, socket_connect_timeout=CONNECT_TIMEOUT)
    try:
        sub = DedicatedPubSub(client)
        await sub.subscribe("arl-test-closing")
        await sub.get_message(ignore_subscribe_messages=False, timeout=1.0)  # confirmed
        reading = asyncio.ensure_future(
            sub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        )
        await asyncio.sleep(0.1)  # waiting for a message on the connection
        await sub.aclose()
        await _timed(asyncio.gather(reading, return_exceptions=True))
        await _until(lambda: proxy.stats().open == 0, "every subscriber socket closed", 3.0)
    finally:
        await client.aclose()


# -- what may be sent again -----------------------------------------------------------------


async def test_only_releases_are_sent_again() -> None:
    """Exactly the release scripts (an access list's entry removed too), the three refunds
    (sent again only as a settlement sends them, with a record) and the reads the listeners
    and the CLI make (a pause's block, a policy store, an access list, a key's ban) are
    marked safe to send twice,
    and ``run_repeatable`` refuses any other script before sending anything (a hit sent
    twice would be counted twice)."""
    repeatable = {name for name, s in _scripts.SCRIPTS.items() if s.repeatable}
    releases = {"lock_release", "semaphore_release", "rwlock_release", "fair_release"}
    releases |= {"idem_release", "list_remove"}
    refunds = {f"{kind}_refund" for kind in ("fixed_window", "sliding_window", "token_bucket")}
    reads = {"limiter_blocked", "policy_read", "list_read", "ban_state"}
    assert repeatable == releases | refunds | reads
    async with arl.Backend.from_url("memory://") as backend:
        with pytest.raises(ValueError, match="not safe to send twice"):
            await backend._run_repeatable(_scripts.FIXED_WINDOW, ["k"], [1])
