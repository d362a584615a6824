"""OpenTelemetry instrumentation (``aioratelimit.otel``): the metrics every primitive
reports, the span per script call, no user key in any attribute, and nothing recorded when
it is off. Read with the SDK's in-memory metric reader and span exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support import jobs

import aioratelimit as arl
from aioratelimit import _keys, _observe, otel
from aioratelimit._aio import Gate
from aioratelimit._idempotency.store import Claimed, IdempotencyStore


@dataclass
class Telemetry:
    reader: InMemoryMetricReader
    spans: InMemorySpanExporter
    tracer_provider: TracerProvider

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, point) of every data point of metric ``name`` read now."""
        return [(dict(p.attributes or {}), p) for n, p in self.all_points() if n == name]

    def all_points(self) -> list[tuple[str, Any]]:
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            (metric.name, point)
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            for point in metric.data.data_points
        ]

    def count(self, name: str, **attributes: Any) -> int:
        """The sum of counter ``name`` (or the count of histogram ``name``) over the points
        whose attributes include ``attributes`` (dots spelled as ``__``)."""
        want = {k.replace("__", "."): v for k, v in attributes.items()}
        total = 0
        for attrs, point in self.points(name):
            if want.items() <= attrs.items():
                total += point.count if hasattr(point, "bucket_counts") else point.value
        return total

    def attribute_values(self) -> list[object]:
        values: list[object] = [
            v for _, p in self.all_points() for v in (p.attributes or {}).values()
        ]
        for span in self.spans.get_finished_spans():
            values.extend((span.attributes or {}).values())
            values.append(span.name)
        return values


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """Instrumentation on, into an in-memory reader and span exporter; off afterwards."""
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(meter_provider=meter_provider, tracer_provider=tracer_provider)
    try:
        yield Telemetry(reader, exporter, tracer_provider)
    finally:
        otel.uninstrument()
        meter_provider.shutdown()
        tracer_provider.shutdown()


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[arl.Backend]:
    async with arl.Backend.from_url(store_url) as backend:
        yield backend


DECISIONS = "aioratelimit.rate_limiting.decisions"
DURATION = "aioratelimit.rate_limiting.decision.duration"


async def test_decisions_by_limiter_algorithm_and_result(
    telemetry: Telemetry, store: arl.Backend, key: str
) -> None:
    """Every hit (and every try of acquire) is one decision, counted by the limiter's
    name, its algorithm and allowed/denied, and timed; peek is not a decision."""
    fixed = arl.FixedWindow("2/minute", backend=store, name="api")
    bucket = arl.TokenBucket("5/second", backend=store)
    for _ in range(3):
        await fixed.hit(key)
    await fixed.peek(key)
    with pytest.raises(arl.RateLimited):
        await fixed.acquire(key)
    await bucket.hit(key)
    await arl.SlidingWindow("3/minute", backend=store, name="sw").hit(key)
    by = {"aioratelimit.rate_limiting.limiter": "api"}
    assert telemetry.count(DECISIONS, **by, aioratelimit__rate_limiting__result="allowed") == 2
    assert telemetry.count(DECISIONS, **by, aioratelimit__rate_limiting__result="denied") == 2
    assert telemetry.count(DECISIONS, aioratelimit__rate_limiting__algorithm="fixed_window") == 4
    assert telemetry.count(DECISIONS, aioratelimit__rate_limiting__algorithm="token_bucket") == 1
    assert telemetry.count(DECISIONS, aioratelimit__rate_limiting__algorithm="sliding_window") == 1
    # An unnamed limiter carries no limiter attribute at all.
    unnamed = [a for a, _ in telemetry.points(DECISIONS) if "token_bucket" in a.values()]
    assert unnamed
    assert all("aioratelimit.rate_limiting.limiter" not in a for a in unnamed)
    assert telemetry.count(DURATION) == 6
    data = telemetry.reader.get_metrics_data()
    assert data is not None
    (scope,) = data.resource_metrics[0].scope_metrics
    assert (scope.scope.name, scope.scope.version) == ("aioratelimit", arl.__version__)
    assert all(p.sum > 0 for _, p in telemetry.points(DURATION))


