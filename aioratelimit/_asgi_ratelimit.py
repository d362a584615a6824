"""The ASGI rate-limit middleware and its per-route ``Rule``.

``RateLimitMiddleware`` picks a plan per request (exempt, a rule, or the default limiter),
resolves the request's key, makes one hit and answers from the decision: the app runs with
the ``RateLimit`` fields added, or the client gets a 429 or 503 problem. ``asgi.py``
re-exports both classes; keys come from ``_request_keys``, answers from ``_http_answers``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._asgi_types import ASGIApp, Receive, Scope, Send
from ._errors import BackendUnavailable
from ._http_answers import (
    UNAVAILABLE_RETRY_AFTER,
    OutageLog,
    Policy,
    check_limiter,
    exceeded_detail,
    retry_after,
    send_problem,
    unavailable_detail,
    with_headers,
)
from ._ratelimit import _Limiter
from ._request_keys import KeyFunc, check_key_func, client_ip, resolve
from ._routes import Template, matches_any, methods_of, templates


class Rule:
    """A limit for one route: ``Rule("POST", "/orders/{id}", limiter)``.

    ``method`` is one method, several, or ``"*"``; ``path`` a template where ``{name}``
    matches one path segment and ``{name:path}`` the rest of the path. ``key`` (default: the
    middleware's) and ``cost`` apply to requests of this route; ``name`` is the policy name
    in the ``RateLimit`` headers (default: the limiter's ``name`` if it has one, else the
    middleware's ``policy_name``).
    """

    __slots__ = ("cost", "key", "limiter", "methods", "name", "template")

    def __init__(
        self,
        method: str | Iterable[str],
        path: str,
        limiter: _Limiter,
        *,
        key: KeyFunc | None = None,
        cost: int = 1,
        name: str | None = None,
    ) -> None:
        self.methods = methods_of(method)
        self.template = Template.compile(path)
        self.limiter = check_limiter(limiter)
        self.key = check_key_func(key, "key")
        self.cost = limiter._check_cost(cost)
        self.name = name

    def matches(self, method: str, path: str) -> bool:
        return (self.methods is None or method in self.methods) and (
            self.template.regex.fullmatch(path) is not None
        )

    def __repr__(self) -> str:
        methods = "*" if self.methods is None else ",".join(sorted(self.methods))
        return f"<Rule {methods} {self.template.text} {self.limiter!r} cost={self.cost}>"


class _Plan:
    """What the middleware does for the requests of one rule (or of the default limiter)."""

    __slots__ = ("cost", "key", "limiter", "policy")

    def __init__(self, limiter: _Limiter, key: KeyFunc, cost: int, policy: Policy) -> None:
        self.limiter, self.key, self.cost, self.policy = limiter, key, cost, policy


class RateLimitMiddleware:
    """Counts each HTTP request against a limiter and answers 429 once the limit is reached.

    A request takes the first ``rules`` entry that matches its method and path; requests no
    rule matches take ``limiter`` (if given; else they are not limited); paths matching an
    ``exempt`` template are never counted. ``key(scope)`` (sync or async) names the client
    to count under; returning ``None`` leaves that request unlimited.

    A limited request gets ``429`` with an ``application/problem+json`` body, ``Retry-After``
    (whole seconds, at least 1), ``RateLimit-Policy`` and ``RateLimit``
    (draft-ietf-httpapi-ratelimit-headers); admitted responses carry the last two as well.

    When the backend is unreachable the request gets ``503`` with ``Retry-After`` (fail
    closed), or with ``fail_open=True`` passes unlimited; either way a WARNING goes to the
    ``aioratelimit`` logger (at most one line per 10 s during an outage, with a count).
    WebSocket and lifespan scopes pass through untouched.
    """

    __slots__ = (
        "_default",
        "_exempt",
        "_outage",
        "_retry_unavailable",
        "_rules",
        "app",
        "fail_open",
    )

    def __init__(
        self,
        app: ASGIApp,
        limiter: _Limiter | None = None,
        *,
        key: KeyFunc | None = None,
        rules: Sequence[Rule] = (),
        exempt: Iterable[str] | str = (),
        fail_open: bool = False,
        policy_name: str = "default",
        cost: int = 1,
        unavailable_retry_after: float = UNAVAILABLE_RETRY_AFTER,
    ) -> None:
        key = check_key_func(key, "key")
        if key is None:
            key = client_ip()
        for rule in rules:
            if not isinstance(rule, Rule):
                raise TypeError(f"rules must hold Rule objects, not {type(rule).__name__}")
        if limiter is None and not rules:
            raise ValueError("RateLimitMiddleware needs a limiter, rules, or both")
        Policy.check_name(policy_name)
        self.app = app
        self.fail_open = bool(fail_open)
        self._exempt = templates(exempt)
        self._rules = [
            (
                rule,
                _Plan(
                    rule.limiter,
                    rule.key or key,
                    rule.cost,
                    Policy(rule.limiter, rule.name or rule.limiter.name or policy_name),
                ),
            )
            for rule in rules
        ]
        self._default = (
            None
            if limiter is None
            else _Plan(
                check_limiter(limiter),
                key,
                limiter._check_cost(cost),
                Policy(limiter, policy_name),
            )
        )
        self._retry_unavailable = (retry_after(unavailable_retry_after),)
        self._outage = OutageLog("RateLimitMiddleware")

    def _plan(self, method: str, path: str) -> _Plan | None:
        if matches_any(self._exempt, path):
            return None
        for rule, plan in self._rules:
            if rule.matches(method, path):
                return plan
        return self._default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        plan = self._plan(scope["method"], scope["path"])
        if plan is None:
            await self.app(scope, receive, send)
            return
        key = await resolve(plan.key, scope)
        if key is None:
            await self.app(scope, receive, send)
            return
        try:
            decision = await plan.limiter.hit(key, plan.cost)
        except BackendUnavailable as exc:
            self._outage(exc, self.fail_open)
            if self.fail_open:
                await self.app(scope, receive, send)
            else:
                await send_problem(
                    send, 503, unavailable_detail("rate limit"), self._retry_unavailable
                )
            return
        headers = plan.policy.headers(decision)
        if not decision.allowed:
            await send_problem(send, 429, exceeded_detail(decision), headers)
            return
        await self.app(scope, receive, with_headers(send, headers))

    def __repr__(self) -> str:
        default = "-" if self._default is None else repr(self._default.limiter)
        return (
            f"<RateLimitMiddleware default={default} rules={len(self._rules)}"
            f" exempt={len(self._exempt)} fail_open={self.fail_open}>"
        )
