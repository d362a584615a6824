"""The three rate limiters: ``FixedWindow``, ``SlidingWindow`` and ``TokenBucket`` (GCRA).

Each names its scripts (``lua/fixed_window.lua``, ``lua/sliding_window.lua``,
``lua/token_bucket.lua`` and their refunds), its kind, its keys' suffixes and its scripts'
constant arguments; everything else is their common base, ``Limiter``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _keys, _scripts
from .._args import check_int
from .._backend import Backend
from .._rates import Rate, RateLike, as_rate, token_bucket
from .failure import Breaker, Fallback, OnUnavailable
from .limiter import Limiter
from .policies import Policies
from .policy import Policy

#: Most sub-window buckets a SlidingWindow may use (the script reads them all per hit).
MAX_BUCKETS = 1000


def _rates(rates: Sequence[Any]) -> tuple[Rate, ...]:
    if not rates:
        raise TypeError("a limiter needs at least one rate, e.g. FixedWindow('100/minute')")
    parsed = tuple(as_rate(r) for r in rates)
    seen = set()
    for r in parsed:
        ident = (r.limit, r.window_us)
        if ident in seen:
            raise ValueError(f"rate {r} is given twice")
        seen.add(ident)
    return parsed


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
        *rates: RateLike,
        backend: Backend | None = None,
        name: str | None = None,
        count_denied: bool = False,
        blockable: bool = False,
        deny_cache: int | None = None,
        on_unavailable: OnUnavailable = "raise",
        breaker: Breaker | None = None,
        shadow: bool = False,
        policies: Policies | None = None,
    ):
        super().__init__(backend, name, count_denied, blockable)
        self.rates = _rates(rates)
        self._suffixes = tuple(_keys.rate_suffix(r.limit, r.window_us) for r in self.rates)
        self._args = tuple(v for r in self.rates for v in (r.limit, r.window_us))
        self._max_cost = min(r.limit for r in self.rates)
        self._options(self.rates, deny_cache, on_unavailable, breaker, shadow, policies)

    def _policy_args(self, policy: Policy) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(v for r in policy.rates for v in (r.limit, r.window_us)), ()

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        rates = (Rate(share.scale(r.limit), r.window) for r in self.rates)
        return FixedWindow(*rates, backend=backend, name=self.name)

    def __repr__(self) -> str:
        rates = ", ".join(map(str, self.rates))
        return f"<FixedWindow {rates} name={self.name!r}{self._shown()}>"


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
        policies: Policies | None = None,
    ):
        super().__init__(backend, name, count_denied, blockable)
        self.rates = _rates(rates)
        self.buckets = check_int(buckets, "buckets")
        if buckets > MAX_BUCKETS:
            raise ValueError(f"buckets must be <= {MAX_BUCKETS}, got {buckets}")
        self._suffixes = tuple(
            _keys.rate_suffix(r.limit, r.window_us, f"/{buckets}") for r in self.rates
        )
        self._args = (buckets, *(v for r in self.rates for v in (r.limit, r.window_us)))
        self._refund_args = self._args
        self._max_cost = min(r.limit for r in self.rates)
        self._options(self.rates, deny_cache, on_unavailable, breaker, shadow, policies)

    def _policy_args(self, policy: Policy) -> tuple[tuple[int, ...], tuple[int, ...]]:
        args = (self.buckets, *(v for r in policy.rates for v in (r.limit, r.window_us)))
        return args, args

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        rates = (Rate(share.scale(r.limit), r.window) for r in self.rates)
        return SlidingWindow(*rates, buckets=self.buckets, backend=backend, name=self.name)

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
        policies: Policies | None = None,
    ):
        super().__init__(backend, name, count_denied, blockable)
        self.rate = as_rate(rate)
        self.burst, interval = token_bucket(self.rate, burst)
        suffix = _keys.rate_suffix(self.rate.limit, self.rate.window_us, f"/{self.burst}")
        self._suffixes = (suffix,)
        self._args = (self.burst, interval)
        self._refund_args = (interval,)
        self._max_cost = self.burst
        self._options((self.rate,), deny_cache, on_unavailable, breaker, shadow, policies)

    def _policy_args(self, policy: Policy) -> tuple[tuple[int, ...], tuple[int, ...]]:
        # A policy's burst is its rate's limit; the code's rates keep the code's burst.
        if len(policy.rates) != 1:
            raise ValueError(f"a TokenBucket's policy has one rate, not {len(policy.rates)}")
        burst = self.burst if policy is self._default_policy else None
        burst, interval = token_bucket(policy.rates[0], burst)
        return (burst, interval), (interval,)

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        rate = Rate(share.scale(self.rate.limit), self.rate.window)
        return TokenBucket(rate, share.scale(self.burst), backend=backend, name=self.name)

    @property
    def rates(self) -> tuple[Rate, ...]:
        return (self.rate,)

    def __repr__(self) -> str:
        return f"<TokenBucket {self.rate} burst={self.burst} name={self.name!r}{self._shown()}>"
