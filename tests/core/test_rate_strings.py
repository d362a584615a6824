"""Rates as peers write them: several in one string (``parse_rates``, and any limiter's
rate argument), ``per``, and weeks, months and years as rolling windows of days."""

from __future__ import annotations

import limits
import pytest
from limits.util import parse_many

import aioratelimit as arl

DAY = 86400.0


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("1/week", 7 * DAY),
        ("1/w", 7 * DAY),
        ("1/2weeks", 14 * DAY),
        ("1/month", 30 * DAY),
        ("1 per month", 30 * DAY),
        ("1/2 months", 60 * DAY),
        ("1/months", 30 * DAY),
        ("1/year", 365 * DAY),
        ("1/y", 365 * DAY),
        ("1 per 2 years", 730 * DAY),
    ],
)
def test_weeks_months_and_years_are_rolling_days(text: str, window: float) -> None:
    """A week is 7 days, a month 30 (as ``limits`` counts it) and a year 365 (``limits``
    counts 360): rolling windows, not the calendar's (that is ``Quota``)."""
    rate = arl.Rate.parse(text)
    assert (rate.limit, rate.window) == (1, window)
    assert arl.Rate.parse(str(rate)) == rate


@pytest.mark.parametrize(
    ("text", "rates"),
    [
        ("100/day;10/hour", ((100, DAY), (10, 3600.0))),
        ("10 per second, 100 per minute", ((10, 1.0), (100, 60.0))),
        ("5/minute|100/day", ((5, 60.0), (100, DAY))),
        (" 10/second ; 100/minute ;1000/month", ((10, 1.0), (100, 60.0), (1000, 30 * DAY))),
        ("3/500ms", ((3, 0.5),)),
        ("10 per 2 hours,1/year", ((10, 7200.0), (1, 365 * DAY))),
    ],
)
def test_several_rates_in_one_string(text: str, rates: tuple[tuple[int, float], ...]) -> None:
    """``parse_rates`` reads rates separated by ';', ',' or '|'; a limiter takes such a
    string as one argument, its rates in order, and next to other rates."""
    assert tuple((r.limit, r.window) for r in arl.parse_rates(text)) == rates
    assert arl.FixedWindow(text).rates == arl.parse_rates(text)
    assert arl.SlidingWindow(text).rates == arl.parse_rates(text)
    assert arl.FixedWindow(text, "7/3s").rates == (*arl.parse_rates(text), arl.Rate(7, 3.0))


MALFORMED = [
    "", ";", "10/second;", ";10/second", "10/second;;100/minute", "10/second,,", "10/second|",
    "10/second 100/minute", "10/second/100/minute", "10/fortnight;1/day", "10/mo",
    "10/monthly", "1/2y3", "\uff11\uff10/second", "10/second\uff1b100/minute", "10/second\n;",
]  # fmt: skip


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_rate_strings_show_the_accepted_forms(text: str) -> None:
    """A malformed string is refused with ValueError, from ``parse_rates`` and from a
    limiter, with a message that shows the accepted forms and the separators."""
    with pytest.raises(ValueError, match="malformed rate") as raised:
        arl.parse_rates(text)
    for form in ("'100/minute'", "'3/500ms'", "per", "month = 30 days", "';', ',' or '|'"):
        assert form in str(raised.value), form
    with pytest.raises(ValueError, match="malformed rate"):
        arl.FixedWindow(text)


def test_one_rate_stays_one_rate() -> None:
    """``Rate.parse`` reads one rate and refuses several, pointing to the separators; a
    TokenBucket has one rate; the same rate twice is refused; a non-str is a TypeError."""
    with pytest.raises(ValueError, match="separated by"):
        arl.Rate.parse("10/second;100/minute")
    with pytest.raises(ValueError, match="one rate"):
        arl.TokenBucket("10/second;100/minute")
    with pytest.raises(ValueError, match="empty rate"):
        arl.TokenBucket("10/second;")
    with pytest.raises(ValueError, match="twice"):
        arl.FixedWindow("10/second;10 per second")
    with pytest.raises(ValueError, match="twice"):
        arl.FixedWindow("1/month", "1/30d")
    with pytest.raises(TypeError):
        arl.parse_rates(10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"2\*\*50"):
        arl.Rate.parse("1/36y")


#: strings as ``limits`` reads them: the forms both libraries take
PEERS = [
    "10/second;100/minute", "10 per second, 100 per minute", "5/minute|100/day",
    "10 per 2 hours", "5/10 seconds", "10/2minutes", "1 per 2 months", "1/month", "3/day",
]  # fmt: skip


@pytest.mark.parametrize("text", PEERS)
def test_rate_strings_read_as_limits_reads_them(text: str) -> None:
    """Each string ``limits.parse_many`` (the installed release) reads, ``parse_rates``
    reads into the same limits and windows: a month of 30 days in both."""
    theirs = [(item.amount, float(item.get_expiry())) for item in parse_many(text)]
    assert [(r.limit, r.window) for r in arl.parse_rates(text)] == theirs


def test_a_year_is_365_days_here_and_360_in_limits() -> None:
    """Where the two differ: ``limits`` counts a year as 12 of its 30-day months."""
    assert limits.parse("1/year").get_expiry() == 360 * 86400
    assert arl.Rate.parse("1/year").window == 365 * 86400