async def test_near_limit_counts_admissions_past_the_share(
    telemetry: Telemetry, store: arl.Backend, key: str
) -> None:
    """An admitted hit that leaves 80 % or more of the limit used is near the limit."""
    limiter = arl.FixedWindow("7/minute", backend=store, name="near")
    for _ in range(8):  # 80 % of 7 is 5.6: hits 6 and 7 are near; the 8th is denied, not near
        await limiter.hit(key)
    assert telemetry.count("aioratelimit.rate_limiting.near_limit") == 2
    (attributes, _), *_ = telemetry.points("aioratelimit.rate_limiting.near_limit")
    assert attributes == {
        "aioratelimit.rate_limiting.limiter": "near",
        "aioratelimit.rate_limiting.algorithm": "fixed_window",
    }


async def test_bans_are_counted_by_limiter_and_algorithm(
    telemetry: Telemetry, store: arl.Backend, key: str
) -> None:
    """Each ban a limiter made with ``ban=`` issues counts once; its denial is a decision."""
    ban = arl.Ban(after=2, within=60, first=30)
    limiter = arl.SlidingWindow("1/minute", backend=store, name="login", ban=ban)
    for _ in range(5):  # admitted, refused, banned, then two refused by the live ban
        await limiter.hit(key)
    assert telemetry.count("aioratelimit.rate_limiting.bans") == 1
    (attributes, _), *_ = telemetry.points("aioratelimit.rate_limiting.bans")
    assert attributes == {
        "aioratelimit.rate_limiting.limiter": "login",
        "aioratelimit.rate_limiting.algorithm": "sliding_window",
    }
    assert telemetry.count("aioratelimit.rate_limiting.decisions") == 5


async def test_lock_and_semaphore_waits_timeouts_renewals_and_lost_leases(
    telemetry: Telemetry, store: arl.Backend, key: str
) -> None:
    """Acquires are timed by how they ended; a timeout is also counted; the background
    renewal is counted per extend; a lease lost under its block is counted once."""
    async with arl.lock(key, ttl=0.3, backend=store):
        with pytest.raises(arl.LockTimeout):
            await arl.Lock(key, backend=store).acquire(timeout=0.05)
        await asyncio.sleep(0.45)  # renewed every ttl/3
    async with arl.semaphore(key, limit=1, backend=store):
        with pytest.raises(arl.LockTimeout):
            await arl.Semaphore(key, limit=1, backend=store).acquire(timeout=0)
    with pytest.raises(arl.LockLost):
        async with arl.lock(f"{key}-short", ttl=0.05, auto_renew=False, backend=store):
            await asyncio.sleep(0.15)
    wait = "aioratelimit.lock.acquire.duration"
    assert (
        telemetry.count(
            wait, aioratelimit__lock__kind="lock", aioratelimit__lock__result="acquired"
        )
        == 2
    )
    assert (
        telemetry.count(wait, aioratelimit__lock__kind="lock", aioratelimit__lock__result="timeout")
        == 1
    )
    assert (
        telemetry.count(
            wait, aioratelimit__lock__kind="semaphore", aioratelimit__lock__result="acquired"
        )
        == 1
    )
    assert telemetry.count("aioratelimit.lock.timeouts", aioratelimit__lock__kind="lock") == 1
    assert telemetry.count("aioratelimit.lock.timeouts", aioratelimit__lock__kind="semaphore") == 1
    timed_out = [p for a, p in telemetry.points(wait) if a["aioratelimit.lock.result"] == "timeout"]
    assert timed_out[0].sum >= 0.04  # it waited for its timeout (lock); a bound, not a timing
    renewals = "aioratelimit.lock.renewals"
    assert telemetry.count(renewals, aioratelimit__lock__renewal__result="renewed") >= 1
    assert telemetry.count("aioratelimit.lock.lost", aioratelimit__lock__kind="lock") == 1


