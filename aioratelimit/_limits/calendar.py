"""``Quota``: at most ``limit`` hits per calendar day, week, month or year in an IANA time
zone, and the period boundaries the client sends with each hit.

Lua has no time-zone database, and the decision must be made on the server's clock. So the
client computes, with ``zoneinfo``, the start of the period around its own clock, that
period's end and the next period's end (µs since the epoch), and ``lua/fixed_window.lua``
picks the period holding the server's ``TIME`` from those two. When the server's time is in
neither (a client clock far off, or boundaries cached from a past period), the script writes
nothing and answers ``allowed = -1`` with its clock; the client computes the boundaries
around that clock and sends the hit once more: safe, as nothing was written.

A period starts at local midnight (a week on Monday, ISO 8601; a month on its first day; a
year on 1 January), so a day across a DST shift lasts 23 or 25 hours and February 28 or 29
days. Where a DST shift skips midnight itself, the period starts at the first instant of its
date (``zoneinfo``'s ``fold=0``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .._args import check_count

#: The calendar periods a ``Quota`` counts in.
PERIODS = ("day", "week", "month", "year")

#: The longest of each period, DST aside (s): what a window-length reader (a deny cache's
#: subscription, a ``RateLimit-Policy`` header's ``w``) takes for it.
_LONGEST = {"day": 86400.0, "week": 604800.0, "month": 2678400.0, "year": 31622400.0}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _zone(tz: object) -> ZoneInfo:
    if not isinstance(tz, str):
        raise TypeError(f"Quota.tz must be an IANA time zone name (str), not {type(tz).__name__}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # (ValueError: a path, not a key, such as '/etc/localtime' or '../x', or a file
        # that is no zone, such as 'zone.tab'.)
        raise ValueError(
            f"Quota.tz {tz!r} is not an IANA time zone, such as 'UTC' or 'Europe/Berlin'"
        ) from exc


def _first(d: date, period: str) -> date:
    """The first day of the period holding date ``d``."""
    if period == "day":
        return d
    if period == "week":
        return d - timedelta(days=d.weekday())  # Monday
    if period == "month":
        return d.replace(day=1)
    return d.replace(month=1, day=1)


def _after(d: date, period: str) -> date:
    """The first day of the period after the one starting on ``d``."""
    if period == "day":
        return d + timedelta(days=1)
    if period == "week":
        return d + timedelta(days=7)
    if period == "month":
        return date(d.year + 1, 1, 1) if d.month == 12 else date(d.year, d.month + 1, 1)
    return date(d.year + 1, 1, 1)


def _before(d: date, period: str) -> date:
    """The first day of the period before the one starting on ``d``."""
    return _first(d - timedelta(days=1), period)


@dataclass(frozen=True, slots=True)
class Quota:
    """At most ``limit`` hits (by cost) per calendar ``period`` (``"day"``, ``"week"``,
    ``"month"`` or ``"year"``) in the IANA time zone ``tz``: each period starts at local
    midnight (a week on Monday, ISO 8601; a month on its first day) and resets there, a
    month being a calendar month and a day 23 or 25 hours across a DST shift.

    A ``FixedWindow`` counts it, alone or with other rates in the same atomic call:
    ``FixedWindow("10/second", Quota(100_000, "month", tz="Europe/Berlin"))``. Its
    ``Decision.reset_after`` is the time left to the period's real end.
    """

    limit: int
    period: str
    tz: str = field(default="UTC", kw_only=True)

    def __post_init__(self) -> None:
        check_count(self.limit, "Quota.limit")
        if not isinstance(self.period, str):
            raise TypeError(f"Quota.period must be a str, not {type(self.period).__name__}")
        if self.period not in PERIODS:
            raise ValueError(
                f"Quota.period must be one of {', '.join(PERIODS)}, got {self.period!r}"
                " (for a rolling window use a rate such as '100/30days')"
            )
        _zone(self.tz)

    @property
    def window(self) -> float:
        """The longest such period in seconds, DST aside (31 days for a month): for what
        reads a window's length, such as a ``RateLimit-Policy`` header."""
        return _LONGEST[self.period]

    def _start_us(self, d: date, zone: ZoneInfo) -> int:
        """The first instant of date ``d`` in ``zone`` (µs since the epoch)."""
        return (datetime(d.year, d.month, d.day, tzinfo=zone) - _EPOCH) // _US

    def bounds(self, now_us: int) -> tuple[int, int, int]:
        """The start of the period holding ``now_us`` (µs since the epoch), its end and the
        next period's end: what a hit sends, for the script to pick from by its clock."""
        zone = ZoneInfo(self.tz)
        local = (_EPOCH + now_us * _US).astimezone(zone)
        day = _first(local.date(), self.period)
        start = self._start_us(day, zone)
        # The local date may belong to the period before or after where a DST shift moves
        # midnight (a repeated hour across it): step until the period holds now.
        while start > now_us:
            day = _before(day, self.period)
            start = self._start_us(day, zone)
        day = _after(day, self.period)
        end = self._start_us(day, zone)
        while end <= now_us:
            day = _after(day, self.period)
            start, end = end, self._start_us(day, zone)
        # The next period that has an instant at all (Pacific/Apia skipped 30 December 2011).
        after = end
        while after <= end:
            day = _after(day, self.period)
            after = self._start_us(day, zone)
        return start, end, after

    def __str__(self) -> str:
        return f"{self.limit}/{self.period}@{self.tz}"


def window_arg(bounds: tuple[int, int, int]) -> str:
    """A quota's window as ``lua/fixed_window.lua`` reads it: ``'start,end,next_end'`` (µs)."""
    start, end, next_end = bounds
    return f"{start},{end},{next_end}"
