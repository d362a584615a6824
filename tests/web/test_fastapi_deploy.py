"""A FastAPI payment service as users write it, on real uvicorn and memory:// or a real Redis:
``@arl.idempotent`` returning a pydantic model, ``Depends(IdempotencyKey(...))`` scoped per
account by the route's own auth dependency, tiers, and refusals shaped by the app."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from support.pace import until
from support.webserver import fresh_backend, serving

import aioratelimit as arl
from aioratelimit.fastapi import (
    IdempotencyKey,
    IdempotentRequest,
    RateLimit,
    Refusal,
    Scope,
    add_problem_handler,
    header,
)


class PaymentIn(BaseModel):
    amount: int


class PaymentOut(BaseModel):
    account: str
    amount: int
    charge: int


class Account(BaseModel):
    id: str


ACCOUNTS = {"tok-alice": "alice", "tok-bob": "bob"}


async def current_account(authorization: Annotated[str, Header()] = "") -> Account:
    """The route's own auth: a bearer token names the account (FastAPI never fills
    ``scope["user"]``)."""
    account = ACCOUNTS.get(authorization.removeprefix("Bearer "))
    if account is None:
        raise HTTPException(401, "unknown or expired token")
    return Account(id=account)


def payments_app(
    backend: arl.Backend,
    charged: list[int],
    hold: threading.Event | None = None,
    **options: object,
) -> FastAPI:
    """The payment service; a charge of 99 runs until ``hold`` is set (the test's thread)."""
    app = FastAPI()
    add_problem_handler(app)
    once = IdempotencyKey(client=Depends(current_account), backend=backend, **options)  # type: ignore[arg-type]

    async def charge(account: Account, payment: PaymentIn) -> PaymentOut:
        charged.append(payment.amount)
        if payment.amount == 99 and hold is not None:
            await asyncio.to_thread(hold.wait, 30)
        if payment.amount == 13:
            raise HTTPException(502, "the provider failed")
        return PaymentOut(account=account.id, amount=payment.amount, charge=len(charged))

    @app.post("/payments", status_code=201)
    async def pay(
        payment: PaymentIn,
        account: Annotated[Account, Depends(current_account)],
        idem: IdempotentRequest = Depends(once),  # noqa: B008 (FastAPI's idiom; a local)
    ) -> PaymentOut:
        return await idem.run(charge, account, payment)

    return app


def auth(token: str, key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if key is not None:
        headers["Idempotency-Key"] = f'"{key}"'
    return headers


async def test_an_idempotent_function_returning_a_model_charges_once(store_url: str) -> None:
    """POST twice with one Idempotency-Key to an endpoint calling @arl.idempotent that returns
    a pydantic model: one charge, the same 201 body twice."""
    backend = fresh_backend(store_url)
    charged: list[int] = []
    app = FastAPI()

    @arl.idempotent(key=lambda key, payment: key, backend=backend)
    async def charge(key: str, payment: PaymentIn) -> PaymentOut:
        charged.append(payment.amount)
        return PaymentOut(account="alice", amount=payment.amount, charge=len(charged))

    @app.post("/payments", status_code=201)
    async def pay(payment: PaymentIn, idempotency_key: Annotated[str, Header()]) -> PaymentOut:
        result = await charge(idempotency_key, payment)
        assert type(result) is PaymentOut  # replays come back as the model too
        return result

    async with serving(app, backend) as client:
        responses = [
            await client.post("/payments", json={"amount": 5}, headers={"Idempotency-Key": "o1"})
            for _ in range(2)
        ]
    assert [r.status_code for r in responses] == [201, 201]
    assert (
        responses[0].json()
        == responses[1].json()
        == {
            "account": "alice",
            "amount": 5,
            "charge": 1,
        }
    )
    assert charged == [5]


async def test_the_dependency_scopes_keys_per_account(store_url: str) -> None:
    """Depends(IdempotencyKey(client=Depends(current_account))): alice's retry (from anywhere) is a
    replay marked Idempotent-Replayed; bob's request with the same key is his own."""
    backend = fresh_backend(store_url)
    charged: list[int] = []
    async with serving(payments_app(backend, charged), backend) as client:
        first = await client.post("/payments", json={"amount": 5}, headers=auth("tok-alice", "k"))
        retry = await client.post("/payments", json={"amount": 5}, headers=auth("tok-alice", "k"))
        bob = await client.post("/payments", json={"amount": 5}, headers=auth("tok-bob", "k"))
    assert [first.status_code, retry.status_code, bob.status_code] == [201, 201, 201]
    assert "idempotent-replayed" not in first.headers
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == first.json() == {"account": "alice", "amount": 5, "charge": 1}
    assert bob.json()["account"] == "bob"
    assert charged == [5, 5]


async def test_the_dependency_takes_a_client_function_too(store_url: str) -> None:
    """IdempotencyKey(client=header("X-Account")): keys are scoped by a client function of
    the scope, as the middleware's; the same key from two accounts charges twice."""
    backend = fresh_backend(store_url)
    charged: list[int] = []
    app = FastAPI()
    once = IdempotencyKey(client=header("X-Account"), backend=backend)

    async def charge(payment: PaymentIn) -> PaymentOut:
        charged.append(payment.amount)
        return PaymentOut(account="-", amount=payment.amount, charge=len(charged))

    @app.post("/charges", status_code=201)
    async def pay(
        payment: PaymentIn,
        idem: IdempotentRequest = Depends(once),  # noqa: B008 (FastAPI's idiom; a local)
    ) -> PaymentOut:
        return await idem.run(charge, payment)

    async with serving(app, backend) as client:
        responses = [
            await client.post(
                "/charges",
                json={"amount": 5},
                headers={"X-Account": account, "Idempotency-Key": '"k"'},
            )
            for account in ("a", "a", "b")
        ]
    assert [r.status_code for r in responses] == [201, 201, 201]
    assert [r.headers.get("idempotent-replayed") for r in responses] == [None, "true", None]
    assert charged == [5, 5]


async def test_the_dependency_refuses_what_the_draft_refuses(store_url: str) -> None:
    """Missing key 400, another body 422, a duplicate while the first runs 409 with
    Retry-After, an expired token 401 without claiming; a raising endpoint frees the key."""
    backend = fresh_backend(store_url)
    charged: list[int] = []
    hold = threading.Event()
    async with serving(payments_app(backend, charged, hold), backend) as client:
        missing = await client.post("/payments", json={"amount": 5}, headers=auth("tok-alice"))
        expired = await client.post("/payments", json={"amount": 5}, headers=auth("old", "e"))
        fresh = await client.post("/payments", json={"amount": 5}, headers=auth("tok-alice", "e"))
        other = await client.post("/payments", json={"amount": 6}, headers=auth("tok-alice", "e"))
        first = asyncio.ensure_future(
            client.post("/payments", json={"amount": 99}, headers=auth("tok-alice", "r"))
        )
        try:
            # The duplicate comes while the first runs (after a fixed pause, a loaded machine
            # could let the first end before it: a replay, not a 409).
            await until(lambda: 99 in charged, what="the first charge running")
            duplicate = await client.post(
                "/payments", json={"amount": 99}, headers=auth("tok-alice", "r")
            )
        finally:
            hold.set()
        raced = [await first, duplicate]
        failed = await client.post("/payments", json={"amount": 13}, headers=auth("tok-alice", "f"))
        refailed = await client.post(
            "/payments", json={"amount": 13}, headers=auth("tok-alice", "f")
        )
    assert missing.status_code == 400
    assert missing.headers["content-type"] == "application/problem+json"
    assert (expired.status_code, fresh.status_code) == (401, 201)
    assert other.status_code == 422
    assert sorted(r.status_code for r in raced) == [201, 409]
    conflict = next(r for r in raced if r.status_code == 409)
    assert conflict.headers["retry-after"] == "1"
    assert (failed.status_code, refailed.status_code) == (502, 502)
    assert charged.count(13) == 2  # the failure stored nothing: the retry ran
    assert charged.count(99) == 1


# -- tiers and shaped refusals in the dependency ------------------------------------------


async def test_the_dependency_picks_a_tier_and_shapes_its_429(store_url: str) -> None:
    """RateLimit(function) picks free/pro by API key; respond= builds the 429 (rendered by
    add_problem_handler); legacy_headers adds X-RateLimit-*."""
    backend = fresh_backend(store_url)
    free = arl.FixedWindow("2/minute", backend=backend, name="free")
    pro = arl.FixedWindow("50/minute", backend=backend, name="pro")

    def tier(scope: Scope) -> arl.Limiter:
        return pro if dict(scope["headers"]).get(b"x-api-key") == b"k-pro" else free

    def respond(refusal: Refusal) -> JSONResponse:
        return JSONResponse(
            {"upgrade": "https://example.com/pricing", "policy": refusal.policy},
            status_code=refusal.status,
            headers=refusal.headers,
        )

    limit = RateLimit(tier, client=header("X-API-Key"), legacy_headers=True, respond=respond)
    app = FastAPI()
    add_problem_handler(app)

    @app.get("/search", dependencies=[Depends(limit)])
    async def search() -> list[str]:
        return ["a"]

    async with serving(app, backend) as client:
        before = time.time()
        free_codes = [await client.get("/search", headers={"X-API-Key": "k-free"}) for _ in "abc"]
        pro_one = await client.get("/search", headers={"X-API-Key": "k-pro"})
        after = time.time()
    assert [r.status_code for r in free_codes] == [200, 200, 429]
    denied = free_codes[2]
    assert denied.json() == {"upgrade": "https://example.com/pricing", "policy": "free"}
    assert denied.headers["ratelimit-policy"] == '"free";q=2;w=60'
    assert denied.headers["x-ratelimit-remaining"] == "0"
    # The window ends at most 60 s after the hit; the header rounds the clock up (<= 1 s).
    assert before < int(denied.headers["x-ratelimit-reset"]) <= after + 61
    assert int(denied.headers["retry-after"]) >= 1
    assert pro_one.headers["ratelimit-policy"] == '"pro";q=50;w=60'
    assert pro_one.headers["x-ratelimit-limit"] == "50"


async def test_a_shaped_refusal_keeps_status_and_headers_without_the_handler() -> None:
    """Without add_problem_handler, a respond= refusal still has its status and headers."""
    backend = fresh_backend("memory://")
    limit = RateLimit(
        arl.FixedWindow("1/minute", backend=backend),
        respond=lambda r: JSONResponse({"x": 1}, status_code=r.status, headers=r.headers),
    )
    app = FastAPI()

    @app.get("/", dependencies=[Depends(limit)])
    async def root() -> int:
        return 1

    async with serving(app, backend) as client:
        codes = [await client.get("/") for _ in "ab"]
    assert [r.status_code for r in codes] == [200, 429]
    assert "retry-after" in codes[1].headers
    assert codes[1].headers["ratelimit"].startswith('"default";r=0;t=')


def test_the_dependency_refuses_bad_options() -> None:
    """Bad client, fingerprint, serializer, wait or limiter raise when built."""
    with pytest.raises(TypeError, match="client"):
        IdempotencyKey(client="me")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fingerprint"):
        IdempotencyKey(fingerprint=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="serializer"):
        IdempotencyKey(serializer=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wait must be a bool"):
        IdempotencyKey(wait=5.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="or a function"):
        RateLimit("10/minute")  # type: ignore[arg-type]


async def test_the_dependency_fails_closed_or_open_when_redis_is_down(own_redis: Any) -> None:
    """Redis stopped: 503 with Retry-After and no charge by default;
    ``on_unavailable="allow"`` charges unprotected."""
    closed_backend = fresh_backend(own_redis.url)
    open_backend = fresh_backend(own_redis.url)
    charged: list[int] = []
    closed = payments_app(closed_backend, charged)
    opened = payments_app(open_backend, charged, on_unavailable="allow")
    async with serving(closed, closed_backend) as c1, serving(opened, open_backend) as c2:
        own_redis.stop()
        down = await c1.post("/payments", json={"amount": 5}, headers=auth("tok-alice", "k"))
        through = await c2.post("/payments", json={"amount": 7}, headers=auth("tok-alice", "k"))
    assert down.status_code == 503
    assert down.headers["retry-after"] == "5"
    assert through.status_code == 201
    assert charged == [7]
