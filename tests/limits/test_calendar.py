"""Calendar quotas (``Quota``): the period arithmetic in pure Python, walked period by
period through the time zones where midnight misbehaves, and the script path on every
backend with periods computed around the real now.

The server's clock cannot be moved: ``tests/stores/test_oracle.py`` drives the script and
its twin across and out of a quota's bounds on a frozen clock; here the real servers answer
periods that ``zoneinfo`` computes on its own, and bounds left behind on purpose.
"""

from __future__ import annotations

import pickle
import uuid
import zoneinfo
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioratelimit as arl
from aioratelimit._limits.algorithms import _CalendarWindow
from aioratelimit._limits.calendar import PERIODS
from aioratelimit._scripts import FIXED_WINDOW, Arg, Reply, Script
from aioratelimit._stores.memory.store import MemoryStore
from aioratelimit.asgi import RateLimitMiddleware
from aioratelimit.testing import ManualClock, memory_backend

US = 1_000_000
H = 3600 * US


def at(tz: str, year: int, month: int, day: int, *clock: int) -> int:
    """µs since the epoch of a local wall time in ``tz`` (fold=0)."""
    hour, minute, second, us = (*clock, 0, 0, 0, 0)[:4]
    wall = datetime(year, month, day, hour, minute, second, us, tzinfo=ZoneInfo(tz))
    return (wall - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def local(tz: str, us: int) -> datetime:
    return datetime.fromtimestamp(us // US, ZoneInfo(tz)) + timedelta(microseconds=us % US)


# -- the boundaries --------------------------------------------------------------------------


def test_the_last_instant_of_february_belongs_to_february_in_berlin() -> None:
    """2027-02-28 23:59:59.999 in Berlin is in February, whose period ends at 1 March
    00:00 Berlin (23:00 UTC); one ms later is March's, which ends on 1 April."""
    month = arl.Quota(10, "month", tz="Europe/Berlin")
    last = at("Europe/Berlin", 2027, 2, 28, 23, 59, 59, 999_000)
    march = at("Europe/Berlin", 2027, 3, 1)
    assert month.bounds(last) == (
        at("Europe/Berlin", 2027, 2, 1),
        march,
        at("Europe/Berlin", 2027, 4, 1),
    )
    assert march - last == 1_000
    assert march == at("UTC", 2027, 2, 28, 23)
    assert month.bounds(march) == (
        march,
        at("Europe/Berlin", 2027, 4, 1),
        at("Europe/Berlin", 2027, 5, 1),
    )


def test_february_of_a_leap_year_has_29_days() -> None:
    """February 2028 lasts 29 days, February 2027 28; 29 February 2028 is a day of 24 h;
    2028 lasts 366 days."""
    tz = "Europe/Berlin"
    month, day, year = (arl.Quota(1, p, tz=tz) for p in ("month", "day", "year"))
    start, end, _ = month.bounds(at(tz, 2028, 2, 29, 12))
    assert (start, end) == (at(tz, 2028, 2, 1), at(tz, 2028, 3, 1))
    assert end - start == 29 * 24 * H
    start, end, _ = month.bounds(at(tz, 2027, 2, 14))
    assert end - start == 28 * 24 * H
    assert day.bounds(at(tz, 2028, 2, 29, 23, 59)) == (
        at(tz, 2028, 2, 29),
        at(tz, 2028, 3, 1),
        at(tz, 2028, 3, 2),
    )
    start, end, _ = year.bounds(at(tz, 2028, 7, 1))
    assert (start, end) == (at(tz, 2028, 1, 1), at(tz, 2029, 1, 1))
    assert end - start == 366 * 24 * H


@pytest.mark.parametrize(
    ("tz", "when", "hours"),
    [
        ("Europe/Berlin", (2027, 3, 28), 23),
        ("Europe/Berlin", (2027, 10, 31), 25),
        ("America/New_York", (2027, 3, 14), 23),
        ("America/New_York", (2027, 11, 7), 25),
        ("Australia/Lord_Howe", (2027, 4, 4), 24.5),  # a half-hour shift
        ("Europe/Berlin", (2027, 6, 1), 24),
    ],
)
def test_a_day_across_a_dst_shift_lasts_23_or_25_hours(
    tz: str, when: tuple[int, int, int], hours: float
) -> None:
    """A day quota's period is the local day: 23 h when the clocks go forward, 25 h when
    they go back, whatever instant of it asks."""
    day = arl.Quota(1, "day", tz=tz)
    midnight, next_midnight = (
        at(tz, *when),
        at(tz, *(date(*when) + timedelta(days=1)).timetuple()[:3]),
    )
    for now in (midnight, midnight + H, (midnight + next_midnight) // 2, next_midnight - 1):
        start, end, _ = day.bounds(now)
        assert (start, end) == (midnight, next_midnight)
    assert next_midnight - midnight == hours * H


def test_a_week_starts_on_monday() -> None:
    """ISO weeks: Sunday 28 February 2027 is in the week of Monday 22 February; Monday
    1 March starts the next."""
    week = arl.Quota(1, "week", tz="Europe/Berlin")
    tz = "Europe/Berlin"
    assert date(2027, 3, 1).weekday() == 0
    assert week.bounds(at(tz, 2027, 2, 28, 23)) == (
        at(tz, 2027, 2, 22),
        at(tz, 2027, 3, 1),
        at(tz, 2027, 3, 8),
    )


#: Zones where midnight misbehaves: DST at midnight (Sao Paulo, Havana, Beirut, Santiago),
#: half-hour shifts (Lord Howe), a skipped day (Apia, 30 December 2011), odd offsets.
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "America/Sao_Paulo",
    "America/Havana",
    "Asia/Beirut",
    "America/Santiago",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Pacific/Chatham",
    "Asia/Kathmandu",
]
#: the years each period is walked through (a day's are fewer: each is a period)
YEARS = {"day": (2010, 2013), "week": (2008, 2029), "month": (1990, 2040), "year": (1971, 2100)}


@pytest.mark.parametrize("period", PERIODS)
@pytest.mark.parametrize("tz", ZONES)
def test_periods_tile_time_from_the_first_instant_of_their_first_date(tz: str, period: str) -> None:
    """Walked period by period: each holds the instant asked and its last µs, the next
    starts where it ends, and each starts at the first instant whose local date is its
    first day (a Monday, the 1st, 1 January), checked against ``zoneinfo`` itself: the
    start's local date is that day and the µs before it an earlier date."""
    quota = arl.Quota(1, period, tz=tz)
    first, last = YEARS[period]
    now, stop = at(tz, first, 1, 1, 12), at(tz, last, 1, 1)
    periods = 0
    while now < stop:
        start, end, after = quota.bounds(now)
        assert start <= now < end < after
        assert quota.bounds(end - 1) == (start, end, after)
        assert quota.bounds(end)[:2] == (end, after)
        day = local(tz, start).date()
        assert local(tz, start - 1).date() < day
        assert local(tz, start).time() <= time(1)  # midnight, or the first instant past a gap
        if period == "week":
            assert day.weekday() == 0
        elif period == "month":
            assert day.day == 1
        elif period == "year":
            assert (day.month, day.day) == (1, 1)
        now = end + (after - end) // 3
        periods += 1
    assert periods > 2


#: every zone this machine knows, sorted (Hypothesis draws from a stable list)
ALL_ZONES = sorted(zoneinfo.available_timezones())


@settings(max_examples=300, deadline=None)
@given(
    tz=st.sampled_from(ALL_ZONES),
    period=st.sampled_from(PERIODS),
    now=st.integers(at("UTC", 1971, 1, 1), at("UTC", 2099, 1, 1)),
)
def test_any_instant_in_any_zone_lies_in_its_period(tz: str, period: str, now: int) -> None:
    """For any instant and any zone: the period holds it, starts at the first instant of
    its first date, and the next one starts where it ends."""
    quota = arl.Quota(1, period, tz=tz)
    start, end, after = quota.bounds(now)
    assert start <= now < end < after
    assert local(tz, start - 1).date() < local(tz, start).date()
    assert quota.bounds(end)[:2] == (end, after)
    assert quota.bounds(start) == (start, end, after)


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((0, "day"), {}, ValueError),
        ((-1, "day"), {}, ValueError),
        ((2**50 + 1, "day"), {}, ValueError),
        ((1.5, "day"), {}, TypeError),
        ((True, "day"), {}, TypeError),
        (("10", "day"), {}, TypeError),
        ((1, "fortnight"), {}, ValueError),
        ((1, "days"), {}, ValueError),
        ((1, "Day"), {}, ValueError),
        ((1, "hour"), {}, ValueError),
        ((1, 86400), {}, TypeError),
        ((1, "day"), {"tz": "Mars/Olympus"}, ValueError),
        ((1, "day"), {"tz": "/etc/localtime"}, ValueError),
        ((1, "day"), {"tz": "../../etc/passwd"}, ValueError),
        ((1, "day"), {"tz": "zone.tab"}, ValueError),
        ((1, "day"), {"tz": ""}, ValueError),
        ((1, "day"), {"tz": "UTC "}, ValueError),
        ((1, "day"), {"tz": 1}, TypeError),
        ((1, "day"), {"tz": None}, TypeError),
        ((1, "day", "UTC"), {}, TypeError),  # tz is keyword-only
    ],
)
def test_a_bad_quota_is_refused(args: Any, kwargs: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        arl.Quota(*args, **kwargs)


def test_only_a_fixed_window_counts_a_quota() -> None:
    """A SlidingWindow or a TokenBucket refuses a quota, naming FixedWindow; a quota given
    twice is refused too."""
    quota = arl.Quota(5, "day", tz="Europe/Berlin")
    with pytest.raises(TypeError, match="FixedWindow"):
        arl.SlidingWindow("1/second", quota)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FixedWindow"):
        arl.TokenBucket(quota)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="twice"):
        arl.FixedWindow(quota, arl.Quota(5, "day", tz="Europe/Berlin"))
    limiter = arl.FixedWindow("10/second", quota)
    assert isinstance(limiter, arl.FixedWindow)
    assert repr(limiter) == "<FixedWindow 10/1s, 5/day@Europe/Berlin name=None>"
    assert arl.FixedWindow(arl.Quota(5, "day"), arl.Quota(5, "week")).rates[1] == arl.Quota(
        5, "week"
    )


