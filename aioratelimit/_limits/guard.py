"""The guard: a rate-limit decision made through options on top of its plain step (one
script call for a limiter, one ``hit`` for a web face): the local deny cache, the failure
policy with its circuit breaker, shadow mode, and a shared pause (``pause``).

A limiter with none of them builds no guard and its decisions never come here; the web
faces build one per limiter they count on, around its ``hit``, with their own policy and
shadow mode (the limiter's own options then apply underneath).

Order: a pause that runs answers first, then a cached denial (no round trip, even with the
breaker open: either is as true then as before); then the breaker, which may serve the
policy at once; then the step, whose unavailability serves the policy; shadow mode shapes
whatever came out.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from .. import _keys, _observe, _scripts
from .._args import check_count, check_key
from .._backend import Backend, get_backend
from .._errors import BackendError, BackendUnavailable
from .._rates import Decision
from . import deny_cache as _deny_cache
from . import pause as _pause
from .deny_cache import DenyCache, Entry, clock
from .failure import Breaker, Fallback, OnUnavailable, check_on_unavailable
from .pause import Pause

_PARTIAL = int(_scripts.Mode.PARTIAL)

R = TypeVar("R")
#: The plain decision a guard wraps: ``step(key, cost, mode)`` (a script's ``Mode``),
#: awaited and then decoded into a ``Decision``.
Step = Callable[[str, int, int], Awaitable[R]]


def check_cost(cost: object, limit: int) -> int:
    """``cost`` if it is an int that ``limit`` (the largest cost ever admitted) can admit."""
    check_count(cost, "cost")
    assert isinstance(cost, int)
    if cost > limit:
        raise ValueError(f"cost {cost} can never be admitted: it is above the limit {limit}")
    return cost


class Options:
    """The failure policy, its breaker and shadow mode, checked; a web face shares one
    ``Options`` (and so one breaker) between the guards of all the limiters it uses."""

    __slots__ = ("breaker", "on_unavailable", "shadow")

    def __init__(
        self, on_unavailable: object, breaker: object, shadow: object, *, name: str
    ) -> None:
        self.on_unavailable: OnUnavailable = check_on_unavailable(on_unavailable)
        if breaker is not None and not isinstance(breaker, Breaker):
            raise TypeError(f"breaker must be a Breaker, not {type(breaker).__name__}")
        if breaker is None and self.on_unavailable != "raise":
            breaker = Breaker(name=name)  # a policy is there to be served: spare the timeouts
        self.breaker: Breaker | None = breaker
        if not isinstance(shadow, bool):
            raise TypeError(f"shadow must be a bool, not {type(shadow).__name__}")
        self.shadow = shadow

    @property
    def plain(self) -> bool:
        """Nothing for a guard to do (but a deny cache, which is not an option here)."""
        return self.breaker is None and not self.shadow


class Guard(Generic[R]):
    """One limiter's decisions through ``options`` around ``step``.

    ``decode`` turns the step's reply into a ``Decision``; ``limit`` is the largest cost
    the limiter ever admits; ``fallback`` is the step of the in-process twin a
    ``Fallback`` policy counts on; ``cache`` the deny cache, whose key watchers listen on
    the channels of ``head`` (the limiter's kind and name) on ``backend`` (None: the
    default one); ``observed`` the limiter name and algorithm its decisions are reported
    under (None: the step reports them itself); ``pause`` the shared pause it honours.
    """

    __slots__ = (
        "backend",
        "breaker",
        "cache",
        "decode",
        "fallback",
        "head",
        "limit",
        "observed",
        "on_unavailable",
        "pause",
        "send",
        "shadow",
        "tag",
    )

    def __init__(
        self,
        step: Step[R],
        decode: Callable[[R], Decision],
        options: Options,
        *,
        limit: int,
        fallback: Step[R] | None = None,
        cache: DenyCache | None = None,
        backend: Backend | None = None,
        head: tuple[str, str | None] = ("", None),
        observed: tuple[str | None, str] | None = None,
        pause: Pause | None = None,
        tag: Callable[[str], str | None] | None = None,
    ) -> None:
        if isinstance(options.on_unavailable, Fallback) != (fallback is not None):
            raise ValueError("a Fallback policy needs a fallback step, and only it")
        self.send, self.decode, self.limit, self.fallback = step, decode, limit, fallback
        self.on_unavailable, self.breaker = options.on_unavailable, options.breaker
        self.shadow = options.shadow
        self.cache, self.backend, self.head, self.observed = cache, backend, head, observed
        self.pause = pause
        #: key -> the hash tag of its keys and channel (a limiter's ``hash_tag``), or None
        self.tag = tag

    def cached(self, key: str, cost: int, mode: int) -> Decision | None:
        """The hot path under attack, a plain method (no coroutine to pay for): the deny
        cache's answer for ``key`` and ``cost``, or None (then ``decide``). A partial hit
        (``mode``) is never answered here: a denial of a larger cost says nothing of it."""
        pause = self.pause
        if pause is not None and (answer := _pause.denial(pause, pause.backend, self.limit)):
            return self._reported(answer)
        cache = self.cache
        # The type checks keep 1.0 or True from matching a cost of 1.
        if cache is None or type(cost) is not int or type(key) is not str or mode >= _PARTIAL:
            return None
        if cache.backend is not (self.backend or get_backend()):
            return None
        answer = cache.answer(key, cost)
        if answer is not None:
            return self._reported(answer)
        return None

    def _reported(self, answer: Decision) -> Decision:
        """An answer made here (no step), shaped and reported as ``decide`` would."""
        if self.shadow or _observe.recorder is not None:
            if self.shadow:
                answer = self.shaped(answer)
            if _observe.recorder is not None and self.observed is not None:
                name, algorithm = self.observed
                _observe.decided(name, algorithm, _observe.result_of(answer), 0.0, answer)
        return answer

    async def paused(self) -> Decision | None:
        """The pause's denial (unshaped), once this process knows the pause (its first
        decision waits for the first read): None when it does not run."""
        pause = self.pause
        if pause is None:
            return None
        backend = pause.backend
        await _pause.ready(pause, backend)
        return _pause.denial(pause, backend, self.limit)

    def decide(self, key: str, cost: int, mode: int) -> Awaitable[Decision]:
        """``hit`` or ``peek`` (the step's ``mode``) through the options, reported to the
        recorder (``_observe``) when there is one. A plain method that returns the
        coroutine: a decision pays for one coroutine frame fewer."""
        if _observe.recorder is None or self.observed is None:
            return self._decide(key, cost, mode)
        name, algorithm = self.observed
        return _observe.guarded(name, algorithm, self._decide(key, cost, mode))

    async def _decide(self, key: str, cost: int, mode: int) -> Decision:
        partial = mode >= _PARTIAL
        cache = None if partial else self.cache  # (see ``cached``)
        # Bad input raises here, before any I/O, whatever the breaker says; a partial hit may
        # ask for more than the limit (it gets what is left). The usual call passes both
        # tests without the checks' calls.
        if type(key) is not str or not key:
            check_key(key)
        if type(cost) is not int or not 0 < cost <= self.limit:
            check_count(cost, "cost") if partial else check_cost(cost, self.limit)
        if self.pause is not None and (paused := await self.paused()) is not None:
            return self.shaped(paused)
        breaker = self.breaker
        entry = None
        flight: asyncio.Future[Decision | None] | None = None
        if cache is not None:
            backend = self.backend or get_backend()
            if cache.backend is not backend:  # another default backend: nothing learned holds
                cache.use(backend)
            while True:
                cached = cache.answer(key, cost)
                if cached is not None:
                    return self.shaped(cached)
                if (entry := cache.entries.get(key)) is None:
                    break
                shared = entry.flights.get(cost)
                if shared is None:
                    if entry.armed_at is not None:  # the others share this call
                        flight = entry.flights[cost] = asyncio.get_running_loop().create_future()
                    break
                # A call for this cost is under way (its denial just ran out): its denial
                # holds for this hit too, made meanwhile; if it was admitted, take turns (one
                # call in flight per key and cost), so a flood costs one denied call per
                # retry window.
                denied = await asyncio.shield(shared)
                if denied is not None:
                    return self.shaped(dataclasses.replace(denied, source="cache"))
        if breaker is not None and not breaker.allow():
            if flight is not None and entry is not None:
                _land(entry, cost, flight, None)
            return await self._degraded(key, cost, mode, None)
        decision: Decision | None = None
        sent, gen = (clock(), cache.gen) if cache is not None else (0.0, 0)
        try:
            decision = self.decode(await self.send(key, cost, mode))
        except BackendUnavailable as exc:
            if breaker is not None:
                breaker.failed()
            return await self._degraded(key, cost, mode, exc)
        except BackendError:
            if breaker is not None:  # the server answered (with an error): it is up
                breaker.succeeded()
            raise
        except BaseException:
            if breaker is not None:
                breaker.abandoned()
            raise
        finally:
            if flight is not None and entry is not None:
                _land(entry, cost, flight, decision)
        if breaker is not None:
            breaker.succeeded()
        if cache is not None and not decision.allowed:
            cache.remember(key, cost, decision, sent, gen, self._watcher(cache))
        return self.shaped(decision)

    def _watcher(self, cache: DenyCache) -> Callable[[str, Entry], asyncio.Task[None]]:
        backend = cache.backend  # the one the cache serves (``use``)
        notifier, head, tag = backend._notifier, backend._head(*self.head), self.tag
        return lambda key, entry: _deny_cache.start_watch(
            cache, notifier, _keys.rate_channel(head, key, tag and tag(key)), key, entry
        )

    async def _degraded(
        self, key: str, cost: int, mode: int, exc: BackendUnavailable | None
    ) -> Decision:
        """The failure policy's decision (``exc`` is None when the breaker is open)."""
        policy = self.on_unavailable
        if policy == "raise":
            if exc is not None:
                raise exc
            raise BackendUnavailable("the backend is unavailable (circuit breaker open)")
        if self.fallback is not None:
            d = self.decode(await self.fallback(key, cost, mode))  # (reported once)
            return self.shaped(dataclasses.replace(d, source="fallback"))
        limit = self.limit
        if policy == "allow":
            granted = min(cost, limit)  # (a partial hit may ask for more than the limit)
            d = Decision(True, limit, limit - granted, 0.0, 0.0, granted=granted, source="policy")
            return self.shaped(d)
        # Denied until the breaker may probe again: a waiter sleeps that long, not a busy loop.
        retry = self.breaker.cooldown if self.breaker is not None else 1.0
        return self.shaped(Decision(False, limit, 0, retry, retry, source="policy"))

    def shaped(self, decision: Decision) -> Decision:
        """In shadow mode: admitted whatever the limit said, and saying what it said (a
        decision shaped already, by the limiter under a web face, stays as it is)."""
        if not self.shadow or decision.shadow:
            return decision
        return dataclasses.replace(
            decision, allowed=True, shadow=True, shadow_denied=not decision.allowed
        )

    def forget(self, key: str) -> None:
        """Drop the local denial of ``key`` (a reset, a refund, a block lifted)."""
        if self.cache is not None:
            self.cache.forget(key)

    def shown(self) -> str:
        """The options in a repr, with their live state."""
        text = ""
        if self.cache is not None:
            text += f" deny_cache={len(self.cache)}/{self.cache.size}"
        if self.pause is not None:
            text += f" pause={self.pause.name!r}"
        if self.on_unavailable != "raise":
            text += f" on_unavailable={self.on_unavailable!r}"
        if self.breaker is not None:
            text += f" breaker={self.breaker.state}"
        return text + (" shadow" if self.shadow else "")


def _land(
    entry: Entry, cost: int, flight: asyncio.Future[Decision | None], decision: Decision | None
) -> None:
    """End a shared call: its sharers get its denial, or None (they make their own call)."""
    if not flight.done():
        flight.set_result(decision if decision is not None and not decision.allowed else None)
    if entry.flights.get(cost) is flight:
        del entry.flights[cost]
