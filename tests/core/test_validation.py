"""Bad input raises ValueError or TypeError before any I/O.

The limiters here use a Backend pointed at a port nothing listens on: had a call reached
the network it would raise BackendUnavailable instead, so each ``pytest.raises`` of a
ValueError/TypeError also proves nothing was sent."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support.servers import free_port

import aioratelimit as arl

#: The package without its types, for calls that are wrong on purpose.
untyped: Any = arl

Limiter = arl.FixedWindow | arl.SlidingWindow | arl.TokenBucket


@pytest.fixture
async def nowhere() -> AsyncIterator[arl.Backend]:
    """A backend whose every I/O fails (nothing listens on its port)."""
    url = f"redis://127.0.0.1:{free_port()}"
    async with arl.Backend.from_url(url, timeout=1, connect_timeout=0.5) as backend:
        yield backend


async def test_the_nowhere_backend_really_fails_on_io(nowhere: arl.Backend) -> None:
    """The control: a valid call on this backend does reach the network and fail there."""
    with pytest.raises(arl.BackendUnavailable):
        await arl.FixedWindow("1/second", backend=nowhere).hit("k")


MALFORMED_RATES = [
    "", " ", "100", "/minute", "100/", "100 minute", "100//minute", "100/minute/", "abc/minute",
    "100/fortnight", "100/minutes extra", "-1/minute", "+1/minute", "1.5/minute", "1e3/minute",
    "100/-5s", "100/0s", "100/0ms", "100/0.0001s", "100/0.5ms", "0/minute", "100/1e3s",
    "100/inf", "100/nan", "100/s s", "100/5 5s", "100 / 5 / s", "1_000/minute",
    "ten/second", "100/second;", "100/sec0nd", "per/minute", "0x10/minute",
]  # fmt: skip


@pytest.mark.parametrize("text", MALFORMED_RATES)
def test_malformed_rate_strings_raise_value_error(text: str) -> None:
    """A malformed rate string raises ValueError, from Rate.parse and from a limiter."""
    with pytest.raises(ValueError):  # noqa: PT011  (any ValueError: the message varies)
        arl.Rate.parse(text)
    with pytest.raises(ValueError):  # noqa: PT011
        arl.FixedWindow(text)


@pytest.mark.parametrize(
    ("text", "limit", "window"),
    [
        ("100/minute", 100, 60.0),
        ("10/second", 10, 1.0),
        ("5/10s", 5, 10.0),
        ("1000/hour", 1000, 3600.0),
        ("20000/day", 20000, 86400.0),
        ("3/500ms", 3, 0.5),
        ("1/ms", 1, 0.001),
        ("7/2.5s", 7, 2.5),
        ("2/3m", 2, 180.0),
        ("4/1h", 4, 3600.0),
        ("9/2d", 9, 172800.0),
        ("1 per day", 1, 86400.0),
        ("  12 / Second ", 12, 1.0),
        ("6/seconds", 6, 1.0),
    ],
)
def test_rate_parse_accepts_the_documented_forms(text: str, limit: int, window: float) -> None:
    """Rate.parse reads the documented forms into (limit, window seconds)."""
    rate = arl.Rate.parse(text)
    assert (rate.limit, rate.window) == (limit, window)
    assert arl.Rate.parse(str(rate)) == rate  # str() is parseable and round-trips


@pytest.mark.parametrize(
    ("limit", "window", "error"),
    [
        (0, 1.0, ValueError),
        (-1, 1.0, ValueError),
        (1, 0, ValueError),
        (1, -1.0, ValueError),
        (1, 0.0009, ValueError),
        (1, math.nan, ValueError),
        (1, math.inf, ValueError),
        (1, -math.inf, ValueError),
        (True, 1.0, TypeError),
        (1.5, 1.0, TypeError),
        ("10", 1.0, TypeError),
        (None, 1.0, TypeError),
        (1, "1s", TypeError),
        (1, None, TypeError),
        (1, False, TypeError),
    ],
)
def test_rate_rejects_bad_limit_or_window(limit: Any, window: Any, error: type[Exception]) -> None:
    """Rate needs an int limit >= 1 and a finite window of at least 1 ms."""
    with pytest.raises(error):
        arl.Rate(limit, window)


#: The bounds of what the scripts compute exactly (Lua's doubles): counts up to 2**50,
#: durations up to 2**50 µs in whole seconds.
MAX_COUNT, MAX_SECONDS = 2**50, 1_125_899_906


@pytest.mark.parametrize(
    ("limit", "window"),
    [
        (MAX_COUNT + 1, 1.0),
        (2**53 + 1, 60.0),
        (10**17, 60.0),
        (sys.maxsize, 60.0),
        (1, MAX_SECONDS + 1.0),
        (1, 1e12),
        (1, 1e300),
    ],
)
def test_rate_beyond_what_the_scripts_compute_exactly(limit: int, window: float) -> None:
    """A limit above 2**50 or a window above 2**50 µs raises ValueError naming the bound
    (Lua computes in doubles: past it a decision would be inexact, wrap or fail)."""
    with pytest.raises(ValueError, match=r"2\*\*50"):
        arl.Rate(limit, window)


def test_the_bounds_themselves_are_accepted() -> None:
    """2**50 hits, a window of 2**50 µs in whole seconds, and a TokenBucket that refills in
    2**50 µs are accepted; one more is refused, for a burst too (burst x interval)."""
    assert arl.Rate(MAX_COUNT, 1.0).limit == MAX_COUNT
    assert arl.Rate(1, MAX_SECONDS).window_us == MAX_SECONDS * 10**6
    assert arl.Rate.parse("1/13031d").window == 13031 * 86400.0
    with pytest.raises(ValueError, match=r"2\*\*50"):
        arl.Rate.parse("1/13032d")
    assert arl.TokenBucket(arl.Rate(MAX_COUNT, 1.0), burst=MAX_COUNT).burst == MAX_COUNT
    assert arl.TokenBucket(arl.Rate(1, 1.0), burst=MAX_COUNT // 10**6).burst == MAX_COUNT // 10**6
    for burst in (MAX_COUNT // 10**6 + 1, MAX_COUNT + 1):
        with pytest.raises(ValueError, match=r"2\*\*50"):
            arl.TokenBucket(arl.Rate(1, 1.0), burst=burst)


async def test_counts_and_durations_past_the_bounds_raise_before_io(
    nowhere: arl.Backend,
) -> None:
    """A partial cost above 2**50, and a block, TTL, lease or timeout above 2**50 µs,
    raise ValueError before any I/O, on every primitive that sends one."""
    limiter = arl.TokenBucket("5/second", backend=nowhere, blockable=True)
    too_long = MAX_SECONDS + 1.0
    with pytest.raises(ValueError, match=r"cost must be <= 2\*\*50"):
        await limiter.hit("k", MAX_COUNT + 1, partial=True)
    with pytest.raises(ValueError, match=r"cost must be <= 2\*\*50"):
        await limiter.peek("k", 10**17, partial=True)
    with pytest.raises(ValueError, match="seconds must be <="):
        await limiter.block("k", too_long)
    with pytest.raises(ValueError, match="timeout must be <="):
        await limiter.acquire("k", wait=True, timeout=too_long)
    with pytest.raises(ValueError, match="ttl must be <="):
        arl.Lock("l", ttl=too_long, backend=nowhere)
    with pytest.raises(ValueError, match="ttl must be <="):
        arl.Semaphore("s", ttl=1e12, backend=nowhere)
    with pytest.raises(ValueError, match="ttl must be <="):
        await arl.issue_token(ttl=too_long, backend=nowhere)
    with pytest.raises(ValueError, match="lease must be <="):
        arl.idempotent(key="k", lease=1e18, backend=nowhere)


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: untyped.FixedWindow(), TypeError),
        (lambda: untyped.SlidingWindow(), TypeError),
        (lambda: untyped.FixedWindow("10/minute", "10/60s"), ValueError),
        (lambda: untyped.SlidingWindow("5/second", arl.Rate(5, 1.0)), ValueError),
        (lambda: untyped.FixedWindow(10), TypeError),
        (lambda: untyped.FixedWindow(None), TypeError),
        (lambda: untyped.FixedWindow(("10", "minute")), TypeError),
        (lambda: untyped.TokenBucket(None), TypeError),
        (lambda: untyped.TokenBucket("10/second", burst=0), ValueError),
        (lambda: untyped.TokenBucket("10/second", burst=-1), ValueError),
        (lambda: untyped.TokenBucket("10/second", burst=2.0), TypeError),
        (lambda: untyped.TokenBucket("10/second", burst=True), TypeError),
        (lambda: untyped.SlidingWindow("10/second", buckets=0), ValueError),
        (lambda: untyped.SlidingWindow("10/second", buckets=-3), ValueError),
        (lambda: untyped.SlidingWindow("10/second", buckets=1001), ValueError),
        (lambda: untyped.SlidingWindow("10/second", buckets=10**9), ValueError),
        (lambda: untyped.SlidingWindow("10/second", buckets=2.5), TypeError),
        (lambda: untyped.SlidingWindow("10/second", buckets="10"), TypeError),
        (lambda: untyped.FixedWindow("10/second", name=""), ValueError),
        (lambda: untyped.FixedWindow("10/second", name=3), TypeError),
        (lambda: untyped.FixedWindow("10/second", backend="redis://x"), TypeError),
    ],
)
def test_bad_limiter_arguments(build: Any, error: type[Exception]) -> None:
    """Bad rates, duplicates, burst/buckets/name/backend out of range raise at construction."""
    with pytest.raises(error):
        build()


BAD_COSTS: list[tuple[Any, type[Exception]]] = [
    (0, ValueError),
    (-1, ValueError),
    (6, ValueError),  # above the tightest limit: could never be admitted
    (10**12, ValueError),
    (1.0, TypeError),
    (2.5, TypeError),
    (True, TypeError),
    (False, TypeError),
    ("1", TypeError),
    (None, TypeError),
]

BAD_KEYS: list[tuple[Any, type[Exception]]] = [
    ("", ValueError),
    ("ab\udc80", ValueError),  # a lone surrogate: no UTF-8 form, on any backend
    (None, TypeError),
    (42, TypeError),
    (b"bytes", TypeError),
    (("a",), TypeError),
]

LIMITERS: dict[str, Callable[[arl.Backend], Limiter]] = {
    "fixed": lambda b: arl.FixedWindow("5/minute", "10/hour", backend=b),
    "sliding": lambda b: arl.SlidingWindow("5/minute", "10/hour", backend=b),
    "token": lambda b: arl.TokenBucket("10/minute", burst=5, backend=b),
}


@pytest.fixture(params=sorted(LIMITERS))
def limiter(request: pytest.FixtureRequest, nowhere: arl.Backend) -> Limiter:
    """Each algorithm, with a tightest limit (or burst) of 5, on the nowhere backend."""
    return LIMITERS[request.param](nowhere)


@pytest.mark.parametrize(("cost", "error"), BAD_COSTS)
async def test_bad_cost_raises_before_io(
    limiter: Limiter, cost: Any, error: type[Exception]
) -> None:
    """A cost < 1, above the limit or not an int raises before any I/O, on every entry point."""
    with pytest.raises(error):
        await limiter.hit("k", cost)
    with pytest.raises(error):
        await limiter.peek("k", cost)
    with pytest.raises(error):
        await limiter.acquire("k", cost, wait=True, timeout=1)
    with pytest.raises(error):
        async with limiter("k", cost=cost):
            pass
    with pytest.raises(error):
        limiter.limit(key="k", cost=cost)


@pytest.mark.parametrize(("key", "error"), BAD_KEYS)
async def test_bad_key_raises_before_io(limiter: Limiter, key: Any, error: type[Exception]) -> None:
    """An empty or non-str key raises before any I/O, on every entry point."""
    with pytest.raises(error):
        await limiter.hit(key)
    with pytest.raises(error):
        await limiter.peek(key)
    with pytest.raises(error):
        await limiter.reset(key)
    with pytest.raises(error):
        await limiter.acquire(key, wait=True)
    with pytest.raises(error):
        async with limiter(key):
            pass

    ran = False

    @limiter.limit(key=lambda: key)
    async def endpoint() -> None:
        nonlocal ran
        ran = True

    with pytest.raises(error):
        await endpoint()
    assert not ran


@pytest.mark.parametrize("where", ["memory", "redis"])
async def test_a_key_that_is_not_text_is_refused_alike_on_every_backend(
    where: str, nowhere: arl.Backend
) -> None:
    """A key, name or prefix holding a lone surrogate (no UTF-8 form) raises the same
    ValueError before any I/O on memory:// as on Redis (not a UnicodeEncodeError from the
    wire, nor a key memory:// alone would take), for every kind of key."""
    bad = "user-\udc80"
    backend = arl.Backend.from_url("memory://") if where == "memory" else nowhere

    @arl.idempotent(key=lambda: bad, backend=backend)
    async def charge() -> None:
        raise AssertionError("ran")

    @arl.FixedWindow("5/minute", backend=backend).limit(key=lambda: bad)
    async def endpoint() -> None:
        raise AssertionError("ran")

    async def called(call: Callable[[], Any]) -> None:
        result = call()
        if asyncio.iscoroutine(result):
            await result

    calls: list[Callable[[], Any]] = [
        lambda: arl.FixedWindow("5/minute", backend=backend).hit(bad),
        lambda: arl.SlidingWindow("5/minute", backend=backend).peek(bad),
        lambda: arl.TokenBucket("5/minute", backend=backend).reset(bad),
        lambda: arl.FixedWindow("5/minute", backend=backend, name=bad),
        lambda: arl.Lock(bad, backend=backend),
        lambda: arl.Semaphore(bad, backend=backend),
        charge,
        endpoint,
    ]
    for call in calls:
        with pytest.raises(ValueError, match="lone surrogate") as info:
            await called(call)
        assert type(info.value) is ValueError
    with pytest.raises(ValueError, match="lone surrogate"):
        arl.Backend.from_url("memory://", prefix=bad)
    await backend.aclose()


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (-1, ValueError),
        (-0.001, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("1", TypeError),
        (True, TypeError),
    ],
)
async def test_bad_timeout_raises_before_io(
    limiter: Limiter, timeout: Any, error: type[Exception]
) -> None:
    """A negative, NaN, infinite or non-number timeout raises before any I/O."""
    with pytest.raises(error):
        await limiter.acquire("k", wait=True, timeout=timeout)
    with pytest.raises(error):
        await limiter.acquire("k", timeout=timeout)
    with pytest.raises(error):
        async with limiter("k", wait=True, timeout=timeout):
            pass
    with pytest.raises(error):
        limiter.limit(key="k", timeout=timeout)


