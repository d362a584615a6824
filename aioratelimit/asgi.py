"""ASGI middleware: rate limits and ``Idempotency-Key`` handling for any ASGI application.

Pure ASGI (Starlette, FastAPI, Litestar, Quart, a bare callable...): importing this module
imports no web framework.

::

    from aioratelimit.asgi import RateLimitMiddleware, Rule, client_ip

    app = RateLimitMiddleware(
        app,
        limiter=arl.SlidingWindow("100/minute"),
        key=client_ip(),
        rules=[Rule("POST", "/orders/{id}", arl.TokenBucket("5/second"))],
        exempt=["/health"],
    )
    app = IdempotencyMiddleware(app, require=["/payments"])
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence

from ._args import check_int, check_seconds
from ._backend import Backend
from ._errors import BackendUnavailable, IdempotencyKeyMismatch
from ._idempotency import Claimed, IdempotencyStore, InProgress, Replay
from ._ratelimit import _Limiter
from ._web import (
    UNAVAILABLE_RETRY_AFTER,
    ASGIApp,
    KeyFunc,
    Message,
    OutageLog,
    Policy,
    Receive,
    Scope,
    Send,
    Template,
    client_ip,
    header,
    log,
    methods_of,
    path_param,
    resolve,
    seconds_header,
    send_problem,
    templates,
    user_id,
    with_headers,
)

__all__ = [
    "IdempotencyMiddleware",
    "KeyFunc",
    "RateLimitMiddleware",
    "Rule",
    "client_ip",
    "header",
    "path_param",
    "user_id",
]


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
        self.limiter = _check_limiter(limiter)
        if key is not None and not callable(key):
            raise TypeError(f"key must be a callable, not {type(key).__name__}")
        self.key = key
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


def _check_limiter(limiter: object) -> _Limiter:
    if not isinstance(limiter, _Limiter):
        raise TypeError(
            "limiter must be a FixedWindow, SlidingWindow or TokenBucket,"
            f" not {type(limiter).__name__}"
        )
    return limiter


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
        if key is None:
            key = client_ip()
        elif not callable(key):
            raise TypeError(f"key must be a callable, not {type(key).__name__}")
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
                _check_limiter(limiter),
                key,
                limiter._check_cost(cost),
                Policy(limiter, policy_name),
            )
        )
        self._retry_unavailable = (
            (b"retry-after", str(seconds_header(unavailable_retry_after)).encode()),
        )
        self._outage = OutageLog("RateLimitMiddleware")

    def _plan(self, method: str, path: str) -> _Plan | None:
        for tpl in self._exempt:
            if tpl.regex.fullmatch(path) is not None:
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
                    send,
                    503,
                    "the rate limit backend is unavailable; try again later",
                    self._retry_unavailable,
                )
            return
        headers = plan.policy.headers(decision)
        if not decision.allowed:
            retry = seconds_header(decision.retry_after)
            await send_problem(send, 429, f"rate limit exceeded; try again in {retry} s", headers)
            return
        await self.app(scope, receive, with_headers(send, headers))

    def __repr__(self) -> str:
        default = "-" if self._default is None else repr(self._default.limiter)
        return (
            f"<RateLimitMiddleware default={default} rules={len(self._rules)}"
            f" exempt={len(self._exempt)} fail_open={self.fail_open}>"
        )


# -- IdempotencyMiddleware ----------------------------------------------------------------

#: Longest ``Idempotency-Key`` value accepted (a UUID is 36).
MAX_IDEMPOTENCY_KEY = 255

_BARE_KEY = re.compile(r"[!-~]{1,255}")
# A Structured Field string (RFC 8941): printable ASCII, with \" and \\ escaped.
_SF_STRING = re.compile(r'"((?:[ !#-\[\]-~]|\\["\\]){1,255})"')

#: Response headers never replayed: per-connection, per-moment or per-client fields.
_UNSAFE = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-connection",
        b"content-length",
        b"date",
        b"server",
        b"set-cookie",
        b"age",
        b"ratelimit",
        b"ratelimit-policy",
        b"retry-after",
        b"idempotent-replayed",
    }
)


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


def _encode_response(status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> bytes:
    """One stored response: a JSON head line (status, safe headers), then the body."""
    head = {
        "status": status,
        "headers": [
            [bytes(k).decode("latin-1"), bytes(v).decode("latin-1")]
            for k, v in headers
            if bytes(k).lower() not in _UNSAFE
        ],
    }
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + body


def _decode_response(payload: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    head, _, body = payload.partition(b"\n")
    doc = json.loads(head)
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in doc["headers"]]
    return int(doc["status"]), headers, body


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


class _Recorder:
    """Forwards the app's response to the client and keeps a copy to store."""

    __slots__ = ("body", "complete", "headers", "limit", "overflow", "send", "status")

    def __init__(self, send: Send, limit: int) -> None:
        self.send = send
        self.limit = limit
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.complete = False
        self.overflow = False  # too large, or a message we cannot replay

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
        elif kind == "http.response.body":
            chunk = bytes(message.get("body", b""))
            if not self.overflow:
                self.body.append(chunk)
                self.overflow = sum(map(len, self.body)) > self.limit
            if not message.get("more_body", False):
                self.complete = True
        else:  # trailers, zero-copy or path sends: not something we can store and replay
            self.overflow = True
        await self.send(message)

    def storable(self) -> bool:
        """A complete, non-5xx response within the size cap."""
        return self.complete and not self.overflow and self.status is not None and self.status < 500


