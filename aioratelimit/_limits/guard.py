"""A limiter's decision when it has options on top of the plain script call: the local deny
cache (``_deny_cache``), the circuit breaker and the failure policy (``_failure``), and
shadow mode. ``Limiter.hit``/``peek``/``acquire`` come here only when one of them is on;
without them a decision never enters this module.

Order: a cached denial answers first (no round trip, even with the breaker open: it is as
true then as before); then the breaker, which may serve the policy at once; then the call,
whose unavailability serves the policy; shadow mode shapes whatever came out.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .. import _keys, _observe, _scripts
from .._args import check_int, check_key
from .._backend import Backend, get_backend
from .._errors import BackendError, BackendUnavailable
from .._rates import Decision
from . import deny_cache as _deny_cache
from .deny_cache import DenyCache, Entry, clock
from .failure import Breaker, Policy, check_policy

_PARTIAL = int(_scripts.Mode.PARTIAL)


class Guarded(Protocol):
    """The slice of ``Limiter`` this module reads."""

    name: str | None
    shadow: bool
    _script: _scripts.Script
    on_unavailable: Policy
    _kind: str
    _max_cost: int
    _backend: Backend | None
    _cache: DenyCache | None
    _breaker: Breaker | None

    @property
    def _fallback(self) -> Guarded | None: ...

    def _check_cost(self, cost: object, partial: bool = False) -> int: ...

    def _keys(self, backend: Backend, key: str) -> list[str]: ...

    def _send(self, key: str, cost: int, commit: int) -> Awaitable[Any]: ...

    async def _decide(self, key: str, cost: int, commit: int) -> Decision: ...


def cached(lim: Guarded, key: str, cost: int, mode: int) -> Decision | None:
    """The hot path under attack, a plain function (no coroutine to pay for): the deny
    cache's answer for ``key`` and ``cost``, or None (then ``decide``). A partial hit
    (``mode``) is never answered here: a denial of a larger cost says nothing of it."""
    cache = lim._cache
    # The type checks keep 1.0 or True from matching a cost of 1.
    if cache is None or type(cost) is not int or type(key) is not str or mode >= _PARTIAL:
        return None
    if cache.backend is not (lim._backend or get_backend()):
        return None
    answer = cache.answer(key, cost)
    if answer is not None and (lim.shadow or _observe.recorder is not None):
        if lim.shadow:
            answer = shaped(lim, answer)
        if _observe.recorder is not None:
            _observe.decided(lim.name, lim._script.name, _observe.result_of(answer), 0.0, answer)
    return answer


async def decide(lim: Guarded, key: str, cost: int, mode: int) -> Decision:
    """``hit`` or ``peek`` (the script's ``mode``) through the limiter's options, reported
    to the recorder (``_observe``) when there is one."""
    if _observe.recorder is None:
        return await _decide(lim, key, cost, mode)
    return await _observe.guarded(lim.name, lim._script.name, _decide(lim, key, cost, mode))


async def _decide(lim: Guarded, key: str, cost: int, commit: int) -> Decision:
    partial = commit >= _PARTIAL
    cache = None if partial else lim._cache  # (see ``cached``)
    backend = lim._backend or get_backend()
    check_key(key)
    # Bad input raises here, before any I/O, whatever the breaker says; a partial hit may
    # ask for more than the limit (it gets what is left).
    lim._check_cost(cost, partial)
    breaker = lim._breaker
    entry = None
    flight: asyncio.Future[Decision | None] | None = None
    if cache is not None:
        if cache.backend is not backend:  # another default backend: nothing learned holds
            cache.use(backend)
        while True:
            cached = cache.answer(key, cost)
            if cached is not None:
                return shaped(lim, cached)
            if (entry := cache.entries.get(key)) is None:
                break
            shared = entry.flights.get(cost)
            if shared is None:
                if entry.armed_at is not None:  # the others share this call
                    flight = entry.flights[cost] = asyncio.get_running_loop().create_future()
                break
            # A call for this cost is under way (its denial just ran out): its denial holds
            # for this hit too, made meanwhile; if it was admitted, take turns (one call in
            # flight per key and cost), so a flood costs one denied call per retry window.
            denied = await asyncio.shield(shared)
            if denied is not None:
                return shaped(lim, dataclasses.replace(denied, source="cache"))
    if breaker is not None and not breaker.allow():
        if flight is not None and entry is not None:
            _land(entry, cost, flight, None)
        return await degraded(lim, key, cost, commit, None)
    decision: Decision | None = None
    sent, gen = clock(), cache.gen if cache is not None else 0
    try:
        decision = Decision.from_reply(await lim._send(key, cost, commit))
    except BackendUnavailable as exc:
        if breaker is not None:
            breaker.failed()
        return await degraded(lim, key, cost, commit, exc)
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
        cache.remember(key, cost, decision, sent, gen, _watcher(lim, backend, cache))
    return shaped(lim, decision)


def _land(
    entry: Entry, cost: int, flight: asyncio.Future[Decision | None], decision: Decision | None
) -> None:
    """End a shared call: its sharers get its denial, or None (they make their own call)."""
    if not flight.done():
        flight.set_result(decision if decision is not None and not decision.allowed else None)
    if entry.flights.get(cost) is flight:
        del entry.flights[cost]


def _watcher(
    lim: Guarded, backend: Backend, cache: DenyCache
) -> Callable[[str, Entry], asyncio.Task[None]]:
    notifier, head = backend._notifier, backend._head(lim._kind, lim.name)
    return lambda key, entry: _deny_cache.start_watch(
        cache, notifier, _keys.rate_channel(head, key), key, entry
    )


async def degraded(
    lim: Guarded, key: str, cost: int, commit: int, exc: BackendUnavailable | None
) -> Decision:
    """The failure policy's decision (``exc`` is None when the breaker is open)."""
    policy = lim.on_unavailable
    if policy == "raise":
        if exc is not None:
            raise exc
        raise BackendUnavailable("the backend is unavailable (circuit breaker open)")
    fallback = lim._fallback
    if fallback is not None:
        d = Decision.from_reply(await fallback._send(key, cost, commit))  # (reported once)
        return shaped(lim, dataclasses.replace(d, source="fallback"))
    limit = lim._max_cost
    if policy == "allow":
        granted = min(cost, limit)  # (a partial hit may ask for more than the limit)
        d = Decision(True, limit, limit - granted, 0.0, 0.0, granted=granted, source="policy")
        return shaped(lim, d)
    # Denied until the breaker may probe again: a waiter sleeps that long, not a busy loop.
    retry = lim._breaker.cooldown if lim._breaker is not None else 1.0
    return shaped(lim, Decision(False, limit, 0, retry, retry, source="policy"))


def shaped(lim: Guarded, decision: Decision) -> Decision:
    """In shadow mode: admitted whatever the limit said, and saying what it said."""
    if not lim.shadow:
        return decision
    return dataclasses.replace(
        decision, allowed=True, shadow=True, shadow_denied=not decision.allowed
    )


class Options:
    """A limiter's options, checked (before anything else is built)."""

    __slots__ = ("cache", "name", "policy")

    def __init__(
        self, name: str, rates: tuple[Any, ...], deny_cache: object, on_unavailable: object
    ) -> None:
        self.name = name
        self.cache: DenyCache | None = None
        if deny_cache is not None:
            size = check_int(deny_cache, "deny_cache")
            # A key stays subscribed for a window after its last denial ran out.
            self.cache = DenyCache(size, max(r.window for r in rates))
        self.policy: Policy = check_policy(on_unavailable)

    def breaker(self, breaker: object) -> Breaker | None:
        """The breaker given, or a default one when the policy is not ``"raise"``."""
        if breaker is not None and not isinstance(breaker, Breaker):
            raise TypeError(f"breaker must be a Breaker, not {type(breaker).__name__}")
        if breaker is None and self.policy != "raise":
            breaker = Breaker(name=self.name)
        return breaker

    def shadow(self, shadow: object) -> bool:
        if not isinstance(shadow, bool):
            raise TypeError(f"shadow must be a bool, not {type(shadow).__name__}")
        return shadow


def shown(lim: Guarded) -> str:
    """The options in a repr, with their live state (nothing when all are off)."""
    text = ""
    if lim._cache is not None:
        text += f" deny_cache={len(lim._cache)}/{lim._cache.size}"
    if lim.on_unavailable != "raise":
        text += f" on_unavailable={lim.on_unavailable!r}"
    if lim._breaker is not None:
        text += f" breaker={lim._breaker.state}"
    return text + (" shadow" if lim.shadow else "")


async def invalidate(lim: Guarded, key: str, reset: bool) -> None:
    """``Limiter._invalidate``: forget ``key`` here at once, then run
    ``lua/rate_invalidate.lua`` (which tells every process; with ``reset``, after removing
    the key's counters)."""
    cache = lim._cache
    if cache is not None:
        cache.forget(key)
    backend = lim._backend or get_backend()
    channel = _keys.rate_channel(backend._head(lim._kind, lim.name), key)
    try:
        await backend._run(
            _scripts.RATE_INVALIDATE,
            lim._keys(backend, key),
            (int(reset), channel, backend._publish_command),
        )
    finally:
        if cache is not None:  # a denial sent before the reset, answered after it
            cache.forget(key)
