"""The ``RateLimit`` fields per algorithm, as ``arl.ratelimit_headers`` (what every web face
sends) formats them, read back by an independent Structured Fields parser
(tests/support/ratelimit_fields.py), on every backend.

draft-ietf-httpapi-ratelimit-headers-11: ``t`` is the effective window, the time within
which the client can use no more than ``r``; for a token bucket that is the time to its
next token, for a sliding window the end of the current sub-window, for a fixed window its
end, and on a refusal the ``Retry-After`` wait.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from support.ratelimit_fields import read_fields

import aioratelimit as arl
from aioratelimit.asgi import RateLimitMiddleware


def fields(decision: arl.Decision, limiter: arl.Limiter, **options: object) -> dict[str, str]:
    pairs = arl.ratelimit_headers(decision, limiter, **options)  # type: ignore[arg-type]
    assert len({name.lower() for name, _ in pairs}) == len(pairs)  # each field once
    return dict(pairs)


async def test_a_fixed_window_s_t_is_the_time_to_its_end(backend: arl.Backend, key: str) -> None:
    limiter = arl.FixedWindow("3/minute", backend=backend)
    for remaining in (2, 1, 0):
        got = read_fields(fields(await limiter.hit(key), limiter))
        assert got.policies == {"default": {"q": 3, "w": 60}}
        assert (got.policy, got.r) == ("default", remaining)
        assert got.t is not None
        assert 1 <= got.t <= 60
    denied = await limiter.hit(key)
    headers = fields(denied, limiter)
    got = read_fields(headers)
    assert got.r == 0
    assert got.t == int(headers["Retry-After"])  # the draft: Retry-After not before t ends


async def test_a_token_bucket_s_t_is_the_time_to_its_next_token(
    backend: arl.Backend, key: str
) -> None:
    """Three hits off a bucket of five refilling one every 10 s: the bucket is full again in
    about 30 s, but a sixth hit could come as soon as the next token, within 10 s."""
    limiter = arl.TokenBucket("5/50s", backend=backend)
    for _ in range(3):
        decision = await limiter.hit(key)
    got = read_fields(fields(decision, limiter))
    assert got.policies == {"default": {"q": 5, "w": 50}}
    assert got.r == 2
    assert decision.reset_after > 20  # what t was before -11: the time to a full bucket
    assert got.t is not None
    assert 1 <= got.t <= 10


async def test_a_sliding_window_s_t_ends_with_its_current_bucket(
    backend: arl.Backend, key: str
) -> None:
    """Buckets of 1 s: no counted hit can leave the window before the current one ends."""
    limiter = arl.SlidingWindow("5/10s", buckets=10, backend=backend)
    decision = await limiter.hit(key)
    got = read_fields(fields(decision, limiter))
    assert got.policies == {"default": {"q": 5, "w": 10}}
    assert got.r == 4
    assert decision.reset_after > 10  # the window plus the current bucket
    assert got.t == 1


async def test_several_rates_are_one_policy_each_and_the_binding_one_is_reported(
    backend: arl.Backend, key: str
) -> None:
    limiter = arl.FixedWindow("2/minute", "100/hour", backend=backend, name="api")
    got = read_fields(fields(await limiter.hit(key), limiter))
    assert got.policies == {"api-1": {"q": 2, "w": 60}, "api-2": {"q": 100, "w": 3600}}
    assert (got.policy, got.r) == ("api-1", 1)
    await limiter.hit(key)
    denied = read_fields(fields(await limiter.hit(key), limiter))
    assert (denied.policy, denied.r) == ("api-1", 0)


async def ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_the_middleware_sends_the_same_fields_and_names_the_violated_policy(
    backend: arl.Backend, key: str
) -> None:
    """Through the ASGI middleware: the fields read back as the helper's, and the 429's
    problem document names the rate that refused, by its policy item."""
    limiter = arl.FixedWindow("2/minute", "100/hour", backend=backend, name=f"api{key[-4:]}")
    transport = httpx.ASGITransport(app=RateLimitMiddleware(ok, limiter, client=lambda s: key))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answers = [await client.get("/") for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 429]
    name = limiter.name
    assert read_fields(answers[0].headers).policies == {
        f"{name}-1": {"q": 2, "w": 60},
        f"{name}-2": {"q": 100, "w": 3600},
    }
    refused = read_fields(answers[2].headers)
    assert (refused.policy, refused.r, refused.t) == (
        f"{name}-1",
        0,
        int(answers[2].headers["retry-after"]),
    )
    problem = json.loads(answers[2].content)
    assert problem["type"] == "https://iana.org/assignments/http-problem-types#quota-exceeded"
    assert problem["violated-policies"] == [f"{name}-1"]


def test_a_fallback_decision_reports_when_its_quota_is_whole() -> None:
    """A twin counted in-process during an outage has scaled rates: its ``t`` is the time to
    a whole quota, which it knows, not a next token it would compute from the real rate."""
    bucket = arl.TokenBucket("5/50s")
    degraded = arl.Decision(True, 2, 1, 30.0, 0.0, source="fallback")
    assert read_fields(fields(degraded, bucket)).t == 30
    assert read_fields(fields(arl.Decision(True, 5, 1, 30.0, 0.0), bucket)).t == 10


def test_legacy_and_shadow_fields_and_the_policy_name() -> None:
    limiter = arl.FixedWindow("10/second")
    shadow = arl.Decision(True, 10, 0, 0.5, 0.0, shadow=True, shadow_denied=True)
    got = fields(shadow, limiter, policy_name="search", legacy=True)
    assert got["RateLimit"] == '"search";r=0;t=1'
    assert got["X-RateLimit-Shadow"] == "denied"
    assert (got["X-RateLimit-Limit"], got["X-RateLimit-Remaining"]) == ("10", "0")
    assert int(got["X-RateLimit-Reset"]) > 1_700_000_000
    assert "Retry-After" not in got


@pytest.mark.parametrize(
    ("decision", "limiter", "options", "error"),
    [
        (None, arl.FixedWindow("1/s"), {}, TypeError),
        (arl.Decision(True, 1, 0, 1.0, 0.0), "1/s", {}, TypeError),
        (arl.Decision(True, 1, 0, 1.0, 0.0), arl.FixedWindow("1/s"), {"legacy": 1}, TypeError),
        (
            arl.Decision(True, 1, 0, 1.0, 0.0),
            arl.FixedWindow("1/s"),
            {"policy_name": 'x"\r\nSet-Cookie: a=b'},
            ValueError,
        ),
        (
            arl.Decision(True, 1, 0, 1.0, 0.0),
            arl.FixedWindow("1/s"),
            {"policy_name": ""},
            ValueError,
        ),
    ],
)
def test_bad_input_is_refused_before_anything_is_formatted(
    decision: object, limiter: object, options: dict[str, object], error: type[Exception]
) -> None:
    """A policy name is the application's: one that could break out of the field (a quote,
    CR LF) is refused, as is anything that is not a decision and a supported limiter."""
    with pytest.raises(error):
        arl.ratelimit_headers(decision, limiter, **options)  # type: ignore[arg-type]
