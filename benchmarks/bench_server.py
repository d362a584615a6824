"""The server's CPU per decision: ours against the C client's minimal script and ``limits``.

Run (it starts a redis-server and a cluster of three masters and three replicas on free
loopback ports, and stops them at the end)::

    .venv/bin/python benchmarks/bench_server.py
    ARL_BATCH=0 .venv/bin/python benchmarks/bench_server.py   # Backend.from_url(batch=False)

One table, every condition measured in every repetition, in rounds whose order rotates
(what the machine's drift does to one condition, it does to all); figures are medians over
the repetitions, ratios medians of per-repetition ratios:

- the C client, ``redis-benchmark``, sending the minimal fixed-window script
  (``FLOOR_LUA``: INCR, PEXPIRE on the first hit, PTTL) by EVALSHA: ``-c 50 -P 16`` (the
  server's limit: pipelined, so the server does the least work per call), ``-c 50 -P 1``
  on random keys and on one hot key, ``-c 1`` (one caller), and ``--cluster -c 50`` on
  the cluster;
- ours, ``FixedWindow``, ``SlidingWindow`` and ``TokenBucket`` ``hit`` on one
  ``Backend.from_url`` (the library's own wire): 64 tasks on distinct keys (each decision
  the next of 100,000 keys, the key space of redis-benchmark's ``-r``), 64 tasks on one hot
  key (every hit admitted), 64 tasks on one hot key under a limit of 10 (denial-heavy),
  and one task (sequential); ``FixedWindow`` with 64 tasks on the cluster;
- ``limits`` (async, on redis-py): ``FixedWindow``, ``SlidingWindowCounter`` and
  ``MovingWindow`` (the peer of our ``TokenBucket``: ``limits`` has no token bucket) with
  64 tasks on distinct keys.

Beside each: decisions/s, the server's CPU µs per decision (``INFO CPU`` deltas, summed
over the cluster's six nodes for its rows), this process's CPU µs per decision
(``time.process_time``; for redis-benchmark, its own) and the p50/p99 latency of one
decision (redis-benchmark's own percentiles for its rows).

``ARL_BATCH`` (when set): passed as ``Backend.from_url(url, batch=...)`` where the backend
takes that keyword (``0``/``1``/``true``/``false`` as a bool, another integer as is), and
named in the report's header either way. The instructions per decision under callgrind:
``benchmarks/callgrind_server.py``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import harness as h

import aioratelimit as arl

RATE = "1000000000/hour"  # every hit admitted
DENY_RATE = "10/hour"  # all but the first 10 hits of a hot key denied
LIMITERS = ("FixedWindow", "SlidingWindow", "TokenBucket")
#: The ``limits`` strategy each of ours is compared with.
PEERS = {
    "FixedWindow": "FixedWindow",
    "SlidingWindow": "SlidingWindowCounter",
    "TokenBucket": "MovingWindow",
}
TASKS = 64
#: Each repetition runs every condition in this many rounds, a share of its count each.
ROUNDS = 4
#: Decisions of each crowd condition per repetition (one run of TASKS tasks)...
CROWD_N = h.scaled(20_000, 1_024)
#: ...of each sequential condition (interleaved in blocks of SEQ_BLOCK)...
SEQ_N = h.scaled(2_000, 80)
SEQ_BLOCK = min(100, SEQ_N // ROUNDS)
#: ...and of redis-benchmark: with 50 connections, one, and pipelined 16 deep.
C_N = h.scaled(20_000, 400)
C_SEQ_N = h.scaled(5_000, 200)
LIMIT_N = h.scaled(150_000, 1_600)
LIMIT_PIPELINE = 16
#: Distinct keys: each decision the next of this many (redis-benchmark's ``-r 100000``).
KEYSPACE = 100_000


def batch_option() -> tuple[dict[str, Any], str]:
    """``Backend.from_url`` options from ``ARL_BATCH``, and a line for the header."""
    raw = os.environ.get("ARL_BATCH")
    if raw is None:
        return {}, "ARL_BATCH unset: the backend's default"
    lowered = raw.strip().lower()
    value: bool | int | str
    if lowered in ("0", "false", "off", "no"):
        value = False
    elif lowered in ("1", "true", "on", "yes"):
        value = True
    else:
        value = int(lowered) if lowered.lstrip("-").isdigit() else raw
    param = inspect.signature(arl.Backend.from_url).parameters.get("batch")
    # Not **redis_options: a keyword the backend does not know would reach redis-py.
    if param is None or param.kind not in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
        return {}, f"ARL_BATCH={raw} ignored: Backend.from_url takes no batch="
    return {"batch": value}, f"Backend.from_url(url, batch={value!r})"


BATCH, BATCH_NOTE = batch_option()


def timed(op: h.Op, into: list[float]) -> h.Op:
    """``op``, each call's wall-clock seconds appended to ``into``."""
    perf, append = h.perf, into.append

    async def run(i: int) -> None:
        start = perf()
        await op(i)
        append(perf() - start)

    return run


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank)."""
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Run:
    """Every repetition's samples and latency percentiles (µs), by condition name."""

    def __init__(self) -> None:
        self.reps = h.Reps()
        self.latency: dict[str, list[tuple[float, float]]] = {}

    def keep(self, got: dict[str, h.Sample], seconds: dict[str, list[float]]) -> None:
        self.reps.append(got)
        for name, xs in seconds.items():
            pair = (1e6 * percentile(xs, 0.5), 1e6 * percentile(xs, 0.99))
            self.latency.setdefault(name, []).append(pair)

    def keep_c(self, name: str, done: h.CRun) -> None:
        """A redis-benchmark run's own percentiles."""
        self.latency.setdefault(name, []).append((done.p50_us, done.p99_us))

    def p(self, name: str) -> tuple[str, str]:
        pairs = self.latency.get(name, [])
        if not pairs:
            return "-", "-"
        return h.fmt(h.median(p for p, _ in pairs)), h.fmt(h.median(p for _, p in pairs))

    def cpu_ratio(self, name: str, base: str) -> float:
        """The median per-repetition ratio of the servers' CPU per decision."""
        return h.paired_ratio(
            [s.server_us for s in self.reps.of(name)], [s.server_us for s in self.reps.of(base)]
        )

    def speed_ratio(self, name: str, base: str) -> float:
        return h.paired_ratio(self.reps.per_s(name), self.reps.per_s(base))


