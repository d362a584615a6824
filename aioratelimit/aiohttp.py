"""aiohttp middlewares: rate limits and ``Idempotency-Key`` handling for aiohttp.web.

Needs the ``aiohttp`` extra. The same rules, key helpers, answers and fields as
``aioratelimit.asgi``, for asyncio's server that speaks no ASGI::

    from aiohttp import web
    from aioratelimit.aiohttp import IdempotencyMiddleware, RateLimitMiddleware, Rule

    app = web.Application(
        middlewares=[
            RateLimitMiddleware(
                arl.SlidingWindow("100/minute"),
                rules=[Rule("POST", "/orders/{id}", arl.TokenBucket("5/second"))],
                exempt=["/health"],
            ),
            IdempotencyMiddleware(routes=["/payments"], require=True),
        ]
    )

A client function (``client=``) reads the request as the ASGI scope an ASGI server would
have built (``scope_of``), with the aiohttp request itself in ``scope["aiohttp.request"]``
and an authentication middleware's ``request["user"]`` in ``scope["user"]``.
"""

from __future__ import annotations

from . import _public

# Before ``_public.publish`` below: the web names both faces export (client_ip, Rule...)
# are asgi's, which claims them first.
from . import asgi as _asgi  # noqa: F401
from ._web.aiohttp_middleware import (
    IdempotencyMiddleware,
    RateLimitMiddleware,
    RespondWithResponse,
    scope_of,
)
from ._web.answers import Refusal
from ._web.clients import ClientFunc, client_ip, credentials, header, path_param, user_id
from ._web.idempotency_flow import STORED, FingerprintFunc, request_fingerprint
from ._web.plans import Choice, LimiterFunc
from ._web.ratelimit import Rule

__all__ = [
    "Choice",
    "ClientFunc",
    "FingerprintFunc",
    "IdempotencyMiddleware",
    "LimiterFunc",
    "RateLimitMiddleware",
    "Refusal",
    "RespondWithResponse",
    "Rule",
    "STORED",
    "client_ip",
    "credentials",
    "header",
    "path_param",
    "request_fingerprint",
    "scope_of",
    "user_id",
]


_public.publish(__name__, __all__)
