"""The framework-neutral half of an idempotency middleware: its options, the key's parsing,
the request's fingerprint, and the steps from a request to what to answer.

``KeyFlow`` holds a middleware's options (checked once, before any I/O) and answers each
step with a ``Problem`` to send, a ``Replay`` of a stored response, a ``Claimed`` key to run
the request under, or ``None``: run it unprotected. The ASGI middleware and the aiohttp one
are each a ``KeyFlow`` with their own way of reading a body and of copying a response; the
FastAPI ``IdempotencyKey`` dependency shares the key's parsing and the fingerprint.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal, NamedTuple

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
    unavailable_detail,
)
from .clients import ClientFunc, check_client_func, credentials, resolve, user_id
from .routes import matches_any, methods_of, templates
from .types import Scope

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


class Problem(NamedTuple):
    """A refusal to send as a problem document: status, detail and extra fields."""

    status: int
    detail: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


MISSING = Problem(400, "this request needs an Idempotency-Key header")
MALFORMED = Problem(
    400,
    "malformed Idempotency-Key: expected one quoted string of 1 to"
    f" {MAX_IDEMPOTENCY_KEY} visible ASCII characters",
)
MISMATCH = Problem(
    422,
    "this Idempotency-Key was already used with another request"
    " (method, path, query or body differ)",
)
# The first request usually ends well within its lease: ask for a prompt retry.
RUNNING = Problem(
    409, "a request with this Idempotency-Key is still being processed", (retry_after_field(1),)
)

#: What a step answers: a problem to send, a stored response to replay, the claimed key to
#: run the request under, or ``None``: run the request unprotected.
Outcome = Problem | Replay | Claimed | None


class KeyFlow:
    """The options of an idempotency middleware and its steps (see ``IdempotencyMiddleware``
    for what each option means)."""

    __slots__ = (
        "_exempt",
        "_face",
        "_outage",
        "_retry_unavailable",
        "_routes",
        "_stored",
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
        face: str = "IdempotencyMiddleware",
    ) -> None:
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
        self._outage = OutageLog(face)
        self._face = face

    def takes(self, method: str, path: str) -> bool:
        """Whether a request is the middleware's to handle (its key, or its lack of one)."""
        if method not in self.methods or matches_any(self._exempt, path):
            return False
        return self._routes is None or matches_any(self._routes, path)

    async def identify(self, scope: Scope, values: list[str]) -> Problem | str | None:
        """The store key of a request whose ``Idempotency-Key`` fields are ``values`` (at
        least one, or none with ``require``): a problem, the key, or ``None`` when the
        client function leaves the request unprotected. Client and key are both in it,
        length-prefixed: one client's key never names another's record."""
        if not values:
            return MISSING
        idem = parse_idempotency_key(values[0]) if len(values) == 1 else None
        if idem is None:
            return MALFORMED
        who = await resolve(self.client, scope)
        if who is None:
            return None
        return f"{len(who)}:{who}:{idem}"

    def too_large(self) -> Problem:
        return Problem(
            413, f"the request body is over the {self.max_body} bytes this endpoint accepts"
        )

    async def claim(self, key: str, scope: Scope, body: bytes) -> Outcome:
        """Claim ``key`` for this request (waiting for a running one with ``wait``)."""
        fingerprint = await call_fingerprint(self.fingerprint, scope, body)
        try:
            if self.wait:
                outcome = await self.store.wait(key, fingerprint, timeout=self.timeout)
            else:
                outcome = await self.store.claim(key, fingerprint)
        except IdempotencyKeyMismatch:
            return MISMATCH
        except BackendUnavailable as exc:
            allow = self.on_unavailable == "allow"
            self._outage(exc, allow)
            if allow:
                return None
            return Problem(503, unavailable_detail("idempotency"), self._retry_unavailable)
        if isinstance(outcome, InProgress):
            return RUNNING
        return outcome

    def stored(self, status: int) -> bool:
        """Whether a response of ``status`` is one to store (``stored=``)."""
        return self._stored(status)

    async def complete(self, claimed: Claimed, payload: bytes) -> None:
        """Store the recorded response under the claimed key."""
        try:
            await self.store.complete(claimed, payload)
        except BackendUnavailable as exc:
            # The client has its response; a retry will run again once the lease passes.
            self._outage(exc, self.on_unavailable == "allow")

    def not_stored(self, method: str, path: str) -> None:
        log.warning(
            "%s: the response to %s %s is over max_response (%d bytes) or not replayable:"
            " not stored, the key is free again",
            self._face,
            method,
            path,
            self.max_response,
        )
