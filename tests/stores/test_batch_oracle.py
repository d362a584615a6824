"""The batch oracle: ``lua/batch.lua`` against the same calls made one by one, on one frozen
clock.

Two fake servers (fakeredis running Redis's Lua, as in ``test_oracle``) go through the same
random history of the library's calls (limiters of every kind and mode, blocks, refunds and
resets, locks, semaphores, one-shot tokens, idempotency keys): a few calls made alone on
both, then a crowd of batched calls, on one key or several, made as ONE batch call on the
first server (laid out as ``_stores.batch`` lays it out: grouped by script and arguments)
and one call each on the second, in the batch's order. The batch's replies must be the
serial calls' replies, element by element (an error where the call alone raised one), and
afterwards the two keyspaces must be equal, key by key."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.exceptions import ResponseError
from test_oracle import (
    T0,
    Ago,
    Call,
    Clock,
    fake_redis,
    fixed_windows,
    frozen,
    idempotency_calls,
    limiter_calls,
    lock_calls,
    normal,
    semaphore_calls,
    sliding_windows,
    token_buckets,
    token_calls,
)

from aioratelimit._scripts import BATCH, BATCH_IDS, SCRIPTS, Arg

FAMILIES = {
    "fixed": limiter_calls("fixed_window", fixed_windows),
    "sliding": limiter_calls("sliding_window", sliding_windows),
    "bucket": limiter_calls("token_bucket", token_buckets),
    "coordination": st.one_of(lock_calls(), semaphore_calls()),
    "tokens": st.one_of(token_calls(), idempotency_calls()),
}

#: clock moves between rounds: none, within the millisecond, about a window, long
STEPS_US = st.sampled_from([0, 1, 999, 1_000, 2_500, 10_000, 33_333, 1_000_000, 60_000_000])


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Clock, fakeredis.FakeRedis, fakeredis.FakeRedis]]:
    clock = Clock()
    with frozen(clock):
        batched, alone = fake_redis(), fake_redis()
        assert batched.script_load(BATCH.source) == BATCH.sha
        try:
            yield clock, batched, alone
        finally:
            batched.close()
            alone.close()


def resolved(call: Call, now: int) -> tuple[Arg, ...]:
    return tuple(now - a.us if isinstance(a, Ago) else a for a in call.args)


def grouped(calls: Sequence[tuple[Call, tuple[Arg, ...]]]) -> list[tuple[Call, tuple[Arg, ...]]]:
    """The calls in the order a batch runs them: group by group, as ``_stores.batch``
    groups them (script, arguments, key count), each group where its first call was."""
    groups: dict[tuple[str, tuple[Arg, ...], int], list[tuple[Call, tuple[Arg, ...]]]] = {}
    for call, args in calls:
        groups.setdefault((call.script, args, len(call.keys)), []).append((call, args))
    return [c for group in groups.values() for c in group]


def batch_call(calls: Sequence[tuple[Call, tuple[Arg, ...]]]) -> list[Any]:
    """KEYS and ARGV of ``batch.lua`` for ``calls`` (already grouped)."""
    keys: list[str] = []
    argv: list[Arg] = []
    run: list[tuple[Call, tuple[Arg, ...]]] = []
    for call, args in calls:
        if run and (run[0][0].script, run[0][1], len(run[0][0].keys)) == (
            call.script,
            args,
            len(call.keys),
        ):
            run.append((call, args))
            continue
        if run:
            argv += group_args(run)
        run = [(call, args)]
    argv += group_args(run)
    for call, _ in calls:
        keys += call.keys
    return [len(keys), *keys, *argv]


def group_args(run: list[tuple[Call, tuple[Arg, ...]]]) -> list[Arg]:
    call, args = run[0]
    return [BATCH_IDS[call.script], len(call.keys), len(args), len(run), *args]


def outcome(reply: Any) -> Any:
    """A reply as compared: an error as just that (its words differ between a script's
    own error and one caught inside a batch), anything else normalised."""
    if isinstance(reply, ResponseError):
        return "error"
    return normal(reply)


def keyspace(client: fakeredis.FakeRedis) -> dict[Any, Any]:
    """Every key: its type, value and PTTL."""
    state: dict[Any, Any] = {}
    for key in sorted(client.keys("*")):
        kind = client.type(key)
        if kind == b"string":
            value: Any = client.get(key)
        elif kind == b"hash":
            value = client.hgetall(key)
        elif kind == b"zset":
            value = client.zrange(key, 0, -1, withscores=True)
        else:
            raise AssertionError(f"{key!r} is a {kind!r}")
        state[key] = (kind, value, client.pttl(key))
    return state


@pytest.mark.parametrize("family", FAMILIES)
@settings(
    max_examples=max(1, 30 * settings().max_examples // 100),  # (30 under the full profile)
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_batch_answers_as_its_calls_one_by_one(
    servers: tuple[Clock, fakeredis.FakeRedis, fakeredis.FakeRedis],
    family: str,
    data: st.DataObject,
) -> None:
    clock, batched, alone = servers
    clock.now_us = T0
    batched.flushall()
    alone.flushall()
    calls = FAMILIES[family]
    for _ in range(3):
        for call in data.draw(st.lists(calls, max_size=4), "alone"):
            args = resolved(call, clock.now_us)
            for server in (batched, alone):
                with contextlib.suppress(ResponseError):
                    server.evalsha(SCRIPTS[call.script].sha, len(call.keys), *call.keys, *args)
        crowd = data.draw(
            st.lists(calls.filter(lambda c: c.script in BATCH_IDS), min_size=2, max_size=12),
            "batch",
        )
        order = grouped([(call, resolved(call, clock.now_us)) for call in crowd])
        replies = batched.evalsha(BATCH.sha, *batch_call(order))
        assert len(replies) == len(order)
        for (call, args), reply in zip(order, replies, strict=True):
            try:
                serial = alone.evalsha(SCRIPTS[call.script].sha, len(call.keys), *call.keys, *args)
            except ResponseError as exc:
                serial = exc
            assert outcome(reply) == outcome(serial), (call, args, reply, serial)
        assert keyspace(batched) == keyspace(alone)
        clock.now_us += data.draw(STEPS_US, "step")
