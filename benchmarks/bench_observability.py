"""What instrumentation costs a decision: off, on without an SDK, on with the SDK.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_observability.py

Conditions, each ``FixedWindow.hit`` on one of 100 keys under a limit every hit is admitted
by, on memory:// (where a decision is cheapest, so any overhead shows most) and on Redis:

- bare: ``hit`` as it was before instrumentation existed (a subclass whose ``hit`` skips the
  test), the reference the "off" row is compared with;
- off: no instrumentation (the default: the hot path makes one test and goes on);
- on, no SDK: ``aioratelimit.otel.instrument()`` with no OpenTelemetry SDK configured (the
  API's no-op instruments, what a library user gets until the application sets one up);
- on, SDK: ``instrument(meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]))``;
- on, SDK + spans (Redis only): the same, on a backend built with
  ``on_call=aioratelimit.otel.on_call`` and a ``TracerProvider`` exporting to memory.

The conditions run interleaved in blocks (the order rotating), each switching the recorder
in before its hit (every condition pays that same assignment); figures are medians over the
repetitions and ratios medians of the per-repetition ratios to "off". Also timed: the one
test a hot path makes when instrumentation is off, alone (``timeit``). The server's CPU is
not read: instrumentation runs in the client, and every condition sends the same script.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable

import harness as h
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import aioratelimit as arl
from aioratelimit import Decision, _observe, otel

KEYS = 100


class Bare(arl.FixedWindow):
    """``FixedWindow`` whose ``hit`` is the one before instrumentation: no test at all."""

    __slots__ = ()

    async def hit(self, key: str, cost: int = 1, *, partial: bool = False) -> Decision:
        return Decision.from_reply(await self._send(key, cost, 1))


def recorders(
    meter_provider: MeterProvider, tracer_provider: TracerProvider
) -> dict[str, _observe.Recorder | None]:
    """The recorder of each condition, built once (``instrument`` then taken back)."""
    built: dict[str, _observe.Recorder | None] = {"off": None}
    otel.instrument()
    built["on, no SDK"] = _observe.recorder
    otel.instrument(meter_provider=meter_provider, tracer_provider=tracer_provider)
    built["on, SDK"] = _observe.recorder
    otel.uninstrument()
    return built


def decide(limiter: arl.FixedWindow, recorder: _observe.Recorder | None) -> h.Op:
    async def op(i: int) -> None:
        _observe.recorder = recorder  # every condition pays this one assignment
        await limiter.hit(f"k{i % KEYS}")

    return op


async def measure(
    name: str, cases: dict[str, h.Op], total: int, block: int, after: Callable[[], object]
) -> h.Reps:
    await h.interleave(cases, 20, 20)  # warm-up: connections, scripts
    reps = h.Reps()
    for rep in range(h.REPS):
        h.progress(f"{name}: repetition {rep + 1}/{h.REPS}")
        reps.append(await h.interleave(cases, total, block, rotate=rep))
        after()
    _observe.recorder = None
    return reps


def rows(reps: h.Reps) -> list[list[str]]:
    return [
        [case, reps.rate(case), h.fmt(h.median(s.us for s in reps.of(case)), 2),
         reps.speed(case, "off"), reps.speed(case, "bare")]
        for case in reps.runs[0]
    ]  # fmt: skip


async def main(lab: h.Lab) -> None:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    built = recorders(meter_provider, tracer_provider)
    memory = arl.Backend.from_url("memory://", prefix=lab.prefix)
    redis_backend = h.our_backend(lab.url, lab.prefix)
    traced = h.our_backend(lab.url, lab.prefix, on_call=otel.on_call)
    try:
        rate = "1000000000/hour"  # every hit admitted: the same path each time
        header = ["condition", "decisions/s", "µs/decision", "÷ off (speed)", "÷ bare (speed)"]

        on_memory = arl.FixedWindow(rate, backend=memory, name="bench")
        cases = {"bare": decide(Bare(rate, backend=memory, name="bench"), None)}
        cases.update({case: decide(on_memory, r) for case, r in built.items()})
        reps = await measure("memory://", cases, h.scaled(20_000, 50), 500, lambda: None)
        h.print_table("memory://, sequential FixedWindow.hit", header, rows(reps))
        memory_decision = h.median(s.seconds / s.ops for s in reps.of("off"))

        on_redis = arl.FixedWindow(rate, backend=redis_backend, name="bench")
        on_traced = arl.FixedWindow(rate, backend=traced, name="bench")
        cases = {"bare": decide(Bare(rate, backend=redis_backend, name="bench"), None)}
        cases.update({case: decide(on_redis, r) for case, r in built.items()})
        cases["on, SDK + spans"] = decide(on_traced, built["on, SDK"])
        # A span is kept per call by the in-memory exporter: dropped after each repetition.
        reps = await measure("redis", cases, h.scaled(5_000, 20), 250, spans.clear)
        h.print_table("Redis, sequential FixedWindow.hit", header, rows(reps))

        number = 2_000_000
        timings = timeit.repeat(
            "_observe.recorder is not None", globals={"_observe": _observe}, number=number
        )
        test_ns = 1e9 * min(timings) / number
        h.print_table(
            "The test a hot path makes when instrumentation is off",
            ["what", "ns", "share of a memory:// decision"],
            [[
                "`_observe.recorder is not None` (timeit, best of 5)",
                h.fmt(test_ns, 1),
                f"{100 * test_ns / (1e9 * memory_decision):.2f} %",
            ]],
        )  # fmt: skip
        h.print_notes(
            "Ratios are throughput relative to off (or to bare), the median of the"
            " per-repetition ratios (1.00: no difference); off against bare is what the"
            " instrumentation costs when it is off. On a shared machine differences of a"
            " few percent are within its noise."
        )
    finally:
        await memory.aclose()
        await redis_backend.aclose()
        await traced.aclose()
        meter_provider.shutdown()
        tracer_provider.shutdown()


if __name__ == "__main__":
    h.run(
        main,
        "Observability: what instrumentation costs a decision",
        ["aioratelimit", "opentelemetry-api", "opentelemetry-sdk"],
    )
