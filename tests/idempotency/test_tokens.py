"""One-shot tokens on every backend: consumed exactly once, bound to their subject, hashed
before they reach Redis, and never an exception for a malformed token."""

from __future__ import annotations

import asyncio
import base64
import math
import uuid

import pytest
import redis
from support.pace import pace
from support.servers import RedisServer

import aioratelimit as arl


async def test_token_is_consumed_exactly_once(backend: arl.Backend) -> None:
    """A token is accepted once, then rejected."""
    token = await arl.issue_token(backend=backend)
    assert await arl.consume_token(token, backend=backend) is True
    assert await arl.consume_token(token, backend=backend) is False


async def test_tokens_carry_at_least_128_random_bits(backend: arl.Backend) -> None:
    """A token is URL-safe base64 of at least 16 bytes, and no two are alike."""
    tokens = [await arl.issue_token(ttl=5, backend=backend) for _ in range(50)]
    assert len(set(tokens)) == len(tokens)
    for token in tokens:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        assert len(raw) >= 16


async def test_200_concurrent_consumers_get_exactly_one_true(backend: arl.Backend) -> None:
    """Of 200 concurrent consumers of one token, exactly one is accepted."""
    token = await arl.issue_token(backend=backend)
    results = await asyncio.gather(*(arl.consume_token(token, backend=backend) for _ in range(200)))
    assert results.count(True) == 1
    assert results.count(False) == 199


async def test_expired_token_is_rejected(backend: arl.Backend) -> None:
    """A token is rejected once its ttl has passed, and was accepted before that."""
    ttl = pace(backend, network=0.6, memory=0.3)  # holds three calls (microseconds here)
    early = await arl.issue_token(ttl=ttl, backend=backend)
    late = await arl.issue_token(ttl=ttl, backend=backend)
    assert await arl.consume_token(early, backend=backend) is True
    # Past the ttl: on memory:// by this process's own clock, across a network the server's.
    await asyncio.sleep(ttl + pace(backend, network=0.2, memory=0.05))
    assert await arl.consume_token(late, backend=backend) is False


async def test_wrong_or_missing_subject_does_not_burn_the_token(backend: arl.Backend) -> None:
    """A token issued for alice is refused to bob and to no subject, then accepted for alice."""
    token = await arl.issue_token(subject="alice", backend=backend)
    assert await arl.consume_token(token, subject="bob", backend=backend) is False
    assert await arl.consume_token(token, backend=backend) is False
    assert await arl.consume_token(token, subject="alice", backend=backend) is True
    assert await arl.consume_token(token, subject="alice", backend=backend) is False


async def test_token_without_subject_is_refused_to_a_subject(backend: arl.Backend) -> None:
    """A token issued for no subject is only accepted without one."""
    token = await arl.issue_token(backend=backend)
    assert await arl.consume_token(token, subject="alice", backend=backend) is False
    assert await arl.consume_token(token, backend=backend) is True


async def test_foreign_well_formed_token_is_rejected(backend: arl.Backend) -> None:
    """A token-shaped string that was never issued is rejected."""
    assert await arl.consume_token("A" * 32, backend=backend) is False
    assert await arl.consume_token(uuid.uuid4().hex, subject="x", backend=backend) is False


MALFORMED: list[object] = [
    "",
    "short",
    "x" * 100_000,
    "with space and ünïcode ...........",
    "a\x00" * 20,
    None,
    123,
    b"bytes-are-not-a-token-0123456789",
    ["list"],
]


@pytest.mark.parametrize("token", MALFORMED, ids=lambda t: type(t).__name__)
async def test_malformed_token_is_false_without_io(token: object) -> None:
    """A malformed token answers False without a round trip (the server here is unreachable)."""
    async with arl.Backend.from_url("redis://127.0.0.1:1/0", connect_timeout=0.5) as nowhere:
        assert await arl.consume_token(token, backend=nowhere) is False
        assert await arl.consume_token(token, subject="s", backend=nowhere) is False


