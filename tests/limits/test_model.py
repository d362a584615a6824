"""memory:// is the reference model of the Lua scripts: one random sequence of hits (whole
or partial, counting denied hits or not), peeks, resets, refunds, blocks, waits and waiting
acquisitions runs on the real server and on a MemoryStore, and
every decision must be identical.

The comparison is exact. Each script reply from the server carries the clock it decided on
(``now_us``: a limiter's sixth field, a refund's or a block's second); the MemoryStore's
clock hands out those same readings in order, so the two sides decide on the same state at
the same instant and must give the same raw reply, field for field.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from support import loops

import aioratelimit as arl
from aioratelimit._rates import Decision
from aioratelimit._scripts import Arg, Reply, Script
from aioratelimit._stores.memory.store import MemoryStore

T = TypeVar("T")

#: Two user keys whose escaped forms must not meet (``{`` is escaped to ``%7B``).
KEYS = st.sampled_from(["a{b}", "a%7Bb%7D"])
COSTS = st.integers(1, 5)
#: Windows of 100 ms to 1 s, mostly short, so that waits of up to 300 ms matter.
WINDOWS_MS = st.one_of(st.sampled_from([100, 150, 200, 300, 500]), st.integers(100, 1000))


@dataclass(frozen=True)
class Call:
    """One script run as the store saw it."""

    script: Script
    keys: list[str]
    args: list[Arg]
    reply: list[int]


def record(backend: arl.Backend, into: list[Call]) -> None:
    """Wrap ``backend._run`` so every script run lands in ``into``."""
    inner = backend._run

    async def run(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        reply = await inner(script, keys, args)
        into.append(Call(script, list(keys), list(args), _ints(reply)))
        return reply

    backend._run = run


#: The scripts whose reply carries no clock (a limiter's reset, its ban index's removal).
CLOCKLESS = ("delete", "rate_invalidate", "list_remove")


def _now(call: Call) -> int:
    """The clock a script decided on: a limiter's reply has it sixth, a ban index's write
    (``list_add``) third, the others second."""
    if call.script.name == "list_add":
        return call.reply[2]
    return call.reply[5] if len(call.reply) > 5 else call.reply[1]


def _ints(reply: Any) -> list[int]:
    return [int(v) for v in reply] if isinstance(reply, list) else [int(reply)]


Config = tuple[str, tuple[arl.Rate, ...], int]


@st.composite
def configs(draw: st.DrawFn, kind: str) -> Config:
    """(algorithm, rates, buckets or burst) for one limiter."""
    rate = st.builds(arl.Rate, st.integers(1, 5), WINDOWS_MS.map(lambda ms: ms / 1e3))
    if kind == "token":
        return kind, (draw(rate),), draw(st.integers(1, 5))
    rates = draw(st.lists(rate, min_size=1, max_size=2, unique_by=lambda r: (r.limit, r.window_us)))
    return kind, tuple(rates), draw(st.sampled_from([1, 2, 3, 5, 10]))


def build(config: Config, backend: arl.Backend, name: str, count_denied: bool) -> Any:
    kind, rates, extra = config
    if kind == "fixed":
        return arl.FixedWindow(
            *rates, backend=backend, name=name, count_denied=count_denied, blockable=True
        )
    if kind == "sliding":
        return arl.SlidingWindow(
            *rates,
            buckets=extra,
            backend=backend,
            name=name,
            count_denied=count_denied,
            blockable=True,
        )
    return arl.TokenBucket(
        rates[0], burst=extra, backend=backend, name=name, count_denied=count_denied, blockable=True
    )


class LuaAgainstMemory(RuleBasedStateMachine):
    """Drives limiters on the server and their twins on memory:// through the same steps.

    Every machine holds one limiter of each algorithm, and each hit, peek and reset goes to
    all of them: the waits (real time on the server) are the cost of a run, so each waited
    second is spent on all three.
    """

    #: The server's URL (set by the test on a subclass: Hypothesis builds machines itself).
    url: str

    def __init__(self) -> None:
        super().__init__()
        self.loop = loops.new_loop()
        prefix = f"model-{uuid.uuid4().hex[:10]}"  # a fresh keyspace per run
        self.server = arl.Backend.from_url(self.url, prefix=prefix)
        self.times: deque[int] = deque()  # server clock readings for the memory side
        self.memory = arl.Backend._of(
            MemoryStore(clock=self.times.popleft), prefix=prefix, url="memory://"
        )
        self.server_calls: list[Call] = []
        self.memory_calls: list[Call] = []
        record(self.server, self.server_calls)
        record(self.memory, self.memory_calls)
        self.last_now = 0
        self.pairs: list[tuple[Any, Any, int]] = []  # (on server, on memory, max cost)

    def run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def teardown(self) -> None:
        try:
            self.run(self.server.aclose())
            self.run(self.memory.aclose())
        finally:
            self.loop.close()

    @initialize(
        fixed=configs("fixed"),
        sliding=configs("sliding"),
        token=configs("token"),
        count_denied=st.booleans(),
    )
    def limiters(self, fixed: Config, sliding: Config, token: Config, count_denied: bool) -> None:
        for config in (fixed, sliding, token):
            kind, rates, extra = config
            max_cost = extra if kind == "token" else min(r.limit for r in rates)
            on_server = build(config, self.server, kind, count_denied)
            self.pairs.append((on_server, build(config, self.memory, kind, count_denied), max_cost))

    def new_server_calls(self, since: int) -> list[Call]:
        calls = self.server_calls[since:]
        for call in calls:
            if call.script.name not in CLOCKLESS:
                self.last_now = _now(call)
        return calls

    def decide(self, method: str, key: str, cost: float, **options: Any) -> None:
        for on_server, on_memory, max_cost in self.pairs:
            # (a partial hit or a block takes its number as it is)
            c = cost if options or method == "block" else min(int(cost), max_cost)
            since, mem_since = len(self.server_calls), len(self.memory_calls)
            server_decision = self.run(getattr(on_server, method)(key, c, **options))
            # A refund then tells the deny caches (``rate_invalidate``: no clock in its
            # reply, and none needed: it only publishes); a block lists the key in the
            # ban index (``list_add``, at its own clock).
            call, *told = self.new_server_calls(since)
            self.times.append(_now(call))
            for t in told:
                self.times.append(self.last_now if t.script.name in CLOCKLESS else _now(t))
            memory_decision = self.run(getattr(on_memory, method)(key, c, **options))
            twin, *twin_told = self.memory_calls[mem_since:]
            assert [t.script.name for t in twin_told] == [t.script.name for t in told]
            assert all(t.script.name in ("rate_invalidate", "list_add") for t in told)
            assert (twin.script, twin.keys, twin.args) == (call.script, call.keys, call.args)
            assert twin.reply == call.reply, f"{on_server!r}.{method}({key!r}, {c})"
            assert memory_decision == server_decision

    @rule(key=KEYS, cost=COSTS)
    def hit(self, key: str, cost: int) -> None:
        self.decide("hit", key, cost)

    @rule(key=KEYS, cost=COSTS)
    def peek(self, key: str, cost: int) -> None:
        self.decide("peek", key, cost)

    @rule(key=KEYS, cost=st.integers(1, 8))
    def hit_partial(self, key: str, cost: int) -> None:
        self.decide("hit", key, cost, partial=True)

    @rule(key=KEYS, cost=COSTS)
    def refund(self, key: str, cost: int) -> None:
        self.decide("refund", key, cost)

    @rule(key=KEYS, seconds=st.sampled_from([0.001, 0.05, 0.2]))
    def block(self, key: str, seconds: float) -> None:
        self.decide("block", key, seconds)

    @rule(key=KEYS)
    def reset(self, key: str) -> None:
        for on_server, on_memory, _ in self.pairs:
            since, mem_since = len(self.server_calls), len(self.memory_calls)
            self.run(on_server.reset(key))
            calls = self.new_server_calls(since)
            # DEL reports no clock, nor does the ban index's removal; the memory side needs
            # one only to tell live keys from expired ones in its (unused) count, and ends
            # up with nothing either way.
            self.times.extend(self.last_now for _ in calls)
            self.run(on_memory.reset(key))
            assert [c.keys for c in self.memory_calls[mem_since:]] == [c.keys for c in calls]

    @rule(ms=st.integers(0, 300))
    def wait(self, ms: int) -> None:
        self.run(asyncio.sleep(ms / 1e3))

    @rule(
        which=st.integers(0, 2),
        key=KEYS,
        cost=COSTS,
        timeout=st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.3]),
    )
    def acquire(self, which: int, key: str, cost: int, timeout: float) -> None:
        """``acquire(wait=True)`` on the server; each script run it made (denied tries, then
        the last) is replayed on memory:// at the same clock readings."""
        on_server, _, max_cost = self.pairs[which]
        cost = min(cost, max_cost)
        since = len(self.server_calls)
        try:
            outcome = self.run(on_server.acquire(key, cost, wait=True, timeout=timeout))
            admitted = True
        except arl.RateLimited as exc:
            outcome, admitted = exc.decision, False
        calls = self.new_server_calls(since)
        assert calls, "acquire made no decision"
        assert [c.reply[0] for c in calls] == [0] * (len(calls) - 1) + [int(admitted)]
        last = Decision.from_reply(calls[-1].reply)
        if admitted and last.retry_after > 0:  # a TokenBucket's booking, admitted after it
            last = dataclasses.replace(last, retry_after=0.0)
        assert last == outcome
        for call in calls:
            self.times.append(call.reply[5])
            reply = self.run(self.memory._run(call.script, call.keys, call.args))
            assert _ints(reply) == call.reply, f"{on_server!r}.acquire({key!r}, {cost}): {call}"

    @invariant()
    def every_clock_reading_used_once(self) -> None:
        assert not self.times


def test_lua_scripts_and_memory_store_decide_alike(redis_url: str) -> None:
    """The Lua scripts and memory:// give identical raw replies for any random history."""

    class OnThisServer(LuaAgainstMemory):
        url = redis_url

    run_state_machine_as_test(
        OnThisServer,
        settings=settings(
            max_examples=25,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            # No shrinking: a replay waits in real time on the server's clock, so shrinking
            # takes minutes and cannot replay timings exactly; the failing run's steps are
            # printed as they were.
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
        ),
    )
