"""Conformance suite for the three rate limiters, run on every backend of the ``backend``
fixture (memory://, a Redis server, a Redis Cluster, a Sentinel master).

Timing-sensitive checks read the clock the decision used (``now_us``, the last field of
every limiter script's raw reply) through a wrapper around ``backend._run``, and sleep
only with generous margins, so they hold on a loaded machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from support.pace import now, pace

import aioratelimit as arl
from aioratelimit._rates import new_decision
from aioratelimit._scripts import Arg, Reply, Script

Make = Callable[[str, arl.Backend], Any]

ALGORITHMS: dict[str, Make] = {
    "fixed": lambda rate, backend: arl.FixedWindow(rate, backend=backend),
    "sliding": lambda rate, backend: arl.SlidingWindow(rate, backend=backend),
    "token": lambda rate, backend: arl.TokenBucket(rate, backend=backend),
}


@pytest.fixture(params=sorted(ALGORITHMS))
def make(request: pytest.FixtureRequest) -> Make:
    """A limiter factory for each algorithm: ``make("5/hour", backend)``."""
    return ALGORITHMS[request.param]


#: the scripts a reset runs (not limiter decisions)
RESETS = ("delete", "rate_invalidate")


class Recorder:
    """Wraps ``backend._run`` to keep every raw script reply (the last field is now_us)."""

    def __init__(self, backend: arl.Backend) -> None:
        self.calls: list[tuple[str, list[Arg], Any]] = []
        inner = backend._run

        async def run(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
            reply = await inner(script, keys, args)
            self.calls.append((script.name, list(args), reply))
            return reply

        backend._run = run

    def admitted(self) -> list[tuple[int, int]]:
        """(now_us, cost) of every admitted limiter hit (peeks excluded), by server time: a
        TokenBucket waiter's booking is admitted at now_us + retry_after_us."""
        return sorted(
            (int(reply[5]) + int(reply[4]), int(args[0]))
            for name, args, reply in self.calls
            if name not in RESETS and int(args[1]) == 1 and reply[0] == 1
        )

    def limiter_calls(self) -> int:
        return sum(name not in RESETS for name, _, _ in self.calls)


async def hits(limiter: Any, key: str, n: int, cost: int = 1) -> list[arl.Decision]:
    return [await limiter.hit(key, cost) for _ in range(n)]


# -- admitting and denying -----------------------------------------------------------------


async def test_admits_exactly_the_limit_then_denies(
    backend: arl.Backend, make: Make, key: str
) -> None:
    """Five hits on 5/hour are admitted with remaining 4..0; every later hit is denied."""
    limiter = make("5/hour", backend)
    decisions = await hits(limiter, key, 8)
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 3
    assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0, 0, 0, 0]
    assert all(d.limit == 5 for d in decisions)
    assert all(d.retry_after == 0.0 for d in decisions[:5])
    assert all(0 < d.retry_after <= 3600 * 1.1 for d in decisions[5:])  # + a bucket


async def test_cost_counts_and_denied_costs_count_nothing(
    backend: arl.Backend, make: Make, key: str
) -> None:
    """Costs add up to the limit; a denied cost is not counted, so a smaller one still fits."""
    limiter = make("10/hour", backend)
    assert [(d.allowed, d.remaining) for d in await hits(limiter, key, 2, cost=4)] == [
        (True, 6),
        (True, 2),
    ]
    denied = await hits(limiter, key, 5, cost=4)
    assert [(d.allowed, d.remaining) for d in denied] == [(False, 2)] * 5
    assert all(d.retry_after > 0 for d in denied)
    last = await limiter.hit(key, 2)
    assert (last.allowed, last.remaining) == (True, 0)
    assert not (await limiter.hit(key)).allowed


async def test_cost_equal_to_the_limit(backend: arl.Backend, make: Make, key: str) -> None:
    """A cost equal to the limit is admitted on a fresh key and leaves nothing."""
    limiter = make("7/hour", backend)
    first = await limiter.hit(key, 7)
    assert (first.allowed, first.remaining) == (True, 0)
    assert not (await limiter.hit(key, 1)).allowed


async def test_full_limit_returns_after_reset_after_despite_denials(
    backend: arl.Backend, make: Make, key: str
) -> None:
    """Denied hits write nothing: the whole limit is back once reset_after has passed."""
    limiter = make("3/600ms", backend)
    loop = asyncio.get_running_loop()
    started = loop.time()
    admitted = await hits(limiter, key, 3)
    t_admitted = loop.time()
    assert all(d.allowed for d in admitted)
    # One denied hit at once, whatever the machine's pace (a loaded CI runner once took
    # 120 ms for the three hits above); then more for up to 120 ms after the first hit:
    # past two SlidingWindow buckets (60 ms each), before the TokenBucket's next token
    # (200 ms).
    denied = [await limiter.hit(key)]
    while len(denied) < 10 and loop.time() < started + 0.12:
        await asyncio.sleep(0.01)
        denied.append(await limiter.hit(key))
    assert not any(d.allowed for d in denied)
    await asyncio.sleep(max(0.0, t_admitted + admitted[-1].reset_after + 0.05 - loop.time()))
    again = await hits(limiter, key, 3)
    assert [(d.allowed, d.remaining) for d in again] == [(True, 2), (True, 1), (True, 0)]


async def test_keys_have_separate_counters(backend: arl.Backend, make: Make, key: str) -> None:
    """Filling one key's limit leaves another key untouched."""
    limiter = make("2/hour", backend)
    await hits(limiter, key, 3)
    other = await limiter.hit(key + "-other")
    assert (other.allowed, other.remaining) == (True, 1)


# -- several rates -------------------------------------------------------------------------

MULTI: dict[str, Callable[..., Any]] = {
    "fixed": lambda *rates, backend: arl.FixedWindow(*rates, backend=backend),
    "sliding": lambda *rates, backend: arl.SlidingWindow(*rates, backend=backend),
}


@pytest.mark.parametrize("kind", sorted(MULTI))
@pytest.mark.parametrize("reverse", [False, True], ids=["short-first", "long-first"])
async def test_hit_denied_by_the_short_rate_is_not_counted_by_the_long_one(
    backend: arl.Backend, key: str, kind: str, reverse: bool
) -> None:
    """3/minute denies; 5/hour would admit but must not count the denied hits."""
    rates = ["3/minute", "5/hour"]
    limiter = MULTI[kind](*(rates[::-1] if reverse else rates), backend=backend)
    assert (await limiter.hit(key, 3)).allowed
    denied = await hits(limiter, key, 5)
    assert [(d.allowed, d.limit) for d in denied] == [(False, 3)] * 5
    # Cost 2 is denied only by 3/minute (a wait under a minute) if 5/hour still holds 3;
    # had the denied hits been counted there, 5/hour would deny it for about an hour.
    fits_hour = await limiter.peek(key, 2)
    assert (fits_hour.allowed, fits_hour.limit) == (False, 3)
    assert 0 < fits_hour.retry_after <= 66  # a minute, + a bucket for SlidingWindow
    # The control: cost 3 would overflow 5/hour, and then it is the hour that is reported.
    over_hour = await limiter.peek(key, 3)
    assert (over_hour.allowed, over_hour.limit) == (False, 5)
    assert over_hour.retry_after > 66


@pytest.mark.parametrize("kind", sorted(MULTI))
@pytest.mark.parametrize("reverse", [False, True], ids=["short-first", "long-first"])
async def test_hit_denied_by_the_long_rate_is_not_counted_by_the_short_one(
    backend: arl.Backend, key: str, kind: str, reverse: bool
) -> None:
    """6/hour denies a cost of 3; 10/minute would admit it but must not count it."""
    rates = ["10/minute", "6/hour"]
    limiter = MULTI[kind](*(rates[::-1] if reverse else rates), backend=backend)
    assert (await limiter.hit(key, 4)).allowed
    denied = await hits(limiter, key, 5, cost=3)
    assert [(d.allowed, d.limit) for d in denied] == [(False, 6)] * 5
    # 10/minute holds 4, not 4 + 5 * 3: a cost of 2 fits both rates.
    last = await limiter.hit(key, 2)
    assert (last.allowed, last.remaining) == (True, 0)
    assert last.limit == 6


