"""HTTP answers: what the web faces send back once a limiter or a store has decided.

- the IETF ``RateLimit`` / ``RateLimit-Policy`` fields (draft-ietf-httpapi-ratelimit-headers)
  and ``Retry-After``, computed from a ``Decision``, on request the legacy
  ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` trio, and ``X-RateLimit-Shadow``;
- ``Refusal``: a refused request as a ``respond=`` hook sees it, to shape the answer;
- RFC 9457 problem bodies (``application/problem+json``) and their detail texts, so the ASGI
  middleware and the FastAPI dependencies word a refusal the same way;
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

from .._args import check_key
from .._limits.algorithms import FixedWindow, SlidingWindow, TokenBucket
from .._limits.limiter import Limiter
from .._rates import Decision
from .types import ASGIApp, Message, Scope, Send

log = logging.getLogger("aioratelimit")

#: Seconds a client is told to wait (``Retry-After``) when the backend is unreachable.
UNAVAILABLE_RETRY_AFTER = 5
#: The failure policies of a web face (``on_unavailable=``): ``"deny"`` answers 503,
#: ``"allow"`` lets the request through; a rate-limit face also takes a ``Fallback``.
WEB_POLICIES = ("deny", "allow")


def check_limiter(limiter: object) -> Limiter:
    """``limiter`` if it is one whose quota the ``RateLimit`` fields can describe."""
    if not isinstance(limiter, (FixedWindow, SlidingWindow, TokenBucket)):
        raise TypeError(
            "limiter must be a FixedWindow, SlidingWindow or TokenBucket,"
            f" not {type(limiter).__name__}"
        )
    return limiter


# -- IETF RateLimit fields ----------------------------------------------------------------


def sf_string(text: str) -> str:
    """``text`` as a Structured Field string (RFC 8941 §3.3.3)."""
    if not all(" " <= c <= "~" for c in text):
        raise ValueError(f"a policy name must be printable ASCII: {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def seconds_header(seconds: float) -> int:
    """Whole seconds for ``Retry-After`` and ``t=``: rounded up, at least 1."""
    return max(1, math.ceil(seconds - 1e-9))


def retry_after_field(seconds: float) -> tuple[bytes, bytes]:
    """The ``Retry-After`` field for a wait of ``seconds``."""
    return (b"retry-after", str(seconds_header(seconds)).encode())


#: The field a shadow decision adds to the response: what the limit said.
SHADOW_HEADER = b"x-ratelimit-shadow"


def shadow_fields(decision: Decision) -> list[tuple[bytes, bytes]]:
    """``X-RateLimit-Shadow: denied`` (or ``allowed``) for a shadow decision; else none."""
    if not decision.shadow:
        return []
    return [(SHADOW_HEADER, b"denied" if decision.shadow_denied else b"allowed")]


def _whole(seconds: float) -> int:
    return max(0, math.ceil(seconds - 1e-9))


class QuotaPolicy:
    """A limiter's quota policies under one name, and the header values they produce.

    A limiter with one rate is one policy named ``name``; with several, one policy per rate,
    ``name-1``, ``name-2``..., and ``RateLimit`` reports the tightest (the decision's limit).
    A token bucket's quota is its burst, its window the time to refill a full burst.

    A limiter made with ``policies=``: each decision's fields are its policy's, named as
    the policy (``"pro"``; the code's rates keep ``name``), with its rates; a key's own
    override (``"key"``) or a policy not read yet in this process shows the decision's
    limit without a window.
    """

    __slots__ = ("_dynamic", "_items", "_limiter", "name", "policy_header")

    def __init__(self, limiter: Limiter, name: str) -> None:
        kind = check_limiter(limiter)
        quotas: list[tuple[int, int | None]] = []
        if isinstance(kind, TokenBucket):
            rate = kind.rate
            quotas.append((kind.burst, seconds_header(kind.burst * rate.window / rate.limit)))
        elif isinstance(kind, (FixedWindow, SlidingWindow)):
            quotas.extend((r.limit, seconds_header(r.window)) for r in kind.rates)
        self.name = self.check_name(name)
        self._limiter = kind
        self._items, self.policy_header = self._quota(name, quotas)
        # (policy name, policy) -> its items and header; a handful of tiers
        self._dynamic: dict[tuple[str, object], tuple[list[tuple[str, int]], bytes]] = {}

    @staticmethod
    def _quota(
        name: str, quotas: list[tuple[int, int | None]]
    ) -> tuple[list[tuple[str, int]], bytes]:
        if len(quotas) == 1:
            names = [sf_string(name)]
        else:
            names = [sf_string(f"{name}-{i}") for i in range(1, len(quotas) + 1)]
        header = ", ".join(
            f"{n};q={q}" + ("" if w is None else f";w={w}")
            for n, (q, w) in zip(names, quotas, strict=True)
        ).encode("ascii")
        return [(n, q) for n, (q, _) in zip(names, quotas, strict=True)], header

    def _for(self, decision: Decision) -> tuple[list[tuple[str, int]], bytes]:
        """The items and ``RateLimit-Policy`` of the policy ``decision`` obeyed."""
        name = decision.policy
        policies = self._limiter._policies
        if name is None or policies is None or name == "default":
            return self._items, self.policy_header
        policy = policies.known(name)
        found = self._dynamic.get((name, policy or decision.limit))
        if found is not None:
            return found
        quotas: list[tuple[int, int | None]] = [(decision.limit, None)]
        if policy is not None and isinstance(self._limiter, TokenBucket):
            rate = policy.rates[0]
            quotas = [(rate.limit, seconds_header(rate.window))]
        elif policy is not None:
            quotas = [(r.limit, seconds_header(r.window)) for r in policy.rates]
        try:
            found = self._quota(name, quotas)
        except ValueError:  # a name a header cannot carry: the limiter's own
            found = self._quota(self.name, quotas)
        if len(self._dynamic) < 256:
            self._dynamic[name, policy or decision.limit] = found
        return found

    @staticmethod
    def check_name(name: object) -> str:
        """A policy name: a non-empty printable-ASCII ``str``."""
        check_key(name, "policy_name")
        assert isinstance(name, str)
        sf_string(name)
        return name

    @staticmethod
    def _item(items: list[tuple[str, int]], limit: int) -> str:
        for item, quota in items:
            if quota == limit:
                return item
        return items[0][0]

    @staticmethod
    def reset_seconds(decision: Decision) -> int:
        """``t`` of the ``RateLimit`` field: for a denied request when this cost could pass
        (it equals ``Retry-After``); otherwise when the quota is fully replenished."""
        if decision.allowed:
            return _whole(decision.reset_after)
        return seconds_header(decision.retry_after)

    def ratelimit(self, decision: Decision) -> bytes:
        """The ``RateLimit`` field: remaining quota and seconds until it resets."""
        item = self._item(self._for(decision)[0], decision.limit)
        return f"{item};r={decision.remaining};t={self.reset_seconds(decision)}".encode("ascii")

    def headers(self, decision: Decision, legacy: bool = False) -> list[tuple[bytes, bytes]]:
        """The fields an admitted or a limited response carries; with ``legacy``, also
        ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset`` (a Unix time in whole seconds,
        as GitHub and most clients read it: when ``t`` of ``RateLimit`` runs out)."""
        fields = [
            (b"ratelimit-policy", self._for(decision)[1]),
            (b"ratelimit", self.ratelimit(decision)),
        ]
        if not decision.allowed:
            fields.append(retry_after_field(decision.retry_after))
        if legacy:
            t = self.reset_seconds(decision)
            fields += [
                (b"x-ratelimit-limit", str(decision.limit).encode()),
                (b"x-ratelimit-remaining", str(decision.remaining).encode()),
                (b"x-ratelimit-reset", str(math.ceil(time.time()) + t).encode()),
            ]
        return fields


# -- refusals users shape ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the rate limit refuses, as a ``respond=`` hook is given it.

    ``status`` is 429 (limited) or 503 (the backend is unreachable and the limit fails
    closed); ``headers`` the fields the default answer carries (lower-case names:
    ``retry-after`` always, ``ratelimit-policy`` and ``ratelimit`` on a 429, the
    ``x-ratelimit-*`` trio with ``legacy_headers``); ``retry_after`` the whole seconds of
    ``Retry-After``; ``detail`` the default problem text; ``decision`` and ``policy`` the
    denied decision and its policy name (``None`` on a 503); ``scope`` the request's.
    """

    status: int
    detail: str
    headers: dict[str, str]
    retry_after: int
    decision: Decision | None
    policy: str | None
    scope: Scope


def refusal(
    status: int,
    detail: str,
    fields: Sequence[tuple[bytes, bytes]],
    scope: Scope,
    decision: Decision | None = None,
    policy: str | None = None,
) -> Refusal:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in fields}
    return Refusal(status, detail, headers, int(headers["retry-after"]), decision, policy, scope)


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


def unavailable_detail(what: str) -> str:
    """The detail of a 503 when the ``what`` backend (``"rate limit"``...) is unreachable."""
    return f"the {what} backend is unavailable; try again later"


def problem_body(status: int, detail: str, **extra: Any) -> bytes:
    """An RFC 9457 problem document (``type`` is ``about:blank``: the title is the status)."""
    doc = {
        "type": "about:blank",
        "title": _TITLES.get(status) or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        **extra,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


async def send_problem(
    send: Send,
    status: int,
    detail: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer with a problem document and the given extra headers."""
    body = problem_body(status, detail)
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
