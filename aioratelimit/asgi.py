"""ASGI middleware: rate limits and ``Idempotency-Key`` handling for any ASGI application.

Pure ASGI (Starlette, FastAPI, Litestar, Quart, a bare callable...): importing this module
imports no web framework.

::

    from aioratelimit.asgi import RateLimitMiddleware, Rule, client_ip

    app = RateLimitMiddleware(
        app,
        limiter=arl.SlidingWindow("100/minute"),
        client=client_ip(),
        rules=[Rule("POST", "/orders/{id}", arl.TokenBucket("5/second"))],
        exempt=["/health"],
    )
    app = IdempotencyMiddleware(app, routes=["/payments"], require=True)

Type aliases for code that plugs into it: ``Scope``, ``Receive``, ``Send``, ``Message`` and
``ASGIApp`` (the ASGI shapes), ``ClientFunc`` (``client=``), ``LimiterFunc`` and ``Choice``
(a limiter picked per request), ``RespondWithApp`` and ``Refusal`` (``respond=``),
``FingerprintFunc`` (``fingerprint=``), ``CostFunc`` (``cost_from=``).

Counting by the response (``cost_from=``: a ``Served`` view to a cost): ``skip_status``,
``only_status``, ``body_bytes`` and ``reported`` (what the endpoint said with
``report_cost``); ``ResponseMeter`` lets the FastAPI dependency do it.
"""

from __future__ import annotations

from . import _public
from ._web.answers import Refusal, RespondWithApp
from ._web.clients import ClientFunc, client_ip, credentials, header, path_param, user_id
from ._web.idempotency import IdempotencyMiddleware
from ._web.idempotency_flow import STORED, FingerprintFunc, request_fingerprint
from ._web.metering import (
    CostFunc,
    ResponseMeter,
    Served,
    body_bytes,
    only_status,
    report_cost,
    reported,
    skip_status,
)
from ._web.plans import Choice, LimiterFunc
from ._web.ratelimit import RateLimitMiddleware, Rule
from ._web.routes import route_path
from ._web.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "ASGIApp",
    "Choice",
    "ClientFunc",
    "CostFunc",
    "FingerprintFunc",
    "IdempotencyMiddleware",
    "LimiterFunc",
    "Message",
    "RateLimitMiddleware",
    "Receive",
    "Refusal",
    "RespondWithApp",
    "ResponseMeter",
    "Rule",
    "STORED",
    "Scope",
    "Send",
    "Served",
    "body_bytes",
    "client_ip",
    "credentials",
    "header",
    "only_status",
    "path_param",
    "report_cost",
    "reported",
    "request_fingerprint",
    "route_path",
    "skip_status",
    "user_id",
]


_public.publish(__name__, __all__)