async def test_tightest_rate_is_reported(backend: arl.Backend, key: str) -> None:
    """Decision reports the rate with fewest hits left, or when denied the longest wait."""
    limiter = arl.FixedWindow("10/second", "3/minute", backend=backend)
    d = await limiter.hit(key)
    assert (d.limit, d.remaining) == (3, 2)
    await hits(limiter, key, 2)
    denied = await limiter.hit(key)
    assert (denied.allowed, denied.limit, denied.remaining) == (False, 3, 0)
    assert 1 < denied.retry_after <= 60


# -- peek and reset ------------------------------------------------------------------------


async def test_peek_changes_nothing(backend: arl.Backend, make: Make, key: str) -> None:
    """Peeks answer what a hit would, but count nothing, before and after the limit."""
    limiter = make("3/hour", backend)
    peeks = [await limiter.peek(key) for _ in range(10)]
    assert all((p.allowed, p.limit, p.remaining) == (True, 3, 2) for p in peeks)
    assert [d.remaining for d in await hits(limiter, key, 2)] == [2, 1]
    assert (await limiter.peek(key, 2)).allowed is False
    peek = await limiter.peek(key)
    hit = await limiter.hit(key)
    assert (peek.allowed, peek.limit, peek.remaining) == (hit.allowed, hit.limit, hit.remaining)
    denied_peeks = [await limiter.peek(key) for _ in range(10)]
    assert all(not p.allowed and p.retry_after > 0 for p in denied_peeks)
    assert not (await limiter.hit(key)).allowed


async def test_reset_forgets_the_key(backend: arl.Backend, make: Make, key: str) -> None:
    """After reset the key has its whole limit again; other keys keep their counts."""
    limiter = make("2/hour", backend)
    await hits(limiter, key, 3)
    await hits(limiter, key + "-b", 2)
    await limiter.reset(key)
    assert [d.allowed for d in await hits(limiter, key, 3)] == [True, True, False]
    assert not (await limiter.hit(key + "-b")).allowed
    await limiter.reset(key + "-never-used")  # resetting an unknown key is fine


@pytest.mark.parametrize("kind", sorted(MULTI))
async def test_reset_clears_every_rate(backend: arl.Backend, key: str, kind: str) -> None:
    """Reset of a multi-rate limiter clears all its rates."""
    limiter = MULTI[kind]("2/minute", "3/hour", backend=backend)
    await hits(limiter, key, 2)
    assert not (await limiter.hit(key)).allowed
    await limiter.reset(key)
    d = await limiter.hit(key, 2)
    assert (d.allowed, d.remaining) == (True, 0)
    assert (await limiter.peek(key)).allowed is False


# -- Decision fields -----------------------------------------------------------------------


async def test_fixed_window_decision_fields(backend: arl.Backend, key: str) -> None:
    """FixedWindow: the window starts at the first hit, so its reset_after is the window."""
    limiter = arl.FixedWindow("2/minute", backend=backend)
    first = await limiter.hit(key)
    assert first == arl.Decision(True, 2, 1, 60.0, 0.0, granted=1)
    second = await limiter.hit(key)
    assert (second.allowed, second.remaining, second.retry_after) == (True, 0, 0.0)
    assert 50 < second.reset_after <= 60
    denied = await limiter.hit(key)
    assert (denied.allowed, denied.limit, denied.remaining) == (False, 2, 0)
    assert 50 < denied.retry_after <= 60
    assert denied.retry_after == denied.reset_after


async def test_decisions_are_true_frozen_dataclasses(backend: arl.Backend, key: str) -> None:
    """A decision read from a reply, and one the deny cache makes, are built in place (not
    through ``__init__``) yet are true ``Decision``s: type, equality, hash, repr, frozen."""
    made = arl.Decision(True, 2, 1, 60.0, 0.0, granted=1)
    read = await arl.FixedWindow("2/minute", backend=backend).hit(key)
    cached = new_decision(True, 2, 1, 60.0, 0.0, "redis", granted=1)
    for d in (read, cached):
        assert type(d) is arl.Decision
        assert (d, hash(d), repr(d)) == (made, hash(made), repr(made))
        with pytest.raises(dataclasses.FrozenInstanceError):
            d.allowed = False  # type: ignore[misc]
        assert d.allowed is True


