"""Reservations settled after the work (``Limiter.reserve``, ``Reservation.settle``) on
every backend and all three limiters: a settlement below the estimate gives the unused part
back, one above it charges the excess as a debt; each is one script call in the
background, applied exactly once (a lost reply sent again changes nothing more), and
concurrent reservations end at exactly the sum of their actual costs."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from support.faultproxy import FaultProxy, Server
from support.kinds import Build
from support.pace import until

import aioratelimit as arl
from aioratelimit._scripts import Arg, Reply, Script


class Calls:
    """Wraps ``backend._run`` to keep the name of every script run (and, with ``lose``,
    to lose the first reply of that script after it ran)."""

    def __init__(self, backend: arl.Backend, lose: str | None = None) -> None:
        self.names: list[str] = []
        self.replies: list[Any] = []
        inner = backend._run

        async def run(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
            self.names.append(script.name)
            reply = await inner(script, keys, args)
            if script.name == lose:
                self.replies.append(reply)
                if len(self.replies) == 1:
                    raise arl.BackendUnavailable("the reply was lost (injected)")
            return reply

        backend._run = run


async def count(limiter: arl.Limiter, key: str) -> int:
    """What ``key`` holds under ``limiter``'s (one) rate now, read by giving it all back
    (so: once, at the end); a TokenBucket's in whole tokens still lacked."""
    limit = limiter._max_cost
    total = 0
    while given := await limiter.refund(key, limit):
        total += given
        if given < limit:
            break
    return total


# -- what a settlement does ----------------------------------------------------------------


async def test_below_the_estimate_gives_back_above_it_charges_a_debt(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """Settled below its estimate, a reservation gives the unused part back; above it, the
    excess is charged even past the limit, and the key is denied until the debt is gone."""
    limiter = build("10/hour", backend=backend)
    async with limiter.reserve(key, 6) as r:
        assert r.decision is not None
        assert r.decision.remaining == 4
        assert r.state == "held"
    r.settle(2)
    await r.wait()
    assert r.state == "settled"
    assert r.actual == 2
    assert (await limiter.peek(key)).remaining == 7  # 2 counted, and the peek's 1
    r = await limiter.reserve(key, 5)
    r.settle(12)  # 7 more than asked: 14 counted against 10
    await backend.drain()
    assert r.state == "settled"
    denied = await limiter.hit(key)
    assert not denied.allowed
    assert denied.remaining == 0
    assert denied.retry_after > 0
    assert await count(limiter, key) == 14


async def test_a_settlement_is_one_script_call_after_the_caller_has_moved_on(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """``settle`` returns before anything is sent; then one refund-script call runs in the
    background. Settled at the estimate, or left unsettled (the estimate stands, even
    when the block raised), a reservation makes no call after its hit."""
    limiter = build("10/hour", backend=backend)
    calls = Calls(backend)
    hit = limiter._script.name
    r = await limiter.reserve(key, 3)
    r.settle(1)
    assert r.state == "settling"
    assert calls.names == [hit]
    await r.wait()
    assert calls.names == [hit, limiter._refund_script.name]
    r = await limiter.reserve(key, 3)
    r.settle(3)
    assert r.state == "settled"
    with pytest.raises(ZeroDivisionError):
        async with limiter.reserve(key, 2):
            1 / 0  # noqa: B018
    async with limiter.reserve(key, 2) as left:
        pass
    await backend.drain()
    assert calls.names == [hit, limiter._refund_script.name, hit, hit, hit]
    assert left.state == "held"
    assert await count(limiter, key) == 1 + 3 + 2 + 2


async def test_a_denied_reservation_raises_and_holds_nothing(
    backend: arl.Backend, build: Build, key: str
) -> None:
    limiter = build("4/hour", backend=backend)
    await limiter.hit(key, 3)
    r = limiter.reserve(key, 2)
    with pytest.raises(arl.RateLimited) as raised:
        await r
    assert r.state == "denied"
    assert raised.value.decision is r.decision
    with pytest.raises(RuntimeError, match="not held"):
        r.settle(1)
    with pytest.raises(RuntimeError, match="taken already"):
        await r


async def test_bad_input_is_refused_before_any_io(backend: arl.Backend, key: str) -> None:
    """A bad key, estimate or actual raises at once and sends nothing; a refused
    ``settle`` leaves the reservation held, to be settled right."""
    limiter = arl.TokenBucket("10/hour", backend=backend)
    calls = Calls(backend)
    for bad_key in ("", 7):
        with pytest.raises((ValueError, TypeError)):
            limiter.reserve(bad_key, 1)  # type: ignore[arg-type]
    for bad_cost in (0, 11, 1.5, True):
        with pytest.raises((ValueError, TypeError)):
            limiter.reserve(key, bad_cost)  # type: ignore[arg-type]
    r = limiter.reserve(key, 2)
    with pytest.raises(RuntimeError, match="not held"):
        r.settle(1)  # not taken yet
    assert calls.names == []
    await r
    interval = int(limiter._refund_args[-1])
    for bad in (-1, 2.0, True, "3", 2 + 2**50 // interval + 1):
        with pytest.raises((ValueError, TypeError)):
            r.settle(bad)  # type: ignore[arg-type]
    assert r.state == "held"
    assert r.actual is None
    raised: list[BaseException] = []

    def elsewhere() -> None:  # off the event loop: no loop to run the call on
        try:
            r.settle(1)
        except RuntimeError as exc:
            raised.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(raised) == 1
    assert r.state == "held"
    r.settle(2 + 2**50 // interval)  # the largest charge a bucket computes exactly
    with pytest.raises(RuntimeError, match="not held"):
        r.settle(1)
    await r.wait()
    assert calls.names == ["token_bucket", "token_bucket_refund"]
    assert "token_bucket_refund" not in calls.names[:1]


# -- through the limiter's options ---------------------------------------------------------


async def test_a_give_back_clears_the_cached_denial_here(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """With a deny cache, a reservation's hit goes through it, and a give-back clears this
    process's cached denial of the key at once: the next hit is the backend's, admitted."""
    limiter = build("4/hour", backend=backend, deny_cache=10)
    r = await limiter.reserve(key, 4)

    async def cached() -> bool:
        return (await limiter.hit(key)).source == "cache"

    await until(cached, what="a denial from the cache")  # (its subscription confirmed)
    r.settle(1)
    await r.wait()
    assert r.state == "settled"
    after = await limiter.hit(key)  # (a denial is cached per cost: this one's was)
    assert (after.allowed, after.source) == (True, "redis")


async def test_an_admission_without_the_backend_settles_nothing(key: str) -> None:
    """Admitted by the failure policy (the server is unreachable: nothing was counted), a
    reservation's settlement sends nothing, below or above its estimate."""
    dead = f"redis://127.0.0.1:{unused_port()}"
    async with arl.Backend.from_url(dead, timeout=0.5, connect_timeout=0.5) as backend:
        limiter = arl.FixedWindow("10/hour", backend=backend, on_unavailable="allow")
        calls = Calls(backend)
        for actual in (0, 30):
            r = await limiter.reserve(key, 5)
            assert r.decision is not None
            assert r.decision.source == "policy"
            r.settle(actual)
            assert r.state == "settled"
            await r.wait()
        assert limiter._refund_script.name not in calls.names


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released: refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- a window that ended before the settlement ---------------------------------------------


async def wait_until_empty(limiter: arl.Limiter, key: str, limit: int) -> None:
    """Wait for the state, not for a time: until ``key`` holds nothing under the limiter."""

    async def empty() -> bool:
        return (await limiter.peek(key)).remaining == limit - 1

    await until(empty, what="the window to end", every=0.02)


async def test_an_ended_window_gets_nothing_back_and_a_charge_lands_in_the_open_one(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """Settled after the window (bucket) that counted its hit has ended, a reservation gives
    nothing back to the one open now (nor does a TokenBucket refill past full), and its
    excess is charged to the window open now (the TAT moves from now)."""
    # Each window must outlast the calls made in it by far (the count is a round trip
    # after the settlement), and a TokenBucket's charge of 3 reads as 3 within one
    # interval (a tenth of its window): 300 ms of slack. (On memory:// the waits are on
    # the virtual clock: free.)
    limiter = build(arl.Rate(10, 1.0), backend=backend)
    if isinstance(limiter, arl.TokenBucket):
        limiter = build(arl.Rate(10, 3.0), backend=backend)
    r = await limiter.reserve(key, 5)
    await wait_until_empty(limiter, key, 10)
    assert (await limiter.hit(key, 2)).allowed  # counted in a window opened since
    r.settle(0)
    await r.wait()
    assert r.state == "settled"
    assert await count(limiter, key) == 2  # not given back to the new window
    later = await limiter.reserve(key, 4)
    await wait_until_empty(limiter, key, 10)
    later.settle(7)
    await later.wait()
    assert await count(limiter, key) == 3  # the excess, in the window open now


# -- concurrency and lost replies ----------------------------------------------------------


async def test_concurrent_reservations_end_at_the_sum_of_their_actual_costs(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """40 tasks reserve random estimates and settle random actual costs, some above their
    estimates: no admission ever found the key above its limit plus the excess settled
    before it, and the key ends at exactly the sum of the admitted reservations' actual
    costs."""
    limit = 120
    limiter = build(f"{limit}/hour", backend=backend)
    rng = random.Random(7)
    plans = [(rng.randint(1, 10), rng.randint(0, 16)) for _ in range(40)]
    settled_excess = 0
    actuals: list[int] = []

    async def one(estimate: int, actual: int) -> None:
        nonlocal settled_excess
        await asyncio.sleep(0)
        try:
            r = await limiter.reserve(key, estimate)
        except arl.RateLimited:
            return
        await asyncio.sleep(rng.random() / 100)
        r.settle(actual)
        await r.wait()
        assert r.state == "settled"
        settled_excess += max(0, actual - estimate)
        actuals.append(actual)

    await asyncio.gather(*(one(e, a) for e, a in plans))
    assert actuals  # some admitted
    assert await count(limiter, key) == sum(actuals)
    # What the key holds is only ever above the limit by the excess settled.
    assert sum(actuals) <= limit + settled_excess


async def test_a_settlement_whose_reply_was_lost_is_sent_again_and_applied_once(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """On every backend: the settlement runs and its reply is lost; it is sent again, the
    script finds its record and changes nothing, so the unused part is given back once."""
    limiter = build("100/hour", backend=backend)
    r = await limiter.reserve(key, 10)
    calls = Calls(backend, lose=limiter._refund_script.name)
    r.settle(4)
    await r.wait()
    assert r.state == "settled"
    assert [reply[2] for reply in calls.replies] == [1, 0]  # applied, then a repeat
    assert await count(limiter, key) == 4


async def test_a_settlement_that_fails_is_logged_never_raised(
    key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A settlement the store refuses (memory:// full: its record would be one key too
    many) is logged, without the user key, and its state says so; the caller, long gone,
    never sees it, the backend's drain returns, and nothing was changed."""
    async with arl.Backend.from_url("memory://?max_keys=1") as backend:
        limiter = arl.FixedWindow("10/hour", backend=backend, name="llm")
        r = await limiter.reserve(key, 5)
        with caplog.at_level(logging.ERROR, logger="aioratelimit"):
            r.settle(1)
            await backend.drain()
        assert r.state == "failed"
        assert any("settlement of llm" in m for m in caplog.messages), caplog.messages
        assert key not in " ".join(caplog.messages)
        assert (await limiter.peek(key, 5)).allowed
        assert not (await limiter.peek(key, 6)).allowed  # the estimate stands


class Errors(arl.Recorder):
    """Keeps the backend errors instrumentation hears."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []

    def backend_error(self, error_type: str, reason: str, script: str | None) -> None:
        self.seen.append((error_type, reason, script))


async def test_a_settlement_the_server_refuses_reaches_the_metrics(
    own_redis: Server, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """At maxmemory (noeviction) the server refuses the settlement's write: one
    BackendError for its script in the metrics and in the log, never sent again (an error
    reply is an answer), and the estimate stands."""
    async with arl.Backend.from_url(own_redis.url) as backend:
        limiter = arl.TokenBucket("10/hour", backend=backend, name="llm")
        r = await limiter.reserve(key, 5)
        errors = Errors()
        previous = arl.set_recorder(errors)
        client = redis.Redis.from_url(own_redis.url)
        try:
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", 1)
            with caplog.at_level(logging.ERROR, logger="aioratelimit"):
                r.settle(0)
                await r.wait()
        finally:
            client.config_set("maxmemory", 0)
            client.close()
            arl.set_recorder(previous)
        assert r.state == "failed"
        assert errors.seen == [("BackendError", "error_reply", "token_bucket_refund")]
        assert any("settlement of llm" in m for m in caplog.messages), caplog.messages
        assert not (await limiter.peek(key, 6)).allowed  # nothing given back


@pytest.fixture
def proxy(own_redis: Server) -> Iterator[FaultProxy]:
    with FaultProxy(own_redis.port) as p:
        yield p


async def test_a_settlement_behind_a_dropped_reply_is_applied_once(
    proxy: FaultProxy, key: str
) -> None:
    """Through a real connection whose one reply the proxy swallows: the settlement ran on
    the server, its reply never came, it was sent again (two scripts reached the server)
    and applied once: the estimate of 10 settled to 4 leaves 4, not 0."""
    async with arl.Backend.from_url(proxy.url, timeout=1.0, connect_timeout=0.5) as backend:
        limiter = arl.FixedWindow("100/hour", backend=backend)
        warm = await limiter.reserve(f"{key}-warm", 2)  # the refund script loaded: the
        warm.settle(1)  # reply dropped below is the script's, not a NOSCRIPT
        await warm.wait()
        r = await limiter.reserve(key, 10)
        sent = proxy.stats().commands
        before = sent.get("EVALSHA", 0) + sent.get("EVAL", 0)
        proxy.drop_reply(commands={"EVALSHA", "EVAL"})
        r.settle(4)
        await r.wait()
        assert proxy.stats().dropped == 1
        assert r.state == "settled"
        sent = proxy.stats().commands
        assert sent.get("EVALSHA", 0) + sent.get("EVAL", 0) - before == 2
        assert await count(limiter, key) == 4