def limiter(name: str, backend: arl.Backend, rate: str = RATE) -> Any:
    return getattr(arl, name)(rate, backend=backend)


#: One condition's share of a repetition: ``step(round)``.
Step = Callable[[int], Awaitable[None]]


class Cases:
    """The timed operations: ours, ``limits``' and their keys."""

    def __init__(
        self,
        prefix: str,
        backend: arl.Backend,
        storage: Any,
        meter: h.CpuMeter,
        unbatched: arl.Backend | None = None,
    ) -> None:
        from limits import RateLimitItemPerHour

        self.prefix, self.item = prefix, RateLimitItemPerHour(1_000_000_000)
        self.meter = meter
        self.ours = {name: limiter(name, backend) for name in LIMITERS}
        #: the same limiters on a backend made with batch=False (None: no such option)
        self.off = {n: limiter(n, unbatched) for n in LIMITERS} if unbatched is not None else {}
        self.deny = {name: limiter(name, backend, DENY_RATE) for name in LIMITERS}
        self.peers = {p: h.limits_strategy(p, storage) for p in PEERS.values()}

    @staticmethod
    def distinct(hit: Callable[[str], Any], tag: str, base: int) -> h.Op:
        """Decision ``i`` on the user key ``base + i`` (of ``KEYSPACE``)."""
        return lambda i: hit(f"{tag}:{(base + i) % KEYSPACE}")

    @staticmethod
    def hot(hit: Callable[[str], Any], key: str) -> h.Op:
        return lambda i: hit(key)

    def peer(
        self,
        name: str,
        strategy: str,
        rep: int,
        add: Callable[[str, h.Sample], None],
        seconds: dict[str, list[float]],
    ) -> Step:
        """``limits``' ``strategy`` at 64 tasks, on distinct keys, as ``ours`` runs."""
        hit, item, n = self.peers[strategy].hit, self.item, CROWD_N // ROUNDS
        tag = f"{self.prefix}:L{strategy}"  # limits' keys do not say the strategy

        async def go(round_: int) -> None:
            base = (rep * ROUNDS + round_) * n
            op: h.Op = lambda i: hit(item, tag, str((base + i) % KEYSPACE))  # noqa: E731
            add(name, await crowd(op, n, self.meter, seconds.setdefault(name, [])))

        return go


async def crowd(op: h.Op, n: int, meter: h.CpuMeter | None, seconds: list[float]) -> h.Sample:
    """One run of ``n`` decisions by ``TASKS`` tasks."""
    got = await h.crowds({"x": timed(op, seconds)}, TASKS, n // TASKS, 1, meter=meter)
    return got["x"]


async def repetition(
    lab: h.Lab, cases: Cases, cluster_fw: Any, cluster_off: Any, sha: str, rep: int, run: Run
) -> None:
    """Every condition, in ``ROUNDS`` rounds of a share of its decisions each, the order
    of the conditions rotating from round to round (and repetition to repetition): what
    the machine's drift does to one, it does to all."""
    assert lab.cluster is not None
    assert lab.cluster_meter is not None
    cluster, cmeter = lab.cluster, lab.cluster_meter
    floor = h.floor_command(sha, lab.prefix)
    hot_floor = [*floor[:3], f"{lab.prefix}:c:hot", floor[4]]
    got: dict[str, h.Sample] = {}
    seconds: dict[str, list[float]] = {}

    def add(name: str, sample: h.Sample) -> None:
        got[name] = got[name] + sample if name in got else sample

    def c(name: str, *args: Any, n: int = C_N // ROUNDS) -> Step:
        server, command, connections, pipeline, meter, *clustered = args

        async def go(_: int) -> None:
            done = h.c_client(server, command, connections, pipeline, n, meter, *clustered)
            add(name, done.sample)
            run.keep_c(name, done)

        return go

    def ours(name: str, hit: Callable[[str], Any], tag: str, distinct: bool = True,
             meter: h.CpuMeter | None = lab.meter) -> Step:  # fmt: skip
        n = CROWD_N // ROUNDS

        async def go(round_: int) -> None:
            base = (rep * ROUNDS + round_) * n
            op = cases.distinct(hit, tag, base) if distinct else cases.hot(hit, f"{tag}{rep}")
            add(name, await crowd(op, n, meter, seconds.setdefault(name, [])))

        return go

    async def sequential(round_: int) -> None:
        n = SEQ_N // ROUNDS
        base = (rep * ROUNDS + round_) * n
        ops = {
            f"{name}|seq": timed(
                cases.distinct(cases.ours[name].hit, f"s{name}", base),
                seconds.setdefault(f"{name}|seq", []),
            )
            for name in LIMITERS
        }
        for name, sample in (await h.interleave(ops, n, SEQ_BLOCK, round_, lab.meter)).items():
            add(name, sample)

    steps: list[Step] = [
        c("C -P 16", lab.redis, floor, 50, LIMIT_PIPELINE, lab.meter, n=LIMIT_N // ROUNDS),
        c("C -c 50", lab.redis, floor, 50, 1, lab.meter),
        c("C -c 50 hot", lab.redis, hot_floor, 50, 1, lab.meter),
        c("C -c 1", lab.redis, floor, 1, 1, lab.meter, n=C_SEQ_N // ROUNDS),
        c("C --cluster", cluster.seed, h.floor_command(sha, lab.prefix, cluster=True), 50, 1,
          cmeter, True),
        sequential,
        ours("cluster FixedWindow|c64", cluster_fw.hit, "cl", meter=cmeter),
    ]  # fmt: skip
    for name in LIMITERS:
        hit = cases.ours[name].hit
        steps.append(ours(f"{name}|c64", hit, f"c{name}"))
        steps.append(ours(f"{name}|hot", hit, f"h{name}", distinct=False))
        steps.append(ours(f"{name}|deny", cases.deny[name].hit, f"d{name}", distinct=False))
        steps.append(cases.peer(f"limits {PEERS[name]}|c64", PEERS[name], rep, add, seconds))
        if name in cases.off:  # the same, each decision its own script call
            off = cases.off[name].hit
            steps.append(ours(f"{name}|c64 off", off, f"o{name}"))
            steps.append(ours(f"{name}|hot off", off, f"oh{name}", distinct=False))
    if cluster_off is not None:
        steps.append(ours("cluster FixedWindow|c64 off", cluster_off.hit, "clo", meter=cmeter))
    for round_ in range(ROUNDS):
        first = (rep * ROUNDS + round_) % len(steps)
        for step in steps[first:] + steps[:first]:
            await step(round_)
    run.keep(got, seconds)


#: (label, condition) of the table's rows, in order.
ROWS = [
    ("C `-c 50 -P 16`, minimal script (the server's limit)", "C -P 16"),
    ("C `-c 50 -P 1`, minimal script, random keys", "C -c 50"),
    ("C `-c 50 -P 1`, minimal script, one hot key", "C -c 50 hot"),
    ("C `-c 1`, minimal script", "C -c 1"),
    *(
        (f"ours {n}, {what}", f"{n}|{key}")
        for n in LIMITERS
        for what, key in (
            ("64 tasks, distinct keys", "c64"),
            ("64 tasks, one hot key", "hot"),
            ("64 tasks, one hot key, denial-heavy", "deny"),
            ("sequential", "seq"),
            ("64 tasks, distinct keys, `batch=False`", "c64 off"),
            ("64 tasks, one hot key, `batch=False`", "hot off"),
        )
    ),
    *((f"limits {p}, 64 tasks, distinct keys", f"limits {p}|c64") for p in PEERS.values()),
    ("cluster: C `--cluster -c 50 -P 1`, minimal script", "C --cluster"),
    ("cluster: ours FixedWindow, 64 tasks, distinct keys", "cluster FixedWindow|c64"),
    ("cluster: ours FixedWindow, 64 tasks, distinct keys, `batch=False`",
     "cluster FixedWindow|c64 off"),
]  # fmt: skip

#: (figure, kind, ours, reference, goal): ``cpu`` ratios want at most the goal, ``speed``
#: ratios at least.
GOALS: list[tuple[str, str, str, str, float]] = [
    ("server CPU: FixedWindow 64 tasks distinct ÷ C -P 16", "cpu", "FixedWindow|c64",
     "C -P 16", 0.5),
    *((f"decisions/s: {n} 64 tasks hot key ÷ C -c 50 hot key", "speed", f"{n}|hot",
       "C -c 50 hot", 3.0) for n in LIMITERS),
    *((f"decisions/s: {n} 64 tasks distinct ÷ C -c 50", "speed", f"{n}|c64", "C -c 50", 2.0)
      for n in LIMITERS),
    *((f"decisions/s: {n} sequential ÷ C -c 1", "speed", f"{n}|seq", "C -c 1", 0.8)
      for n in LIMITERS),
    *((f"server CPU: {n} ÷ limits {p}, 64 tasks", "cpu", f"{n}|c64", f"limits {p}|c64", 0.3)
      for n, p in PEERS.items()),
    ("decisions/s: cluster FixedWindow 64 tasks ÷ C --cluster -c 50", "speed",
     "cluster FixedWindow|c64", "C --cluster", 1.5),
]  # fmt: skip


def report(run: Run) -> None:
    reps = run.reps
    rows = []
    for label, key in ROWS:
        if key not in run.reps:  # (batch=False rows, where the option does not exist)
            continue
        p50, p99 = run.p(key)
        rows.append([label, reps.rate(key), p50, p99, reps.client(key), reps.server(key)])
    h.print_table(
        f"Server CPU per decision, medians of {h.REPS} repetitions (min-max)",
        ["condition", "decisions/s", "p50 µs", "p99 µs", "client CPU µs", "server CPU µs"],
        rows,
    )
    goals = []
    for figure, kind, ours, base, goal in GOALS:
        ratio = run.cpu_ratio if kind == "cpu" else run.speed_ratio
        value = ratio(ours, base)
        ok = value <= goal if kind == "cpu" else value >= goal
        off = f"{ours} off"
        before = h.ratio(ratio(off, base)) if off in run.reps else "-"
        met = "≤" if kind == "cpu" else "≥"
        goals.append([figure, before, h.ratio(value), f"{met} {goal:g}", "yes" if ok else "no"])
    h.print_table(
        "Goals: ratios of the rows above",
        ["figure", "`batch=False`", "today", "goal", "met"],
        goals,
    )
    h.print_notes(
        f"Each repetition runs every condition in {ROUNDS} rounds, the order of the"
        f" conditions rotating every round: a crowd is {CROWD_N} decisions by {TASKS} tasks a"
        f" repetition, the sequential ones {SEQ_N} each interleaved in blocks of {SEQ_BLOCK};"
        f" redis-benchmark {C_N} requests ({C_SEQ_N} with -c 1, {LIMIT_N} with -P"
        f" {LIMIT_PIPELINE}). Distinct keys: each decision the next of {KEYSPACE:,} keys; hot:"
        " one key, every hit admitted (denial-heavy: a limit of 10). Server CPU: `INFO CPU`"
        " deltas around each run, per decision (the cluster's: summed over its six nodes,"
        " replication included); client CPU: this process's (`time.process_time`),"
        " redis-benchmark's own for its rows. Latency: per decision, from the call to its"
        " answer (redis-benchmark's: the median of its runs' own percentiles, per pipeline"
        " with -P 16).",
        f"Ours: `Backend.from_url(url)` ({BATCH_NOTE}). limits: its async `RedisStorage`"
        " on redis-py; its MovingWindow stands in for a token bucket, which it lacks.",
    )


async def main(lab: h.Lab) -> None:
    assert lab.cluster is not None
    backend = h.our_backend(lab.url, lab.prefix, **BATCH)
    clustered = h.our_backend(lab.cluster.url, lab.prefix, **BATCH)
    # Side by side: the same on backends made with batch=False, where the option exists
    # (and ARL_BATCH does not pick one already).
    split = not BATCH and "batch" in inspect.signature(arl.Backend.from_url).parameters
    unbatched = h.our_backend(lab.url, lab.prefix, batch=False) if split else None
    cluster_off = h.our_backend(lab.cluster.url, lab.prefix, batch=False) if split else None
    storage = h.limits_storage(lab.url, "redispy", f"{lab.prefix}:L")
    try:
        sha = ""
        for server in (lab.redis, *lab.cluster.nodes):
            with server.client() as client:
                sha = str(client.script_load(h.FLOOR_LUA))
        cases = Cases(lab.prefix, backend, storage, lab.meter, unbatched)
        cluster_fw = limiter("FixedWindow", clustered)
        cluster_unbatched = limiter("FixedWindow", cluster_off) if cluster_off else None
        # Warm-up: every script loaded, every connection open.
        warm = [cluster_fw.hit, *(lim.hit for lim in [*cases.ours.values(), *cases.off.values()])]
        if cluster_unbatched is not None:
            warm.append(cluster_unbatched.hit)
        await h.fan_out(lambda i: warm[i % len(warm)](f"warm:{i}"), TASKS, 8)(0)
        for name, strategy in cases.peers.items():  # limits' keys do not say the strategy
            await strategy.hit(cases.item, f"warm{name}")
        run = Run()
        for rep in range(h.REPS):
            await repetition(lab, cases, cluster_fw, cluster_unbatched, sha, rep, run)
            h.progress(f"rep {rep + 1}/{h.REPS} done")
        report(run)
    finally:
        for opened in (backend, clustered, unbatched, cluster_off):
            if opened is not None:
                await opened.aclose()
        await h.close_limits(storage)


if __name__ == "__main__":
    h.run(
        main,
        "Server CPU per decision: ours, the C client's minimal script, limits",
        ("aioratelimit", "redis", "hiredis", "limits"),
        cluster=True,
        extra=[("ARL_BATCH", BATCH_NOTE)],
    )
