"""OpenTelemetry metrics and spans for aioratelimit (``pip install 'aioratelimit[otel]'``).

``instrument()`` records every decision, acquire, renewal, lost lease, idempotency claim
and backend error through the OpenTelemetry API (``opentelemetry-api`` only: with no SDK
configured, the API's instruments do nothing). ``on_call``, passed to
``Backend.from_url(url, on_call=aioratelimit.otel.on_call)`` or ``configure(on_call=...)``,
makes one client span per script call. No attribute ever carries a user's key, token or lock
name. The names are in ``docs/metrics.md``; ``uninstrument()`` switches recording off.

Only this module imports OpenTelemetry: ``import aioratelimit`` works without it.
"""

from __future__ import annotations

import math
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider

from . import _observe, _public
from ._scripts import ScriptCall
from ._version import __version__

__all__ = ["DURATION_BUCKETS", "SCOPE", "instrument", "on_call", "uninstrument"]

#: The instrumentation scope's name (the meter's and the tracer's).
SCOPE = "aioratelimit"
#: Histogram buckets (seconds): a decision takes tens of microseconds to milliseconds, a
#: lock acquire up to its timeout (OpenTelemetry's defaults start at 5 ms).
DURATION_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

# Attribute names (modelled on aspnetcore.rate_limiting.*: ours under aioratelimit.*).
LIMITER = "aioratelimit.rate_limiting.limiter"
ALGORITHM = "aioratelimit.rate_limiting.algorithm"
RESULT = "aioratelimit.rate_limiting.result"
LOCK_KIND = "aioratelimit.lock.kind"
LOCK_RESULT = "aioratelimit.lock.result"
RENEWAL_RESULT = "aioratelimit.lock.renewal.result"
IDEMPOTENCY_NAME = "aioratelimit.idempotency.name"
OUTCOME = "aioratelimit.idempotency.outcome"
REASON = "aioratelimit.backend.reason"
SCRIPT = "aioratelimit.script"
BREAKER_STATE = "aioratelimit.breaker.state"
LEADER_NAME = "aioratelimit.leader.name"
LEADER_EVENT = "aioratelimit.leader.event"
#: ``db.system`` of a memory:// call (no such database in the conventions: ours).
MEMORY_SYSTEM = "aioratelimit.memory"


