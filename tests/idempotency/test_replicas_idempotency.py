"""Tokens and idempotency records confirmed by replicas (``replicas=``): what a write that
no replica confirmed becomes. An issued token is withdrawn; an idempotency claim is
released; a consume and a stored result stand (taking them back would re-enable a replay),
and raise ``NotReplicated``. The replica is frozen (SIGSTOP) to make the refusal certain.
"""

from __future__ import annotations

import pytest
from support.replicas import SHORT, frozen
from support.servers import RedisServer

import aioratelimit as arl
from aioratelimit._idempotency.store import Claimed, IdempotencyStore, Replay


async def test_an_unconfirmed_token_is_withdrawn(
    own_redis: RedisServer, primary: arl.Backend, replica: RedisServer
) -> None:
    master = own_redis.client()
    before = master.dbsize()
    with frozen(replica), pytest.raises(arl.NotReplicated, match="withdrawn"):
        await arl.issue_token(backend=primary, replicas=1, replicas_timeout=SHORT)
    assert master.dbsize() == before  # no token record left behind
    token = await arl.issue_token(backend=primary, replicas=1)
    assert await arl.consume_token(token, backend=primary, replicas=1)


async def test_an_unconfirmed_consume_stands(primary: arl.Backend, replica: RedisServer) -> None:
    """A consume that was not confirmed raises, and the token stays spent: it is never
    put back (that would let it be used twice)."""
    token = await arl.issue_token(backend=primary, replicas=1)

    @arl.consumes_token(lambda t: t, backend=primary, replicas=1, replicas_timeout=SHORT)
    async def act(t: str) -> str:
        return "acted"

    with frozen(replica), pytest.raises(arl.NotReplicated, match="treat it as spent"):
        await act(token)
    assert not await arl.consume_token(token, backend=primary)
    # A wrong or unknown token writes nothing: False, without waiting for a confirmation.
    with frozen(replica):
        assert not await arl.consume_token(
            token, backend=primary, replicas=1, replicas_timeout=SHORT
        )


async def test_an_unconfirmed_claim_is_released(
    primary: arl.Backend, replica: RedisServer, key: str
) -> None:
    store = IdempotencyStore(primary, replicas=1, replicas_timeout=SHORT)
    with frozen(replica), pytest.raises(arl.NotReplicated):
        await store.claim(key)
    # Released: the next claim gets the key at once (no lease to wait out).
    assert isinstance(await IdempotencyStore(primary).claim(key), Claimed)


async def test_an_unconfirmed_result_stands(
    primary: arl.Backend, replica: RedisServer, key: str
) -> None:
    store = IdempotencyStore(primary, replicas=1, replicas_timeout=SHORT)
    claimed = await store.claim(key)
    assert isinstance(claimed, Claimed)
    with frozen(replica), pytest.raises(arl.NotReplicated, match="stored on the master"):
        async with store.running(claimed):
            await store.complete(claimed, b"result")
    assert claimed.settled
    assert await IdempotencyStore(primary).claim(key) == Replay(key, b"result")


async def test_idempotent_returns_an_unconfirmed_result(
    primary: arl.Backend, replica: RedisServer, key: str
) -> None:
    runs = []

    @arl.idempotent(key, backend=primary, replicas=1, replicas_timeout=SHORT)
    async def once() -> int:
        runs.append(1)
        if len(runs) == 1:
            replica.pause()  # the claim was confirmed; the result will not be
        return len(runs)

    try:
        assert await once() == 1
    finally:
        replica.resume()
    assert await once() == 1  # replayed: the result stood
    assert runs == [1]
