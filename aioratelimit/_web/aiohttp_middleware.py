"""aiohttp's side of the web layer: its requests read as ASGI scopes, and its two middlewares.

aiohttp speaks no ASGI, so each request is shown to the framework-neutral parts as the
scope an ASGI server would have built (``scope_of``): method, path, query string, headers,
peer address, and ``scope["aiohttp.request"]``. Client functions (``client_ip``,
``header``, ``user_id``...), limiter functions, rules and fingerprints then work unchanged,
and the rate-limit flow (``RateLimitFlow``), the rule book, the idempotency steps
(``KeyFlow``) and the stored-response format are the ASGI middlewares' own: only reading
the request and writing the response are aiohttp's.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from .._backend import Backend
from .._errors import BackendUnavailable
from .._idempotency.store import Claimed, Replay
from .._limits.failure import Breaker, Fallback
from .._limits.limiter import Limiter
from .._limits.lists import AccessList
from .answers import PROBLEM_JSON, UNAVAILABLE_RETRY_AFTER, Refusal, check_respond, problem_body
from .clients import ClientFunc, header_values
from .flow import RateLimitFlow, Verdict
from .idempotency_flow import STORED, FingerprintFunc, KeyFlow, Problem
from .inflight import InFlightPlan, Slot, check_in_flight_options
from .plans import LimiterFunc
from .ratelimit import Rule, RuleBook
from .records import decode_response, encode_response
from .types import Scope

#: ``respond=`` of the aiohttp middleware: builds the answer to a refusal (any aiohttp
#: response), sync or async.
RespondWithResponse = Callable[[Refusal], "web.StreamResponse | Awaitable[web.StreamResponse]"]


def scope_of(request: web.Request) -> Scope:
    """``request`` as the ASGI HTTP scope a client function reads. The peer is the socket's
    (``X-Forwarded-For`` counts only through ``client_ip(trusted_proxies=...)``); a
    ``request["user"]`` set by an authentication middleware is ``scope["user"]``."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None
    version = request.version
    scope: Scope = {
        "type": "http",
        "http_version": f"{version.major}.{version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.rel_url.raw_path.encode("ascii", "replace"),
        "query_string": request.query_string.encode("latin-1", "replace"),
        "root_path": "",
        "headers": [(bytes(k).lower(), bytes(v)) for k, v in request.raw_headers],
        "client": client,
        "aiohttp.request": request,
    }
    if "user" in request:
        scope["user"] = request["user"]
    return scope


def _text(fields: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in fields]


def problem_response(
    status: int,
    detail: str,
    fields: Iterable[tuple[bytes, bytes]] = (),
    body: bytes | None = None,
) -> web.Response:
    """An ``application/problem+json`` answer (``body``: the document, else about:blank)."""
    headers = CIMultiDict(_text(fields))
    headers["Content-Type"] = PROBLEM_JSON.decode()
    return web.Response(status=status, body=body or problem_body(status, detail), headers=headers)


