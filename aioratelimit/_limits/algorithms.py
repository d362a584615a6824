"""The three rate limiters: ``FixedWindow``, ``SlidingWindow`` and ``TokenBucket`` (GCRA).

Each names its scripts (``lua/fixed_window.lua``, ``lua/sliding_window.lua``,
``lua/token_bucket.lua`` and their refunds), its kind, its keys' suffixes and its scripts'
constant arguments; everything else is their common base, ``Limiter``.

``hash_tag=`` (each of them): a function of the user key naming the Redis Cluster hash tag
of all of that key's Redis keys, on every backend, so a key's counters are the same whether
it is hit alone or with others in one decision (``multi.hit_all``, which on a cluster needs
the keys of one decision to share a tag). Without it a key is its own tag.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from .. import _keys, _scripts
from .._args import US, check_int
from .._backend import Backend
from .._errors import BackendError
from .._rates import Rate, RateLike, as_rate, parse_rates, token_bucket
from .._scripts import Reply
from .bans import Ban
from .calendar import Quota, window_arg
from .failure import Breaker, Fallback, OnUnavailable
from .limiter import Limiter
from .pause import Pause
from .policies import Policies
from .policy import Policy

#: Most sub-window buckets a SlidingWindow may use (the script reads them all per hit).
MAX_BUCKETS = 1000


def _rates(rates: Sequence[Any], kind: str = "") -> tuple[Rate | Quota, ...]:
    """The rates as given: each ``Rate``, ``Quota`` (with ``kind``, the limiter that takes
    none, refused), or string of one or more rates (``parse_rates``)."""
    if not rates:
        raise TypeError("a limiter needs at least one rate, e.g. FixedWindow('100/minute')")
    parsed: list[Rate | Quota] = []
    for r in rates:
        if isinstance(r, Quota) and kind:
            raise TypeError(_NO_QUOTA.format(kind=kind, quota=r))
        if isinstance(r, Rate | Quota):
            parsed.append(r)
        elif isinstance(r, str):
            parsed.extend(parse_rates(r))
        else:
            as_rate(r)  # raises its TypeError
    seen = set()
    for r in parsed:
        ident = (r.limit, r.window_us) if isinstance(r, Rate) else r
        if ident in seen:
            raise ValueError(f"rate {r} is given twice")
        seen.add(ident)
    return tuple(parsed)


def _plain_rates(rates: Sequence[Any], kind: str) -> tuple[Rate, ...]:
    """``_rates`` for a limiter that counts no calendar quota (``kind``)."""
    return tuple(r for r in _rates(rates, kind) if isinstance(r, Rate))


_NO_QUOTA = (
    "a {kind} counts no calendar quota ({quota}): a FixedWindow does, alone or next to"
    " other rates: FixedWindow('10/second', Quota(...))"
)


class FixedWindow(Limiter):
    """At most ``limit`` hits per window; each window starts at the key's first admitted hit.

    Cheapest in memory (one integer key per rate) but allows up to twice the limit across
    the edge between two windows; use ``SlidingWindow`` where that matters.
    """

    __slots__ = ("rates",)
    _script = _scripts.FIXED_WINDOW
    _policy_script = _scripts.FIXED_WINDOW_POLICY
    _refund_script = _scripts.FIXED_WINDOW_REFUND
    _kind = "fw"

    def __init__(
        self,
        *rates: RateLike | Quota,
        backend: Backend | None = None,
        name: str | None = None,
        count_denied: bool = False,
        blockable: bool = False,
        deny_cache: int | None = None,
        on_unavailable: OnUnavailable = "raise",
        breaker: Breaker | None = None,
        shadow: bool = False,
        pause: Pause | str | None = None,
        hash_tag: Callable[[str], str] | None = None,
        policies: Policies | None = None,
        ban: Ban | None = None,
    ):
        super().__init__(backend, name, count_denied, blockable, hash_tag, ban)
        self.rates: tuple[Rate | Quota, ...] = _rates(rates)
        if any(isinstance(r, Quota) for r in self.rates):
            # The subclass that sends the periods' bounds (the same slots), before its
            # ``_send`` is handed to the guard: a plain limiter's hit tests for no quota.
            self.__class__ = _CalendarWindow
        self._suffixes = tuple(
            _keys.rate_suffix(r.limit, r.window_us)
            if isinstance(r, Rate)
            else _keys.quota_suffix(r.limit, r.period, r.tz)
            for r in self.rates
        )
        self._args = tuple(
            v for r in self.rates for v in (r.limit, r.window_us if isinstance(r, Rate) else 0)
        )
        self._refund_args = self._args  # a charge opens a window; a refund finds the hit's
        self._max_cost = min(r.limit for r in self.rates)
        if isinstance(self, _CalendarWindow):
            self._bound(time.time_ns() // 1000)
        self._options(self.rates, deny_cache, on_unavailable, breaker, shadow, pause, policies)

    def _policy_args(self, policy: Policy) -> tuple[tuple[int, ...], tuple[int, ...]]:
        # The refund script takes the same rates (a charge opens a window of its length).
        args = tuple(v for r in policy.rates for v in (r.limit, r.window_us))
        return args, args

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        rates = (replace(r, limit=share.scale(r.limit)) for r in self.rates)
        return FixedWindow(*rates, backend=backend, name=self.name, hash_tag=self._hash_tag)

    def __repr__(self) -> str:
        rates = ", ".join(map(str, self.rates))
        return f"<FixedWindow {rates} name={self.name!r}{self._shown()}>"


class _CalendarWindow(FixedWindow):
    """A ``FixedWindow`` with a calendar quota: each hit sends, as the quota's window, the
    bounds of the period around the last clock reading and of the next one (``calendar``),
    for the script to pick from by the server's clock. Bounds the server's clock has left
    behind are answered -1 with nothing written; then it sends the bounds around the
    server's clock once more: at most once a period per limiter, as its bounds are kept
    between hits (answered -1 again, the server's clock moved by a period between the two
    calls: ``BackendError``, nothing counted)."""

    __slots__ = ()  # (a FixedWindow becomes one: ``__class__`` assignment)

    def _bound(self, now_us: int) -> None:
        """Its arguments with every quota's bounds around ``now_us``, each in place of its
        window (rate i's is the script's ARGV[4 + 2i], its ``_args[2i + 1]``)."""
        args: list[int | str] = list(self._args)
        for i, r in enumerate(self.rates):
            if isinstance(r, Quota):
                args[2 * i + 1] = window_arg(r.bounds(now_us))
        # A settlement's charge opens a quota's window up to its period's end, as a hit would.
        self._args = self._refund_args = tuple(args)

    def _send(self, key: str, cost: int, mode: int, *extra: int) -> Awaitable[Reply]:
        # The checks raise here, before any I/O, as the plain limiter's do.
        return self._decided(super()._send(key, cost, mode, *extra), key, cost, mode)

    async def _decided(self, sent: Awaitable[Reply], key: str, cost: int, mode: int) -> Reply:
        reply = await sent
        if reply[0] != -1:
            return reply
        # Nothing was written: the same hit, with bounds around the server's clock.
        self._bound(reply[5])
        reply = await super()._send(key, cost, mode)
        if reply[0] == -1:
            raise BackendError(
                f"the server's clock moved by a calendar period between two calls"
                f" ({reply[5] / US:.6f} s since the epoch): {self!r} counted nothing"
            )
        return reply


class SlidingWindow(Limiter):
    """Never more than ``limit`` hits (by cost) in ANY interval of length ``window``.

    Each window is cut into ``buckets`` sub-window counters; the oldest, partly expired
    bucket still counts in full, so the limiter errs on the side of denying: an interval
    of up to ``window * (1 + 1/buckets)`` may be needed before capacity fully returns.
    """

    __slots__ = ("buckets", "rates")
    _script = _scripts.SLIDING_WINDOW
    _policy_script = _scripts.SLIDING_WINDOW_POLICY
    _refund_script = _scripts.SLIDING_WINDOW_REFUND
    _kind = "sw"

    def __init__(
        self,
        *rates: RateLike,
        buckets: int = 10,
        backend: Backend | None = None,
        name: str | None = None,
        count_denied: bool = False,
        blockable: bool = False,
        deny_cache: int | None = None,
        on_unavailable: OnUnavailable = "raise",
        breaker: Breaker | None = None,
        shadow: bool = False,
        pause: Pause | str | None = None,
        hash_tag: Callable[[str], str] | None = None,
        policies: Policies | None = None,
        ban: Ban | None = None,
    ):
        super().__init__(backend, name, count_denied, blockable, hash_tag, ban)
        self.rates = _plain_rates(rates, "SlidingWindow")
        self.buckets = check_int(buckets, "buckets")
        if buckets > MAX_BUCKETS:
            raise ValueError(f"buckets must be <= {MAX_BUCKETS}, got {buckets}")
        self._suffixes = tuple(
            _keys.rate_suffix(r.limit, r.window_us, f"/{buckets}") for r in self.rates
        )
        args = (buckets, *(v for r in self.rates for v in (r.limit, r.window_us)))
        self._args = self._refund_args = args
        self._max_cost = min(r.limit for r in self.rates)
        self._options(self.rates, deny_cache, on_unavailable, breaker, shadow, pause, policies)

    def _policy_args(self, policy: Policy) -> tuple[tuple[int, ...], tuple[int, ...]]:
        args = (self.buckets, *(v for r in policy.rates for v in (r.limit, r.window_us)))
        return args, args

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        rates = (Rate(share.scale(r.limit), r.window) for r in self.rates)
        return SlidingWindow(
            *rates, buckets=self.buckets, backend=backend, name=self.name, hash_tag=self._hash_tag
        )

    def __repr__(self) -> str:
        rates = ", ".join(map(str, self.rates))
        return f"<SlidingWindow {rates} buckets={self.buckets} name={self.name!r}{self._shown()}>"


class TokenBucket(Limiter):
    """GCRA: a steady ``rate``, with bursts of up to ``burst`` hits (default: the rate's limit).

    A full bucket holds ``burst`` tokens and refills one token every ``window / limit``
    seconds (rounded up to the microsecond, so never faster than asked).
    """

    __slots__ = ("burst", "rate")
    _script = _scripts.TOKEN_BUCKET
    _policy_script = _scripts.TOKEN_BUCKET_POLICY
    _refund_script = _scripts.TOKEN_BUCKET_REFUND
    _reserves = True
    _kind = "tb"

    def __init__(
        self,
        rate: RateLike,
        burst: int | None = None,
        *,
        backend: Backend | None = None,
        name: str | None = None,
        count_denied: bool = False,
        blockable: bool = False,
        deny_cache: int | None = None,
        on_unavailable: OnUnavailable = "raise",
        breaker: Breaker | None = None,
        shadow: bool = False,
        pause: Pause | str | None = None,
        hash_tag: Callable[[str], str] | None = None,
        policies: Policies | None = None,
        ban: Ban | None = None,
    ):
        super().__init__(backend, name, count_denied, blockable, hash_tag, ban)
        if isinstance(rate, Quota):
            raise TypeError(_NO_QUOTA.format(kind="TokenBucket", quota=rate))
        if isinstance(rate, str) and len(parsed := parse_rates(rate)) > 1:
            raise ValueError(f"a TokenBucket has one rate, got {len(parsed)} in {rate!r}")
        self.rate = as_rate(rate)
        self.burst, interval = token_bucket(self.rate, burst)
        suffix = _keys.rate_suffix(self.rate.limit, self.rate.window_us, f"/{self.burst}")
        self._suffixes = (suffix,)
        self._args = (self.burst, interval)
        self._refund_args = (interval,)
        self._max_cost = self.burst
        self._options((self.rate,), deny_cache, on_unavailable, breaker, shadow, pause, policies)

    def _policy_args(self, policy: Policy) -> tuple[tuple[int, ...], tuple[int, ...]]:
        # A policy's burst is its rate's limit; the code's rates keep the code's burst.
        if len(policy.rates) != 1:
            raise ValueError(f"a TokenBucket's policy has one rate, not {len(policy.rates)}")
        burst = self.burst if policy is self._default_policy else None
        burst, interval = token_bucket(policy.rates[0], burst)
        return (burst, interval), (interval,)

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        rate = Rate(share.scale(self.rate.limit), self.rate.window)
        burst = share.scale(self.burst)
        return TokenBucket(rate, burst, backend=backend, name=self.name, hash_tag=self._hash_tag)

    @property
    def rates(self) -> tuple[Rate, ...]:
        return (self.rate,)

    def __repr__(self) -> str:
        return f"<TokenBucket {self.rate} burst={self.burst} name={self.name!r}{self._shown()}>"