# -- on every backend ------------------------------------------------------------------------


class Replies:
    """Wraps ``backend._run`` to keep each fixed_window call's last argument and reply."""

    def __init__(self, backend: arl.Backend) -> None:
        self.calls: list[tuple[Arg, Reply]] = []
        inner = backend._run

        async def run(script: Script, keys: Any, args: Any) -> Reply:
            reply = await inner(script, keys, args)
            if script is FIXED_WINDOW:
                self.calls.append((args[-1], reply))
            return reply

        backend._run = run


def next_midnight_us(tz: str, now_us: int) -> int:
    """``zoneinfo``'s own answer: the first instant of the local day after ``now_us``'s."""
    today = local(tz, now_us).date()
    tomorrow = today + timedelta(days=1)
    return at(tz, tomorrow.year, tomorrow.month, tomorrow.day)


#: zones around the globe: some day boundary is hours away from any now
DAY_ZONES = ["UTC", "Europe/Berlin", "Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kathmandu"]


@pytest.mark.parametrize("tz", DAY_ZONES)
async def test_a_day_quota_counts_to_local_midnight(backend: arl.Backend, tz: str) -> None:
    """Three hits a day: remaining 2, 1, 0, then denied; reset_after (and a denial's
    retry_after) is exactly the time from the server's now to the next local midnight,
    as ``zoneinfo`` computes it."""
    replies = Replies(backend)
    for _ in range(2):  # again with a new key, should a midnight fall in between
        key = f"user-{uuid.uuid4().hex[:12]}"
        replies.calls.clear()
        limiter = arl.FixedWindow(arl.Quota(3, "day", tz=tz), backend=backend)
        decisions = [await limiter.hit(key) for _ in range(4)]
        nows = [int(reply[5]) for _, reply in replies.calls]
        ends = {next_midnight_us(tz, now) for now in nows}
        if len(ends) == 1:
            break
    assert len(replies.calls) == 4  # one call each: the bounds held the server's now
    assert [(d.allowed, d.remaining, d.limit) for d in decisions] == [
        (True, 2, 3),
        (True, 1, 3),
        (True, 0, 3),
        (False, 0, 3),
    ]
    (end,) = ends
    for d, now in zip(decisions, nows, strict=True):
        assert round(d.reset_after * US) == end - now
    assert round(decisions[-1].retry_after * US) == end - nows[-1]


