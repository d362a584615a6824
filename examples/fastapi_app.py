"""A FastAPI service with aioratelimit's web integration: rate limits, one-shot tokens and
idempotent POSTs.

Run it (uvicorn on http://127.0.0.1:8000; the embedded memory:// store unless REDIS_URL is
set, e.g. REDIS_URL=redis://127.0.0.1:6379/0)::

    pip install -e '.[web]'
    python examples/fastapi_app.py

Then, for instance::

    curl -i http://127.0.0.1:8000/items/1                  # RateLimit headers
    curl -i http://127.0.0.1:8000/search?q=x               # 5/second per client, then 429
    curl -s -X POST http://127.0.0.1:8000/tokens           # {"token": "...", ...}
    curl -i -X POST -H 'X-Token: <token>' http://127.0.0.1:8000/confirm   # 200, then 403
    curl -i -X POST -H 'Idempotency-Key: "order-1"' -H 'Content-Type: application/json' \\
         -d '{"amount": 5, "currency": "EUR"}' http://127.0.0.1:8000/payments  # 201, replays

What is where:

- ``RateLimitMiddleware``: every route 100 requests per minute per client IP (a sliding
  window), ``POST /payments`` 10 per minute, ``/health`` and the docs exempt;
- ``Depends(RateLimit(...))``: ``/search`` also 5 per second per client (a token bucket),
  declared on the route alone, with no ``request`` parameter in the endpoint;
- ``POST /tokens`` issues one-shot tokens, ``Depends(ConsumeToken(...))`` on ``/confirm``
  lets each through once (from the ``X-Token`` header or a ``token`` form field);
- ``IdempotencyMiddleware``: ``POST /payments`` needs an ``Idempotency-Key`` and runs once
  per key; a retry gets the stored 201 with ``Idempotent-Replayed: true``.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import Depends, FastAPI
from pydantic import BaseModel, Field

import aioratelimit as arl
from aioratelimit.asgi import IdempotencyMiddleware, RateLimitMiddleware, Rule, client_ip
from aioratelimit.fastapi import ConsumeToken, RateLimit, add_problem_handler


class PaymentIn(BaseModel):
    amount: int = Field(gt=0)
    currency: str = Field(min_length=3, max_length=3)


class PaymentOut(BaseModel):
    id: str
    amount: int
    currency: str
    status: str


def create_app(
    *, rate_limit: bool = True, limit: str = "100/minute", backend: arl.Backend | None = None
) -> FastAPI:
    """The service. ``rate_limit=False`` leaves the RateLimitMiddleware out (the benchmark's
    baseline); ``backend`` defaults to ``arl.get_backend()`` (REDIS_URL, else memory://)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await (backend or arl.get_backend()).aclose()

    app = FastAPI(title="aioratelimit example", lifespan=lifespan)
    add_problem_handler(app)  # 429/403/503 from the dependencies as application/problem+json
    payments: dict[str, PaymentOut] = {}
    search_limit = RateLimit(arl.TokenBucket("5/second", backend=backend, name="search"))

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int | str]:
        return {"id": item_id, "name": f"item {item_id}"}

    @app.get("/search", dependencies=[Depends(search_limit)])
    async def search(q: str = "") -> dict[str, list[str]]:
        return {"results": [f"{q}-{i}" for i in range(3)]}

    @app.post("/tokens")
    async def new_token() -> dict[str, str | int]:
        token = await arl.issue_token(ttl=600.0, backend=backend)
        return {"token": token, "expires_in": 600}

    @app.post("/confirm")
    async def confirm(
        token: str = Depends(ConsumeToken(header="X-Token", field="token", backend=backend)),
    ) -> dict[str, bool]:
        return {"confirmed": True}

    @app.post("/payments", status_code=201)
    async def pay(payment: PaymentIn) -> PaymentOut:
        out = PaymentOut(id=uuid.uuid4().hex, status="captured", **payment.model_dump())
        payments[out.id] = out
        return out

    @app.get("/payments")
    async def list_payments() -> list[PaymentOut]:
        return list(payments.values())

    # The last middleware added is the outermost: limits first, then idempotency keys.
    app.add_middleware(IdempotencyMiddleware, backend=backend, routes=["/payments"], require=True)
    if rate_limit:
        app.add_middleware(
            RateLimitMiddleware,
            limiter=arl.SlidingWindow(limit, backend=backend),
            client=client_ip(),
            rules=[
                Rule(
                    "POST",
                    "/payments",
                    arl.FixedWindow("10/minute", backend=backend, name="payments"),
                )
            ],
            exempt=["/health", "/docs", "/openapi.json"],
        )
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--limit", default="100/minute", help="the per-client default limit")
    parser.add_argument("--no-rate-limit", action="store_true", help="leave the middleware out")
    parser.add_argument("--prefix", default="arl", help="the key prefix in Redis")
    args = parser.parse_args()
    arl.configure(prefix=args.prefix)  # REDIS_URL, else memory:// (logged once)
    app = create_app(rate_limit=not args.no_rate_limit, limit=args.limit)
    # proxy_headers=False: scope["client"] stays the socket peer, which client_ip() judges
    # (uvicorn would otherwise rewrite it from X-Forwarded-For sent by 127.0.0.1).
    uvicorn.run(app, host=args.host, port=args.port, proxy_headers=False, access_log=False)


if __name__ == "__main__":
    main()
