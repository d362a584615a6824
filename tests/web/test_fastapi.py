"""FastAPI dependencies and the example service, on a real uvicorn server and a real Redis."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from support import jobs
from support.servers import RedisServer, free_port
from support.webserver import Server, fresh_backend, serving

import aioratelimit as arl
from aioratelimit.fastapi import (
    ConsumeToken,
    ProblemException,
    RateLimit,
    add_problem_handler,
    header,
)

ROOT = Path(__file__).resolve().parents[2]


def load_example() -> ModuleType:
    """examples/fastapi_app.py as a module (registered, so pydantic can resolve its models)."""
    name = "aioratelimit_example_fastapi_app"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "fastapi_app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def limited_app(backend: arl.Backend, *, problems: bool = True, **options: Any) -> FastAPI:
    """Endpoints guarded only by the dependencies (no middleware), none taking a request."""
    app = FastAPI()
    if problems:
        add_problem_handler(app)
    limit = RateLimit(arl.FixedWindow("3/minute", backend=backend), **options)

    @app.get("/limited", dependencies=[Depends(limit)])
    async def limited() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/decision")
    async def decision(
        d: arl.Decision | None = Depends(limit),  # noqa: B008 (FastAPI's idiom)
    ) -> dict[str, int | None]:
        return {"remaining": None if d is None else d.remaining}

    @app.post("/tokens")
    async def tokens(user: str | None = None) -> dict[str, str]:
        return {"token": await arl.issue_token(ttl=60.0, subject=user, backend=backend)}

    @app.post("/use")
    async def use(
        token: str = Depends(ConsumeToken(header="X-Token", field="token", backend=backend)),
    ) -> dict[str, bool]:
        return {"used": True}

    @app.post("/mine")
    async def mine(
        token: str = Depends(ConsumeToken(subject=header("X-User"), backend=backend)),
    ) -> dict[str, bool]:
        return {"used": True}

    return app


# -- RateLimit ------------------------------------------------------------------------------


async def test_rate_limit_dependency_needs_no_request_parameter(store_url: str) -> None:
    """Depends(RateLimit(...)) admits the limit with RateLimit fields, then answers the same
    429 problem document and headers as the middleware."""
    backend = fresh_backend(store_url)
    async with serving(limited_app(backend), backend) as client:
        responses = [await client.get("/limited") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert [r.headers["ratelimit"].split(";t=")[0] for r in responses[:3]] == [
        '"default";r=2',
        '"default";r=1',
        '"default";r=0',
    ]
    assert all(r.headers["ratelimit-policy"] == '"default";q=3;w=60' for r in responses)
    denied = responses[3]
    retry = int(denied.headers["retry-after"])
    assert 1 <= retry <= 60
    assert denied.headers["ratelimit"] == f'"default";r=0;t={retry}'
    assert denied.headers["content-type"] == "application/problem+json"
    assert denied.json() == {
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Quota Exceeded",
        "status": 429,
        "detail": f"rate limit exceeded; try again in {retry} s",
        "violated-policies": ["default"],
    }


async def test_without_the_problem_handler_fastapi_answers_its_own_json() -> None:
    """ProblemException is an HTTPException: unhandled, FastAPI's default JSON body comes
    with the same status and headers."""
    backend = fresh_backend("memory://")
    app = limited_app(backend, problems=False, policy_name="api")
    async with serving(app, backend) as client:
        responses = [await client.get("/limited") for _ in range(4)]
    denied = responses[3]
    assert denied.status_code == 429
    assert denied.headers["content-type"] == "application/json"
    assert denied.json()["detail"].startswith("rate limit exceeded; try again in")
    assert denied.headers["ratelimit-policy"] == '"api";q=3;w=60'
    assert denied.headers["ratelimit"].startswith('"api";r=0;t=')
    assert "retry-after" in denied.headers
    assert issubclass(ProblemException, Exception)


async def test_the_decision_is_the_dependency_value() -> None:
    """An endpoint can take the Decision itself from the dependency."""
    backend = fresh_backend("memory://")
    async with serving(limited_app(backend), backend) as client:
        bodies = [(await client.get("/decision")).json() for _ in range(2)]
    assert bodies == [{"remaining": 2}, {"remaining": 1}]


async def test_rate_limit_dependency_backend_down(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stopped: 503 with Retry-After by default, the endpoint runs with
    ``on_unavailable="allow"``."""
    closed_backend = fresh_backend(own_redis.url)
    open_backend = fresh_backend(own_redis.url)
    closed = limited_app(closed_backend)
    opened = limited_app(open_backend, on_unavailable="allow")
    with caplog.at_level(logging.WARNING, logger="aioratelimit"):
        async with serving(closed, closed_backend) as c1, serving(opened, open_backend) as c2:
            own_redis.stop()
            down = await c1.get("/limited")
            through = await c2.get("/limited")
    assert down.status_code == 503
    assert down.headers["retry-after"] == "5"
    assert down.json()["detail"] == "the rate limit backend is unavailable; try again later"
    assert through.status_code == 200
    assert "ratelimit" not in through.headers
    messages = [r.getMessage() for r in caplog.records if r.name == "aioratelimit"]
    assert any("answering 503" in m for m in messages)
    assert any("fail open" in m for m in messages)


# -- ConsumeToken ---------------------------------------------------------------------------


async def test_consume_token_from_a_header_or_a_form_field(store_url: str) -> None:
    """A token passes once, from the header or a form field; reuse, forgery and absence are
    403; concurrent uses of one token let exactly one through."""
    backend = fresh_backend(store_url)
    async with serving(limited_app(backend), backend) as client:

        async def token() -> str:
            return str((await client.post("/tokens")).json()["token"])

        t1 = await token()
        by_header = [(await client.post("/use", headers={"X-Token": t1})).status_code for _ in "ab"]
        t2 = await token()
        by_form = [(await client.post("/use", data={"token": t2})).status_code for _ in "ab"]
        missing = await client.post("/use")
        forged = await client.post("/use", headers={"X-Token": "x" * 32})
        t3 = await token()
        raced = await asyncio.gather(
            *(client.post("/use", headers={"X-Token": t3}) for _ in range(20))
        )
    assert by_header == [200, 403]
    assert by_form == [200, 403]
    assert missing.status_code == 403
    assert missing.json()["detail"] == "a one-shot token is required"
    assert forged.status_code == 403
    assert forged.headers["content-type"] == "application/problem+json"
    assert forged.json()["detail"] == "the token is unknown, expired, already used or not yours"
    assert sorted(r.status_code for r in raced) == [200] + [403] * 19


async def test_consume_token_checks_the_subject() -> None:
    """A token issued for one subject is refused (and not burnt) for another."""
    backend = fresh_backend("memory://")
    async with serving(limited_app(backend), backend) as client:
        t = (await client.post("/tokens", params={"user": "hdr:x-user:alice"})).json()["token"]
        bob = await client.post("/mine", headers={"X-Token": t, "X-User": "bob"})
        alice = [
            (await client.post("/mine", headers={"X-Token": t, "X-User": "alice"})).status_code
            for _ in "ab"
        ]
    assert bob.status_code == 403
    assert alice == [200, 403]


def test_dependencies_reject_bad_configuration() -> None:
    """Misconfigured dependencies raise when built, not per request."""
    with pytest.raises(ValueError, match="header, a form field"):
        ConsumeToken(header=None)
    with pytest.raises(TypeError):
        RateLimit(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="can never be admitted"):
        RateLimit(arl.FixedWindow("1/minute"), cost=2)


# -- the example service --------------------------------------------------------------------


async def test_example_service_end_to_end(store_url: str) -> None:
    """The example's middleware, dependency, token and idempotency flows work together."""
    example = load_example()
    backend = fresh_backend(store_url)
    app = example.create_app(backend=backend)
    # The app's lifespan closes its backend on the server's loop.
    with Server(app, lifespan="on") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            item = await client.get("/items/7")
            health = await client.get("/health")
            searches = await asyncio.gather(*(client.get("/search?q=a") for _ in range(30)))
            token = (await client.post("/tokens")).json()["token"]
            confirms = [
                (await client.post("/confirm", headers={"X-Token": token})).status_code
                for _ in "ab"
            ]
            body = {"amount": 5, "currency": "EUR"}
            key = {"Idempotency-Key": '"order-1"'}
            paid = await client.post("/payments", json=body, headers=key)
            again = await client.post("/payments", json=body, headers=key)
            other = await client.post("/payments", json={**body, "amount": 6}, headers=key)
            nokey = await client.post("/payments", json=body)
            listed = (await client.get("/payments")).json()
    assert item.json() == {"id": 7, "name": "item 7"}
    assert item.headers["ratelimit-policy"] == '"default";q=100;w=60'
    assert item.headers["ratelimit"].startswith('"default";r=99;t=')
    assert "ratelimit" not in health.headers
    search_codes = [r.status_code for r in searches]
    assert search_codes.count(200) >= 5
    assert search_codes.count(429) >= 1
    denied = next(r for r in searches if r.status_code == 429)
    assert '"search";q=5;w=1' in denied.headers["ratelimit-policy"]
    assert confirms == [200, 403]
    assert paid.status_code == 201
    assert paid.headers["ratelimit-policy"] == '"payments";q=10;w=60'
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == paid.json()
    assert other.status_code == 422
    assert nokey.status_code == 400
    assert len(listed) == 1


def serve_the_example() -> tuple[int, httpx.Response, httpx.Response, str]:
    """``python examples/fastapi_app.py`` in a folder of its own, asked for ``/health`` and
    an item, then sent SIGTERM (a background job: tests/support/jobs.py): its exit status, the two
    responses and its output."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    with tempfile.TemporaryDirectory(prefix="arl-example-") as where:
        log = Path(where) / "server.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-W", "error", str(ROOT / "examples" / "fastapi_app.py"),
                 "--port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=where,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 30
                while True:
                    assert proc.poll() is None, log.read_text()
                    try:
                        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                        item = httpx.get(f"http://127.0.0.1:{port}/items/3", timeout=5)
                        break
                    except httpx.TransportError:
                        assert time.monotonic() < deadline, log.read_text()
                        time.sleep(0.1)
            finally:
                proc.terminate()
                code = proc.wait(30)
        return code, health, item, log.read_text()


@pytest.mark.early(job=serve_the_example)
def test_example_runs_with_one_command(request: pytest.FixtureRequest) -> None:
    """``python examples/fastapi_app.py`` serves on the embedded store with no REDIS_URL, and
    stops cleanly on SIGTERM."""
    code, health, item, output = jobs.result(request)
    assert health.json() == {"ok": True}
    assert item.headers["ratelimit"].startswith('"default";r=99;t=')
    # uvicorn re-raises the SIGTERM it handled once it has shut down gracefully.
    assert code in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output
    assert "using memory://" in output