async def test_a_quota_counts_in_the_same_call_as_the_rates(backend: arl.Backend, key: str) -> None:
    """``FixedWindow("2/hour", Quota(3, "month"))``: both count each hit, in one call; the
    tighter rate denies the third; a limiter of the quota alone shares its key and sees
    the two hits counted, its reset at the month's end in that zone."""
    tz = "America/New_York"
    replies = Replies(backend)
    quota = arl.Quota(3, "month", tz=tz)
    both = arl.FixedWindow("2/hour", quota, backend=backend)
    decisions = [await both.hit(key) for _ in range(3)]
    assert [(d.allowed, d.limit, d.remaining) for d in decisions] == [
        (True, 2, 1),
        (True, 2, 0),
        (False, 2, 0),
    ]
    assert 0 < decisions[2].retry_after <= 3600
    alone = arl.FixedWindow(quota, backend=backend)
    peek = await alone.peek(key)
    assert (peek.allowed, peek.remaining) == (True, 0)  # (after the peeked hit)
    now = int(replies.calls[-1][1][5])
    assert round(peek.reset_after * US) == quota.bounds(now)[1] - now
    assert len(replies.calls) == 4
    # A refund gives back to the quota's count too, and a reset forgets it.
    assert await both.refund(key) == 1
    assert (await alone.peek(key)).remaining == 1
    await both.reset(key)
    assert (await alone.peek(key)).remaining == 2


