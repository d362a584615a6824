"""Counting by the response: a request admitted on an estimate (a ``Reservation``) is
settled to the cost its response decides, once the response has been sent.

A rule or dependency with ``cost_from=`` reserves its ``cost`` when the request comes in;
the request's ``Meter`` (one per request, in the scope under ``METER``) watches the ASGI
messages the app sends (the status, the headers, the body bytes as they go: nothing is
buffered) and, right after the last body chunk went out, or when the app ends without
one (the client went away, the app raised), hands each cost function a ``Served`` view
and settles each reservation to its answer, in the background (``Reservation.settle``).

What the endpoint reports (``report_cost``) goes into the meter through the scope: server
side only, so a client can never name its own cost (no request or response header is read
for it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from .._limits.reservation import Reservation
from .types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("aioratelimit")

#: The scope entry of a request's ``Meter``.
METER = "aioratelimit.meter"


class Served:
    """What a response did, as a ``cost_from`` function is given it (read-only).

    ``status`` is the response's status (None: the app sent none, it raised or the client
    left first); ``headers`` its header fields as ``(name, value)`` pairs, names in lower
    case (``header(name)`` reads one); ``body_bytes`` the body bytes passed to the server,
    counted as they went; ``complete`` whether the last body chunk was sent (False: the
    client disconnected or the app raised part way); ``reported`` what the endpoint
    reported with ``report_cost`` (None: nothing); ``estimate`` the cost the request was
    admitted on (the rule's ``cost``).
    """

    __slots__ = ("body_bytes", "complete", "estimate", "headers", "reported", "status")

    def __init__(
        self,
        status: int | None,
        headers: tuple[tuple[str, str], ...],
        body_bytes: int,
        complete: bool,
        reported: int | None,
        estimate: int,
    ) -> None:
        self.status, self.headers, self.body_bytes = status, headers, body_bytes
        self.complete, self.reported, self.estimate = complete, reported, estimate

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def __repr__(self) -> str:
        return (
            f"<Served status={self.status} body_bytes={self.body_bytes}"
            f" complete={self.complete} reported={self.reported} estimate={self.estimate}>"
        )


#: ``cost_from=``: the actual cost of a request from its ``Served`` response (an int from
#: 0 up), or None to keep the estimate.
CostFunc = Callable[[Served], "int | None"]


def check_cost_func(cost_from: object) -> CostFunc | None:
    if cost_from is not None and not callable(cost_from):
        raise TypeError(f"cost_from must be a callable or None, not {type(cost_from).__name__}")
    return cost_from


class Meter:
    """One request's response, watched, and the reservations to settle by it."""

    __slots__ = ("_pending", "body_bytes", "complete", "headers", "reported", "status")

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: tuple[tuple[str, str], ...] = ()
        self.body_bytes = 0
        self.complete = False
        self.reported: int | None = None
        self._pending: list[tuple[Reservation, CostFunc]] = []

    def add(self, reservation: Reservation, cost_from: CostFunc) -> None:
        """Settle ``reservation`` to ``cost_from``'s answer once the response is sent."""
        self._pending.append((reservation, cost_from))

    def watch(self, send: Send) -> Send:
        """``send`` that tells this meter what goes out, and settles after the last chunk."""

        async def metered(message: Message) -> None:
            await send(message)
            kind = message["type"]
            if kind == "http.response.start":
                self.status = int(message["status"])
                self.headers = tuple(
                    (bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1"))
                    for k, v in message.get("headers", ())
                )
            elif kind == "http.response.body":
                # Counted once the server took it: a send that raised (the client gone)
                # did not serve its chunk.
                self.body_bytes += len(message.get("body", b""))
                if not message.get("more_body", False):
                    self.complete = True
                    self.settle()

        return metered

    def settle(self) -> None:
        """Settle every pending reservation by the response so far, once (later calls do
        nothing); never raises: the response has been sent, nobody is there to hear it."""
        pending, self._pending = self._pending, []
        for reservation, cost_from in pending:
            estimate = reservation.estimate
            served = Served(
                self.status, self.headers, self.body_bytes, self.complete, self.reported, estimate
            )
            try:
                actual = cost_from(served)
                if actual is not None and actual != estimate:
                    reservation.settle(actual)
            except Exception as exc:  # the estimate stands
                log.error("aioratelimit: cost_from failed for %r: %r", served, exc)

    def __repr__(self) -> str:
        return (
            f"<Meter status={self.status} body_bytes={self.body_bytes}"
            f" complete={self.complete} pending={len(self._pending)}>"
        )


def report_cost(request_or_scope: Any, cost: int) -> bool:
    """Report ``cost`` (an int from 0 up) for the request, added to what it reported before:
    what ``reported()`` (or a ``cost_from`` reading ``Served.reported``) settles its
    reservation to. Call it before the response's last body chunk is sent (from a
    streamed body's generator: before it ends). ``request_or_scope`` is a Starlette or
    FastAPI ``Request``, or an ASGI scope. Returns whether a meter heard it (False: no
    rule or dependency counts this request by its response; nothing happens)."""
    if type(cost) is not int:
        raise TypeError(f"cost must be an int, not {type(cost).__name__}")
    if cost < 0:
        raise ValueError(f"cost must be 0 or more, got {cost}")
    scope = getattr(request_or_scope, "scope", request_or_scope)
    meter = scope.get(METER) if isinstance(scope, dict) else None
    if not isinstance(meter, Meter):
        return False
    meter.reported = (meter.reported or 0) + cost
    return True


def meter_of(scope: Scope) -> tuple[Meter, bool]:
    """The request's meter and whether it is new here (then the caller owns it: it must
    run the app through ``owned(...)``)."""
    meter = scope.get(METER)
    if isinstance(meter, Meter):
        return meter, False
    meter = scope[METER] = Meter()
    return meter, True


async def owned(meter: Meter, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run ``app`` with ``meter`` watching its messages; whatever the app did, the meter
    settles when it ends (the last chunk never went out: ``complete`` is False)."""
    try:
        await app(scope, receive, meter.watch(send))
    finally:
        meter.settle()


class ResponseMeter:
    """ASGI middleware that lets a FastAPI ``RateLimit(..., cost_from=...)`` dependency
    count a request by its response: ``app.add_middleware(ResponseMeter)``.

    A dependency runs inside the endpoint's call and never sees the response go out; this
    watches it (status, headers, body bytes as they go) and settles what the request's
    dependencies reserved, once the last body chunk was sent. Under a ``RateLimitMiddleware``
    that already watches the request (a ``cost_from`` rule), it only passes it on. WebSocket
    and lifespan scopes pass through untouched.
    """

    __slots__ = ("app",)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        meter, new = meter_of(scope)
        if new:
            await owned(meter, self.app, scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def __repr__(self) -> str:
        return f"<ResponseMeter {self.app!r}>"


# -- the common cost functions ---------------------------------------------------------------


def _statuses(statuses: Iterable[int | range], what: str) -> frozenset[int]:
    found: set[int] = set()
    for s in statuses:
        items = s if isinstance(s, range) else (s,)
        for status in items:
            if type(status) is not int:
                raise TypeError(f"{what} takes int statuses or ranges, not {status!r}")
            if not 100 <= status <= 599:
                raise ValueError(f"{what}: {status} is not an HTTP status (100 to 599)")
            found.add(status)
    if not found:
        raise ValueError(f"{what} needs at least one status")
    return frozenset(found)


def skip_status(*statuses: int | range) -> CostFunc:
    """A ``cost_from`` that counts nothing for a response of one of ``statuses`` (``304``,
    ``range(500, 600)``), the estimate for any other; a response that sent no status keeps
    the estimate."""
    skipped = _statuses(statuses, "skip_status")

    def cost(served: Served) -> int:
        return 0 if served.status in skipped else served.estimate

    return cost


def only_status(*statuses: int | range) -> CostFunc:
    """A ``cost_from`` that counts the estimate only for a response of one of ``statuses``
    (failed logins: ``401, 403``), nothing for any other; a response that sent no status
    keeps the estimate."""
    counted = _statuses(statuses, "only_status")

    def cost(served: Served) -> int:
        if served.status is None or served.status in counted:
            return served.estimate
        return 0

    return cost


def body_bytes(unit: int = 1) -> CostFunc:
    """A ``cost_from`` that counts the response body's bytes passed to the server (a
    disconnect: those sent until then), in ``unit``s rounded up (``unit=1024``: KiB)."""
    if type(unit) is not int:
        raise TypeError(f"unit must be an int, not {type(unit).__name__}")
    if unit < 1:
        raise ValueError(f"unit must be 1 or more, got {unit}")

    def cost(served: Served) -> int:
        return -(-served.body_bytes // unit)

    return cost


def reported() -> CostFunc:
    """A ``cost_from`` that counts what the endpoint reported (``report_cost``); the
    estimate when it reported nothing."""

    def cost(served: Served) -> int:
        return served.estimate if served.reported is None else served.reported

    return cost
