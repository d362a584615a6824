"""A limiter's ban index (``Limiter.bans``) on every backend: a ban its hits issue is
listed in the background with the time it runs, ``block`` lists a key, ``unban`` and
``reset`` take it off, an ended ban drops out on its own; the index is bounded, and a
failed index write never fails the decision that issued the ban."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from support.counting import Calls
from support.pace import until

import aioratelimit as arl
from aioratelimit import _keys, _scripts
from aioratelimit._limits import bans as _bans

KINDS: dict[str, Callable[..., Any]] = {
    "fixed": lambda rate, **kw: arl.FixedWindow(rate, **kw),
    "sliding": lambda rate, **kw: arl.SlidingWindow(rate, **kw),
    "token": lambda rate, **kw: arl.TokenBucket(rate, **kw),
}


async def ban(limiter: arl.Limiter, key: str) -> None:
    """Hit ``key`` until its ban is issued (a limiter of 1/minute, ``after=1``)."""
    assert (await limiter.hit(key)).allowed
    assert (await limiter.hit(key)).retry_after == 30.0


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_bans_issued_by_hits_are_listed(backend: arl.Backend, kind: str, key: str) -> None:
    """Each key a limiter's hits banned is listed, by key, with at most the ban's length
    left, once the background write is done; another limiter's bans are not."""
    rule = arl.Ban(after=1, within=60, first=30)
    limiter = KINDS[kind]("1/minute", backend=backend, name=f"idx-{key}", ban=rule)
    other = KINDS[kind]("1/minute", backend=backend, name=f"idx2-{key}", ban=rule)
    await ban(limiter, f"{key}/b")
    await ban(limiter, f"{key}/a")
    await ban(other, f"{key}/c")
    await backend.drain()
    listed = await limiter.bans()
    assert [entry.key for entry in listed] == [f"{key}/a", f"{key}/b"]
    assert all(25.0 < entry.ttl <= 30.0 for entry in listed)
    assert [entry.key for entry in await other.bans()] == [f"{key}/c"]


async def test_only_the_hit_that_bans_writes_the_index(backend: arl.Backend, key: str) -> None:
    """The hit that issues the ban answers before its listing is written (a task of the
    backend's, which ``drain`` waits for); hits that ban nothing send one call each."""
    rule = arl.Ban(after=1, within=60, first=30)
    limiter = arl.SlidingWindow("1/minute", backend=backend, name=f"idx-{key}", ban=rule)
    await backend.drain()
    calls = Calls(backend)
    assert (await limiter.hit(key)).allowed
    assert not backend._tasks
    assert (await limiter.hit(key)).retry_after == 30.0
    assert [task.done() for task in backend._tasks] == [False]
    await backend.drain()
    assert not (await limiter.hit(key)).allowed  # refused by the ban: nothing to list
    await backend.drain()
    assert calls.count == 4  # three hits, one listing
    assert [entry.key for entry in await limiter.bans()] == [key]


async def test_unban_and_reset_take_a_key_off(backend: arl.Backend, key: str) -> None:
    """``unban`` and ``reset`` take the key off the index; the other bans stay listed."""
    rule = arl.Ban(after=1, within=60, first=30)
    limiter = arl.FixedWindow("1/minute", backend=backend, name=f"idx-{key}", ban=rule)
    for suffix in "abc":
        await ban(limiter, f"{key}/{suffix}")
    await backend.drain()
    assert await limiter.unban(f"{key}/a")
    await limiter.reset(f"{key}/b")
    assert [entry.key for entry in await limiter.bans()] == [f"{key}/c"]


async def test_block_lists_a_key_and_an_ended_one_drops_out(backend: arl.Backend, key: str) -> None:
    """``block`` on a blockable limiter lists the key for the block it answers (a longer
    block in place: that one); a block that ends leaves the list by itself."""
    limiter = arl.SlidingWindow("5/minute", backend=backend, name=f"idx-{key}", blockable=True)
    assert await limiter.block(f"{key}/long", 60.0) == 60.0
    assert await limiter.block(f"{key}/long", 1.0) > 59.0
    await limiter.block(f"{key}/short", 0.2)
    listed = {entry.key: entry.ttl for entry in await limiter.bans()}
    assert listed.keys() == {f"{key}/long", f"{key}/short"}
    assert 59.0 < listed[f"{key}/long"] <= 60.0
    assert listed[f"{key}/short"] <= 0.2

    async def short_gone() -> bool:
        return [entry.key for entry in await limiter.bans()] == [f"{key}/long"]

    await until(short_gone, what="the ended block to leave the index")


async def test_a_full_index_lists_no_new_ban(
    backend: arl.Backend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index that lists ``MAX_LISTED`` live bans refuses a new key (the ban holds) and
    still takes a listed key's new ban."""
    monkeypatch.setattr(_bans, "MAX_LISTED", 2)
    limiter = arl.FixedWindow("1/minute", backend=backend, name=f"idx-{key}", blockable=True)
    for suffix in "abc":
        await limiter.block(f"{key}/{suffix}", 30.0)
    await limiter.block(f"{key}/a", 50.0)
    listed = {entry.key: entry.ttl for entry in await limiter.bans()}
    assert listed.keys() == {f"{key}/a", f"{key}/b"}
    assert listed[f"{key}/a"] > 45.0
    assert (await limiter.ban_state(f"{key}/c")).blocked_for > 0.0


async def test_a_failed_index_write_leaves_the_decision_as_it_is(
    backend: arl.Backend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An index write that fails (here: the index key holds a string) is logged at debug;
    the hit that issued the ban answers it, and ``drain`` raises nothing."""
    rule = arl.Ban(after=1, within=60, first=30)
    limiter = arl.TokenBucket("1/minute", backend=backend, name=f"idx-{key}", ban=rule)
    index, _ = _keys.ban_index(backend._head(limiter._kind, limiter.name))
    await backend._run(_scripts.LIMITER_BLOCK, [index], (60_000_000,))  # a string there
    with caplog.at_level(logging.DEBUG, logger="aioratelimit"):
        await ban(limiter, key)
        await backend.drain()
    assert f"the ban of {key!r} was not listed" in caplog.text
    assert (await limiter.ban_state(key)).blocked_for > 0.0


async def test_bans_needs_a_blockable_limiter(backend: arl.Backend) -> None:
    """A limiter whose hits read no block issues no ban: ``bans`` is a ``TypeError``."""
    with pytest.raises(TypeError, match="blockable"):
        await arl.FixedWindow("1/minute", backend=backend).bans()