async def test_leader_terms_are_counted_and_gauged(
    telemetry: Telemetry, store: arl.Backend, key: str
) -> None:
    """Each term this process begins or ends is counted by the election's name and the
    event; the gauge is 1 while it leads and 0 after; a term's acquire is kind "leader"."""
    changes, leading = "aioratelimit.leader.changes", "aioratelimit.leader.leading"
    name = {"aioratelimit__leader__name": key}  # (the election's name: a role, by design)
    async with arl.leader(key, ttl=30, backend=store):
        assert telemetry.count(leading, **name) == 1
    async with arl.leader(key, ttl=30, backend=store):
        pass
    assert telemetry.count(changes, aioratelimit__leader__event="elected", **name) == 2
    assert telemetry.count(changes, aioratelimit__leader__event="resigned", **name) == 2
    assert telemetry.count(leading, **name) == 0
    wait = "aioratelimit.lock.acquire.duration"
    assert telemetry.count(wait, aioratelimit__lock__kind="leader") == 2


async def test_a_cancelled_acquire_and_a_failed_one(
    telemetry: Telemetry, store: arl.Backend, key: str
) -> None:
    """An acquire cancelled while it waits is ``canceled``; one the backend fails is
    ``error``; neither is a timeout."""
    async with arl.lock(key, backend=store):
        waiter = asyncio.create_task(arl.Lock(key, backend=store).acquire())
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    async with arl.Backend.from_url("redis://127.0.0.1:9/0", connect_timeout=0.5) as down:
        with pytest.raises(arl.BackendUnavailable):
            await arl.Semaphore(key, backend=down).acquire(timeout=0)
    wait = "aioratelimit.lock.acquire.duration"
    assert telemetry.count(wait, aioratelimit__lock__result="canceled") == 1
    assert (
        telemetry.count(
            wait, aioratelimit__lock__kind="semaphore", aioratelimit__lock__result="error"
        )
        == 1
    )
    assert telemetry.count("aioratelimit.lock.timeouts") == 0


async def test_a_renewal_refused_is_a_lost_lease(
    telemetry: Telemetry, store: arl.Backend, key: str
) -> None:
    """A lease taken away under its block: its renewal is refused and the lease is lost."""
    record = _keys.lock(store._head(_keys.LOCK_KIND), key)[0]

    async def held() -> None:
        async with arl.lock(key, ttl=0.3, backend=store):
            await store._run(arl._scripts.DELETE, [record], ())
            await asyncio.sleep(1)

    with pytest.raises(arl.LockLost):
        await held()
    assert (
        telemetry.count("aioratelimit.lock.renewals", aioratelimit__lock__renewal__result="refused")
        == 1
    )
    assert telemetry.count("aioratelimit.lock.lost") == 1


async def test_idempotency_outcomes(telemetry: Telemetry, store: arl.Backend, key: str) -> None:
    """Each claim of a key is counted by what it found: a first run, a replay, a call
    still in progress, a mismatched fingerprint."""
    started = asyncio.Event()
    release = asyncio.Event()

    @arl.idempotent(
        key=lambda k, body: k, fingerprint=lambda k, body: body, backend=store, name="charges"
    )
    async def charge(k: str, body: str) -> str:
        started.set()
        await release.wait()
        return "ok"

    first = asyncio.create_task(charge(key, "a"))
    await started.wait()
    with pytest.raises(arl.IdempotencyInProgress):
        await charge(key, "a")
    release.set()
    assert await first == "ok"
    assert await charge(key, "a") == "ok"
    with pytest.raises(arl.IdempotencyKeyMismatch):
        await charge(key, "b")
    claims = "aioratelimit.idempotency.claims"
    for outcome in ("first_run", "in_progress", "replay", "mismatch"):
        assert (
            telemetry.count(
                claims,
                aioratelimit__idempotency__outcome=outcome,
                aioratelimit__idempotency__name="charges",
            )
            == 1
        ), outcome


