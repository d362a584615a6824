"""Numbers at the edges. The scripts compute in Lua's doubles (integers exact up to 2**53),
the memory twins in Python's exact integers: a limit, burst, cost or window past what the
scripts compute exactly is refused with ``ValueError`` before anything is sent, and every
other gives the same raw reply, and so the same decision, on Redis and on memory://."""

from __future__ import annotations

import math
import sys
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from support import loops

import aioratelimit as arl
from aioratelimit._scripts import Arg, Reply, Script
from aioratelimit._stores.memory.store import MemoryStore

#: The documented bounds: counts (a limit, a burst, a cost) up to 2**50, durations up to
#: 2**50 µs in whole seconds (and a TokenBucket's full refill, burst x interval, too).
MAX_COUNT = 2**50
MAX_SECONDS = 1_125_899_906

COUNTS = st.one_of(
    st.sampled_from([1, 2, 3, 7, 1000, MAX_COUNT - 1, MAX_COUNT, MAX_COUNT + 1]),
    st.sampled_from([2**53 - 1, 2**53, 2**53 + 1, 10**17, 10**17 + 1, sys.maxsize, 2**63, 2**64]),
    st.integers(1, 10**6),
    st.integers(1, 2**66),
)
WINDOWS = st.one_of(
    st.sampled_from([0.001, 0.0015, 1.0, 60.0, 86_400.0, 1e6, 1e8, MAX_SECONDS - 1.0]),
    st.sampled_from([float(MAX_SECONDS), MAX_SECONDS + 0.5, 2**50 / 1e6, 1e12, 1e15, 1e18]),
    st.floats(0.001, 1e5),
    st.floats(0.001, 2e9),
)


@dataclass(frozen=True)
class Spec:
    """One limiter and the hits made on it: (cost, partial) each."""

    kind: str  # "fixed", "sliding" or "token"
    limit: int
    window: float
    extra: int | None  # a SlidingWindow's buckets, a TokenBucket's burst (None: the limit)
    count_denied: bool
    hits: tuple[tuple[int, bool], ...]


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    kind = draw(st.sampled_from(["fixed", "sliding", "token"]))
    limit, window = draw(COUNTS), draw(WINDOWS)
    if kind == "sliding":
        extra: int | None = draw(st.sampled_from([1, 10, 1000]))
    elif kind == "token":
        extra = draw(st.one_of(st.none(), COUNTS))
    else:
        extra = None
    costs = st.one_of(COUNTS, st.just(limit), st.just(extra or limit))
    hits = draw(st.lists(st.tuples(costs, st.booleans()), min_size=1, max_size=4))
    return Spec(kind, limit, window, extra, draw(st.booleans()), tuple(hits))


def window_us(seconds: float) -> int:
    return math.ceil(seconds * 1e6 - 1e-6)


def refused(spec: Spec) -> bool:
    """What the documented bounds refuse of the limiter itself."""
    if not 1 <= spec.limit <= MAX_COUNT or not 0.001 <= spec.window <= MAX_SECONDS:
        return True
    if spec.kind == "token":
        burst = spec.limit if spec.extra is None else spec.extra
        interval = -(-window_us(spec.window) // spec.limit)
        return not 1 <= burst <= MAX_COUNT or burst * interval > MAX_COUNT
    return False


def max_cost(spec: Spec) -> int:
    return spec.extra or spec.limit if spec.kind == "token" else spec.limit


def build(spec: Spec, backend: arl.Backend) -> arl.Limiter:
    rate = arl.Rate(spec.limit, spec.window)
    if spec.kind == "fixed":
        return arl.FixedWindow(rate, backend=backend, count_denied=spec.count_denied)
    if spec.kind == "sliding":
        assert spec.extra is not None
        return arl.SlidingWindow(
            rate, buckets=spec.extra, backend=backend, count_denied=spec.count_denied
        )
    return arl.TokenBucket(rate, spec.extra, backend=backend, count_denied=spec.count_denied)


Recorded = list[tuple[str, list[int]]]


def recording(backend: arl.Backend, into: Recorded) -> arl.Backend:
    """``backend``, with every script it runs and its raw reply kept in ``into``."""
    inner = backend._run

    async def run(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        reply = await inner(script, keys, args)
        into.append((script.name, [int(v) for v in reply]))
        return reply

    backend._run = run
    return backend


def test_every_number_is_refused_before_io_or_decided_alike(redis_url: str) -> None:
    """For limits, bursts, costs and windows drawn about every bound (2**50, 2**53, 2**63,
    sys.maxsize, 10**17, the longest and shortest window): either ValueError from both
    backends with nothing sent, as the bounds say, or the same raw reply from the Lua on
    Redis and from the twin on memory:// at the same clock reading."""
    loop = loops.new_loop()
    prefix = f"numbers-{uuid.uuid4().hex[:8]}"
    server_calls: Recorded = []
    server = recording(arl.Backend.from_url(redis_url, prefix=prefix), server_calls)

    def run(aw: Any) -> Any:
        return loop.run_until_complete(aw)

    @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(spec=specs())
    @example(Spec("fixed", sys.maxsize, 60.0, None, False, ((1, False),)))
    @example(Spec("fixed", 2**53 + 1, 60.0, None, False, ((2**53 + 1, False), (1, False))))
    @example(Spec("token", 10**17, 1.0, None, True, ((10**17, False), (1, True))))
    @example(Spec("token", MAX_COUNT, 1.0, None, True, ((MAX_COUNT, False), (MAX_COUNT, False))))
    @example(Spec("sliding", 1, 1e12, 10, False, ((1, False), (1, False))))
    @example(Spec("fixed", 3, float(MAX_SECONDS), None, True, ((2, False), (2, False))))
    @example(Spec("fixed", MAX_COUNT, 1.0, None, True, ((MAX_COUNT, False),) * 3))
    def check(spec: Spec) -> None:
        times: deque[int] = deque()
        memory_calls: Recorded = []
        memory = recording(
            arl.Backend._of(MemoryStore(clock=times.popleft), prefix=prefix, url="memory://"),
            memory_calls,
        )
        sent = len(server_calls)
        try:
            on_server = build(spec, server)
        except ValueError:
            assert refused(spec), spec
            with pytest.raises(ValueError):  # noqa: PT011  (the same refusal)
                build(spec, memory)
            return
        assert not refused(spec), spec
        event("accepted")
        on_memory = build(spec, memory)
        key = uuid.uuid4().hex
        hits: list[tuple[Callable[..., Any], Callable[..., Any], int, bool]] = [
            (on_server.hit, on_memory.hit, cost, partial) for cost, partial in spec.hits
        ]
        hits.append((on_server.peek, on_memory.peek, 1, False))
        for on_redis, on_twin, cost, partial in hits:
            sent = len(server_calls)
            try:
                decision = run(on_redis(key, cost, partial=partial))
            except ValueError:
                assert len(server_calls) == sent  # nothing was sent
                assert cost > MAX_COUNT or (not partial and cost > max_cost(spec))
                with pytest.raises(ValueError):  # noqa: PT011
                    run(on_twin(key, cost, partial=partial))
                continue
            assert cost <= MAX_COUNT
            event(f"decided: {'allowed' if decision.allowed else 'denied'}")
            (name, reply) = server_calls[-1]
            times.append(reply[5])  # the twin decides at the server's clock reading
            assert run(on_twin(key, cost, partial=partial)) == decision
            assert memory_calls[-1] == (name, reply), spec

    try:
        check()
    finally:
        run(server.aclose())
        loop.close()