async def test_bounds_left_behind_are_sent_again_around_the_servers_clock(
    backend: arl.Backend, key: str
) -> None:
    """A limiter whose bounds the server's clock has left (kept from 40 days ago) is
    answered -1 with nothing written, and sends the hit once more with the bounds around
    the server's clock: one hit counted; its next hit is one call again."""
    replies = Replies(backend)
    quota = arl.Quota(5, "week", tz="Asia/Tokyo")
    limiter = arl.FixedWindow(quota, backend=backend)
    assert isinstance(limiter, _CalendarWindow)
    stale = limiter._args[-1]
    limiter._bound(int(datetime.now(UTC).timestamp() * US) - 40 * 24 * H)
    assert limiter._args[-1] != stale
    first = await limiter.hit(key)
    assert (first.allowed, first.remaining) == (True, 4)
    (_sent, answer), (again, reply) = replies.calls
    assert answer[0] == -1
    assert answer[1:5] == [0, 0, 0, 0]
    assert again == arl_bounds(quota, int(answer[5]))
    assert reply[0] == 1
    assert (await limiter.hit(key)).remaining == 3
    assert len(replies.calls) == 3


def arl_bounds(quota: arl.Quota, now_us: int) -> str:
    return ",".join(map(str, quota.bounds(now_us)))


