"""The types users write against: a sample program passes ``mypy --strict``, and every
class in the public signatures it reveals is importable from a public namespace."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import jobs, typecheck

import aioratelimit as arl
import aioratelimit.asgi
import aioratelimit.fastapi

PROGRAM = """
import asyncio
from typing import assert_type

import aioratelimit as arl
from aioratelimit.asgi import (
    ASGIApp, Choice, ClientFunc, LimiterFunc, Message, RateLimitMiddleware, Receive, Refusal,
    Rule, Scope, Send, client_ip, header,
)
from aioratelimit.fastapi import IdempotencyKey, IdempotentRequest, RateLimit

free = arl.FixedWindow("10/minute", name="free")
pro = arl.SlidingWindow("1000/minute", name="pro")
limiter: arl.Limiter = arl.TokenBucket("5/second")


@limiter.limit(key="jobs")
async def job(n: int) -> int:
    return n


def tier(scope: Scope) -> Choice:
    return pro if scope.get("user") else (free, 2)


async def by_account(scope: Scope) -> str | None:
    return "k"


async def inner(scope: Scope, receive: Receive, send: Send) -> None:
    message: Message = await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [], **message})


def respond(refusal: Refusal) -> ASGIApp:
    return inner


picker: LimiterFunc = tier
who: ClientFunc = by_account
app: ASGIApp = RateLimitMiddleware(
    inner, picker, client=who, rules=[Rule("GET", "/", free)], respond=respond
)
client_key: ClientFunc = header("X-API-Key", fallback=client_ip())
dependency = RateLimit(tier, client=client_key)
once = IdempotencyKey()


async def main(idem: IdempotentRequest) -> None:
    task: asyncio.Task[int] = asyncio.create_task(job(1))
    assert_type(await task, int)
    async with arl.lock("report") as lease:
        assert_type(lease, arl.Lease)
    async with limiter("k") as decision:
        assert_type(decision, arl.Decision)
    assert_type(arl.lock("x"), arl.Hold)
    assert_type(arl.semaphore("x"), arl.Hold)
    assert_type(limiter("k"), arl.Admission)
    async with limiter.reserve("k", 3) as reservation:
        assert_type(reservation, arl.Reservation)
    assert_type(await limiter.reserve("k"), arl.Reservation)
    assert_type(reservation.settle(1), None)
    assert_type(await idem.run(job, 2), int)

    reveal_type(arl.lock)
    reveal_type(arl.semaphore)
    reveal_type(arl.Lock("x").acquire)  # bound: what users call
    reveal_type(arl.FixedWindow.__call__)
    reveal_type(arl.FixedWindow.limit)
    reveal_type(arl.idempotent)
    reveal_type(arl.consumes_token)
    reveal_type(arl.configure)
    reveal_type(RateLimitMiddleware.__init__)
    reveal_type(Rule.__init__)
    reveal_type(client_ip)
    reveal_type(RateLimit.__init__)
    reveal_type(IdempotencyKey.__init__)
    reveal_type(IdempotentRequest.run)
"""


def type_check() -> subprocess.CompletedProcess[str]:
    """mypy --strict over the sample program (a background job: tests/support/jobs.py)."""
    with tempfile.TemporaryDirectory(prefix="arl-typing-") as where:
        (Path(where) / "user_program.py").write_text(PROGRAM, encoding="utf-8")
        return typecheck.mypy_strict(Path(where), ["user_program.py"])


@pytest.mark.early(job=type_check)
def test_a_user_program_type_checks_with_public_names_only(request: pytest.FixtureRequest) -> None:
    """mypy --strict passes on the sample, and each aioratelimit class it reveals in a
    public signature is exported (from aioratelimit, .asgi or .fastapi)."""
    proc = jobs.result(request)
    lines = proc.stdout.splitlines()
    errors = [line for line in lines if ": error:" in line]
    assert not errors, proc.stdout + proc.stderr
    revealed = [line for line in lines if "Revealed type is" in line]
    assert len(revealed) == PROGRAM.count("reveal_type("), proc.stdout
    named = set(re.findall(r"aioratelimit\.(_[\w.]+)\.(\w+)", "\n".join(revealed)))
    assert named, "the reveal found no aioratelimit class: the check would prove nothing"
    public = [arl, aioratelimit.asgi, aioratelimit.fastapi]
    private = sorted(
        f"aioratelimit.{module}.{name}"
        for module, name in named
        if not any(
            getattr(ns, name, None) is getattr(sys.modules[f"aioratelimit.{module}"], name)
            for ns in public
        )
    )
    assert private == [], f"private types in public signatures: {private}"
