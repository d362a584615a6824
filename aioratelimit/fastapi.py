"""FastAPI dependencies: a rate limit, a one-shot token check and an ``Idempotency-Key``,
per endpoint.

Needs the ``web`` extra (``pip install '.[web]'`` in a checkout); ``import aioratelimit``
alone never imports FastAPI. No dependency needs a ``request`` parameter in the endpoint::

    from fastapi import Depends, FastAPI
    from aioratelimit.fastapi import ConsumeToken, RateLimit, add_problem_handler, client_ip

    app = FastAPI()
    add_problem_handler(app)            # optional: problem+json bodies, as the middleware

    @app.get("/search", dependencies=[Depends(RateLimit(arl.TokenBucket("5/second")))])
    async def search(q: str) -> list[str]: ...

    @app.post("/confirm")
    async def confirm(token: str = Depends(ConsumeToken(header="X-Token"))) -> dict[str, str]: ...

``Depends(IdempotencyKey(client=Depends(current_account)))`` gives an ``IdempotentRequest``
whose ``await idem.run(charge, ...)`` runs once per account and key.

Rejections are raised as ``ProblemException`` (an ``HTTPException``): FastAPI's default
handler answers ``{"detail": ...}`` as JSON with the status and headers; after
``add_problem_handler(app)`` the body is an RFC 9457 ``application/problem+json`` document,
exactly what ``aioratelimit.asgi`` middleware sends.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

from fastapi import Request, Response

from . import _public

# Before ``_public.publish`` below: the web names both faces export (client_ip, Refusal...)
# are asgi's, which claims them first.
from . import asgi as _asgi  # noqa: F401
from ._backend import Backend
from ._errors import BackendUnavailable
from ._idempotency.tokens import consume_token
from ._limits.failure import Breaker, Fallback
from ._limits.limiter import Limiter
from ._limits.lists import AccessList
from ._rates import Decision
from ._web.answers import (
    UNAVAILABLE_RETRY_AFTER,
    OutageLog,
    Refusal,
    check_respond,
    problem_kind,
)
from ._web.clients import (
    ClientFunc,
    check_client_func,
    client_ip,
    credentials,
    header,
    path_param,
    resolve,
    user_id,
)
from ._web.flow import RateLimitFlow, Verdict
from ._web.idempotency_dependency import IdempotencyKey, IdempotentRequest
from ._web.inflight import InFlightPlan, Slot, check_in_flight_options
from ._web.metering import (
    METER,
    CostFunc,
    Meter,
    ResponseMeter,
    Served,
    body_bytes,
    only_status,
    report_cost,
    reported,
    skip_status,
)
from ._web.plans import Choice, LimiterFunc, Plan
from ._web.problems import ProblemException, add_problem_handler, unavailable
from ._web.routes import route_place
from ._web.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "ASGIApp",
    "Choice",
    "ClientFunc",
    "ConsumeToken",
    "CostFunc",
    "IdempotencyKey",
    "IdempotentRequest",
    "InFlight",
    "LimiterFunc",
    "Message",
    "ProblemException",
    "RateLimit",
    "Receive",
    "Refusal",
    "RespondWithResponse",
    "ResponseMeter",
    "Scope",
    "Send",
    "Served",
    "add_problem_handler",
    "body_bytes",
    "client_ip",
    "credentials",
    "header",
    "only_status",
    "path_param",
    "report_cost",
    "reported",
    "skip_status",
    "user_id",
]

#: ``respond=`` of the dependency: builds the answer to a refusal (a Starlette or FastAPI
#: ``Response``), sync or async; rendered by ``add_problem_handler``.
RespondWithResponse = Callable[[Refusal], Response | Awaitable[Response]]


class RateLimit:
    """``Depends(RateLimit(limiter, client=client_ip()))``: one hit per request of the
    endpoint.

    Admitted: the response gets ``RateLimit-Policy`` and ``RateLimit`` fields (and with
    ``legacy_headers=True`` ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset``), and the
    dependency's value is the ``Decision``. Denied: ``ProblemException`` 429 with
    ``Retry-After``, ``RateLimit-Policy`` and ``RateLimit``. ``client(scope)`` is the same
    kind of client function the middleware takes (sync or async; ``None`` = not limited); so is
    ``limiter``, which may be a function of the scope that picks the limiter (and the cost)
    per request: tiers. A limiter without a ``name`` counts per route (the route's methods
    and path template are part of its key), so two routes that each declare
    ``RateLimit(arl.FixedWindow("2/minute"))`` count apart; a named limiter counts under its
    name on every route it is used on (a quota shared on purpose). The policy is named
    ``policy_name``, else the limiter's ``name``, else ``"default"`` (give it a name of its
    own when the middleware limits the same route).
    Backend unreachable: 503 with ``Retry-After``, or with ``on_unavailable="allow"`` the
    endpoint runs, or with ``on_unavailable=Fallback(share)`` the
    request is counted in-process on ``share`` of the limits; a WARNING either way.
    ``breaker`` and ``shadow`` (never refuse; ``X-RateLimit-Shadow`` says what the limit
    said) are the middleware's options. ``respond(refusal)`` (sync or async) builds the 429/503
    ``Response`` itself; ``add_problem_handler(app)`` sends it. ``lists=AccessList(...)``
    is looked up first, as the middleware's: allowed, the endpoint runs uncounted (the
    value is None); denied, ``ProblemException`` 403 before any limit is counted.

    Headers set by a dependency reach the client unless the endpoint returns a ``Response``
    object itself (FastAPI's rule); use the middleware for such endpoints.

    ``cost_from(served)`` counts the request by its response, as a ``Rule``'s does: it is
    admitted on ``cost`` (an estimate, reserved) and settled to ``cost_from``'s answer
    once the response has been sent. A dependency never sees the response go out: the app
    needs ``ResponseMeter`` (``app.add_middleware(ResponseMeter)``), or a
    ``RateLimitMiddleware`` counting this request by its response, to watch it; without
    either the request fails with ``RuntimeError`` before anything is counted.
    """

    __slots__ = ("_flow", "client", "cost_from", "plan", "respond")

    def __init__(
        self,
        limiter: Limiter | LimiterFunc,
        *,
        client: ClientFunc | None = None,
        cost: int = 1,
        policy_name: str | None = None,
        unavailable_retry_after: float = UNAVAILABLE_RETRY_AFTER,
        legacy_headers: bool = False,
        respond: RespondWithResponse | None = None,
        on_unavailable: Literal["deny", "allow"] | Fallback = "deny",
        breaker: Breaker | None = None,
        shadow: bool = False,
        cost_from: CostFunc | None = None,
        lists: AccessList | None = None,
    ) -> None:
        self.client = check_client_func(client, "client") or client_ip()
        self.plan = Plan(limiter, self.client, cost, policy_name, "default", cost_from, lists=lists)
        self.cost_from = self.plan.cost_from
        self._flow = RateLimitFlow(
            "RateLimit dependency",
            on_unavailable=on_unavailable,
            breaker=breaker,
            shadow=shadow,
            legacy_headers=legacy_headers,
            unavailable_retry_after=unavailable_retry_after,
        )
        self.respond = check_respond(respond)

    @property
    def on_unavailable(self) -> Literal["deny", "allow"] | Fallback:
        return self._flow.on_unavailable

    @property
    def legacy_headers(self) -> bool:
        return self._flow.legacy_headers

    async def __call__(self, request: Request, response: Response) -> Decision | None:
        scope = request.scope
        meter = scope.get(METER)
        if self.cost_from is not None and not isinstance(meter, Meter):
            raise RuntimeError(
                "RateLimit(cost_from=...) needs the response watched:"
                " app.add_middleware(ResponseMeter)"
            )
        verdict = await self._flow.check(self.plan, scope, route_place(scope))
        if verdict is None:
            return None
        if verdict.status != 200:
            raise await self._refuse(verdict, scope)
        if verdict.reservation is not None and self.cost_from is not None:
            assert isinstance(meter, Meter)
            meter.add(verdict.reservation, self.cost_from)
        for k, v in verdict.fields:
            response.headers.append(k.decode(), v.decode())
        return verdict.decision

    async def _refuse(self, verdict: Verdict, scope: Scope) -> ProblemException:
        if self.respond is None:
            fields = {k.decode(): v.decode() for k, v in verdict.fields}
            kind = problem_kind(verdict.status)
            return ProblemException(
                verdict.status, verdict.detail, fields, kind=kind, violated=verdict.violated
            )
        refused = verdict.refusal(scope)
        answer = self.respond(refused)
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, Response):
            raise TypeError(f"respond must return a Response, not {type(answer).__name__}")
        # Without add_problem_handler, FastAPI's own handler still sends status and headers.
        return ProblemException(
            answer.status_code, refused.detail, refused.headers, response=answer
        )

    def __repr__(self) -> str:
        return f"<RateLimit {self.plan!r} on_unavailable={self.on_unavailable!r}>"


#: The most routes one ``InFlight`` dependency keeps a plan for (each route its own slots).
_MAX_PLACES = 1024


class InFlight:
    """``Depends(InFlight(2, arl.FixedWindow("100/minute")))``: at most ``slots`` requests
    of one client at once on the endpoint, and (with a ``limiter``) its rate, decided in one
    script call: the hit counts only if a slot is free, the slot is taken only if the rate
    admits the hit. The middleware's ``Rule(..., in_flight=)`` as a dependency.

    The slot is held from the dependency until the response has been sent (FastAPI runs a
    ``yield`` dependency's exit then, a streamed response's end included), renewed every
    ``ttl`` / 3 seconds meanwhile, and given back when the request ends however it ends.
    ``limiter`` is a ``FixedWindow`` of plain rates without options of its own; without one
    the dependency limits concurrency alone, on ``backend`` (default: the configured one).
    The slots and an unnamed limiter count per route, as ``RateLimit``'s do.

    Admitted: the response gets ``RateLimit-Policy`` and ``RateLimit`` (the rate's items,
    then ``"<policy>-in-flight"`` with ``qu="concurrent-requests"``) and the value is the
    rate's ``Decision`` (``None`` without a limiter). Refused: ``ProblemException`` 429,
    ``Retry-After: 1`` for a full set of slots. Backend unreachable: 503, or with
    ``on_unavailable="allow"`` the endpoint runs unlimited.
    """

    __slots__ = ("_flow", "_plans", "_settings")

    def __init__(
        self,
        slots: int,
        limiter: Limiter | None = None,
        *,
        client: ClientFunc | None = None,
        cost: int = 1,
        ttl: float = 30.0,
        policy_name: str | None = None,
        backend: Backend | None = None,
        unavailable_retry_after: float = UNAVAILABLE_RETRY_AFTER,
        on_unavailable: Literal["deny", "allow"] = "deny",
    ) -> None:
        check_in_flight_options(True, on_unavailable, None, False)
        client = check_client_func(client, "client") or client_ip()
        settings = (slots, ttl, limiter, client, cost, policy_name, "default")
        # Checked here, with a placeholder route, so a bad dependency fails at once.
        InFlightPlan(*settings, "-", backend)
        self._settings = (settings, backend)
        self._plans: dict[str | None, InFlightPlan] = {}
        self._flow = RateLimitFlow(
            "InFlight dependency",
            on_unavailable=on_unavailable,
            breaker=None,
            shadow=False,
            legacy_headers=False,
            unavailable_retry_after=unavailable_retry_after,
        )

    def _plan(self, place: str | None) -> InFlightPlan:
        plan = self._plans.get(place)
        if plan is None:
            if len(self._plans) >= _MAX_PLACES:
                self._plans.clear()
            settings, backend = self._settings
            plan = self._plans[place] = InFlightPlan(*settings, place, backend)
        return plan

    async def __call__(
        self, request: Request, response: Response
    ) -> AsyncIterator[Decision | None]:
        scope = request.scope
        plan = self._plan(route_place(scope))
        try:
            verdict, lease = await plan.enter(scope)
        except BackendUnavailable as exc:
            verdict, lease = self._flow.unavailable(exc, plan.name, plan.names), None
        if verdict is None:
            yield None
            return
        if lease is None:
            fields = {k.decode(): v.decode() for k, v in verdict.fields}
            kind = problem_kind(verdict.status)
            raise ProblemException(
                verdict.status, verdict.detail, fields, kind=kind, violated=verdict.violated
            )
        slot = Slot(lease)
        try:
            for k, v in verdict.fields:
                response.headers.append(k.decode(), v.decode())
            yield verdict.decision
        finally:
            await slot.release()

    def __repr__(self) -> str:
        settings = self._settings[0]
        return f"<InFlight slots={settings[0]} limiter={settings[2]!r} routes={len(self._plans)}>"


class ConsumeToken:
    """``Depends(ConsumeToken(header="X-Token"))``: the endpoint runs only if the one-shot
    token the request presents is consumed now (see ``arl.issue_token``).

    The token is read from request header ``header``, else from form field ``field`` (an
    urlencoded or multipart body; needs python-multipart). ``subject`` is ``None``, a string,
    or a client function ``subject(scope)`` naming whom the token must have been issued for.
    The dependency's value is the token.

    Rejected — missing, malformed, unknown, expired, already used, or issued for another
    subject — is ``ProblemException`` 403 Forbidden: the store deliberately does not say
    which (a used token and a forged one look alike), so there is no separate 409. Backend
    unreachable: 503 with ``Retry-After`` (a token check never fails open).
    """

    __slots__ = ("_outage", "backend", "field", "header", "subject")

    def __init__(
        self,
        *,
        header: str | None = "X-Token",
        field: str | None = None,
        subject: str | ClientFunc | None = None,
        backend: Backend | None = None,
    ) -> None:
        if header is None and field is None:
            raise ValueError("ConsumeToken needs a header, a form field, or both")
        for what, value in (("header", header), ("field", field)):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{what} must be a non-empty str or None")
        if subject is not None and not (isinstance(subject, str) or callable(subject)):
            raise TypeError(
                f"subject must be a str, a callable or None, not {type(subject).__name__}"
            )
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        self.header = header
        self.field = field
        self.subject = subject
        self.backend = backend
        self._outage = OutageLog("ConsumeToken dependency")

    async def _presented(self, request: Request) -> str | None:
        if self.header is not None:
            value = request.headers.get(self.header)
            if value:
                return value
        if self.field is not None and request.headers.get("content-type", "").startswith(
            ("application/x-www-form-urlencoded", "multipart/form-data")
        ):
            posted = (await request.form()).get(self.field)
            if isinstance(posted, str) and posted:
                return posted
        return None

    async def __call__(self, request: Request) -> str:
        token = await self._presented(request)
        if token is None:
            raise ProblemException(403, "a one-shot token is required")
        subject = self.subject
        if subject is not None and not isinstance(subject, str):
            subject = await resolve(subject, request.scope)
        try:
            ok = await consume_token(token, subject, self.backend)
        except BackendUnavailable as exc:
            self._outage(exc, False)
            raise unavailable("token", UNAVAILABLE_RETRY_AFTER) from exc
        if not ok:
            raise ProblemException(403, "the token is unknown, expired, already used or not yours")
        return token

    def __repr__(self) -> str:
        return f"<ConsumeToken header={self.header!r} field={self.field!r}>"


_public.publish(__name__, __all__)
