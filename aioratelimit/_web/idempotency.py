"""The ASGI idempotency middleware: each ``Idempotency-Key`` runs its request once.

``IdempotencyMiddleware`` reads and checks the key, buffers the request body (bounded by
``max_body``) to fingerprint it, then claims the key in an ``IdempotencyStore``: the first
request runs the app under a ``ResponseCopy`` and its response is stored; a repeat is
answered from the record. The key's parsing and the fingerprint are shared with the
FastAPI ``IdempotencyKey`` dependency.

A route whose ``IdempotencyKey`` dependency handles its keys is left to it
(``keyed_routes``).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

from .._args import check_int, check_timeout
from .._backend import Backend
from .._errors import BackendUnavailable, IdempotencyKeyMismatch
from .._idempotency.store import Claimed, IdempotencyStore, InProgress, Replay
from .._limits.failure import check_on_unavailable
from .answers import (
    UNAVAILABLE_RETRY_AFTER,
    WEB_POLICIES,
    OutageLog,
    retry_after_field,
    send_problem,
    unavailable_detail,
)
from .clients import ClientFunc, check_client_func, credentials, header_values, resolve, user_id
from .keyed_routes import HANDOFF, Handoff, KeyedRoutes
from .records import ResponseCopy, send_recorded
from .routes import matches_any, methods_of, route_path, templates
from .types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("aioratelimit")

#: Longest ``Idempotency-Key`` value accepted (a UUID is 36).
MAX_IDEMPOTENCY_KEY = 255

_BARE_KEY = re.compile(r"[!-~]{1,255}")
# A Structured Field string (RFC 8941): printable ASCII, with \" and \\ escaped.
_SF_STRING = re.compile(r'"((?:[ !#-\[\]-~]|\\["\\]){1,255})"')


#: Statuses stored (and replayed) by default: success, and 303 See Other, the answer of a
#: completed POST that redirects. 4xx are not: 401, 403, 409 and 429 say nothing final
#: about the request, and a retry with a fresh token must run.
STORED = frozenset([*range(200, 300), 303])

#: ``fingerprint(scope, body)``: what identifies a request's content (str or bytes, sync or
#: async); a key reused with another fingerprint is 422.
FingerprintFunc = Callable[[Scope, bytes], "str | bytes | Awaitable[str | bytes]"]


def request_fingerprint(scope: Scope, body: bytes) -> bytes:
    """The default fingerprint: method, path, query string and a SHA-256 of the body."""
    return b"\0".join(
        (
            scope["method"].encode(),
            scope["path"].encode("utf-8", "surrogateescape"),
            bytes(scope.get("query_string", b"")),
            hashlib.sha256(body).digest(),
        )
    )


def default_client() -> ClientFunc:
    """Whose keys a request's are: the authenticated user in ``scope["user"]`` (Starlette's
    ``AuthenticationMiddleware``), ``"user:<id>"``; else a keyed digest of the credentials
    the request carries and its address, ``"cred:<digest>"`` (``credentials()``)."""
    return user_id(fallback=credentials())


def check_wait(wait: object) -> bool:
    """``wait=`` of the idempotency faces: a bool (``timeout=`` bounds it), as everywhere."""
    if not isinstance(wait, bool):
        raise TypeError(
            f"wait must be a bool (bound the wait with timeout=), not {type(wait).__name__}"
        )
    return wait


def status_filter(stored: Iterable[int] | Callable[[int], bool]) -> Callable[[int], bool]:
    """``stored`` as a predicate on the status: statuses (a ``range`` too) or a function."""
    if callable(stored):
        return stored
    statuses = frozenset(stored)
    for status in statuses:
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError(f"stored must hold int statuses, not {type(status).__name__}")
        if not 200 <= status <= 599:
            raise ValueError(f"a stored status must be a final status, 200 to 599: {status}")
    return statuses.__contains__


async def call_fingerprint(fingerprint: FingerprintFunc, scope: Scope, body: bytes) -> str | bytes:
    value = fingerprint(scope, body)
    if inspect.isawaitable(value):
        value = await value
    if not isinstance(value, (str, bytes)):
        raise TypeError(f"fingerprint must return str or bytes, not {type(value).__name__}")
    return value


def parse_idempotency_key(value: str) -> str | None:
    """The key from an ``Idempotency-Key`` field: a Structured Field string (as the IETF
    draft has it, ``"8e03978e-..."``) or, leniently, a bare token of visible ASCII. ``None``
    when malformed (empty, too long, control or non-ASCII characters)."""
    value = value.strip(" \t")
    if value.startswith('"'):
        m = _SF_STRING.fullmatch(value)
        if m is None:
            return None
        return re.sub(r"\\(.)", r"\1", m[1])
    return value if _BARE_KEY.fullmatch(value) else None


class _BodyTooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, or ``_BodyTooLarge`` once it exceeds ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class IdempotencyMiddleware:
    """Runs each ``Idempotency-Key`` once (draft-ietf-httpapi-idempotency-key-header).

    Requests with a method in ``methods`` that carry an ``Idempotency-Key`` are run once per
    (client, key): the first runs the app and, if its status is one of ``stored`` (2xx and
    303 by default; statuses, a ``range`` or a predicate), its response (status, safe
    headers, body) is stored for ``ttl`` seconds; a later request with the same key gets
    that response again with ``Idempotent-Replayed: true``, without running anything. Any
    other response frees the key at once: a retry runs. The key is bound to the request's
    ``fingerprint(scope, body)``, by default ``request_fingerprint``: method, path, query
    string and a SHA-256 of the body.

    A stored response is only ever replayed to the client that created it. The client is
    ``client(scope)``: by default the authenticated ``scope["user"]`` (an authentication
    middleware's), else a keyed digest of the credentials the request carries
    (``Authorization``, ``Cookie``, ``X-API-Key``...) together with its address
    (``credentials()``); the address alone only when you say so, ``client=client_ip()``. A
    client function that answers ``None`` leaves that request unprotected.

    Which requests it takes: every route (``routes=None``), or only those whose path matches
    one of the ``routes`` templates; never the ``exempt`` ones, and never a route that has
    an ``IdempotencyKey`` dependency, which handles the keys of its route itself.

    - ``400`` (problem+json) when the key is malformed, or missing with ``require=True`` (on
      every route it takes; without, a request with no key runs unprotected);
    - ``409`` with ``Retry-After`` while the first request with the key still runs; with
      ``wait=True`` a duplicate waits for it to finish and gets its response, or the 409
      once ``timeout`` seconds have passed (``None``: as long as the first one runs);
    - ``422`` when the key comes again with another method, path, query or body;
    - ``413`` when the body is over ``max_body`` bytes (never a silent bypass);
    - failures and responses outside ``stored`` are not stored: the key is free for a retry
      at once. A response over ``max_response`` bytes is not stored either (logged).
    - The first request holds the key under a ``lease`` (seconds), renewed while it runs; if
      the process dies, the key is free once the lease has passed.
    - Backend unreachable: ``503`` with ``Retry-After`` (fail closed,
      ``on_unavailable="deny"``), or with ``on_unavailable="allow"`` the request runs
      unprotected; a WARNING either way.
    """

    __slots__ = (
        "_exempt",
        "_keyed",
        "_outage",
        "_retry_unavailable",
        "_routes",
        "_stored",
        "_warned",
        "app",
        "client",
        "fingerprint",
        "max_body",
        "max_response",
        "methods",
        "on_unavailable",
        "require",
        "store",
        "timeout",
        "wait",
    )

    def __init__(
        self,
        app: ASGIApp,
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
        self.app = app
        self._stored = status_filter(stored)
        if fingerprint is not None and not callable(fingerprint):
            raise TypeError(f"fingerprint must be a callable, not {type(fingerprint).__name__}")
        self.fingerprint = fingerprint or request_fingerprint
        ms = methods_of(tuple(methods))
        if ms is None:
            raise ValueError("methods must name the methods to protect, not '*'")
        self.methods = ms
        if not isinstance(require, bool):
            raise TypeError(
                "require must be a bool: whether every route the middleware takes needs the"
                " header; to take some routes only, list them: routes=['/payments'],"
                " require=True"
            )
        self.require = require
        self._routes = None if routes is None else templates(routes)
        self._exempt = templates(exempt)
        client = check_client_func(client, "client")
        self.client = default_client() if client is None else client
        self.max_body = check_int(max_body, "max_body", minimum=0)
        self.max_response = check_int(max_response, "max_response", minimum=0)
        self.wait = check_wait(wait)
        self.timeout = check_timeout(timeout)
        # No Fallback: a key's record has no in-process twin to be counted on.
        self.on_unavailable = check_on_unavailable(on_unavailable, WEB_POLICIES, fallback=False)
        # Room for the head line (status and headers) on top of the body.
        self.store = IdempotencyStore(
            backend, ttl=ttl, lease=lease, name=name, max_bytes=self.max_response + (64 << 10)
        )
        self._retry_unavailable = (retry_after_field(unavailable_retry_after),)
        self._outage = OutageLog("IdempotencyMiddleware")
        self._keyed = KeyedRoutes(app)
        self._warned = False

    def _takes(self, scope: Scope) -> bool:
        """Whether this request is the middleware's to handle (its key, or its lack of one)."""
        if scope["type"] != "http" or scope["method"] not in self.methods:
            return False
        path = route_path(scope)
        if matches_any(self._exempt, path):
            return False
        return self._routes is None or matches_any(self._routes, path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._takes(scope):
            await self.app(scope, receive, send)
            return
        values = header_values(scope, b"idempotency-key")
        # A route whose own dependency handles its keys is left to it, key or not.
        if (not values and not self.require) or self._keyed.owns(scope):
            await self.app(scope, receive, send)
            return
        if not values:
            await send_problem(send, 400, "this request needs an Idempotency-Key header")
            return
        idem = parse_idempotency_key(values[0]) if len(values) == 1 else None
        if idem is None:
            await send_problem(
                send,
                400,
                "malformed Idempotency-Key: expected one quoted string of 1 to"
                f" {MAX_IDEMPOTENCY_KEY} visible ASCII characters",
            )
            return
        who = await resolve(self.client, scope)
        if who is None:  # the app's client function leaves this request unprotected
            await self.app(scope, receive, send)
            return
        if self._declared_length(scope) > self.max_body:
            await self._too_large(send)
            return
        try:
            body = await _read_body(receive, self.max_body)
        except _BodyTooLarge:
            await self._too_large(send)
            return
        except _Disconnected:
            return
        key = f"{len(who)}:{who}:{idem}"
        fingerprint = await call_fingerprint(self.fingerprint, scope, body)
        replayed = _replayer(body, receive)
        try:
            if self.wait:
                outcome = await self.store.wait(key, fingerprint, timeout=self.timeout)
            else:
                outcome = await self.store.claim(key, fingerprint)
        except IdempotencyKeyMismatch:
            await send_problem(
                send,
                422,
                "this Idempotency-Key was already used with another request"
                " (method, path, query or body differ)",
            )
            return
        except BackendUnavailable as exc:
            allow = self.on_unavailable == "allow"
            self._outage(exc, allow)
            if allow:
                await self.app(scope, replayed, send)
            else:
                await send_problem(
                    send, 503, unavailable_detail("idempotency"), self._retry_unavailable
                )
            return
        if isinstance(outcome, InProgress):
            # The first request usually ends well within its lease: ask for a prompt retry.
            await send_problem(
                send,
                409,
                "a request with this Idempotency-Key is still being processed",
                (retry_after_field(1),),
            )
            return
        if isinstance(outcome, Replay):
            await send_recorded(send, outcome.payload)
            return
        await self._run(scope, replayed, send, outcome)

    async def _run(self, scope: Scope, receive: Receive, send: Send, claimed: Claimed) -> None:
        copy = ResponseCopy(send, self.max_response)
        handoff = scope[HANDOFF] = Handoff()
        async with self.store.running(claimed):
            await self.app(scope, receive, copy)
            if handoff.taken:
                self._handed_off(scope)
                return  # the route's dependency has the key: leaving releases ours
            if not copy.storable(self._stored):
                if copy.overflow and copy.complete:
                    log.warning(
                        "IdempotencyMiddleware: the response to %s %s is over max_response"
                        " (%d bytes) or not replayable: not stored, the key is free again",
                        scope["method"],
                        scope["path"],
                        self.max_response,
                    )
                return  # leaving the block releases the key
            try:
                await self.store.complete(claimed, copy.payload())
            except BackendUnavailable as exc:
                # The client has its response; a retry will run again once the lease passes.
                self._outage(exc, self.on_unavailable == "allow")

    def _handed_off(self, scope: Scope) -> None:
        """A request reached an ``IdempotencyKey`` dependency the routes did not show."""
        if not self._warned:
            self._warned = True
            log.warning(
                "IdempotencyMiddleware: %s %s reached an IdempotencyKey dependency, which"
                " handles its keys itself: the middleware stores nothing for it. It did not"
                " find that route among the app's routes; exempt it (exempt=) or list the"
                " middleware's own routes (routes=)",
                scope["method"],
                scope["path"],
            )

    @staticmethod
    def _declared_length(scope: Scope) -> int:
        for k, v in scope.get("headers") or ():
            if k == b"content-length":
                try:
                    return int(v)
                except ValueError:
                    return 0  # the server rejects it; the streamed count still applies
        return 0

    async def _too_large(self, send: Send) -> None:
        await send_problem(
            send, 413, f"the request body is over the {self.max_body} bytes this endpoint accepts"
        )

    def __repr__(self) -> str:
        methods = ",".join(sorted(self.methods))
        return (
            f"<IdempotencyMiddleware {methods} {self.store!r}"
            f" on_unavailable={self.on_unavailable!r}>"
        )


def _replayer(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the real channel (for
    ``http.disconnect``)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay
