"""A request through a rate limit, the same for every web face: pick the limiter, name the
client, take one guarded hit, and say what to answer (``Verdict``).

``RateLimitMiddleware`` and the FastAPI ``RateLimit`` dependency each hold one
``RateLimitFlow``; only their ends differ (ASGI messages, or a response's headers and an
exception). The web's options are a ``Guard`` per limiter around its ``hit``, sharing one
breaker: ``on_unavailable`` is ``"deny"`` (503 with ``Retry-After``: the web default),
``"allow"`` (the request passes unlimited) or a ``Fallback(share)``: each limiter gets an
in-process twin with ``share`` of its limits, counted while the backend is unavailable.
``shadow=True`` never refuses. A limiter's own options apply underneath, as anywhere.

Where a limit is declared decides what it shares: a limiter with a ``name`` counts under
that name wherever it is used (shared on purpose); an unnamed one counts per place it is
declared (a ``Rule``, or the route of a ``RateLimit`` dependency), so two routes that each
declare ``FixedWindow("2/minute")`` get two counts per client, not one.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from .._backend import Backend
from .._errors import BackendUnavailable
from .._limits.failure import Fallback, check_on_unavailable
from .._limits.guard import Guard, Options, Step
from .._limits.limiter import Limiter
from .._rates import Decision
from .._scripts import Mode
from .answers import (
    WEB_POLICIES,
    OutageLog,
    Refusal,
    exceeded_detail,
    problem_body,
    problem_kind,
    refusal,
    retry_after_field,
    unavailable_detail,
)
from .clients import resolve
from .plans import Plan
from .types import Scope

#: The most limiters one face keeps a guard (and a fallback twin) for: a ``LimiterFunc``
#: that built a new limiter per request must not grow the table without bound.
MAX_GUARDS = 1024

_HIT = int(Mode.HIT)


class Verdict:
    """What a face answers a request the limit counted: ``status`` 200 (admitted: the app
    runs with ``fields`` added), 429 (limited) or 503 (the backend is unavailable), with
    the ``fields`` and ``detail`` of the refusal, the ``decision`` (``None`` on a 503), the
    ``policy`` name and the ``violated`` policy items the problem document names."""

    __slots__ = ("decision", "detail", "fields", "policy", "status", "violated")

    def __init__(
        self,
        status: int,
        fields: list[tuple[bytes, bytes]],
        decision: Decision | None,
        detail: str = "",
        policy: str | None = None,
        violated: tuple[str, ...] = (),
    ) -> None:
        self.status, self.fields, self.decision = status, fields, decision
        self.detail, self.policy, self.violated = detail, policy, violated

    def refusal(self, scope: Scope) -> Refusal:
        """The refusal as a ``respond=`` hook is given it."""
        return refusal(
            self.status, self.detail, self.fields, scope, self.decision, self.policy, self.violated
        )

    def problem(self) -> bytes:
        """The default answer's RFC 9457 document: the draft's problem type for the status."""
        return problem_body(self.status, self.detail, problem_kind(self.status), self.violated)


def placed(place: str, client: str) -> str:
    """The key an unnamed limiter counts ``client`` under at ``place``: both, the place
    length-prefixed so that no two (place, client) pairs share a key."""
    return f"route:{len(place)}:{place}:{client}"


def _same(decision: Decision) -> Decision:
    return decision


def _hit_step(limiter: Limiter) -> Step[Decision]:
    """``limiter.hit`` as a guard's step (a web face only ever hits)."""
    return lambda key, cost, mode: limiter.hit(key, cost)


class RateLimitFlow:
    """One face's way from a request to its ``Verdict``, with the face's options."""

    __slots__ = (
        "_guards",
        "_options",
        "_outage",
        "_retry_unavailable",
        "_store",
        "legacy_headers",
        "on_unavailable",
    )

    def __init__(
        self,
        face: str,
        *,
        on_unavailable: Any,
        breaker: Any,
        shadow: Any,
        legacy_headers: bool,
        unavailable_retry_after: float,
    ) -> None:
        self.on_unavailable = cast(
            Literal["deny", "allow"] | Fallback, check_on_unavailable(on_unavailable, WEB_POLICIES)
        )
        # "deny" and "allow" are answered here, from the guard's BackendUnavailable.
        fallback = self.on_unavailable if isinstance(self.on_unavailable, Fallback) else "raise"
        options = Options(fallback, breaker, shadow, name="web")
        #: None: no option on, a request's hit is the limiter's own
        self._options = None if options.plain else options
        self._guards: dict[Limiter, Guard[Decision]] = {}
        # The fallback twins' own memory:// store: counted in this process only.
        self._store = Backend.from_url("memory://") if fallback != "raise" else None
        self.legacy_headers = bool(legacy_headers)
        self._retry_unavailable = retry_after_field(unavailable_retry_after)
        self._outage = OutageLog(face)

    def _guard(self, limiter: Limiter, options: Options) -> Guard[Decision]:
        """A new guard for ``limiter`` (with its fallback twin, for a ``Fallback``)."""
        if len(self._guards) >= MAX_GUARDS:
            self._guards.clear()
        share, twin = options.on_unavailable, None
        if isinstance(share, Fallback) and self._store is not None:
            twin = _hit_step(limiter._scaled(share, self._store))
        guard = Guard(_hit_step(limiter), _same, options, limit=limiter._max_cost, fallback=twin)
        self._guards[limiter] = guard
        return guard

    def unavailable(
        self, exc: BackendUnavailable, name: str, names: tuple[str, ...]
    ) -> Verdict | None:
        """The verdict when the backend is unavailable: None with ``"allow"`` (the request
        passes unlimited), else a 503 naming every policy item of the request's: the quota
        is down to nothing while the backend is away (temporary-reduced-capacity)."""
        allow = self.on_unavailable == "allow"
        self._outage(exc, allow)
        if allow:
            return None
        detail = unavailable_detail("rate limit")
        return Verdict(503, [self._retry_unavailable], None, detail, name, names)

    async def check(self, plan: Plan, scope: Scope, place: str | None = None) -> Verdict | None:
        """The verdict on a request under ``plan``, declared at ``place`` (a rule's or a
        route's text; None: one count for every route); None: not limited, the app runs as
        it is (the plan picked no limiter, the client function answered None, or the backend
        is unavailable and the face lets requests through)."""
        pick = await plan.pick(scope)
        if pick is None:
            return None
        client = await resolve(pick.client, scope)
        if client is None:
            return None
        limiter, options = pick.limiter, self._options
        if place is not None and limiter.name is None:
            client = placed(place, client)
        try:
            if options is None:
                decision = await limiter.hit(client, pick.cost)
            else:
                guard = self._guards.get(limiter) or self._guard(limiter, options)
                decision = await guard.decide(client, pick.cost, _HIT)
        except BackendUnavailable as exc:
            return self.unavailable(exc, pick.policy.name, pick.policy.names)
        policy = pick.policy
        fields = policy.headers(decision, self.legacy_headers)
        if decision.allowed:
            return Verdict(200, fields, decision)
        violated = (policy.violated(decision),)
        return Verdict(429, fields, decision, exceeded_detail(decision), policy.name, violated)
