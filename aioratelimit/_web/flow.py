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

from contextvars import ContextVar
from typing import Any, Literal, cast

from .. import _observe
from .._backend import Backend
from .._errors import BackendUnavailable, RateLimited
from .._limits.failure import Fallback, check_on_unavailable
from .._limits.guard import Guard, Options, Step
from .._limits.limiter import Limiter
from .._limits.list_table import Action
from .._limits.reservation import Reservation
from .._rates import Decision
from .._scripts import Mode
from .answers import (
    LISTED_DETAIL,
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
from .plans import Pick, Plan
from .types import Scope

#: The most limiters one face keeps a guard (and a fallback twin) for: a ``LimiterFunc``
#: that built a new limiter per request must not grow the table without bound.
MAX_GUARDS = 1024

_HIT = int(Mode.HIT)
#: The field a shadowed face adds where a deny entry would have refused the request.
_SHADOW_LISTED = (b"x-ratelimit-shadow", b"denied")

#: Where a reserving step leaves its reservation for the ``check`` that called the guard:
#: a guard returns a Decision only. A list set per call (a copied context shares it).
_taken: ContextVar[list[Reservation] | None] = ContextVar("aioratelimit_taken", default=None)


class Verdict:
    """What a face answers a request the limit counted: ``status`` 200 (admitted: the app
    runs with ``fields`` added), 429 (limited) or 503 (the backend is unavailable), with
    the ``fields`` and ``detail`` of the refusal, the ``decision`` (``None`` on a 503), the
    ``policy`` name and the ``violated`` policy items the problem document names;
    ``reservation`` is the admission's, held, when the plan counts by the response."""

    __slots__ = ("decision", "detail", "fields", "policy", "reservation", "status", "violated")

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
        self.reservation: Reservation | None = None

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
    """``limiter.hit`` as a guard's step (a plan without ``cost_from``)."""
    return lambda key, cost, mode: limiter.hit(key, cost)


async def reserve(limiter: Limiter, key: str, cost: int) -> Decision:
    """A reservation of ``cost`` taken for ``key``: its decision, denied or not; the held
    reservation goes to the calling ``check`` (``_taken``)."""
    reservation = limiter.reserve(key, cost)
    try:
        await reservation
    except RateLimited:
        return cast(Decision, reservation.decision)
    taken = _taken.get()
    if taken is not None:
        taken.append(reservation)
    return cast(Decision, reservation.decision)


def _reserve_step(limiter: Limiter) -> Step[Decision]:
    """``reserve`` as a guard's step (a plan with ``cost_from``)."""
    return lambda key, cost, mode: reserve(limiter, key, cost)


class RateLimitFlow:
    """One face's way from a request to its ``Verdict``, with the face's options."""

    __slots__ = (
        "_guards",
        "_options",
        "_outage",
        "_reserving",
        "_retry_unavailable",
        "_shadow",
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
        self._reserving: dict[Limiter, Guard[Decision]] = {}  # (guards of cost_from plans)
        # The fallback twins' own memory:// store: counted in this process only.
        self._store = Backend.from_url("memory://") if fallback != "raise" else None
        self.legacy_headers = bool(legacy_headers)
        self._retry_unavailable = retry_after_field(unavailable_retry_after)
        self._outage = OutageLog(face)
        self._shadow = bool(options.shadow)

    def _guard(self, limiter: Limiter, options: Options, reserving: bool) -> Guard[Decision]:
        """A new guard for ``limiter`` (with its fallback twin, for a ``Fallback``), around
        its hit or, ``reserving``, its reservation (the twin only ever hits: what it counts
        is not the backend's, and a reservation it admitted would settle nothing)."""
        table = self._reserving if reserving else self._guards
        if len(table) >= MAX_GUARDS:
            table.clear()
        share, twin = options.on_unavailable, None
        if isinstance(share, Fallback) and self._store is not None:
            twin = _hit_step(limiter._scaled(share, self._store))
        step = _reserve_step(limiter) if reserving else _hit_step(limiter)
        guard = Guard(step, _same, options, limit=limiter._max_cost, fallback=twin)
        table[limiter] = guard
        return guard

    def _listed(self, listed: Action, pick: Pick) -> Verdict | None:
        """The verdict on a client an access list names: None (allowed: the app runs,
        nothing counted) or a 403 (denied; admitted with the shadow field when shadowed)."""
        allowed = listed == "allow"
        if _observe.recorder is not None:
            result = _observe.ALLOWED_LISTED if allowed else _observe.DENIED_LISTED
            limiter = pick.limiter
            _observe.decided(limiter.name, limiter._script.name, result, 0.0)
        if allowed:
            return None
        if self._shadow:
            return Verdict(200, [_SHADOW_LISTED], None)
        return Verdict(403, [], None, LISTED_DETAIL, pick.policy.name)

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
        # Precedence: an allow entry bypasses every limit, a deny entry refuses at once
        # (before a block or a limit is counted), then the limits; from the list as this
        # process holds it, so no request pays a round trip for it.
        if plan.lists is not None:
            listed = await plan.lists.verdict(client)
            if listed is not None:
                return self._listed(listed, pick)
        limiter, options = pick.limiter, self._options
        if place is not None and limiter.name is None:
            client = placed(place, client)
        reserving = pick.cost_from is not None
        taken: list[Reservation] = []
        token = _taken.set(taken) if reserving else None
        try:
            if options is None:
                if reserving:
                    decision = await reserve(limiter, client, pick.cost)
                else:
                    decision = await limiter.hit(client, pick.cost)
            else:
                table = self._reserving if reserving else self._guards
                guard = table.get(limiter) or self._guard(limiter, options, reserving)
                decision = await guard.decide(client, pick.cost, _HIT)
        except BackendUnavailable as exc:
            return self.unavailable(exc, pick.policy.name, pick.policy.names)
        finally:
            if token is not None:
                _taken.reset(token)
        policy = pick.policy
        fields = policy.headers(decision, self.legacy_headers)
        if decision.allowed:
            verdict = Verdict(200, fields, decision)
            # Held: admitted on the backend's count (a denial shadow mode let through, or
            # a fallback's admission, took none: nothing to settle).
            if taken and taken[-1].state == "held":
                verdict.reservation = taken[-1]
            return verdict
        violated = (policy.violated(decision),)
        return Verdict(429, fields, decision, exceeded_detail(decision), policy.name, violated)