class _Instruments(_observe.Recorder):
    """``Recorder`` on OpenTelemetry instruments."""

    def __init__(self, meter_provider: MeterProvider | None, near_limit: float) -> None:
        meter = metrics.get_meter(SCOPE, __version__, meter_provider=meter_provider)
        self.near_limit = near_limit
        self._decision_attributes: dict[tuple[str | None, str, str | None], dict[str, str]] = {}
        buckets = list(DURATION_BUCKETS)
        self.decisions = meter.create_counter(
            "aioratelimit.rate_limiting.decisions",
            unit="{decision}",
            description="Rate-limit decisions, by limiter, algorithm and result.",
        )
        self.decision_duration = meter.create_histogram(
            "aioratelimit.rate_limiting.decision.duration",
            unit="s",
            description="How long a rate-limit decision took (one script round trip).",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self.near = meter.create_counter(
            "aioratelimit.rate_limiting.near_limit",
            unit="{decision}",
            description="Admitted decisions that left the limit near exhaustion.",
        )
        self.bans = meter.create_counter(
            "aioratelimit.rate_limiting.bans",
            unit="{ban}",
            description="Keys banned by a limiter made with ban=, by limiter and algorithm.",
        )
        self.acquire_duration = meter.create_histogram(
            "aioratelimit.lock.acquire.duration",
            unit="s",
            description="How long a lock or semaphore acquire waited, by how it ended.",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self.timeouts = meter.create_counter(
            "aioratelimit.lock.timeouts",
            unit="{acquire}",
            description="Lock and semaphore acquires that ended in LockTimeout.",
        )
        self.renewals = meter.create_counter(
            "aioratelimit.lock.renewals",
            unit="{renewal}",
            description="Background lease renewals, by result.",
        )
        self.lost_leases = meter.create_counter(
            "aioratelimit.lock.lost",
            unit="{lease}",
            description="Leases lost under their async with block (LockLost).",
        )
        self.claims = meter.create_counter(
            "aioratelimit.idempotency.claims",
            unit="{claim}",
            description="Idempotency key claims, by outcome.",
        )
        self.errors = meter.create_counter(
            "aioratelimit.backend.errors",
            unit="{error}",
            description="Calls to the backend that failed, by error type and reason.",
        )
        self.leader_changes = meter.create_counter(
            "aioratelimit.leader.changes",
            unit="{term}",
            description="Terms this process began or ended, by leader name and event.",
        )
        self.leading = meter.create_up_down_counter(
            "aioratelimit.leader.leading",
            unit="{term}",
            description="1 while this process leads the name, 0 otherwise.",
        )
        self.breaker_state = meter.create_gauge(
            "aioratelimit.breaker.state",
            unit="1",
            description="1 for the state a circuit breaker is in, 0 for the others.",
        )

    def decision(
        self, limiter: str | None, algorithm: str, result: str, seconds: float, decision: Any
    ) -> None:
        attributes = self._decision_attributes.get((limiter, algorithm, result))
        if attributes is None:
            attributes = self._attributes(limiter, algorithm, result)
        self.decisions.add(1, attributes)
        self.decision_duration.record(seconds, attributes)
        if result == _observe.ALLOWED and decision is not None:
            limit = decision.limit
            if limit - decision.remaining >= math.ceil(self.near_limit * limit):
                self.near.add(1, self._attributes(limiter, algorithm, None))

    def _attributes(
        self, limiter: str | None, algorithm: str, result: str | None
    ) -> dict[str, str]:
        """A decision's attributes, built once per (limiter, algorithm, result): a bounded
        set, since none of them is a key. Never changed once built (the SDK may keep it)."""
        cached = self._decision_attributes.get((limiter, algorithm, result))
        if cached is None:
            cached = {ALGORITHM: algorithm}
            if result is not None:
                cached[RESULT] = result
            if limiter is not None:
                cached[LIMITER] = limiter
            self._decision_attributes[limiter, algorithm, result] = cached
        return cached

    def ban(self, limiter: str | None, algorithm: str, seconds: float) -> None:
        self.bans.add(1, self._attributes(limiter, algorithm, None))

    def acquire(self, kind: str, result: str, seconds: float) -> None:
        self.acquire_duration.record(seconds, {LOCK_KIND: kind, LOCK_RESULT: result})
        if result == _observe.TIMEOUT:
            self.timeouts.add(1, {LOCK_KIND: kind})

    def renewal(self, kind: str, result: str) -> None:
        self.renewals.add(1, {LOCK_KIND: kind, RENEWAL_RESULT: result})

    def lost(self, kind: str) -> None:
        self.lost_leases.add(1, {LOCK_KIND: kind})

    def leader(self, name: str, event: str) -> None:
        self.leader_changes.add(1, {LEADER_NAME: name, LEADER_EVENT: event})
        self.leading.add(1 if event == _observe.ELECTED else -1, {LEADER_NAME: name})

    def claim(self, name: str | None, outcome: str) -> None:
        attributes = {OUTCOME: outcome}
        if name is not None:
            attributes[IDEMPOTENCY_NAME] = name
        self.claims.add(1, attributes)

    def backend_error(self, error_type: str, reason: str, script: str | None) -> None:
        attributes = {"error.type": error_type, REASON: reason}
        if script is not None:
            attributes[SCRIPT] = script
        self.errors.add(1, attributes)

    def breaker(self, state: str, server: str | None) -> None:
        for each in _observe.BREAKER_STATES:
            attributes = {BREAKER_STATE: each}
            if server is not None:
                attributes["server.address"] = server
            self.breaker_state.set(1 if each == state else 0, attributes)


_tracer: trace.Tracer | None = None


def instrument(
    *,
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
    near_limit: float = 0.8,
) -> None:
    """Record aioratelimit's metrics from now on, through ``meter_provider`` (default: the
    global one, ``opentelemetry.metrics.set_meter_provider``); ``on_call`` makes its spans
    with ``tracer_provider`` (default: the global one).

    ``near_limit``: an admitted decision counts as near the limit once it has used that
    share of the limit or more (0.8: 80 of 100). Calling it again replaces the instruments.
    """
    global _tracer
    if not isinstance(near_limit, (int, float)) or not 0 < near_limit <= 1:
        raise ValueError(f"near_limit must be a share in (0, 1], not {near_limit!r}")
    recorder = _Instruments(meter_provider, float(near_limit))
    _tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
    _observe.set_recorder(recorder)


def uninstrument() -> None:
    """Stop recording (a hot path is back to its one test); spans use the global tracer."""
    global _tracer
    _observe.set_recorder(None)
    _tracer = None


def on_call(call: ScriptCall) -> None:
    """The ``on_call`` hook of ``Backend.from_url``: one CLIENT span per script call, from
    its start to its end, a child of the span current at the call, named like
    ``EVALSHA fixed_window``. On memory:// (the script's twin, in process) ``db.system`` is
    ``aioratelimit.memory`` and there is no server."""
    tracer = _tracer or trace.get_tracer(SCOPE)
    system = MEMORY_SYSTEM if call.server == "memory" else "redis"
    attributes: dict[str, str | int] = {
        "db.system": system,
        "db.system.name": system,
        "db.operation": "EVALSHA",
        "db.operation.name": "EVALSHA",
        SCRIPT: call.script,
    }
    host, _, port = call.server.rpartition(":")
    if host and port.isdigit():
        attributes["server.address"] = host.strip("[]")
        attributes["server.port"] = int(port)
    elif system == "redis":
        attributes["server.address"] = call.server  # a unix socket's path, or "cluster"
    limiter = _observe.LIMITER.get()
    if limiter is not None:
        attributes[LIMITER] = limiter
    span = tracer.start_span(
        f"EVALSHA {call.script}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        start_time=call.start_ns,
    )
    if call.error is not None:
        # The type only: an error's message may quote what the server was sent.
        error_type = type(call.error).__name__
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, error_type))
    span.end(end_time=call.start_ns + call.duration_ns)


_public.publish(__name__, __all__)
