"""The ASGI rate-limit middleware and its per-route ``Rule``: which plan a request falls
under (exempt, a rule, or the default), then the request flow's verdict answered in ASGI
messages (the app runs with the ``RateLimit`` fields added, or a 429 or 503 is sent).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Literal

from .._backend import Backend
from .._errors import BackendUnavailable
from .._limits.failure import Breaker, Fallback
from .._limits.limiter import Limiter
from .._limits.lists import AccessList, check_lists
from .answers import (
    UNAVAILABLE_RETRY_AFTER,
    RespondWithApp,
    check_respond,
    problem_kind,
    send_problem,
    with_headers,
)
from .clients import ClientFunc, check_client_func, client_ip
from .flow import RateLimitFlow, Verdict
from .inflight import InFlightPlan, Slot, check_in_flight_options, refuse_websocket
from .metering import CostFunc, check_cost_func, meter_of, owned
from .plans import LimiterFunc, Plan
from .routes import Template, matches_any, methods_of, route_path, templates
from .types import ASGIApp, Message, Receive, Scope, Send


class Rule:
    """A limit for one route: ``Rule("POST", "/orders/{id}", limiter)``.

    ``method`` is one method, several, or ``"*"``; a ``GET`` rule covers ``HEAD`` too (a
    framework answers ``HEAD`` by running the ``GET`` endpoint, so it is counted, not let
    past the limit). ``path`` is a template where ``{name}`` matches one path segment and
    ``{name:path}`` the rest of the path, matched against the path inside the application
    (a mount prefix or ``root_path`` left out). ``limiter`` is a limiter, or a function of
    the scope that picks one (and the cost) per request (see ``RateLimitMiddleware``); a
    limiter without a ``name`` counts for this rule alone, a named one counts under its
    name wherever it is used. ``client`` (default: the middleware's) and ``cost`` apply to
    requests of this route; ``name`` is the policy name in the ``RateLimit`` headers
    (default: the limiter's ``name`` if it has one, else the middleware's ``policy_name``).
    ``cost_from(served)`` counts the request by its response: ``cost`` is then an estimate
    the request is admitted on, settled to what ``cost_from`` answers once the response
    has been sent (see ``RateLimitMiddleware``).
    ``lists`` (default: the middleware's) is the ``AccessList`` its clients are looked up on.

    ``in_flight=n``: at most ``n`` requests of one client on this route at once (a
    WebSocket connection counts for its lifetime). Each holds a slot until its response
    ends, the client goes away or its task is cancelled; a slot is renewed every
    ``in_flight_ttl`` / 3 seconds while it is held, and a crashed holder's expires after
    ``in_flight_ttl``. With a ``limiter`` (a ``FixedWindow`` of plain rates, without
    options of its own) the slot and the rate are decided in one call: the hit counts
    only if a slot is free, the slot is taken only if the rate admits the hit. Without one
    the rule limits concurrency alone, on ``backend`` (default: the configured backend).
    (An in-flight rule takes neither ``cost_from`` nor ``lists`` yet.)
    """

    __slots__ = (
        "backend",
        "client",
        "cost",
        "cost_from",
        "in_flight",
        "in_flight_ttl",
        "limiter",
        "lists",
        "methods",
        "name",
        "place",
        "template",
    )

    def __init__(
        self,
        method: str | Iterable[str],
        path: str,
        limiter: Limiter | LimiterFunc | None = None,
        *,
        client: ClientFunc | None = None,
        cost: int = 1,
        name: str | None = None,
        cost_from: CostFunc | None = None,
        lists: AccessList | None = None,
        in_flight: int | None = None,
        in_flight_ttl: float = 30.0,
        backend: Backend | None = None,
    ) -> None:
        methods = methods_of(method)
        self.lists = check_lists(lists, "lists")
        self.methods = methods | {"HEAD"} if methods is not None and "GET" in methods else methods
        self.template = Template.compile(path)
        #: the rule as text, ``"GET,HEAD /orders/{id}"``: what an unnamed limiter counts per
        shown = "*" if self.methods is None else ",".join(sorted(self.methods))
        self.place = f"{shown} {self.template.text}"
        self.client = check_client_func(client, "client")
        self.name = name
        self.limiter = limiter
        self.cost_from = check_cost_func(cost_from)
        self.in_flight, self.in_flight_ttl, self.backend = in_flight, in_flight_ttl, backend
        if in_flight is not None and (cost_from is not None or lists is not None):
            raise ValueError("a Rule with in_flight= takes neither cost_from= nor lists= (yet)")
        self.cost = cost
        # Checked here, with a placeholder client, so a bad rule fails at once.
        plan = self._plan(client_ip(), "default")
        self.cost = plan.cost if isinstance(plan, InFlightPlan) else plan._cost

    def _plan(
        self, client: ClientFunc, default_name: str, lists: AccessList | None = None
    ) -> Plan | InFlightPlan:
        """The rule's plan under the middleware's ``client``, policy name and access list:
        an ``InFlightPlan`` with ``in_flight``, else a ``Plan``."""
        client = self.client or client
        if self.in_flight is not None:
            return InFlightPlan(
                self.in_flight,
                self.in_flight_ttl,
                self.limiter,
                client,
                self.cost,
                self.name,
                default_name,
                self.place,
                self.backend,
            )
        if self.limiter is None:
            raise TypeError("a Rule needs a limiter, in_flight=, or both")
        if self.backend is not None:
            raise ValueError("backend= goes with in_flight= (a limiter has its own backend)")
        return Plan(
            self.limiter,
            client,
            self.cost,
            self.name,
            default_name,
            self.cost_from,
            lists=self.lists or lists,
        )

    def matches(self, method: str, path: str) -> bool:
        return (self.methods is None or method in self.methods) and (
            self.template.regex.fullmatch(path) is not None
        )

    def __repr__(self) -> str:
        return f"<Rule {self.place} {self.limiter!r} cost={self.cost}>"


class RuleBook:
    """Which plan a request falls under: none for an ``exempt`` path, else the first rule
    matching its method and path, else the default ``limiter`` (if any). Every rate-limit
    middleware (ASGI, aiohttp) holds one, built from its options and checked at once."""

    __slots__ = ("_default", "_exempt", "_rules")

    def __init__(
        self,
        limiter: Limiter | LimiterFunc | None,
        client: ClientFunc | None,
        rules: Sequence[Rule],
        exempt: Iterable[str] | str,
        policy_name: str | None,
        cost: int,
        cost_from: CostFunc | None = None,
        lists: AccessList | None = None,
    ) -> None:
        lists = check_lists(lists, "lists")
        client = check_client_func(client, "client")
        if client is None:
            client = client_ip()
        for rule in rules:
            if not isinstance(rule, Rule):
                raise TypeError(f"rules must hold Rule objects, not {type(rule).__name__}")
        if limiter is None and not rules:
            raise ValueError("a rate-limit middleware needs a limiter, rules, or both")
        self._exempt = templates(exempt)
        fallback = policy_name or "default"
        self._rules: list[tuple[Rule, Plan | InFlightPlan]] = [
            (rule, rule._plan(client, fallback, lists)) for rule in rules
        ]
        self._default = (
            None
            if limiter is None
            else Plan(limiter, client, cost, policy_name, fallback, cost_from, lists=lists)
        )

    @property
    def in_flight(self) -> bool:
        """Whether a rule has an in-flight limit."""
        return any(isinstance(plan, InFlightPlan) for _, plan in self._rules)

    def plan(self, method: str, path: str) -> tuple[Plan | InFlightPlan | None, str | None]:
        """The request's plan (None: not limited) and where it was declared (a rule's
        place; None for the default, one count across every route)."""
        if matches_any(self._exempt, path):
            return None, None
        for rule, plan in self._rules:
            if rule.matches(method, path):
                return plan, rule.place
        return self._default, None

    def __repr__(self) -> str:
        default = "-" if self._default is None else repr(self._default)
        return f"default={default} rules={len(self._rules)} exempt={len(self._exempt)}"


class RateLimitMiddleware:
    """Counts each HTTP request against a limiter and answers 429 once the limit is reached.

    A request takes the first ``rules`` entry that matches its method and path; requests no
    rule matches take ``limiter`` (if given; else they are not limited); paths matching an
    ``exempt`` template are never counted. Paths are those inside the application: under
    Starlette's ``Mount("/api", ...)`` or a server's ``root_path``, ``exempt=["/health"]``
    covers ``/api/health``. ``client(scope)`` (sync or async) names the client to count
    under; returning ``None`` leaves that request unlimited.

    ``limiter`` (and a rule's) may be a function of the scope instead, sync or async, that
    picks the limiter per request: it returns a limiter (counted at ``cost``), a
    ``(limiter, cost)`` pair, or ``None`` (not limited). That is how tiers are written.

    A limited request gets ``429`` with an ``application/problem+json`` body, ``Retry-After``
    (whole seconds, at least 1), ``RateLimit-Policy`` and ``RateLimit``
    (draft-ietf-httpapi-ratelimit-headers); admitted responses carry the last two as well,
    and with ``legacy_headers=True`` all of them ``X-RateLimit-Limit``, ``-Remaining`` and
    ``-Reset`` too. The default limiter's policy is named ``policy_name``, else its own
    ``name``, else ``"default"``. ``respond(refusal)`` (sync or async) builds the answer to a
    429 or 503 instead: it returns any ASGI app, such as a Starlette ``Response``.

    When the backend is unreachable the request gets ``503`` with ``Retry-After`` (fail
    closed, ``on_unavailable="deny"``), or with ``on_unavailable="allow"`` passes
    unlimited, or with ``on_unavailable=Fallback(share)`` is
    counted on an in-process limiter with ``share`` of the limits; either way a WARNING
    goes to the ``aioratelimit`` logger (at most one line per 10 s during an outage, with a
    count). ``breaker=Breaker(...)`` stops calling the backend for a cool-down after
    consecutive failures. ``shadow=True`` never refuses: the request
    passes, with ``X-RateLimit-Shadow: denied`` when the limit would have refused it.
    WebSocket and lifespan scopes pass through untouched, but for a rule with
    ``in_flight=``: a WebSocket connection then holds a slot for its lifetime.

    ``cost_from`` (the default limiter's; a rule has its own) counts a request by its
    response: it is admitted on ``cost``, an estimate (``limiter.reserve``), and once the
    response has been sent (its last body chunk, or the app ended without it: the client
    went away, the app raised) ``cost_from(served)`` is given a ``Served`` view (status,
    headers, body bytes counted as they went, ``complete``, the endpoint's ``report_cost``)
    and its answer settles the reservation, in the background, exactly once (None keeps
    the estimate). The response's fields show the admission's decision.

    ``lists=AccessList(...)`` (or a rule's own) is looked up first, by the request's client
    key (a ``client_ip`` key also matches the networks holding its address, after the
    trusted-proxy rules): an allow entry lets the request through uncounted, a deny entry
    answers ``403`` (``application/problem+json``) before any limit is counted; others are
    counted as usual. A ``blockable`` limiter's block answers 429 with ``Retry-After``.
    """

    __slots__ = ("_book", "_flow", "app", "respond")

    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter | LimiterFunc | None = None,
        *,
        client: ClientFunc | None = None,
        rules: Sequence[Rule] = (),
        exempt: Iterable[str] | str = (),
        policy_name: str | None = None,
        cost: int = 1,
        unavailable_retry_after: float = UNAVAILABLE_RETRY_AFTER,
        legacy_headers: bool = False,
        respond: RespondWithApp | None = None,
        on_unavailable: Literal["deny", "allow"] | Fallback = "deny",
        breaker: Breaker | None = None,
        shadow: bool = False,
        cost_from: CostFunc | None = None,
        lists: AccessList | None = None,
    ) -> None:
        self.app = app
        self._book = RuleBook(limiter, client, rules, exempt, policy_name, cost, cost_from, lists)
        check_in_flight_options(self._book.in_flight, on_unavailable, breaker, shadow)
        self._flow = RateLimitFlow(
            "RateLimitMiddleware",
            on_unavailable=on_unavailable,
            breaker=breaker,
            shadow=shadow,
            legacy_headers=legacy_headers,
            unavailable_retry_after=unavailable_retry_after,
        )
        self.respond = check_respond(respond)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":
            # A WebSocket handshake is a GET; only an in-flight rule holds one (for the
            # connection's lifetime): a rate limit lets WebSockets pass, as it always has.
            plan, _ = self._book.plan("GET", route_path(scope))
            if isinstance(plan, InFlightPlan):
                await self._in_flight(plan, scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        if kind != "http":
            await self.app(scope, receive, send)
            return
        plan, place = self._book.plan(scope["method"], route_path(scope))
        if isinstance(plan, InFlightPlan):
            await self._in_flight(plan, scope, receive, send)
            return
        verdict = None if plan is None else await self._flow.check(plan, scope, place)
        if verdict is None:
            await self.app(scope, receive, send)
        elif verdict.status == 200:
            send = with_headers(send, verdict.fields)
            reservation = verdict.reservation
            cost_from = None if plan is None else plan.cost_from
            if reservation is None or cost_from is None:
                await self.app(scope, receive, send)
                return
            meter, new = meter_of(scope)
            meter.add(reservation, cost_from)
            if new:
                await owned(meter, self.app, scope, receive, send)
            else:  # an outer middleware watches the response and settles
                await self.app(scope, receive, send)
        else:
            await self._refuse(verdict, scope, receive, send)

    async def _refuse(self, verdict: Verdict, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a 429 or 503: the problem document, or what ``respond`` builds."""
        if scope["type"] == "websocket":
            await refuse_websocket(verdict, scope, send)
        elif self.respond is None:
            await send_problem(
                send,
                verdict.status,
                verdict.detail,
                verdict.fields,
                problem_kind(verdict.status),
                verdict.violated,
            )
        else:
            answer = self.respond(verdict.refusal(scope))
            if inspect.isawaitable(answer):
                answer = await answer
            await answer(scope, receive, send)

    async def _in_flight(
        self, plan: InFlightPlan, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A request under an in-flight rule: its slot held from admission to the end of
        its response (or of its WebSocket connection)."""
        try:
            verdict, lease = await plan.enter(scope)
        except BackendUnavailable as exc:
            verdict, lease = self._flow.unavailable(exc, plan.name, plan.names), None
        if verdict is None:
            await self.app(scope, receive, send)
            return
        if lease is None:
            await self._refuse(verdict, scope, receive, send)
            return
        slot = Slot(lease)
        fields = verdict.fields
        start = "http.response.start" if scope["type"] == "http" else "websocket.accept"

        def add_fields(message: Message) -> Message:
            if message["type"] == start:
                message = dict(message)
                message["headers"] = [*message.get("headers", ()), *fields]
            return message

        try:
            await self.app(scope, slot.receive(receive), slot.send(send, add_fields))
        finally:
            await slot.release()

    @property
    def on_unavailable(self) -> Literal["deny", "allow"] | Fallback:
        return self._flow.on_unavailable

    @property
    def legacy_headers(self) -> bool:
        return self._flow.legacy_headers

    def __repr__(self) -> str:
        return f"<RateLimitMiddleware {self._book!r} on_unavailable={self.on_unavailable!r}>"