#: Windows about the millisecond and off it (whole µs), alone and together (limits apart,
#: so the reported rate is known by its limit; a TokenBucket takes one rate). The bounds
#: hold at any pace; the longest window sets how long the test sleeps (about three of them).
BOUNDED = [
    [arl.Rate(3, 0.002)],
    [arl.Rate(2, 0.0015)],
    [arl.Rate(5, 0.0333), arl.Rate(9, 0.1)],
    [arl.Rate(1, 0.001001), arl.Rate(4, 0.0105), arl.Rate(7, 0.05)],
]


@pytest.mark.parametrize(
    ("kind", "rates"),
    [(k, rs) for rs in BOUNDED for k in sorted(ALGORITHMS) if k != "token" or len(rs) == 1],
    ids=lambda v: v if isinstance(v, str) else "+".join(map(str, v)),
)
async def test_reset_and_retry_after_never_exceed_the_window(
    backend: arl.Backend, key: str, kind: str, rates: list[arl.Rate]
) -> None:
    """Every decision's reset_after and retry_after are within the window of the rate it
    reports, for hits and peeks bunched into the first milliseconds of a window and spread
    over several windows. A FixedWindow's end is kept in whole ms, rounded up (its first ms
    once reported up to 999 µs more); a SlidingWindow's bound is the window plus one
    sub-window, a TokenBucket's the time to refill the burst, both in the whole µs of a
    sub-window or a token (the window rounded up to them)."""
    limiter: Any = {
        "fixed": arl.FixedWindow,
        "sliding": arl.SlidingWindow,
        "token": arl.TokenBucket,
    }[kind](*rates, backend=backend)
    per = {"fixed": 1, "sliding": 10, "token": rates[0].limit}[kind]  # sub-windows, tokens
    grain = {"fixed": 0, "sliding": 1, "token": 0}[kind]  # sub-windows over the window
    bounds = {r.limit: -(-r.window_us // per) * (per + grain) / 1e6 for r in rates}
    rng = random.Random(f"{key}{kind}")
    decisions = []
    for _ in range(6):
        for _ in range(rng.randrange(4, 12)):
            cost = rng.randint(1, min(bounds))
            hit = limiter.hit if rng.random() < 0.8 else limiter.peek
            decisions.append(await hit(key, cost))
        await asyncio.sleep(rng.uniform(0, max(rate.window for rate in rates)))
    assert any(not d.allowed for d in decisions)
    for d in decisions:
        bound = bounds[d.limit]
        assert 0 < d.reset_after <= bound, (d, bound)
        assert 0 <= d.retry_after <= bound, (d, bound)


async def test_sliding_window_decision_fields(backend: arl.Backend, key: str) -> None:
    """SlidingWindow: capacity is fully back one window after the current bucket ends."""
    limiter = arl.SlidingWindow("2/minute", buckets=10, backend=backend)
    first = await limiter.hit(key)
    assert (first.allowed, first.limit, first.remaining, first.retry_after) == (True, 2, 1, 0.0)
    assert 60 < first.reset_after <= 66
    await limiter.hit(key)
    denied = await limiter.hit(key)
    assert (denied.allowed, denied.limit, denied.remaining) == (False, 2, 0)
    assert 60 < denied.retry_after <= 66
    assert denied.reset_after >= denied.retry_after


async def test_token_bucket_decision_fields(backend: arl.Backend, key: str) -> None:
    """TokenBucket: each token takes window/limit to come back; limit is the burst."""
    limiter = arl.TokenBucket("2/minute", backend=backend)
    first = await limiter.hit(key)
    assert first == arl.Decision(True, 2, 1, 30.0, 0.0, granted=1)
    second = await limiter.hit(key)
    assert (second.allowed, second.remaining, second.retry_after) == (True, 0, 0.0)
    assert 59 < second.reset_after <= 60
    denied = await limiter.hit(key)
    assert (denied.allowed, denied.limit, denied.remaining) == (False, 2, 0)
    assert 29 < denied.retry_after <= 30


async def test_token_bucket_burst_larger_than_rate(backend: arl.Backend, key: str) -> None:
    """burst=5 on 1/minute admits five at once, then one per minute."""
    limiter = arl.TokenBucket("1/minute", burst=5, backend=backend)
    decisions = await hits(limiter, key, 6)
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.limit for d in decisions] == [5] * 6
    assert 59 < decisions[-1].retry_after <= 60
    assert 299 < decisions[-1].reset_after <= 300


# -- time ----------------------------------------------------------------------------------


async def test_sub_second_window_recovers(backend: arl.Backend, make: Make, key: str) -> None:
    """3/200ms: a denial lasts at most ~200 ms and ends after its retry_after."""
    limiter = make("3/200ms", backend)
    decisions = [await limiter.hit(key)]
    while decisions[-1].allowed and len(decisions) < 10:
        decisions.append(await limiter.hit(key))
    assert len(decisions) >= 4  # (exactly 4 unless the machine stalled for ~70 ms)
    assert not decisions[-1].allowed
    retry = decisions[-1].retry_after
    assert 0 < retry <= 0.22  # a SlidingWindow may add one bucket (20 ms)
    await asyncio.sleep(retry + 0.02)
    assert (await limiter.hit(key)).allowed


@pytest.mark.parametrize("buckets", [1, 3, 10])
async def test_sliding_window_never_exceeds_the_limit_in_any_interval(
    backend: arl.Backend, key: str, buckets: int
) -> None:
    """Under random traffic no interval of length window holds more than limit admitted."""
    seed = f"{key}-{buckets}"
    rng = random.Random(seed)
    # Random bursts; each admission is timed by the store's own clock.
    limit, window_us = 6, pace(backend, network=250_000, memory=100_000)
    limiter = arl.SlidingWindow(arl.Rate(limit, window_us / 1e6), buckets=buckets, backend=backend)
    recorder = Recorder(backend)
    costs: list[int] = []
    loop = asyncio.get_running_loop()
    # At least three windows, and on until the stream has gone past the limit and been
    # denied: a machine that stalls can leave three windows with one window's traffic.
    end, give_up = (loop.time() + n * window_us / 1e6 for n in (3, 40))
    while True:
        burst = [rng.choice([1, 1, 1, 2, 3]) for _ in range(rng.randint(1, 4))]
        costs.extend(burst)
        await asyncio.gather(*(limiter.hit(key, c) for c in burst))
        await asyncio.sleep(rng.uniform(0, window_us / 1e6 / 4))
        admitted = recorder.admitted()
        tested = sum(c for _, c in admitted) > limit and len(admitted) < len(costs)
        if loop.time() >= give_up or (loop.time() >= end and tested):
            break
    assert recorder.limiter_calls() == len(costs)
    assert sum(c for _, c in admitted) > limit  # the stream really went past the limit...
    assert len(admitted) < len(costs)  # ...and was really denied at times
    for i, (start, _) in enumerate(admitted):
        inside = sum(c for t, c in admitted[i:] if t <= start + window_us)
        assert inside <= limit, f"{inside} admitted in [{start}, {start + window_us}] us ({seed})"


async def test_token_bucket_steady_rate_after_the_burst(backend: arl.Backend, key: str) -> None:
    """A burst of `burst` at once, then one token per interval, never more in any stretch."""
    limiter = arl.TokenBucket("20/second", burst=5, backend=backend)
    recorder = Recorder(backend)
    burst = await hits(limiter, key, 5)
    assert all(d.allowed for d in burst)
    for _ in range(8):
        await limiter.acquire(key, wait=True, timeout=5)
    admitted = recorder.admitted()
    assert len(admitted) == 13
    interval_us = 50_000
    for i, (start, _) in enumerate(admitted):
        for j in range(i, len(admitted)):
            taken = j - i + 1
            assert taken <= 5 + (admitted[j][0] - start) // interval_us
    # The steady part runs at about the rate (ideally 8 x 50 ms; generous for a loaded
    # machine, but far below what sleeping a whole window per try would take).
    assert admitted[-1][0] - admitted[0][0] <= 2_000_000


# -- async with, wait=True, the decorator ---------------------------------------------------


async def test_async_with_admits_and_yields_the_decision(
    backend: arl.Backend, make: Make, key: str
) -> None:
    """``async with limiter(key)`` runs the block with the admitting decision."""
    limiter = make("2/hour", backend)
    async with limiter(key) as decision:
        assert (decision.allowed, decision.remaining) == (True, 1)
    async with limiter(key, cost=1) as decision:
        assert decision.remaining == 0


async def test_async_with_raises_rate_limited_when_denied(
    backend: arl.Backend, make: Make, key: str
) -> None:
    """A denied ``async with`` raises RateLimited with the decision; the block never runs."""
    limiter = make("1/hour", backend)
    await limiter.hit(key)
    ran = False
    with pytest.raises(arl.RateLimited) as info:
        async with limiter(key):
            ran = True
    assert not ran
    assert isinstance(info.value, arl.AioRateLimitError)
    assert info.value.decision.allowed is False
    assert info.value.decision.limit == 1
    assert info.value.retry_after == info.value.decision.retry_after
    assert 0 < info.value.retry_after <= 3600 * 1.1


async def test_wait_sleeps_for_retry_after_and_succeeds(
    backend: arl.Backend, make: Make, key: str
) -> None:
    """``wait=True`` sleeps until the hit can be admitted (a few tries, not polling)."""
    limiter = make("2/400ms", backend)
    while (await limiter.hit(key)).allowed:  # full: the next try is denied (for >= 200 ms)
        pass
    recorder = Recorder(backend)
    started = now()
    async with limiter(key, wait=True, timeout=10) as decision:
        assert decision.allowed
    elapsed = now() - started
    first_retry = recorder.calls[0][2][4] / 1e6
    if isinstance(limiter, arl.TokenBucket):
        # One call: the slot was booked (admitted, retry_after_us ahead), then it slept.
        assert recorder.calls[0][2][0] == 1
        assert first_retry > 0
        assert recorder.limiter_calls() == 1
    else:
        assert recorder.calls[0][2][0] == 0  # the first try was denied...
        assert 2 <= recorder.limiter_calls() <= 4  # ...then it slept instead of polling
    assert first_retry - 0.01 <= elapsed < 5


async def test_wait_with_a_short_timeout_raises_at_once(
    backend: arl.Backend, make: Make, key: str
) -> None:
    """wait=True with a timeout shorter than retry_after raises RateLimited at once."""
    limiter = make("1/hour", backend)
    await limiter.hit(key)
    started = now()
    with pytest.raises(arl.RateLimited) as info:
        await limiter.acquire(key, wait=True, timeout=0.2)
    assert now() - started < 1.0
    assert info.value.retry_after > 0.2
    with pytest.raises(arl.RateLimited):
        async with limiter(key, wait=True, timeout=0):
            pass


async def test_wait_within_the_timeout_succeeds(backend: arl.Backend, make: Make, key: str) -> None:
    """``wait=True`` with a timeout longer than retry_after is admitted."""
    limiter = make(pace(backend, network="1/200ms", memory="1/100ms"), backend)
    await limiter.hit(key)
    decision = await limiter.acquire(key, wait=True, timeout=5)
    assert decision.allowed


async def test_decorator_with_key_from_the_arguments(backend: arl.Backend, key: str) -> None:
    """``@limiter.limit(key=callable)`` limits per key computed from the call's arguments."""
    limiter = arl.FixedWindow("2/hour", backend=backend)
    seen: list[tuple[str, int]] = []

    @limiter.limit(key=lambda user, n, **kw: f"{key}:{user}:{kw.get('scope', '')}")
    async def handle(user: str, n: int, *, scope: str = "") -> int:
        """Doc of handle."""
        seen.append((user, n))
        return n * 2

    assert handle.__name__ == "handle"
    assert handle.__doc__ == "Doc of handle."
    assert [await handle("ann", 1), await handle("ann", 2)] == [2, 4]
    with pytest.raises(arl.RateLimited):
        await handle("ann", 3)
    assert await handle("bob", 4) == 8  # another key
    assert await handle("ann", 5, scope="x") == 10  # keyword arguments reach the key too
    assert seen == [("ann", 1), ("ann", 2), ("bob", 4), ("ann", 5)]


async def test_decorator_with_a_str_key_and_cost(backend: arl.Backend, key: str) -> None:
    """``@limiter.limit(key="...", cost=2)`` shares one key across every call."""
    limiter = arl.TokenBucket("5/hour", backend=backend)

    @limiter.limit(key=key, cost=2)
    async def work() -> str:
        return "done"

    assert [await work(), await work()] == ["done", "done"]
    with pytest.raises(arl.RateLimited) as info:
        await work()
    assert info.value.decision.remaining == 1
    assert (await limiter.hit(key)).allowed  # the single token left is still there


async def test_decorator_with_wait(backend: arl.Backend, key: str) -> None:
    """``@limiter.limit(..., wait=True)`` waits for its turn instead of raising."""
    rate = pace(backend, network="1/200ms", memory="1/100ms")
    limiter = arl.SlidingWindow(rate, buckets=4, backend=backend)

    @limiter.limit(key=key, wait=True, timeout=5)
    async def work(n: int) -> int:
        return n

    assert [await work(i) for i in range(3)] == [0, 1, 2]


# -- what separates limiters ---------------------------------------------------------------


async def test_name_separates_limiters(backend: arl.Backend, make: Make, key: str) -> None:
    """Limiters with different names count separately; the same name shares counts."""

    def named(name: str | None) -> Any:
        limiter = make("1/hour", backend)
        return type(limiter)("1/hour", backend=backend, name=name)

    assert (await named("login").hit(key)).allowed
    assert not (await named("login").hit(key)).allowed  # the control: one name, one counter
    assert (await named("search").hit(key)).allowed
    assert (await named(None).hit(key)).allowed  # unnamed is yet another limiter


@pytest.mark.parametrize("kind", sorted(ALGORITHMS))
async def test_same_rate_unnamed_limiters_share_counts(
    backend: arl.Backend, key: str, kind: str
) -> None:
    """Limiters of one algorithm and rate share one counter per key; other algorithms don't."""
    one = ALGORITHMS[kind]("2/hour", backend)
    two = ALGORITHMS[kind]("2/hour", backend)
    assert (await one.hit(key)).allowed
    assert (await two.hit(key)).remaining == 0
    others = [ALGORITHMS[k]("2/hour", backend) for k in ALGORITHMS if k != kind]
    for limiter in others:
        assert (await limiter.hit(key)).remaining == 1


async def test_prefix_separates_backends(backend: arl.Backend, make: Make, key: str) -> None:
    """Backends with different prefixes on one store share no state; the same prefix does."""
    other = arl.Backend._of(backend._store, prefix=f"other-{uuid.uuid4().hex[:6]}", url=backend.url)
    same = arl.Backend._of(backend._store, prefix=backend.prefix, url=backend.url)
    assert (await make("1/hour", backend).hit(key)).allowed
    assert not (await make("1/hour", same).hit(key)).allowed  # the control
    assert (await make("1/hour", other).hit(key)).allowed


async def test_memory_never_runs_backwards_when_the_wall_clock_steps_back(
    make: Make, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memory:// reads a monotonic clock anchored to the wall clock: with the wall clock
    stepped back 30 s (NTP, a VM resumed) between hits, no decision reports a reset or a
    retry beyond its window (a SlidingWindow's: the window plus one sub-window), and a
    denied key is admitted again once its window has passed."""
    window = 0.25  # holds the four hits below (microseconds on memory://)
    async with arl.Backend.from_url("memory://") as backend:
        limiter = make(f"2/{int(window * 1000)}ms", backend)
        assert (await limiter.hit(key)).allowed
        real = time.time_ns
        monkeypatch.setattr(time, "time_ns", lambda: real() - 30_000_000_000)
        monkeypatch.setattr(time, "time", lambda: real() / 1e9 - 30.0)
        decisions = [await limiter.hit(key) for _ in range(3)]
        assert [d.allowed for d in decisions] == [True, False, False]
        bound = window * 1.1  # a SlidingWindow: the window and one sub-window
        for d in decisions:
            assert 0 <= d.reset_after <= bound, d
            assert 0 <= d.retry_after <= bound, d
        await asyncio.sleep(bound + 0.05)
        assert (await limiter.hit(key)).allowed