async def test_the_script_writes_nothing_outside_the_bounds(backend: arl.Backend, key: str) -> None:
    """fixed_window.lua, sent bounds that end before the server's now (one rate and
    several), answers {-1, 0, 0, 0, 0, now_us, 0} and writes nothing."""
    limiter = arl.FixedWindow("9/hour", arl.Quota(2, "day"), backend=backend)
    keys = limiter._keys(backend, key)
    past = f"{1 * US},{2 * US},{3 * US}"
    for args in ((1, 1, 2, past), (1, 1, 9, 3_600 * US, 2, past), (1, 6, 9, 3_600 * US, 2, past)):
        reply = await backend._run(FIXED_WINDOW, keys[-(len(args) - 2) // 2 :], args)
        assert reply[:5] == [-1, 0, 0, 0, 0]
        assert reply[6] == 0
        assert reply[5] > 3 * US
    assert (await limiter.peek(key)).remaining == 1  # (after the peeked hit)
    assert (await arl.FixedWindow("9/hour", backend=backend).peek(key)).remaining == 8


async def test_a_server_clock_that_leaves_the_bounds_twice_is_an_error(key: str) -> None:
    """Should the server's clock leave the bounds sent around its own last reading (a
    clock stepped by a period between two calls), the hit raises BackendError, counted
    nowhere."""
    readings = [20 * 365 * 24 * H, 10 * 365 * 24 * H]  # (popped from the end)

    def clock() -> int:
        return readings.pop() if len(readings) > 1 else readings[0]

    store = MemoryStore(clock=clock)
    backend = arl.Backend._of(store, prefix="t", url="memory://")
    limiter = arl.FixedWindow(arl.Quota(2, "year"), backend=backend)
    assert isinstance(limiter, _CalendarWindow)
    limiter._bound(0)
    with pytest.raises(arl.BackendError, match="clock"):
        await limiter.hit(key)
    assert store.keyspace.data == {}
    await backend.aclose()


async def test_the_options_send_the_bounds_too(backend: arl.Backend, key: str) -> None:
    """Behind the guard (shadow mode, a deny cache) a quota's bounds left behind are sent
    again all the same, and an in-process fallback counts the quota scaled, by the
    calendar too."""
    quota = arl.Quota(2, "day", tz="Europe/Berlin")
    past = int(datetime.now(UTC).timestamp() * US) - 3 * 24 * H
    shadow = arl.FixedWindow(quota, backend=backend, shadow=True, name="shadowed")
    cached = arl.FixedWindow(quota, backend=backend, deny_cache=100, name="cached")
    answers = []
    for limiter in (shadow, cached):
        assert isinstance(limiter, _CalendarWindow)
        limiter._bound(past)
        answers.append([await limiter.hit(key) for _ in range(3)])
    assert [(d.allowed, d.remaining, d.shadow_denied) for d in answers[0]] == [
        (True, 1, False),
        (True, 0, False),
        (True, 0, True),
    ]
    assert [(d.allowed, d.remaining) for d in answers[1]] == [(True, 1), (True, 0), (False, 0)]
    falls_back = arl.FixedWindow(quota, backend=backend, on_unavailable=arl.Fallback(0.5))
    assert isinstance(falls_back._fallback, _CalendarWindow)
    assert falls_back._fallback.rates == (arl.Quota(1, "day", tz="Europe/Berlin"),)


def test_a_quotas_key_is_the_same_in_every_period() -> None:
    """A quota's key names its limit, period and zone after the user key's tag, and not
    the period: bounds sent around another instant name the same keys. A Quota pickles."""
    backend = arl.Backend.from_url("memory://")
    limiter = arl.FixedWindow("5/second", arl.Quota(3, "month", tz="Europe/Berlin"))
    assert isinstance(limiter, _CalendarWindow)
    keys = limiter._keys(backend, "u{1}")
    assert keys == ["arl:fw:{u%7B1%7D}:5/1000", "arl:fw:{u%7B1%7D}:3/month@Europe/Berlin"]
    before = limiter._args
    limiter._bound(at("Europe/Berlin", 2030, 7, 1))
    assert limiter._args != before
    assert limiter._keys(backend, "u{1}") == keys
    quota = arl.Quota(3, "month", tz="Europe/Berlin")
    assert pickle.loads(pickle.dumps(quota)) == quota


async def test_a_manual_clock_crosses_the_end_of_february() -> None:
    """On a memory store whose clock stands at 2027-02-28 23:59:59 in Berlin: three hits
    use February's quota, the fourth waits one second, to March; once the clock moves
    there, the quota is whole again, for all of March. The limiter's bounds (around this
    machine's clock) are sent again around the store's, each time it leaves them."""
    clock = ManualClock(at("Europe/Berlin", 2027, 2, 28, 23, 59, 59) / US)
    backend = memory_backend(clock=clock)
    monthly = arl.FixedWindow(arl.Quota(3, "month", tz="Europe/Berlin"), backend=backend)
    decisions = [await monthly.hit("acct") for _ in range(4)]
    assert [(d.allowed, d.remaining) for d in decisions] == [
        (True, 2),
        (True, 1),
        (True, 0),
        (False, 0),
    ]
    assert decisions[-1].retry_after == 1.0
    clock.advance(1.0)
    march = await monthly.hit("acct")
    assert (march.allowed, march.remaining) == (True, 2)
    assert march.reset_after == 31 * 24 * 3600 - 3600  # to 1 April, an hour of it skipped
    clock.advance(31 * 24 * 3600 - 3600)
    april = await monthly.hit("acct")
    assert (april.allowed, april.remaining, april.reset_after) == (True, 2, 30 * 24 * 3600)
    await backend.aclose()


async def test_the_middleware_announces_a_quota_and_its_real_reset() -> None:
    """Behind ``RateLimitMiddleware`` a monthly quota is a policy of its own (its window
    the longest month), and ``RateLimit``/``Retry-After`` count to the month's real end."""
    clock = ManualClock(at("Europe/Berlin", 2027, 2, 28, 23, 59, 59) / US)
    backend = memory_backend(clock=clock)

    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    quota = arl.Quota(2, "month", tz="Europe/Berlin")
    app = RateLimitMiddleware(ok, arl.FixedWindow(quota, name="plan", backend=backend))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answers = [await client.get("/") for _ in range(3)]
        assert [r.status_code for r in answers] == [200, 200, 429]
        assert answers[2].headers["ratelimit-policy"] == '"plan";q=2;w=2678400'
        assert answers[2].headers["ratelimit"] == '"plan";r=0;t=1'
        assert answers[2].headers["retry-after"] == "1"
        clock.advance(1.0)
        march = await client.get("/")
        assert march.status_code == 200
        assert march.headers["ratelimit"] == f'"plan";r=1;t={31 * 24 * 3600 - 3600}'
    await backend.aclose()


async def test_a_settlement_reaches_a_quota(backend: arl.Backend, key: str) -> None:
    """A reservation on a limiter with a quota settles under the quota too: a charge above
    the estimate is counted in the period open now, a give-back returns what was unused."""
    limiter = arl.FixedWindow("100/hour", arl.Quota(10, "day", tz="Europe/Berlin"), backend=backend)
    over = await limiter.reserve(key, 2)
    over.settle(5)
    await over.wait()
    assert over.state == "settled"
    assert (await limiter.peek(key)).remaining == 10 - 5 - 1  # (peek asks for a cost of 1)
    under = await limiter.reserve(key, 3)
    under.settle(1)
    await under.wait()
    assert (await limiter.peek(key)).remaining == 10 - 6 - 1