class IdempotencyMiddleware:
    """Runs each ``Idempotency-Key`` once (draft-ietf-httpapi-idempotency-key-header).

    Requests with a method in ``methods`` that carry an ``Idempotency-Key`` are run once per
    (client, key): the first runs the app and its response (status, safe headers, body) is
    stored for ``ttl`` seconds; a later request with the same key gets that response again
    with ``Idempotent-Replayed: true``, without running anything. The key is scoped per
    client (``client(scope)``, by default its IP address as ``client_ip()`` judges it) and
    bound to the request's fingerprint: method, path, query string and a SHA-256 of the body.

    - ``400`` (problem+json) when the key is malformed, or missing on a path that requires
      it (``require=True``: every path; or a list of path templates);
    - ``409`` with ``Retry-After`` while the first request with the key still runs (or, with
      ``wait`` seconds > 0, after waiting that long for it to finish and replaying it);
    - ``422`` when the key comes again with another method, path, query or body;
    - ``413`` when the body is over ``max_body`` bytes (never a silent bypass);
    - 5xx responses and failures are not stored: the key is free for a retry at once. A
      response over ``max_response`` bytes is not stored either (logged).
    - The first request holds the key under a ``lease`` (seconds), renewed while it runs; if
      the process dies, the key is free once the lease has passed.
    - Backend unreachable: ``503`` with ``Retry-After`` (fail closed), or with
      ``fail_open=True`` the request runs unprotected; a WARNING either way.
    """

    __slots__ = (
        "_exempt",
        "_header",
        "_outage",
        "_require",
        "_retry_unavailable",
        "app",
        "client",
        "fail_open",
        "max_body",
        "max_response",
        "methods",
        "store",
        "wait",
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        backend: Backend | None = None,
        methods: Iterable[str] = ("POST", "PATCH"),
        require: bool | Iterable[str] = False,
        exempt: Iterable[str] | str = (),
        client: KeyFunc | None = None,
        max_body: int = 1 << 20,
        max_response: int = 1 << 20,
        ttl: float = 86400.0,
        lease: float = 30.0,
        wait: float = 0.0,
        fail_open: bool = False,
        name: str = "http",
        unavailable_retry_after: float = UNAVAILABLE_RETRY_AFTER,
    ) -> None:
        self.app = app
        ms = methods_of(tuple(methods))
        if ms is None:
            raise ValueError("methods must name the methods to protect, not '*'")
        self.methods = ms
        if isinstance(require, bool):
            self._require: bool | tuple[Template, ...] = require
        else:
            self._require = templates(require)
        self._exempt = templates(exempt)
        if client is None:
            client = client_ip()
        elif not callable(client):
            raise TypeError(f"client must be a callable, not {type(client).__name__}")
        self.client = client
        self.max_body = check_int(max_body, "max_body", minimum=0)
        self.max_response = check_int(max_response, "max_response", minimum=0)
        self.wait = check_seconds(wait, "wait", allow_zero=True)
        self.fail_open = bool(fail_open)
        # Room for the head line (status and headers) on top of the body.
        self.store = IdempotencyStore(
            backend, ttl=ttl, lease=lease, name=name, max_bytes=self.max_response + (64 << 10)
        )
        self._header = b"idempotency-key"
        self._retry_unavailable = (
            (b"retry-after", str(seconds_header(unavailable_retry_after)).encode()),
        )
        self._outage = OutageLog("IdempotencyMiddleware")

    def _required(self, path: str) -> bool:
        if isinstance(self._require, bool):
            return self._require
        return any(t.regex.fullmatch(path) is not None for t in self._require)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if any(t.regex.fullmatch(path) is not None for t in self._exempt):
            await self.app(scope, receive, send)
            return
        values = [bytes(v) for k, v in scope.get("headers") or () if k == self._header]
        if not values:
            if self._required(path):
                await send_problem(send, 400, "this request needs an Idempotency-Key header")
            else:
                await self.app(scope, receive, send)
            return
        idem = parse_idempotency_key(values[0].decode("latin-1")) if len(values) == 1 else None
        if idem is None:
            await send_problem(
                send,
                400,
                "malformed Idempotency-Key: expected one quoted string of 1 to"
                f" {MAX_IDEMPOTENCY_KEY} visible ASCII characters",
            )
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
        who = await resolve(self.client, scope) or "-"
        key = f"{len(who)}:{who}:{idem}"
        fingerprint = b"\0".join(
            (
                scope["method"].encode(),
                path.encode("utf-8", "surrogateescape"),
                bytes(scope.get("query_string", b"")),
                hashlib.sha256(body).digest(),
            )
        )
        replayed = _replayer(body, receive)
        try:
            if self.wait > 0:
                outcome = await self.store.wait(key, fingerprint, timeout=self.wait)
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
            self._outage(exc, self.fail_open)
            if self.fail_open:
                await self.app(scope, replayed, send)
            else:
                await send_problem(
                    send,
                    503,
                    "the idempotency backend is unavailable; try again later",
                    self._retry_unavailable,
                )
            return
        if isinstance(outcome, InProgress):
            # The first request usually ends well within its lease: ask for a prompt retry.
            await send_problem(
                send,
                409,
                "a request with this Idempotency-Key is still being processed",
                ((b"retry-after", b"1"),),
            )
            return
        if isinstance(outcome, Replay):
            await self._replay(send, outcome)
            return
        await self._run(scope, replayed, send, outcome)

    async def _run(self, scope: Scope, receive: Receive, send: Send, claimed: Claimed) -> None:
        recorder = _Recorder(send, self.max_response)
        async with self.store.running(claimed):
            await self.app(scope, receive, recorder)
            if not recorder.storable():
                if recorder.overflow and recorder.complete:
                    log.warning(
                        "IdempotencyMiddleware: the response to %s %s is over max_response"
                        " (%d bytes) or not replayable: not stored, the key is free again",
                        scope["method"],
                        scope["path"],
                        self.max_response,
                    )
                return  # leaving the block releases the key
            assert recorder.status is not None
            payload = _encode_response(recorder.status, recorder.headers, b"".join(recorder.body))
            try:
                await self.store.complete(claimed, payload)
            except BackendUnavailable as exc:
                # The client has its response; a retry will run again once the lease passes.
                self._outage(exc, self.fail_open)

    async def _replay(self, send: Send, replay: Replay) -> None:
        status, headers, body = _decode_response(replay.payload)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    *headers,
                    (b"content-length", str(len(body)).encode()),
                    (b"idempotent-replayed", b"true"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

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
        return f"<IdempotencyMiddleware {methods} {self.store!r} fail_open={self.fail_open}>"


def _replayer(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the real channel (for
    ``http.disconnect``)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay
