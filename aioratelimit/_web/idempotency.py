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

import logging
from collections.abc import Callable, Iterable
from typing import Literal

from .._backend import Backend
from .._idempotency.store import Claimed, Replay
from .answers import UNAVAILABLE_RETRY_AFTER, send_problem
from .clients import ClientFunc, header_values
from .idempotency_flow import STORED, FingerprintFunc, KeyFlow, Problem
from .keyed_routes import HANDOFF, Handoff, KeyedRoutes
from .records import ResponseCopy, send_recorded
from .routes import route_path
from .types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("aioratelimit")


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


class IdempotencyMiddleware(KeyFlow):
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

    __slots__ = ("_keyed", "_warned", "app")

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
            face="IdempotencyMiddleware",
        )
        self.app = app
        self._keyed = KeyedRoutes(app)
        self._warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.takes(scope["method"], route_path(scope)):
            await self.app(scope, receive, send)
            return
        values = header_values(scope, b"idempotency-key")
        # A route whose own dependency handles its keys is left to it, key or not.
        if (not values and not self.require) or self._keyed.owns(scope):
            await self.app(scope, receive, send)
            return
        key = await self.identify(scope, values)
        if key is None:  # the app's client function leaves this request unprotected
            await self.app(scope, receive, send)
            return
        if isinstance(key, Problem):
            await send_problem(send, *key)
            return
        if self._declared_length(scope) > self.max_body:
            await send_problem(send, *self.too_large())
            return
        try:
            body = await _read_body(receive, self.max_body)
        except _BodyTooLarge:
            await send_problem(send, *self.too_large())
            return
        except _Disconnected:
            return
        replayed = _replayer(body, receive)
        outcome = await self.claim(key, scope, body)
        if outcome is None:  # the backend is unavailable and the middleware fails open
            await self.app(scope, replayed, send)
        elif isinstance(outcome, Problem):
            await send_problem(send, *outcome)
        elif isinstance(outcome, Replay):
            await send_recorded(send, outcome.payload)
        else:
            await self._run(scope, replayed, send, outcome)

    async def _run(self, scope: Scope, receive: Receive, send: Send, claimed: Claimed) -> None:
        copy = ResponseCopy(send, self.max_response)
        handoff = scope[HANDOFF] = Handoff()
        async with self.store.running(claimed):
            await self.app(scope, receive, copy)
            if handoff.taken:
                self._handed_off(scope)
                return  # the route's dependency has the key: leaving releases ours
            if not copy.storable(self.stored):
                if copy.overflow and copy.complete:
                    self.not_stored(scope["method"], scope["path"])
                return  # leaving the block releases the key
            await self.complete(claimed, copy.payload())

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