def test_decorator_key_must_be_str_or_callable(nowhere: arl.Backend) -> None:
    """``@limiter.limit(key=...)`` takes a non-empty str or a callable."""
    limiter = arl.FixedWindow("5/minute", backend=nowhere)
    with pytest.raises(TypeError):
        limiter.limit(key=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # noqa: PT011
        limiter.limit(key="")


@pytest.mark.parametrize(
    ("url", "options", "error"),
    [
        ("http://127.0.0.1:6379", {}, ValueError),
        ("127.0.0.1:6379", {}, ValueError),
        ("", {}, ValueError),
        ("redis:/127.0.0.1", {}, ValueError),
        ("memcached://127.0.0.1", {}, ValueError),
        (None, {}, TypeError),
        (b"redis://127.0.0.1", {}, TypeError),
        ("redis://127.0.0.1", {"prefix": ""}, ValueError),
        ("memory://", {"prefix": ""}, ValueError),
        ("redis://127.0.0.1", {"prefix": 5}, TypeError),
        ("redis://127.0.0.1", {"max_connections": 0}, ValueError),
        ("redis://127.0.0.1", {"timeout": 0}, ValueError),
        ("redis://127.0.0.1", {"timeout": -1.0}, ValueError),
        ("redis://127.0.0.1", {"timeout": math.nan}, ValueError),
        ("redis://127.0.0.1", {"connect_timeout": math.inf}, ValueError),
    ],
)
def test_bad_backend_arguments(url: Any, options: dict[str, Any], error: type[Exception]) -> None:
    """An unsupported URL scheme, an empty prefix or a bad pool option raises at once."""
    with pytest.raises(error):
        arl.Backend.from_url(url, **options)