async def test_backend_errors_by_type_and_reason(telemetry: Telemetry, key: str) -> None:
    """A backend that cannot be reached: the decision's result is ``error`` and the
    backend error is counted by its type, its reason and the script."""
    # Port 9 (discard) has no listener here: the connection is refused at once.
    async with arl.Backend.from_url("redis://127.0.0.1:9/0", connect_timeout=0.5) as backend:
        with pytest.raises(arl.BackendUnavailable):
            await arl.FixedWindow("5/minute", backend=backend, name="down").hit(key)
    assert telemetry.count(DECISIONS, aioratelimit__rate_limiting__result="error") == 1
    errors = telemetry.points("aioratelimit.backend.errors")
    assert [a for a, _ in errors] == [
        {
            "error.type": "BackendUnavailable",
            "aioratelimit.backend.reason": "unreachable",
            "aioratelimit.script": "fixed_window",
        }
    ]


async def test_a_full_pool_is_a_backend_timeout(telemetry: Telemetry) -> None:
    """No pooled connection freed within the timeout (raised by the gate, not through
    ``translate``): one backend error, reason ``timeout``."""
    gate = Gate(1)
    gate.free -= 1
    with pytest.raises(arl.BackendUnavailable):
        await gate.wait(0.01)
    errors = telemetry.points("aioratelimit.backend.errors")
    assert [a for a, _ in errors] == [
        {"error.type": "BackendUnavailable", "aioratelimit.backend.reason": "timeout"}
    ]


async def test_bad_input_is_no_decision(telemetry: Telemetry, store: arl.Backend) -> None:
    """A decision or an acquire refused for its arguments (before any I/O) records
    nothing."""
    limiter = arl.FixedWindow("5/minute", backend=store)
    with pytest.raises(ValueError, match="key"):
        await limiter.hit("")
    with pytest.raises(ValueError, match="cost"):
        await limiter.hit("k", 6)
    with pytest.raises(ValueError, match="timeout"):
        await arl.Lock("k", backend=store).acquire(timeout=-1)
    assert telemetry.points(DECISIONS) == []
    assert telemetry.points("aioratelimit.lock.acquire.duration") == []


def test_breaker_state_is_a_gauge_of_the_state_it_is_in(telemetry: Telemetry) -> None:
    """``breaker_changed`` (called by the breaker) sets its state to 1, the others to 0."""
    _observe.breaker_changed(_observe.OPEN, "127.0.0.1:6400")
    _observe.breaker_changed(_observe.HALF_OPEN, "127.0.0.1:6400")
    states = {
        a["aioratelimit.breaker.state"]: p.value
        for a, p in telemetry.points("aioratelimit.breaker.state")
    }
    assert states == {"closed": 0, "open": 0, "half_open": 1}
    with pytest.raises(ValueError, match="breaker state"):
        _observe.breaker_changed("ajar")


def test_decisions_made_elsewhere_report_through_decided(telemetry: Telemetry) -> None:
    """The results the deny cache, fallback and shadow mode produce are in the vocabulary."""
    for result in (_observe.DENIED_CACHED, _observe.DEGRADED, _observe.SHADOW_DENIED):
        _observe.decided("api", "fixed_window", result, 0.0)
    for result in ("denied_cached", "degraded", "shadow_denied"):
        assert telemetry.count(DECISIONS, aioratelimit__rate_limiting__result=result) == 1


