"""The web layers' failure policy and shadow mode, shared by ``RateLimitMiddleware`` and
the FastAPI ``RateLimit`` dependency.

``on_unavailable`` is ``"deny"`` (503 with ``Retry-After``: the web default), ``"allow"``
(the request passes unlimited) or a ``Fallback(share)``:
each limiter the layer uses gets an in-process twin with ``share`` of its limits, counted
while the backend is unavailable. A ``breaker`` (given, or a default one with a fallback)
keeps an outage from costing every request its timeout. ``shadow=True`` never refuses: a
request the limit would refuse passes, and says so in ``X-RateLimit-Shadow``. A limiter's
own options (its deny cache, policy, breaker, shadow mode) apply underneath, as anywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._backend import Backend
from .._errors import BackendError, BackendUnavailable
from .._limits.failure import Breaker, Fallback
from .._limits.limiter import Limiter
from .._rates import Decision

#: The field a shadow decision adds to the response: what the limit said.
SHADOW_HEADER = b"x-ratelimit-shadow"
#: The most limiters one web layer keeps a fallback twin for.
MAX_FALLBACKS = 1024


class WebPolicy:
    """One web layer's ``on_unavailable``, ``breaker`` and ``shadow`` options."""

    __slots__ = ("_fallbacks", "_store", "allow", "breaker", "fallback", "shadow")

    def __init__(self, on_unavailable: Any, breaker: Any, shadow: Any) -> None:
        if isinstance(on_unavailable, Fallback):
            self.fallback: Fallback | None = on_unavailable
        elif on_unavailable in ("deny", "allow"):
            self.fallback = None
        elif isinstance(on_unavailable, str):
            raise ValueError(
                f"on_unavailable must be 'deny', 'allow' or a Fallback, got {on_unavailable!r}"
            )
        else:
            raise TypeError(
                "on_unavailable must be 'deny', 'allow' or a Fallback,"
                f" not {type(on_unavailable).__name__}"
            )
        if breaker is not None and not isinstance(breaker, Breaker):
            raise TypeError(f"breaker must be a Breaker, not {type(breaker).__name__}")
        if not isinstance(shadow, bool):
            raise TypeError(f"shadow must be a bool, not {type(shadow).__name__}")
        #: "allow": pass unlimited when the backend is unavailable (and no fallback)
        self.allow = on_unavailable == "allow"
        if breaker is None and self.fallback is not None:
            breaker = Breaker(name="web")
        self.breaker: Breaker | None = breaker
        self.shadow = shadow
        # limiter id -> (the limiter, its twin); the limiter is held, so its id is not reused
        self._fallbacks: dict[int, tuple[Limiter, Limiter]] = {}
        self._store: Backend | None = None

    async def hit(self, limiter: Limiter, key: str, cost: int) -> Decision:
        """The request's decision; ``BackendUnavailable`` when the policy has no fallback
        (the layer answers 503, or passes with ``"allow"``)."""
        breaker = self.breaker
        if breaker is not None and not breaker.allow():
            decision = await self._degraded(
                limiter, key, cost, BackendUnavailable("circuit breaker open")
            )
        else:
            try:
                decision = await limiter.hit(key, cost)
            except BackendUnavailable as exc:
                if breaker is not None:
                    breaker.failed()
                decision = await self._degraded(limiter, key, cost, exc)
            except BackendError:
                if breaker is not None:  # the server answered (with an error): it is up
                    breaker.succeeded()
                raise
            except BaseException:
                if breaker is not None:
                    breaker.abandoned()
                raise
            else:
                if breaker is not None:
                    breaker.succeeded()
        if self.shadow and not decision.shadow:
            return dataclasses.replace(
                decision, allowed=True, shadow=True, shadow_denied=not decision.allowed
            )
        return decision

    async def _degraded(
        self, limiter: Limiter, key: str, cost: int, exc: BackendUnavailable
    ) -> Decision:
        if self.fallback is None:
            raise exc
        known = self._fallbacks.get(id(limiter))
        if known is None:
            if self._store is None:
                self._store = Backend.from_url("memory://")
            if len(self._fallbacks) >= MAX_FALLBACKS:  # limiters made per request: bounded
                self._fallbacks.clear()
            known = self._fallbacks[id(limiter)] = (
                limiter,
                limiter._scaled(self.fallback, self._store),
            )
        twin = known[1]
        return dataclasses.replace(await twin.hit(key, cost), source="fallback")


def shadow_fields(decision: Decision) -> list[tuple[bytes, bytes]]:
    """``X-RateLimit-Shadow: denied`` (or ``allowed``) for a shadow decision; else none."""
    if not decision.shadow:
        return []
    return [(SHADOW_HEADER, b"denied" if decision.shadow_denied else b"allowed")]