class RateLimitMiddleware:
    """aiohttp middleware: counts each request against a limiter and answers 429 once the
    limit is reached; ``web.Application(middlewares=[RateLimitMiddleware(limiter)])``.

    The options, rules, key helpers, answers and fields are those of
    ``aioratelimit.asgi.RateLimitMiddleware`` (see there), with templates matched against
    ``request.path`` (a sub-application's prefix included, as aiohttp shows it to its
    middlewares): ``rules`` (``Rule``), ``exempt``, ``client``, ``policy_name``, ``cost``,
    ``legacy_headers``, ``on_unavailable``, ``breaker``, ``shadow``, ``lists``. ``respond(refusal)``
    (sync or async) returns the aiohttp response to send instead of the problem document.

    An admitted request's response gets the ``RateLimit`` fields, a raised ``HTTPException``
    too; a response the handler has already started streaming (``prepare()``d) cannot take
    them.
    """

    __middleware_version__ = 1  # aiohttp's new-style middleware: (request, handler)

    __slots__ = ("_book", "_flow", "respond")

    def __init__(
        self,
        limiter: Limiter | LimiterFunc | None = None,
        *,
        client: ClientFunc | None = None,
        rules: Sequence[Rule] = (),
        exempt: Iterable[str] | str = (),
        policy_name: str | None = None,
        cost: int = 1,
        unavailable_retry_after: float = UNAVAILABLE_RETRY_AFTER,
        legacy_headers: bool = False,
        respond: RespondWithResponse | None = None,
        on_unavailable: Literal["deny", "allow"] | Fallback = "deny",
        breaker: Breaker | None = None,
        shadow: bool = False,
        lists: AccessList | None = None,
    ) -> None:
        # Counting by the response watches the ASGI messages a response is sent in; an
        # aiohttp response is written by aiohttp itself: refused, not silently left at the
        # estimate.
        if any(isinstance(rule, Rule) and rule.cost_from is not None for rule in rules):
            raise ValueError(
                "a Rule with cost_from= counts by the response, which needs the ASGI"
                " middleware (aioratelimit.asgi); the aiohttp middleware does not do it"
            )
        self._book = RuleBook(limiter, client, rules, exempt, policy_name, cost, None, lists)
        check_in_flight_options(self._book.in_flight, on_unavailable, breaker, shadow)
        self._flow = RateLimitFlow(
            "aiohttp RateLimitMiddleware",
            on_unavailable=on_unavailable,
            breaker=breaker,
            shadow=shadow,
            legacy_headers=legacy_headers,
            unavailable_retry_after=unavailable_retry_after,
        )
        self.respond = check_respond(respond)

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        scope = scope_of(request)
        plan, place = self._book.plan(request.method, request.path)
        if isinstance(plan, InFlightPlan):
            return await self._in_flight(plan, scope, request, handler)
        verdict = None if plan is None else await self._flow.check(plan, scope, place)
        if verdict is None:
            return await handler(request)
        if verdict.status != 200:
            return await self._refuse(verdict, scope)
        return await self._admitted(verdict, request, handler)

    async def _in_flight(
        self, plan: InFlightPlan, scope: Scope, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """A request under an in-flight rule: its slot held while the handler runs (a
        streamed response is written inside it), given back when it returns, raises or
        is cancelled."""
        try:
            verdict, lease = await plan.enter(scope)
        except BackendUnavailable as exc:
            verdict, lease = self._flow.unavailable(exc, plan.name, plan.names), None
        if verdict is None:
            return await handler(request)
        if lease is None:
            return await self._refuse(verdict, scope)
        slot = Slot(lease)
        try:
            return await self._admitted(verdict, request, handler)
        finally:
            await slot.release()

    async def _admitted(
        self, verdict: Verdict, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        fields = _text(verdict.fields)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            exc.headers.extend(fields)
            raise
        if not response.prepared:
            response.headers.extend(fields)
        return response

    async def _refuse(self, verdict: Verdict, scope: Scope) -> web.StreamResponse:
        if self.respond is None:
            return problem_response(
                verdict.status, verdict.detail, verdict.fields, verdict.problem()
            )
        answer = self.respond(verdict.refusal(scope))
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, web.StreamResponse):
            raise TypeError(f"respond must return an aiohttp response, not {type(answer).__name__}")
        return answer

    @property
    def on_unavailable(self) -> Literal["deny", "allow"] | Fallback:
        return self._flow.on_unavailable

    @property
    def legacy_headers(self) -> bool:
        return self._flow.legacy_headers

    def __repr__(self) -> str:
        return (
            f"<aiohttp RateLimitMiddleware {self._book!r} on_unavailable={self.on_unavailable!r}>"
        )


class IdempotencyMiddleware(KeyFlow):
    """aiohttp middleware: runs each ``Idempotency-Key`` once, as
    ``aioratelimit.asgi.IdempotencyMiddleware`` does (same options and answers: 400, 409,
    413, 422, 503, a replay marked ``Idempotent-Replayed: true``).

    The body is read with ``request.read()`` (bounded by the application's
    ``client_max_size`` as it is read, then by ``max_body``), so the handler reads it again
    from aiohttp's cache. A response is stored when it is a ``web.Response`` whose body is
    bytes, within ``max_response``, and with a status in ``stored``; a streamed response
    is sent, not stored (the key is free again).
    """

    __middleware_version__ = 1

    __slots__ = ()

    def __init__(
        self,
        *,
        backend: Backend | None = None,
        methods: Iterable[str] = ("POST", "PATCH"),
        routes: Iterable[str] | str | None = None,
        require: bool = False,
        exempt: Iterable[str] | str = (),
        client: ClientFunc | None = None,
        max_body: int = 1 << 20,
        max_response: int = 1 << 20,
        ttl: float = 86400.0,
        lease: float = 30.0,
        wait: bool = False,
        timeout: float | None = None,
        on_unavailable: Literal["deny", "allow"] = "deny",
        name: str = "http",
        unavailable_retry_after: float = UNAVAILABLE_RETRY_AFTER,
        stored: Iterable[int] | Callable[[int], bool] = STORED,
        fingerprint: FingerprintFunc | None = None,
    ) -> None:
        super().__init__(
            backend=backend,
            methods=methods,
            routes=routes,
            require=require,
            exempt=exempt,
            client=client,
            max_body=max_body,
            max_response=max_response,
            ttl=ttl,
            lease=lease,
            wait=wait,
            timeout=timeout,
            on_unavailable=on_unavailable,
            name=name,
            unavailable_retry_after=unavailable_retry_after,
            stored=stored,
            fingerprint=fingerprint,
            face="aiohttp IdempotencyMiddleware",
        )

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.takes(request.method, request.path):
            return await handler(request)
        scope = scope_of(request)
        values = header_values(scope, b"idempotency-key")
        if not values and not self.require:
            return await handler(request)
        key = await self.identify(scope, values)
        if key is None:
            return await handler(request)
        if isinstance(key, Problem):
            return _problem(key)
        declared = request.content_length
        if declared is not None and declared > self.max_body:
            return _problem(self.too_large())
        body = await request.read()
        if len(body) > self.max_body:
            return _problem(self.too_large())
        outcome = await self.claim(key, scope, body)
        if outcome is None:  # the backend is unavailable and the middleware fails open
            return await handler(request)
        if isinstance(outcome, Problem):
            return _problem(outcome)
        if isinstance(outcome, Replay):
            return _replay(outcome.payload)
        return await self._run(request, handler, outcome)

    async def _run(
        self, request: web.Request, handler: Handler, claimed: Claimed
    ) -> web.StreamResponse:
        async with self.store.running(claimed):
            try:
                response = await handler(request)  # an error: leaving releases the key
            except web.HTTPException as exc:
                # aiohttp's raised answers are responses too: a raised 303 is stored.
                await self._record(request, claimed, exc)
                raise
            await self._record(request, claimed, response)
            return response

    async def _record(
        self, request: web.Request, claimed: Claimed, response: web.StreamResponse
    ) -> None:
        """Store ``response`` if it is one to replay; else the key is freed on leaving."""
        if not self.stored(response.status):
            return
        payload = _payload(response, self.max_response)
        if payload is None:
            self.not_stored(request.method, request.path)
            return
        await self.complete(claimed, payload)

    def __repr__(self) -> str:
        methods = ",".join(sorted(self.methods))
        return (
            f"<aiohttp IdempotencyMiddleware {methods} {self.store!r}"
            f" on_unavailable={self.on_unavailable!r}>"
        )


def _problem(problem: Problem) -> web.Response:
    return problem_response(problem.status, problem.detail, problem.headers)


def _payload(response: web.StreamResponse, limit: int) -> bytes | None:
    """The stored form of ``response``, or ``None`` when it cannot be replayed: streamed,
    already sent, a body that is not bytes (a file), or over ``limit`` bytes."""
    if not isinstance(response, web.Response) or response.prepared:
        return None
    body = response.body
    if not isinstance(body, (bytes, bytearray)) or len(body) > limit:
        return None
    headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()
    ]
    return encode_response(response.status, headers, bytes(body))


def _replay(payload: bytes) -> web.Response:
    """A stored response, marked ``Idempotent-Replayed: true``."""
    status, fields, body = decode_response(payload)
    headers = CIMultiDict(_text(fields))
    headers["Idempotent-Replayed"] = "true"
    return web.Response(status=status, body=body, headers=headers)
