"""Rate limiters: ``FixedWindow``, ``SlidingWindow`` and ``TokenBucket`` (GCRA).

Each decision is one script run (``lua/fixed_window.lua``, ``lua/sliding_window.lua``,
``lua/token_bucket.lua``) over one key per (user key, rate), all under the user key's hash
tag. The three classes share everything but the script and its arguments: validation, key
building, the reply-to-``Decision`` decoding, waiting, the context manager and the decorator.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from . import _guard, _keys, _scripts
from ._args import check_int, check_key, check_timeout
from ._backend import Backend, get_backend
from ._deny_cache import DenyCache
from ._errors import RateLimited
from ._failure import Breaker, Fallback, Policy
from ._rates import Decision, Rate, RateLike, as_rate
from ._scripts import Script

P = ParamSpec("P")
R = TypeVar("R")

#: Added to every wait for ``retry_after`` (seconds): see ``acquire``.
TIMER_SLACK = 0.001

#: Most sub-window buckets a SlidingWindow may use (the script reads them all per hit).
MAX_BUCKETS = 1000


class Limiter:
    """The common base of ``FixedWindow``, ``SlidingWindow`` and ``TokenBucket``: annotate
    with it where any of the three will do (``hit``, ``peek``, ``reset``, ``acquire``,
    ``async with limiter(key)`` and ``@limiter.limit`` are the same on all three).

    Not instantiated itself; a subclass names its script, kind and arguments.
    """

    __slots__ = (
        "_args",
        "_backend",
        "_breaker",
        "_cache",
        "_fallback",
        "_head_id",
        "_max_cost",
        "_plain",
        "_suffixes",
        "name",
        "on_unavailable",
        "shadow",
    )

    _script: Script
    _kind: str

    def __init__(self, backend: Backend | None, name: str | None) -> None:
        if type(self) is Limiter:
            raise TypeError("Limiter is a base: use FixedWindow, SlidingWindow or TokenBucket")
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        if name is not None:
            check_key(name, "name")
        self._backend = backend
        self.name = name
        self._head_id = (self._kind, name)  # its key in Backend.heads
        # Set by subclasses: per-key suffixes, the script's constant arguments, and the
        # largest cost that could ever be admitted.
        self._suffixes: tuple[str, ...] = ()
        self._args: tuple[int, ...] = ()
        self._max_cost = 0
        # Set by ``_options`` (a subclass calls it once its rates are known).
        self._cache: DenyCache | None = None
        self._breaker: Breaker | None = None
        self._fallback: Limiter | None = None
        self.on_unavailable: Policy = "raise"
        self.shadow = False
        self._plain = True

    def _options(
        self,
        rates: tuple[Rate, ...],
        deny_cache: int | None,
        on_unavailable: Policy,
        breaker: Breaker | None,
        shadow: bool,
    ) -> None:
        """The options on top of the plain decision (``_guard``); with all of them off a
        decision stays the one script call it was."""
        options = _guard.Options(self.name or self._kind, rates, deny_cache, on_unavailable)
        self._cache, self.on_unavailable = options.cache, options.policy
        self._breaker, self.shadow = options.breaker(breaker), options.shadow(shadow)
        if isinstance(self.on_unavailable, Fallback):
            # Its own memory:// store: counted in this process only, never sent anywhere.
            self._fallback = self._scaled(self.on_unavailable, Backend.from_url("memory://"))
        self._plain = self._cache is None and self._breaker is None and not self.shadow

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        """The same limiter with every limit scaled to ``share``, on ``backend``."""
        raise NotImplementedError

    @property
    def breaker(self) -> Breaker | None:
        """The circuit breaker in front of the backend (None: every call goes to it)."""
        return self._breaker

    @property
    def backend(self) -> Backend:
        return self._backend or get_backend()

    def _keys(self, backend: Backend, key: str) -> list[str]:
        head = backend.heads.get(self._head_id) or backend.head(self._kind, self.name)
        suffixes = self._suffixes
        if len(suffixes) == 1:  # one rate, the common case: no comprehension frame
            return [_keys.tagged(head, key, suffixes[0])]
        return [_keys.tagged(head, key, suffix) for suffix in suffixes]

    def _check_cost(self, cost: object) -> int:
        check_int(cost, "cost")
        assert isinstance(cost, int)
        if cost > self._max_cost:
            raise ValueError(
                f"cost {cost} can never be admitted: it is above the limit {self._max_cost}"
            )
        return cost

    def _send(self, key: str, cost: int, commit: int) -> Awaitable[Any]:
        """Check the arguments and start the script; the caller awaits and decodes the reply.

        A plain function, not a coroutine: a decision pays for one coroutine frame fewer.
        """
        # The usual call (a non-empty str key, an int cost within the limit) passes both
        # checks without the calls; anything else goes through them and raises there.
        if type(key) is not str or not key:
            check_key(key)
        if type(cost) is not int or not 0 < cost <= self._max_cost:
            cost = self._check_cost(cost)
        backend = self._backend or get_backend()
        return backend.run(self._script, self._keys(backend, key), (cost, commit, *self._args))

    async def _decide(self, key: str, cost: int, commit: int) -> Decision:
        if not self._plain:
            return _guard.cached(self, key, cost) or await _guard.decide(self, key, cost, commit)
        return Decision.from_reply(await self._send(key, cost, commit))

    async def hit(self, key: str, cost: int = 1) -> Decision:
        """Count ``cost`` hits for ``key`` if every rate admits them (a denied hit counts none)."""
        if not self._plain:
            return _guard.cached(self, key, cost) or await _guard.decide(self, key, cost, 1)
        return Decision.from_reply(await self._send(key, cost, 1))

    async def peek(self, key: str, cost: int = 1) -> Decision:
        """What ``hit`` would answer now; changes nothing."""
        if not self._plain:
            return _guard.cached(self, key, cost) or await _guard.decide(self, key, cost, 0)
        return Decision.from_reply(await self._send(key, cost, 0))

    async def reset(self, key: str) -> None:
        """Forget every hit counted for ``key`` (under every rate of this limiter), and
        tell every process's deny cache."""
        check_key(key)
        await self._invalidate(key, reset=True)
        if self._fallback is not None:
            await self._fallback.reset(key)

    async def _invalidate(self, key: str, *, reset: bool = False) -> None:
        """Forget the local denial of ``key`` at once, then tell the other processes (with
        ``reset``, after removing the key's counters, in the same script)."""
        await _guard.invalidate(self, key, reset)

    async def acquire(
        self, key: str, cost: int = 1, *, wait: bool = False, timeout: float | None = None
    ) -> Decision:
        """``hit``, raising ``RateLimited`` when denied; with ``wait=True`` sleep for
        ``retry_after`` and try again until admitted, or until ``timeout`` seconds would be
        exceeded (then ``RateLimited`` at once: no sleep that cannot end in time)."""
        check_key(key)
        self._check_cost(cost)
        timeout = check_timeout(timeout)
        decision = await self._decide(key, cost, 1)
        if decision.allowed:
            return decision
        if not wait:
            raise RateLimited(f"rate limited: {key!r}", decision=decision)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not decision.allowed:
            if deadline is not None and loop.time() + decision.retry_after > deadline:
                raise RateLimited(f"rate limited: {key!r} (timeout {timeout} s)", decision=decision)
            # A millisecond more: loops whose timers have millisecond resolution (uvloop)
            # wake up to 1 ms early, which would cost a denied try and another sleep.
            await asyncio.sleep(decision.retry_after + TIMER_SLACK)
            decision = await self._decide(key, cost, 1)
        return decision

    def __call__(
        self, key: str, cost: int = 1, wait: bool = False, timeout: float | None = None
    ) -> Admission:
        """``async with limiter(key) as decision:`` runs the block only when admitted."""
        return Admission(self, key, cost, wait, timeout)

    def limit(
        self,
        key: str | Callable[..., str],
        cost: int = 1,
        wait: bool = False,
        timeout: float | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
        """Decorate an async function so each call first takes a hit for ``key``.

        ``key`` is a string, or a callable given the function's arguments that returns one.
        The decorated function is a coroutine function (``asyncio.create_task(job(1))``).
        """
        if not (isinstance(key, str) or callable(key)):
            raise TypeError(f"key must be a str or a callable, not {type(key).__name__}")
        if isinstance(key, str):
            check_key(key)
        self._check_cost(cost)
        check_timeout(timeout)

        def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
            @functools.wraps(fn)
            async def limited(*args: P.args, **kwargs: P.kwargs) -> R:
                k = key(*args, **kwargs) if callable(key) else key
                await self.acquire(k, cost, wait=wait, timeout=timeout)
                return await fn(*args, **kwargs)

            return limited

        return decorate


class Admission:
    """``async with limiter(key, ...) as decision``: entering takes the hit (and waits, with
    ``wait=True``) or raises ``RateLimited``; leaving gives nothing back."""

    __slots__ = ("_cost", "_key", "_limiter", "_timeout", "_wait")

    def __init__(
        self, limiter: Limiter, key: str, cost: int, wait: bool, timeout: float | None
    ) -> None:
        self._limiter, self._key, self._cost = limiter, key, cost
        self._wait, self._timeout = wait, timeout

    async def __aenter__(self) -> Decision:
        return await self._limiter.acquire(
            self._key, self._cost, wait=self._wait, timeout=self._timeout
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A rate limit is not a resource held by the block: nothing to give back.
        return None


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
    _kind = "fw"

    def __init__(
        self,
        *rates: RateLike,
        backend: Backend | None = None,
        name: str | None = None,
        deny_cache: int | None = None,
        on_unavailable: Policy = "raise",
        breaker: Breaker | None = None,
        shadow: bool = False,
    ):
        super().__init__(backend, name)
        self.rates = _rates(rates)
        self._suffixes = tuple(_keys.rate_suffix(r.limit, r.window_us) for r in self.rates)
        self._args = tuple(v for r in self.rates for v in (r.limit, r.window_us))
        self._max_cost = min(r.limit for r in self.rates)
        self._options(self.rates, deny_cache, on_unavailable, breaker, shadow)

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        rates = (Rate(share.scale(r.limit), r.window) for r in self.rates)
        return FixedWindow(*rates, backend=backend, name=self.name)

    def __repr__(self) -> str:
        rates = ", ".join(map(str, self.rates))
        return f"<FixedWindow {rates} name={self.name!r}{_guard.shown(self)}>"


class SlidingWindow(Limiter):
    """Never more than ``limit`` hits (by cost) in ANY interval of length ``window``.

    Each window is cut into ``buckets`` sub-window counters; the oldest, partly expired
    bucket still counts in full, so the limiter errs on the side of denying: an interval
    of up to ``window * (1 + 1/buckets)`` may be needed before capacity fully returns.
    """

    __slots__ = ("buckets", "rates")
    _script = _scripts.SLIDING_WINDOW
    _kind = "sw"

    def __init__(
        self,
        *rates: RateLike,
        buckets: int = 10,
        backend: Backend | None = None,
        name: str | None = None,
        deny_cache: int | None = None,
        on_unavailable: Policy = "raise",
        breaker: Breaker | None = None,
        shadow: bool = False,
    ):
        super().__init__(backend, name)
        self.rates = _rates(rates)
        self.buckets = check_int(buckets, "buckets")
        if buckets > MAX_BUCKETS:
            raise ValueError(f"buckets must be <= {MAX_BUCKETS}, got {buckets}")
        self._suffixes = tuple(
            _keys.rate_suffix(r.limit, r.window_us, f"/{buckets}") for r in self.rates
        )
        self._args = (buckets, *(v for r in self.rates for v in (r.limit, r.window_us)))
        self._max_cost = min(r.limit for r in self.rates)
        self._options(self.rates, deny_cache, on_unavailable, breaker, shadow)

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        rates = (Rate(share.scale(r.limit), r.window) for r in self.rates)
        return SlidingWindow(*rates, buckets=self.buckets, backend=backend, name=self.name)

    def __repr__(self) -> str:
        rates = ", ".join(map(str, self.rates))
        return (
            f"<SlidingWindow {rates} buckets={self.buckets} name={self.name!r}{_guard.shown(self)}>"
        )


class TokenBucket(Limiter):
    """GCRA: a steady ``rate``, with bursts of up to ``burst`` hits (default: the rate's limit).

    A full bucket holds ``burst`` tokens and refills one token every ``window / limit``
    seconds (rounded up to the microsecond, so never faster than asked).
    """

    __slots__ = ("burst", "rate")
    _script = _scripts.TOKEN_BUCKET
    _kind = "tb"

    def __init__(
        self,
        rate: RateLike,
        burst: int | None = None,
        *,
        backend: Backend | None = None,
        name: str | None = None,
        deny_cache: int | None = None,
        on_unavailable: Policy = "raise",
        breaker: Breaker | None = None,
        shadow: bool = False,
    ):
        super().__init__(backend, name)
        self.rate = as_rate(rate)
        self.burst = self.rate.limit if burst is None else check_int(burst, "burst")
        interval = -(-self.rate.window_us // self.rate.limit)
        suffix = _keys.rate_suffix(self.rate.limit, self.rate.window_us, f"/{self.burst}")
        self._suffixes = (suffix,)
        self._args = (self.burst, interval)
        self._max_cost = self.burst
        self._options((self.rate,), deny_cache, on_unavailable, breaker, shadow)

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        rate = Rate(share.scale(self.rate.limit), self.rate.window)
        return TokenBucket(rate, share.scale(self.burst), backend=backend, name=self.name)

    @property
    def rates(self) -> tuple[Rate, ...]:
        return (self.rate,)

    def __repr__(self) -> str:
        return (
            f"<TokenBucket {self.rate} burst={self.burst} name={self.name!r}{_guard.shown(self)}>"
        )
