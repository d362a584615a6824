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

# Defined in this module before the web layer was split; still importable from here.
from ._asgi_idempotency import MAX_IDEMPOTENCY_KEY as MAX_IDEMPOTENCY_KEY
from ._asgi_idempotency import IdempotencyMiddleware
from ._asgi_idempotency import parse_idempotency_key as parse_idempotency_key
from ._asgi_ratelimit import RateLimitMiddleware, Rule
from ._request_keys import KeyFunc, client_ip, header, path_param, user_id

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