async def test_bad_arguments_raise_before_io() -> None:
    """A bad ttl, subject or backend raises ValueError/TypeError before anything is sent."""
    async with arl.Backend.from_url("redis://127.0.0.1:1/0", connect_timeout=0.5) as nowhere:
        for ttl in (0, -1.0, math.nan, math.inf):
            with pytest.raises(ValueError, match="ttl"):
                await arl.issue_token(ttl=ttl, backend=nowhere)
        with pytest.raises(TypeError, match="ttl"):
            await arl.issue_token(ttl="60", backend=nowhere)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="subject"):
            await arl.issue_token(subject=42, backend=nowhere)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="subject"):
            await arl.consume_token("A" * 32, subject=42, backend=nowhere)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="backend"):
        await arl.issue_token(backend="memory://")  # type: ignore[arg-type]


async def test_consumes_token_decorator(backend: arl.Backend) -> None:
    """The decorated function runs once per token; a used or foreign token raises TokenRejected."""
    runs: list[str] = []

    @arl.consumes_token(token=lambda form, user: form["csrf"], subject=lambda form, user: user)
    async def submit(form: dict[str, str], user: str) -> str:
        runs.append(user)
        return "ok"

    token = await arl.issue_token(subject="alice", backend=backend)
    with pytest.raises(arl.TokenRejected):
        await submit({"csrf": token}, "bob")
    assert runs == []
    # the decorator uses the default backend unless told otherwise
    bound = arl.consumes_token(token=lambda t: t, backend=backend)

    @bound
    async def once(t: str) -> int:
        return 1

    t2 = await arl.issue_token(backend=backend)
    assert await once(t2) == 1
    with pytest.raises(arl.TokenRejected):
        await once(t2)

    @arl.consumes_token(token=lambda form, user: form.get("csrf"), subject="alice", backend=backend)
    async def submit_as_alice(form: dict[str, str], user: str) -> str:
        runs.append(user)
        return "ok"

    assert await submit_as_alice({"csrf": token}, "alice") == "ok"
    with pytest.raises(arl.TokenRejected):
        await submit_as_alice({"csrf": token}, "alice")
    with pytest.raises(arl.TokenRejected):
        await submit_as_alice({}, "alice")
    assert runs == ["alice"]


async def test_redis_stores_no_raw_token_or_subject(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    """Neither a token nor its subject appears in any key or value; every record has a TTL."""
    prefix = f"tok-{uuid.uuid4().hex[:8]}"
    issued: list[tuple[str, str | None]] = []
    async with arl.Backend.from_url(redis_url, prefix=prefix) as backend:
        for _ in range(20):
            for subject in (f"subject-{uuid.uuid4().hex}", None):
                token = await arl.issue_token(ttl=60, subject=subject, backend=backend)
                issued.append((token, subject))
        assert await arl.consume_token(issued[0][0], subject=issued[0][1], backend=backend)
    keys = list(sync_redis.scan_iter(match=f"{prefix}:*", count=1000))
    assert len(keys) == len(issued) - 1
    blob = b"\n".join(keys + [sync_redis.get(k) or b"" for k in keys])
    for token, subject in issued:
        assert token.encode() not in blob
        assert subject is None or subject.encode() not in blob
    for k in keys:
        assert 0 < sync_redis.pttl(k) <= 60_001  # PXAT rounds up to the ms
    sync_redis.delete(*keys)


async def test_consume_and_issue_are_one_round_trip_each(own_redis: RedisServer) -> None:
    """consume_token and issue_token each send one EVALSHA and nothing else."""
    async with arl.Backend.from_url(own_redis.url) as backend:
        # Warm-up: the first run of each script pays one NOSCRIPT + EVAL that caches it.
        tokens = [await arl.issue_token(backend=backend) for _ in range(5)]
        assert not await arl.consume_token("A" * 32, backend=backend)
        client = own_redis.client()
        try:
            client.config_resetstat()
            for token in tokens:
                assert await arl.consume_token(token, backend=backend)
            for _ in range(5):
                await arl.issue_token(backend=backend)
            stats = client.info("commandstats")
        finally:
            client.close()
    calls = {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}
    calls.pop("config|resetstat", None)
    # EVALSHA at the top; TIME, SET inside token_issue; GET, DEL inside token_consume.
    # One EVALSHA per call, each write closed by the wire's ECHO tag (same round trip).
    assert calls == {"evalsha": 10, "echo": 10, "time": 5, "set": 5, "get": 5, "del": 5}
