"""Escalating bans (``ban=Ban(...)``) on every backend and all three limiters: the
``after``-th refusal within ``within`` bans the key for ``first``, each repeat for
``factor`` times longer up to ``longest``, counted inside the limiter's own script (one
call per hit); ``ban_state``, ``unban``, ``block`` and ``reset`` on the same record; bad
options refused before any I/O."""

from __future__ import annotations

import math
from typing import Any

import pytest
from support.counting import Calls
from support.kinds import Build
from support.pace import pace, until

import aioratelimit as arl
from aioratelimit import _observe


async def refuse(limiter: arl.Limiter, key: str, times: int) -> list[arl.Decision]:
    """``times`` hits after the one the limiter admits: each refused by its rate."""
    return [await limiter.hit(key) for _ in range(times)]


async def test_the_nth_refusal_bans_the_key_for_first(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """``after - 1`` refusals ban nothing; the ``after``-th answers the ban (``first``),
    one script call each; a refusal by the live ban, and a peek, count no strike."""
    limiter = build("1/minute", backend=backend, ban=arl.Ban(after=3, within=60, first=30))
    assert (await limiter.hit(key)).allowed
    refused = await refuse(limiter, key, 2)
    assert not any(d.allowed for d in refused)
    assert not (await limiter.peek(key)).allowed
    state = await limiter.ban_state(key)
    assert (state.blocked_for, state.strikes, state.bans) == (0.0, 2, 0)
    calls = Calls(backend)
    banned = await limiter.hit(key)
    assert (banned.allowed, banned.retry_after, banned.reset_after) == (False, 30.0, 30.0)
    # The strike and the ban inside the hit's own script call (the ban's listing in the
    # limiter's ban index follows, in the background).
    assert calls.count == 1
    during = await limiter.hit(key)
    assert not during.allowed
    assert during.retry_after <= 30.0
    state = await limiter.ban_state(key)
    assert 29.0 < state.blocked_for <= 30.0
    assert (state.strikes, state.bans) == (0, 1)
    # The record lives until the last ban's end plus the longest ban (a day by default).
    assert 86_400 + 29 < state.forget_after <= 86_400 + 30.001  # (its end in whole ms)


async def test_each_repeat_ban_grows_by_factor_up_to_longest(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """While the record lives each ban lasts ``factor`` times the last, at most
    ``longest``: first, first * factor, then the cap, and the cap again."""
    first, longest = pace(backend, network=(0.1, 0.3), memory=(0.05, 0.15))
    ban = arl.Ban(after=1, within=60, first=first, factor=2, longest=longest)
    limiter = build("1/minute", backend=backend, ban=ban)
    assert (await limiter.hit(key)).allowed
    lengths = []
    for _ in range(4):
        lengths.append((await limiter.hit(key)).retry_after)

        async def lifted() -> bool:
            state: arl.BanState = await limiter.ban_state(key)
            return state.blocked_for == 0.0

        await until(lifted, what="the ban's end")
    assert lengths == [first, first * 2, longest, longest]
    assert (await limiter.ban_state(key)).bans == 4


async def test_strikes_outside_within_do_not_count(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """A strike counts towards a ban only within ``within`` of the period's first one:
    after it ends, counting starts again from one."""
    within = pace(backend, network=0.2, memory=0.05)
    limiter = build("1/minute", backend=backend, ban=arl.Ban(after=2, within=within, first=60))
    assert (await limiter.hit(key)).allowed
    await refuse(limiter, key, 1)

    async def forgotten() -> bool:
        state: arl.BanState = await limiter.ban_state(key)
        return state.strikes == 0

    await until(forgotten, what="the period's end")
    await refuse(limiter, key, 1)
    state = await limiter.ban_state(key)
    assert (state.blocked_for, state.strikes, state.bans) == (0.0, 1, 0)
    (banned,) = await refuse(limiter, key, 1)
    assert banned.retry_after == 60.0
    assert (await limiter.ban_state(key)).bans == 1


async def test_unban_reset_and_block_share_the_record(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """``unban`` lifts the ban and forgets the strikes but keeps the counts; ``reset``
    forgets everything; ``block`` works on a banning limiter (its hits read the block)."""
    limiter = build("1/minute", backend=backend, ban=arl.Ban(after=1, within=60, first=60))
    assert (await limiter.hit(key)).allowed
    assert (await limiter.hit(key)).retry_after == 60.0
    assert await limiter.unban(key)
    assert await limiter.ban_state(key) == arl.BanState(0.0, 0, 0, 0.0)
    assert not await limiter.unban(key)
    assert (await limiter.hit(key)).retry_after == 60.0  # the count kept: refused, banned
    await limiter.reset(key)
    assert await limiter.ban_state(key) == arl.BanState(0.0, 0, 0, 0.0)
    assert (await limiter.hit(key)).allowed
    assert await limiter.block(key, 5.0) == 5.0
    assert (await limiter.ban_state(key)).bans == 0  # a block is no ban


async def test_a_ban_under_a_hash_tag(backend: arl.Backend, build: Build, key: str) -> None:
    """With ``hash_tag=``, the strike record and the block go under the tag it names, as the
    counters do (one slot on a cluster): the ban is issued, read and lifted there."""
    ban = arl.Ban(after=1, within=60, first=60)
    limiter = build("1/minute", backend=backend, ban=ban, hash_tag=lambda k: k.split("/")[0])
    assert (await limiter.hit(f"{key}/a")).allowed
    assert (await limiter.hit(f"{key}/a")).retry_after == 60.0
    assert (await limiter.ban_state(f"{key}/a")).bans == 1
    assert (await limiter.ban_state(f"{key}/b")).bans == 0  # another key, the same tag
    assert await limiter.unban(f"{key}/a")
    assert (await limiter.hit(f"{key}/b")).allowed


async def test_a_ban_is_reported_to_the_recorder(backend: arl.Backend, key: str) -> None:
    """The denial that issues a ban reports ``Recorder.ban`` with its length (once)."""

    class Bans(arl.Recorder):
        def __init__(self) -> None:
            self.bans: list[tuple[str | None, str, float]] = []

        def ban(self, limiter: str | None, algorithm: str, seconds: float) -> None:
            self.bans.append((limiter, algorithm, seconds))

    ban = arl.Ban(after=2, within=60, first=30)
    limiter = arl.FixedWindow("1/minute", backend=backend, name="login", ban=ban)
    recorder = Bans()
    old = _observe.set_recorder(recorder)
    try:
        for _ in range(5):
            await limiter.hit(key)
    finally:
        _observe.set_recorder(old)
    assert recorder.bans == [("login", "fixed_window", 30.0)]


BAD_BANS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"after": 0, "within": 1, "first": 1}, ValueError),
    ({"after": 1.0, "within": 1, "first": 1}, TypeError),
    ({"after": 1, "within": 0, "first": 1}, ValueError),
    ({"after": 1, "within": 1, "first": math.nan}, ValueError),
    ({"after": 1, "within": 1, "first": "1"}, TypeError),
    ({"after": 1, "within": 1, "first": 10, "longest": 5}, ValueError),
    ({"after": 1, "within": 1, "first": 1, "longest": 400 * 86400}, ValueError),
    ({"after": 1, "within": 1, "first": 1, "factor": 0.5}, ValueError),
    ({"after": 1, "within": 1, "first": 1, "factor": math.nan}, ValueError),
    ({"after": 1, "within": 1, "first": 1, "factor": 101}, ValueError),
    ({"after": 1, "within": 1, "first": 1, "factor": True}, TypeError),
]


@pytest.mark.parametrize(("options", "error"), BAD_BANS)
def test_bad_ban_options_are_refused(options: dict[str, Any], error: type[Exception]) -> None:
    """A non-positive count or time, a cap below ``first`` or above a year, a factor
    below 1 or above 100, or of a wrong type: refused when the ``Ban`` is made."""
    with pytest.raises(error):
        arl.Ban(**options)


async def test_ban_options_that_cannot_be_honoured_raise_before_any_io(
    backend: arl.Backend, build: Build, key: str
) -> None:
    """``ban=`` of another type, with ``deny_cache=`` (a denial cached here would count no
    strike) or ``policies=``, and in a multi-key decision: refused, nothing sent."""
    ban = arl.Ban(after=1, within=1, first=1)
    calls = Calls(backend)
    with pytest.raises(TypeError, match="Ban"):
        build("1/second", backend=backend, ban={"after": 1})
    with pytest.raises(ValueError, match="deny_cache"):
        build("1/second", backend=backend, ban=ban, deny_cache=100)
    policies = arl.Policies()
    with pytest.raises(ValueError, match="policies"):
        build("1/second", backend=backend, name="api", ban=ban, policies=policies)
    build("1/second", backend=backend, name="api", policies=policies)  # (left unbound)
    banning: arl.Limiter = build("1/second", backend=backend, ban=ban)
    with pytest.raises(TypeError, match="ban="):
        await arl.hit_all([(banning, key), (build("1/second", backend=backend), key)])
    with pytest.raises(ValueError, match="key"):
        await banning.ban_state("")
    assert calls.count == 0
