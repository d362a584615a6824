"""What instrumentation costs a decision: off, on without an SDK, on with the SDK.

Run (the script starts no server; it writes keys only under a prefix unique to the run and
deletes them at the end)::

    REDIS_URL=redis://127.0.0.1:6391/0 .venv/bin/python benchmarks/bench_observability.py

Conditions, each ``FixedWindow.hit`` on one of 100 keys under a limit every hit is admitted
by, on memory:// (where a decision is cheapest, so any overhead shows most) and on
``REDIS_URL``:

- bare: ``hit`` as it was before instrumentation existed (a subclass whose ``hit`` skips the
  test), the reference the "off" row is compared with;
- off: no instrumentation (the default: the hot path makes one test and goes on);
- on, no SDK: ``aioratelimit.otel.instrument()`` with no OpenTelemetry SDK configured (the
  API's no-op instruments, what a library user gets until the application sets one up);
- on, SDK: ``instrument(meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]))``;
- on, SDK + spans (``REDIS_URL`` only): the same, on a backend built with
  ``on_call=aioratelimit.otel.on_call`` and a ``TracerProvider`` exporting to memory.

The conditions run interleaved in blocks (the order rotating), each switching the recorder
in before its hit (every condition pays that same assignment); figures are medians over the
repetitions and ratios medians of the per-repetition ratios to "off". Also timed: the one
test a hot path makes when instrumentation is off, alone (``timeit``).
"""

from __future__ import annotations

import asyncio
import timeit
from collections.abc import Sequence

import redis.asyncio as aredis
from _common import (
    REPS,
    Op,
    bench_prefix,
    column,
    delete_prefix,
    fmt,
    interleave,
    paired_ratio,
    print_header,
    print_notes,
    print_smoke_note,
    print_table,
    progress,
    ratio,
    redact,
    redis_url,
    scaled,
    with_spread,
)
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


def decide(limiter: arl.FixedWindow, recorder: _observe.Recorder | None) -> Op:
    async def op(i: int) -> None:
        _observe.recorder = recorder  # every condition pays this one assignment
        await limiter.hit(f"k{i % KEYS}")

    return op


async def measure(
    name: str, cases: dict[str, Op], total: int, block: int
) -> list[dict[str, float]]:
    reps = []
    for rep in range(REPS):
        progress(f"{name}: repetition {rep + 1}/{REPS}")
        reps.append(await interleave(cases, total, block, rotate=rep))
    _observe.recorder = None
    return reps


def rows(reps: Sequence[dict[str, float]]) -> list[list[str]]:
    off = column(reps, "off")
    bare = column(reps, "bare")
    return [
        [
            case,
            with_spread([1 / s for s in column(reps, case)], 0),
            fmt(1e6 * sorted(column(reps, case))[len(reps) // 2], 2),
            ratio(paired_ratio(off, column(reps, case))),
            ratio(paired_ratio(bare, column(reps, case))),
        ]
        for case in reps[0]
    ]


async def main() -> None:
    url = redis_url()
    prefix = bench_prefix()
    client = aredis.Redis.from_url(url)
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    built = recorders(meter_provider, tracer_provider)
    memory = arl.Backend.from_url("memory://", prefix=prefix)
    redis_backend = arl.Backend.from_url(url, prefix=prefix)
    traced = arl.Backend.from_url(url, prefix=prefix, on_call=otel.on_call)
    try:
        server = await client.info("server")
        print_header(
            "Observability benchmark: what instrumentation costs a decision",
            server,
            ["aioratelimit", "opentelemetry-api", "opentelemetry-sdk"],
        )
        rate = "1000000000/hour"  # every hit admitted: the same path each time
        header = ["condition", "decisions/s", "us/decision", "vs off", "vs bare"]

        on_memory = arl.FixedWindow(rate, backend=memory, name="bench")
        cases = {"bare": decide(Bare(rate, backend=memory, name="bench"), None)}
        cases.update({case: decide(on_memory, r) for case, r in built.items()})
        reps = await measure("memory://", cases, scaled(20_000, 50), 500)
        print_table("memory://, sequential FixedWindow.hit", header, rows(reps))
        memory_decision = sorted(column(reps, "off"))[len(reps) // 2]

        on_redis = arl.FixedWindow(rate, backend=redis_backend, name="bench")
        on_traced = arl.FixedWindow(rate, backend=traced, name="bench")
        cases = {"bare": decide(Bare(rate, backend=redis_backend, name="bench"), None)}
        cases.update({case: decide(on_redis, r) for case, r in built.items()})
        cases["on, SDK + spans"] = decide(on_traced, built["on, SDK"])
        # A span is kept per call by the in-memory exporter: drop them between repetitions.
        reps = []
        for rep in range(REPS):
            progress(f"redis: repetition {rep + 1}/{REPS}")
            reps.append(await interleave(cases, scaled(5_000, 20), 250, rotate=rep))
            spans.clear()
        _observe.recorder = None
        print_table(f"{redact(url)}, sequential FixedWindow.hit", header, rows(reps))

        number = 2_000_000
        test_ns = (
            1e9
            * min(
                timeit.repeat(
                    "_observe.recorder is not None", globals={"_observe": _observe}, number=number
                )
            )
            / number
        )
        print_table(
            "The test a hot path makes when instrumentation is off",
            ["what", "ns", "share of a memory:// decision"],
            [
                [
                    "`_observe.recorder is not None` (timeit, best of 5)",
                    fmt(test_ns, 1),
                    f"{100 * test_ns / (1e9 * memory_decision):.2f} %",
                ]
            ],
        )
        print_notes(
            "Ratios are throughput relative to off (or to bare), the median of the"
            " per-repetition ratios (1.00: no difference); off against bare is what the"
            " instrumentation costs when it is off. The machine is shared with other work:"
            " differences of a few percent are within its noise; run it again on a quiet"
            " machine before reading more into them."
        )
        print_smoke_note()
    finally:
        await delete_prefix(client, prefix)
        await memory.aclose()
        await redis_backend.aclose()
        await traced.aclose()
        await client.aclose()
        meter_provider.shutdown()
        tracer_provider.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