@pytest.mark.parametrize("backend", ["memory", "redis", "cluster", "sentinel"])
async def test_a_span_per_script_call(
    telemetry: Telemetry, backend: str, backend_url: str, key: str
) -> None:
    """``on_call`` makes one CLIENT span per script call, a child of the current span, with
    the database, the operation, the script, the server and the limiter's name."""
    tracer = telemetry.tracer_provider.get_tracer("test")
    async with arl.Backend.from_url(backend_url, on_call=otel.on_call) as store:
        limiter = arl.FixedWindow("5/minute", backend=store, name="api")
        await limiter.hit(key)  # connects: the span of a first call also names its server
        with tracer.start_as_current_span("request") as parent:
            await limiter.hit(key)
            await limiter.reset(key)
    spans: list[ReadableSpan] = [
        s for s in telemetry.spans.get_finished_spans() if s.name != "request"
    ]
    assert [s.name for s in spans] == [
        "EVALSHA fixed_window",
        "EVALSHA fixed_window",
        "EVALSHA rate_invalidate",
    ]
    hit = spans[1]
    assert hit.kind is SpanKind.CLIENT
    assert hit.parent is not None
    assert hit.parent.span_id == parent.get_span_context().span_id
    attributes = dict(hit.attributes or {})
    system = "redis"
    if backend == "memory":
        system = "aioratelimit.memory"  # the twin, in process: no server
    else:
        assert attributes.pop("server.address") in ("127.0.0.1", "localhost")
        assert isinstance(attributes.pop("server.port"), int)
    assert attributes == {
        "db.system": system,
        "db.system.name": system,
        "db.operation": "EVALSHA",
        "db.operation.name": "EVALSHA",
        "aioratelimit.script": "fixed_window",
        "aioratelimit.rate_limiting.limiter": "api",
    }
    assert hit.start_time is not None
    assert hit.end_time is not None
    assert 0 < hit.end_time - hit.start_time < 10**10
    assert "aioratelimit.rate_limiting.limiter" not in (spans[2].attributes or {})  # a reset


async def test_a_failed_call_is_an_error_span(telemetry: Telemetry, key: str) -> None:
    """A call that failed ends its span with status ERROR and ``error.type``, no message."""
    backend = arl.Backend.from_url(
        "redis://127.0.0.1:9/0", connect_timeout=0.5, on_call=otel.on_call
    )
    async with backend:
        with pytest.raises(arl.BackendUnavailable):
            await arl.FixedWindow("5/minute", backend=backend).hit(key)
    (span,) = telemetry.spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "BackendUnavailable"
    assert span.status.description == "BackendUnavailable"


async def test_no_attribute_is_a_key_a_name_or_a_token(
    telemetry: Telemetry, redis_url: str
) -> None:
    """Across every primitive, no metric attribute and no span attribute equals (or
    contains) a key, a lock or semaphore name, an idempotency key or a token used."""
    secrets = [f"secret-{n}-{_keys.new_token()[:8]}" for n in range(5)]
    user_key, lock_name, sem_name, idem_key, subject = secrets
    async with arl.Backend.from_url(redis_url, on_call=otel.on_call) as store:
        limiter = arl.FixedWindow("1/minute", backend=store, name="api")
        await limiter.hit(user_key)
        await limiter.hit(user_key)
        async with arl.lock(lock_name, backend=store):
            with pytest.raises(arl.LockTimeout):
                await arl.Lock(lock_name, backend=store).acquire(timeout=0)
        async with arl.semaphore(sem_name, limit=1, backend=store):
            pass
        token = await arl.issue_token(subject=subject, backend=store)
        assert await arl.consume_token(token, subject=subject, backend=store)

        @arl.idempotent(key=idem_key, backend=store)
        async def once() -> int:
            return 1

        assert await once() == await once() == 1
    secrets.append(token)
    values = telemetry.attribute_values()
    assert len(values) > 20
    leaks = [v for v in values if any(s in str(v) for s in secrets)]
    assert leaks == []


