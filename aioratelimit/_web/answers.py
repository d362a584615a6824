"""HTTP answers: what the web faces send back once a limiter or a store has decided.

- ``Retry-After`` (the ``RateLimit`` fields of a ``Decision`` are ``headers``'s);
- ``Refusal``: a refused request as a ``respond=`` hook sees it, to shape the answer;
- RFC 9457 problem bodies (``application/problem+json``) and their detail texts, so every
  web face words a refusal the same way: a rate limit's 429 is the ``quota-exceeded`` problem
  type and its 503 ``temporary-reduced-capacity`` (draft-ietf-httpapi-ratelimit-headers-11),
  both naming the ``violated-policies``; other refusals are ``about:blank``;
- the throttled WARNING line for a backend outage.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from .._rates import Decision
from .headers import seconds_header
from .types import ASGIApp, Message, Scope, Send

log = logging.getLogger("aioratelimit")

#: Seconds a client is told to wait (``Retry-After``) when the backend is unreachable.
UNAVAILABLE_RETRY_AFTER = 5
#: The failure policies of a web face (``on_unavailable=``): ``"deny"`` answers 503,
#: ``"allow"`` lets the request through; a rate-limit face also takes a ``Fallback``.
WEB_POLICIES = ("deny", "allow")


def retry_after_field(seconds: float) -> tuple[bytes, bytes]:
    """The ``Retry-After`` field for a wait of ``seconds``."""
    return (b"retry-after", str(seconds_header(seconds)).encode())


# -- refusals users shape ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the rate limit refuses, as a ``respond=`` hook is given it.

    ``status`` is 429 (limited) or 503 (the backend is unreachable and the limit fails
    closed); ``headers`` the fields the default answer carries (lower-case names:
    ``retry-after`` always, ``ratelimit-policy`` and ``ratelimit`` on a 429, the
    ``x-ratelimit-*`` trio with ``legacy_headers``); ``retry_after`` the whole seconds of
    ``Retry-After``; ``detail`` the default problem text; ``decision`` the denied decision
    (``None`` on a 503) and ``policy`` the request's policy name; ``scope`` the request's;
    ``violated_policies`` the policy items the default problem document names (the one
    exceeded on a 429, every one of the request's policy on a 503).
    """

    status: int
    detail: str
    headers: dict[str, str]
    retry_after: int
    decision: Decision | None
    policy: str | None
    scope: Scope
    violated_policies: tuple[str, ...] = ()


def refusal(
    status: int,
    detail: str,
    fields: Sequence[tuple[bytes, bytes]],
    scope: Scope,
    decision: Decision | None = None,
    policy: str | None = None,
    violated: tuple[str, ...] = (),
) -> Refusal:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in fields}
    retry = int(headers["retry-after"])
    return Refusal(status, detail, headers, retry, decision, policy, scope, violated)


#: ``respond=`` of the middleware: builds the answer to a refusal, as any ASGI app (a
#: Starlette ``Response`` is one), sync or async.
RespondWithApp = Callable[[Refusal], ASGIApp | Awaitable[ASGIApp]]


def check_respond(respond: object) -> Any:
    """``respond`` if it is ``None`` or callable."""
    if respond is not None and not callable(respond):
        raise TypeError(f"respond must be a callable, not {type(respond).__name__}")
    return respond


# -- problem responses --------------------------------------------------------------------

PROBLEM_JSON = b"application/problem+json"

# RFC 9110's reason phrases, the same on every Python (3.13 renamed 413 and 422 in ``http``).
_TITLES = {413: "Content Too Large", 422: "Unprocessable Content"}


def exceeded_detail(decision: Decision) -> str:
    """The detail of a 429 for a denied ``decision``."""
    return f"rate limit exceeded; try again in {seconds_header(decision.retry_after)} s"


#: The detail of a 403 for a client on an access list's deny entries.
LISTED_DETAIL = "the client is denied access"


def unavailable_detail(what: str) -> str:
    """The detail of a 503 when the ``what`` backend (``"rate limit"``...) is unreachable."""
    return f"the {what} backend is unavailable; try again later"


#: The problem types of draft-ietf-httpapi-ratelimit-headers-11 (§5, registered in IANA's
#: HTTP Problem Types): a rate limit's refusals are these, never ``about:blank``.
QUOTA_EXCEEDED = "quota-exceeded"
TEMPORARY_REDUCED_CAPACITY = "temporary-reduced-capacity"
PROBLEM_TYPES = {
    QUOTA_EXCEEDED: "Quota Exceeded",
    TEMPORARY_REDUCED_CAPACITY: "Temporary Reduced Capacity",
    "abnormal-usage-detected": "Abnormal Usage Detected",
}
PROBLEM_TYPE_BASE = "https://iana.org/assignments/http-problem-types#"


def problem_body(
    status: int, detail: str, kind: str | None = None, violated: Sequence[str] = ()
) -> bytes:
    """An RFC 9457 problem document: ``about:blank`` (the title is the status), or with a
    ``kind`` of ``PROBLEM_TYPES`` that type, its title and ``violated-policies``."""
    if kind is None:
        doc: dict[str, Any] = {
            "type": "about:blank",
            "title": _TITLES.get(status) or HTTPStatus(status).phrase,
        }
    else:
        doc = {"type": PROBLEM_TYPE_BASE + kind, "title": PROBLEM_TYPES[kind]}
    doc.update(status=status, detail=detail)
    if kind is not None:
        doc["violated-policies"] = list(violated)
    return json.dumps(doc, separators=(",", ":")).encode()


def problem_kind(status: int) -> str | None:
    """A rate limit's problem type for a refusal of ``status``: 429 and 503 have the
    draft's; a 403 (a client on an access list's deny entries) is ``about:blank``."""
    if status == 403:
        return None
    return QUOTA_EXCEEDED if status == 429 else TEMPORARY_REDUCED_CAPACITY


async def send_problem(
    send: Send,
    status: int,
    detail: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    kind: str | None = None,
    violated: Sequence[str] = (),
) -> None:
    """Answer with a problem document and the given extra headers."""
    body = problem_body(status, detail, kind, violated)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_JSON),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def with_headers(send: Send, extra: Sequence[tuple[bytes, bytes]]) -> Send:
    """``send`` that appends ``extra`` headers to the response start message."""

    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", ()), *extra]
        await send(message)

    return sender


# -- the outage log -----------------------------------------------------------------------


class OutageLog:
    """One WARNING when the backend fails, then at most one line per ``every`` seconds with
    the count of failures since (an outage under load must not flood the log)."""

    __slots__ = ("_every", "_last", "_suppressed", "_what")

    def __init__(self, what: str, every: float = 10.0) -> None:
        self._what = what
        self._every = every
        self._last = -math.inf
        self._suppressed = 0

    def __call__(self, exc: BaseException, allowed: bool) -> None:
        """Log ``exc``; ``allowed``: the request passes (``on_unavailable="allow"``)."""
        now = time.monotonic()
        if now - self._last < self._every:
            self._suppressed += 1
            return
        action = "letting requests through (fail open)" if allowed else "answering 503"
        more = (
            f" ({self._suppressed} more failures since the last line)" if self._suppressed else ""
        )
        log.warning("%s: backend unavailable, %s: %s%s", self._what, action, exc, more)
        self._last, self._suppressed = now, 0