def test_off_records_nothing(key: str) -> None:
    """Uninstrumented (the default, and after ``uninstrument``), the hot paths find no
    recorder and a reader sees nothing."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel.instrument(meter_provider=provider)
    otel.uninstrument()
    assert _observe.recorder is None

    async def main() -> None:
        async with arl.Backend.from_url("memory://") as backend:
            await arl.FixedWindow("5/minute", backend=backend).hit(key)

    asyncio.run(main())
    data = reader.get_metrics_data()
    assert data is None or all(
        not s.metrics for r in data.resource_metrics for s in r.scope_metrics
    )
    provider.shutdown()


def test_instrument_checks_near_limit() -> None:
    with pytest.raises(ValueError, match="near_limit"):
        otel.instrument(near_limit=1.5)
    assert _observe.recorder is None


def without_opentelemetry() -> subprocess.CompletedProcess[str]:
    """A program that decides with OpenTelemetry hidden, in a fresh interpreter (a
    background job: tests/support/jobs.py)."""
    program = (
        "import sys, asyncio\n"
        "sys.modules['opentelemetry'] = None  # as if it were not installed\n"
        "import aioratelimit as arl\n"
        "async def main():\n"
        "    async with arl.Backend.from_url('memory://') as b:\n"
        "        assert (await arl.FixedWindow('1/minute', backend=b).hit('k')).allowed\n"
        "asyncio.run(main())\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.')]\n"
        "try:\n"
        "    import aioratelimit.otel\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('aioratelimit.otel imported without opentelemetry')\n"
    )
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", program], capture_output=True, text=True, timeout=60
    )


@pytest.mark.early(job=without_opentelemetry)
def test_the_package_works_without_opentelemetry(request: pytest.FixtureRequest) -> None:
    """``import aioratelimit`` imports no OpenTelemetry, and decides without it installed."""
    done = jobs.result(request)
    assert (done.returncode, done.stderr) == (0, "")


async def test_a_recorder_of_ones_own_without_opentelemetry(key: str) -> None:
    """``set_recorder`` installs any ``Recorder`` subclass (what a collector without
    OpenTelemetry uses); the methods it does not override do nothing; None switches off."""
    heard: list[tuple[str | None, str, str]] = []

    class Decisions(arl.Recorder):
        def decision(
            self, limiter: str | None, algorithm: str, result: str, seconds: float, decision: Any
        ) -> None:
            heard.append((limiter, algorithm, result))

    assert arl.set_recorder(Decisions()) is None
    try:
        async with arl.Backend.from_url("memory://") as backend:
            limiter = arl.FixedWindow("1/minute", backend=backend, name="mine")
            await limiter.hit(key)
            await limiter.hit(key)
            async with arl.lock(key, backend=backend):  # Recorder.acquire: does nothing
                pass
    finally:
        assert isinstance(arl.set_recorder(None), Decisions)
    assert heard == [("mine", "fixed_window", "allowed"), ("mine", "fixed_window", "denied")]
    with pytest.raises(TypeError, match="Recorder"):
        arl.set_recorder(object())  # type: ignore[arg-type]
    assert _observe.recorder is None


async def test_off_the_hot_paths_never_enter_the_instrumented_code(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """With no recorder, a decision, an acquire and a claim only test
    ``_observe.recorder``: none of the reporting functions is called (the rarer events,
    a renewal or a lost lease, call theirs, which test it first)."""

    def never(*args: object, **kwargs: object) -> Any:
        raise AssertionError("instrumented code ran with instrumentation off")

    for name in ("decide", "decided", "acquire", "claimed", "backend_error"):
        monkeypatch.setattr(_observe, name, never)
    assert _observe.recorder is None
    async with arl.Backend.from_url("memory://") as backend:
        limiter = arl.TokenBucket("1/minute", backend=backend, name="off")
        await limiter.hit(key)
        with pytest.raises(arl.RateLimited):
            await limiter.acquire(key)
        async with arl.lock(key, backend=backend):
            pass
        store = IdempotencyStore(backend)
        assert isinstance(await store.claim(key), Claimed)
