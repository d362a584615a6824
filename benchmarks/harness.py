"""The one harness every benchmark runs on: its servers, clients, peers, timing and tables.

A benchmark script says what it compares; everything else is here, once:

- **servers**: ``run`` starts a ``redis-server`` (and, when the script asks, a Redis Cluster
  of three masters and three replicas) on free loopback ports, hands them to the script,
  and stops them by PID when it ends, however it ends. A benchmark sends traffic only to
  servers it started, so every figure of the server's CPU is the run's own;
- **the server's CPU**: ``CpuMeter`` reads ``INFO CPU`` (``used_cpu_sys + used_cpu_user``,
  and the main thread's where the server reports it) around every measured block, less
  what a reading itself costs, so each condition gets the µs of server CPU per operation
  beside its throughput;
- **clients**: the raw redis-py floor (``FLOOR_LUA`` by EVALSHA on ``redis.asyncio``), our
  backend, and ``redis-benchmark`` (the C client) on the same server, the physical limit;
- **peers**: the ``limits`` library's storages and strategies, redis-py's asyncio ``Lock``
  and python-redis-lock (optional);
- **timing**: the conditions a script compares run interleaved in blocks, in an order that
  rotates from block to block, inside every repetition; figures are medians over the
  repetitions and ratios medians of per-repetition ratios (both sides measured side by
  side): a shared machine drifts by tens of percent within seconds;
- **output**: Markdown on stdout (progress on stderr), the run's header first.

Knobs (environment):

``REPS``
    Repetitions (default 7). Fewer than 5 is a smoke run, and the tables say so.
``SCALE``
    Multiplies every operation count (default 1.0).
``SMOKE=1``
    A smoke run: ``REPS=2 SCALE=0.01`` (what the test suite runs, to prove a script works).
``LOOP``
    The event loop: ``asyncio`` (default) or ``uvloop``.
``REDIS_SERVER``
    The ``redis-server`` binary (default: the one on ``PATH``); ``redis-benchmark`` and
    ``redis-cli`` are taken from beside it, else from ``PATH``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import math
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import redis
import redis.asyncio as aredis

import aioratelimit as arl
from aioratelimit._scripts import Arg, Reply, Script

# -- knobs --------------------------------------------------------------------------------

#: Repetitions below this are a smoke run, not a measurement.
MIN_REPS = 5


def _env_number(name: str, default: float, kind: Callable[[str], float]) -> float:
    value = kind(os.environ.get(name, str(default)))
    if not value > 0:
        raise SystemExit(f"{name} must be > 0, got {value}")
    return value


SMOKE = os.environ.get("SMOKE", "") not in ("", "0")
REPS = int(_env_number("REPS", 2 if SMOKE else 7, int))
SCALE = _env_number("SCALE", 0.01 if SMOKE else 1.0, float)
LOOP = os.environ.get("LOOP", "asyncio")
if LOOP not in ("asyncio", "uvloop"):
    raise SystemExit(f"LOOP must be asyncio or uvloop, got {LOOP!r}")


def scaled(count: int, minimum: int = 1) -> int:
    """``count`` multiplied by ``SCALE``, at least ``minimum``."""
    return max(minimum, round(count * SCALE))


def progress(text: str) -> None:
    """A progress line on stderr (stdout is the Markdown report)."""
    print(text, file=sys.stderr, flush=True)


def bench_prefix() -> str:
    """A key prefix of the run, 13 bytes (the default ``arl`` is 3): key names about as
    long as real ones, for the benchmarks that measure memory per key."""
    return f"arlb:{uuid.uuid4().hex[:8]}"


# -- servers ------------------------------------------------------------------------------


def _tool(name: str) -> str | None:
    """A Redis binary: beside ``REDIS_SERVER`` if set, else on ``PATH``."""
    server = os.environ.get("REDIS_SERVER")
    if server and (beside := Path(server).with_name(name)).exists():
        return str(beside)
    return shutil.which(name)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: ``setpriv --pdeathsig KILL`` before a child's command: the kernel kills the child when
#: the benchmark dies, however it dies (a server left running would hold its port).
_DIE_WITH_US = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


class Child:
    """A process this run started, stopped by its PID (SIGTERM, then SIGKILL)."""

    def __init__(self, label: str, argv: Sequence[str], log: Path, **popen: Any) -> None:
        self.label, self.log = label, log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [*_DIE_WITH_US, *argv], stdout=out, stderr=subprocess.STDOUT, **popen
            )
        progress(f"started {label}, pid {self.proc.pid}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        progress(f"stopped {self.label}, pid {self.proc.pid}")


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``check`` (a state nothing signals) until it holds, at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


class RedisServer:
    """One ``redis-server`` on a free loopback port, without persistence."""

    def __init__(
        self, scratch: Path, *extra: str, wrapper: Sequence[str] = (), start_timeout: float = 20.0
    ) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"redis-{self.port}-", dir=scratch))
        binary = os.environ.get("REDIS_SERVER") or _tool("redis-server")
        if binary is None:
            raise SystemExit("redis-server not found: install it or set REDIS_SERVER")
        argv = [
            *wrapper, binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.dir), *extra,
        ]  # fmt: skip
        self.child = Child(f"redis-server on 127.0.0.1:{self.port}", argv, self.dir / "log")
        wait_for(self._answers, f"redis-server on port {self.port}", start_timeout)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=10, socket_connect_timeout=5)

    def _answers(self) -> bool:
        if not self.child.alive():
            raise SystemExit(f"redis-server exited at start:\n{self.child.output()}")
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        self.child.stop()


class RedisCluster:
    """Three masters and three replicas on loopback, formed by ``redis-cli --cluster``."""

    def __init__(self, scratch: Path, masters: int = 3, replicas: int = 1) -> None:
        self.nodes: list[RedisServer] = []
        self.replicas = masters * replicas
        try:
            for _ in range(masters * (1 + replicas)):
                self.nodes.append(
                    RedisServer(
                        scratch,
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", "nodes.conf",
                        "--cluster-port", str(free_port()),
                        # a loaded machine must not fail a master over mid-run
                        "--cluster-node-timeout", "15000",
                        "--repl-diskless-sync-delay", "0",
                    )
                )  # fmt: skip
            cli = _tool("redis-cli")
            if cli is None:
                raise SystemExit("redis-cli not found: it forms the cluster")
            subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                capture_output=True, check=True, timeout=120,
            )  # fmt: skip
            wait_for(self._healthy, "the cluster to form", 120.0)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def seed(self) -> RedisServer:
        return self.nodes[0]

    def _healthy(self) -> bool:
        """Every node serves, agrees on who replicates whom, and is linked to the others
        (right after forming, a node may still see a replica as a master without slots,
        and a shard's wake-ups would skip it)."""
        for node in self.nodes:
            with node.client() as client:
                info = client.cluster("INFO")
                seen = client.cluster("NODES").values()
                repl = client.info("replication")
            if info.get("cluster_state") != "ok" or len(seen) != len(self.nodes):
                return False
            if sum("slave" in peer["flags"] for peer in seen) != self.replicas:
                return False
            if not all(peer["connected"] for peer in seen):
                return False
            if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                return False
        return True

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


# -- the server's CPU ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cpu:
    """CPU seconds of the measured servers: the whole process (``used_cpu_sys +
    used_cpu_user``) and its main thread (NaN where the server does not report it)."""

    total: float = 0.0
    main: float = 0.0

    def __add__(self, other: Cpu) -> Cpu:
        return Cpu(self.total + other.total, self.main + other.main)

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(self.total - other.total, self.main - other.main)


UNMETERED = Cpu(math.nan, math.nan)


class CpuMeter:
    """Reads how much CPU some servers have used (``INFO CPU``, summed over them).

    A reading is a round trip that costs the server CPU of its own: ``calibrate`` measures
    the CPU between two back-to-back readings, and ``since`` takes it off every interval.
    The readings are blocking calls made between measured blocks, never inside one."""

    def __init__(self, servers: Sequence[RedisServer]) -> None:
        self.clients = [server.client() for server in servers]
        self.overhead = Cpu()

    def read(self) -> Cpu:
        total = main = 0.0
        for client in self.clients:
            info = client.info("cpu")
            total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
            if "used_cpu_sys_main_thread" in info:
                main += float(info["used_cpu_sys_main_thread"])
                main += float(info["used_cpu_user_main_thread"])
            else:
                main = math.nan
        return Cpu(total, main)

    def since(self, start: Cpu) -> Cpu:
        """The servers' CPU since the reading ``start``, less one reading's own cost (never
        below zero: the cost is a median, an idle interval may come out a little under)."""
        used = self.read() - start - self.overhead
        return Cpu(
            max(0.0, used.total), used.main if math.isnan(used.main) else max(0.0, used.main)
        )

    def calibrate(self, pairs: int = 31) -> None:
        deltas = []
        for _ in range(pairs):
            start = self.read()
            deltas.append(self.read() - start)
        self.overhead = Cpu(
            statistics.median(d.total for d in deltas), statistics.median(d.main for d in deltas)
        )

    def close(self) -> None:
        for client in self.clients:
            client.close()


#: The meter of every condition, or one per condition name (a run on two deployments).
Meters = CpuMeter | Mapping[str, CpuMeter] | None


def _meter_of(meters: Meters, name: str) -> CpuMeter | None:
    if meters is None or isinstance(meters, CpuMeter):
        return meters
    return meters.get(name)


# -- the run ------------------------------------------------------------------------------


@dataclass
class Lab:
    """What a benchmark gets from ``run``: its servers, their meters, and a key prefix."""

    redis: RedisServer
    meter: CpuMeter
    cluster: RedisCluster | None = None
    cluster_meter: CpuMeter | None = None
    prefix: str = field(default_factory=bench_prefix)
    scratch: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))

    @property
    def url(self) -> str:
        return self.redis.url


@contextlib.contextmanager
def started(cluster: bool = False) -> Iterator[Lab]:
    """A ``Lab``: a redis-server (and a cluster), their meters calibrated; every server is
    stopped by PID on the way out, however it is left."""
    scratch = Path(tempfile.mkdtemp(prefix="arl-bench-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        server = RedisServer(scratch)
        stack.callback(server.stop)
        lab = Lab(server, CpuMeter([server]), scratch=scratch)
        stack.callback(lab.meter.close)
        if cluster:
            lab.cluster = RedisCluster(scratch)
            stack.callback(lab.cluster.stop)
            lab.cluster_meter = CpuMeter(lab.cluster.nodes)
            stack.callback(lab.cluster_meter.close)
            lab.cluster_meter.calibrate()
        lab.meter.calibrate()
        yield lab


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """``main`` on the ``LOOP`` event loop."""
    if LOOP == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def run(
    body: Callable[[Lab], Coroutine[Any, Any, None]],
    title: str,
    packages: Sequence[str] = ("aioratelimit", "redis", "hiredis"),
    *,
    cluster: bool = False,
    extra: Sequence[tuple[str, str]] = (),
) -> None:
    """A benchmark's whole run: start its servers, print the report's header, run
    ``body`` on the ``LOOP`` event loop, and stop every server."""
    with started(cluster) as lab:
        print_header(title, lab, packages, extra)
        run_loop(body(lab))
        if REPS < MIN_REPS:
            print_notes(f"**Smoke run** (REPS={REPS} < {MIN_REPS}): not a measurement.")
        sys.stdout.flush()


# -- clients ------------------------------------------------------------------------------

#: One timed operation: ``op(i)`` performs operation number ``i``.
Op = Callable[[int], Awaitable[object]]

#: The minimal fixed-window decision (INCR, PEXPIRE on the first hit, PTTL): the floor any
#: Lua limiter pays, run by the raw client and by redis-benchmark as the reference.
FLOOR_LUA = """\
local c = redis.call('INCR', KEYS[1])
if c == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return {c, redis.call('PTTL', KEYS[1])}
"""
WINDOW_MS = 60_000


def raw_client(url: str, **options: Any) -> aredis.Redis:
    """The raw floor's client: ``redis.asyncio`` with a connection per concurrent task."""
    return aredis.Redis.from_url(url, **{"max_connections": 1024, **options})


def raw_cluster(url: str, **options: Any) -> Any:
    """The raw floor's client on a cluster: ``redis.asyncio.RedisCluster`` on its seeds."""
    from redis.asyncio.cluster import ClusterNode
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    seeds = url.partition("://")[2].split(",")
    nodes = [ClusterNode(host, int(port)) for host, port in (s.split(":") for s in seeds)]
    return AsyncRedisCluster(startup_nodes=nodes, **{"max_connections": 1024, **options})


async def load_floor(client: Any) -> str:
    """Load the floor's script (on every master of a cluster client); its SHA."""
    return str(await client.script_load(FLOOR_LUA))


def floor_op(client: Any, sha: str, head: str, keys: int = 1000) -> Op:
    """The raw floor's decision on ``keys`` keys under ``head`` (each key its own hash
    tag, so that on a cluster they spread over the masters)."""
    evalsha = client.evalsha
    return lambda i: evalsha(sha, 1, f"{head}{{{i % keys}}}", WINDOW_MS)


def our_backend(url: str, prefix: str, **options: Any) -> arl.Backend:
    """Our backend as users build it: ``Backend.from_url`` with its defaults."""
    return arl.Backend.from_url(url, prefix=prefix, **options)


#: ``run(script, keys, args)``: one script through our backend's store.
RunScript = Callable[[Script, Sequence[str], Sequence[Arg]], Awaitable[Reply]]


def run_script(backend: arl.Backend) -> RunScript:
    """The store's own call a primitive makes: the one place the benchmarks reach it."""
    return backend._run


@contextlib.contextmanager
def intercept(
    backend: arl.Backend,
    seen: Callable[[Script, Sequence[str], Sequence[Arg], Reply], None],
) -> Iterator[None]:
    """While inside, ``seen(script, keys, args, reply)`` after each script ``backend`` runs."""
    inner = backend._run

    async def watched(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        reply = await inner(script, keys, args)
        seen(script, keys, args, reply)
        return reply

    backend._run = watched
    try:
        yield
    finally:
        backend._run = inner


@dataclass(frozen=True)
class Sample:
    """One condition's figures in one repetition: ``ops`` operations in ``seconds``, this
    process's CPU (``client_cpu``, s) and the servers' (``server``, s) meanwhile."""

    ops: int
    seconds: float
    client_cpu: float = math.nan
    server: Cpu = UNMETERED

    def __add__(self, other: Sample) -> Sample:
        return Sample(
            self.ops + other.ops,
            self.seconds + other.seconds,
            self.client_cpu + other.client_cpu,
            self.server + other.server,
        )

    @property
    def per_s(self) -> float:
        return self.ops / self.seconds

    @property
    def us(self) -> float:
        """Wall-clock µs per operation."""
        return 1e6 * self.seconds / self.ops

    @property
    def client_us(self) -> float:
        return 1e6 * self.client_cpu / self.ops

    @property
    def server_us(self) -> float:
        return 1e6 * self.server.total / self.ops

    @property
    def server_main_us(self) -> float:
        return 1e6 * self.server.main / self.ops


@dataclass(frozen=True, slots=True)
class CRun:
    """One ``redis-benchmark`` run: its ``Sample`` (its own CPU as the client's) and the
    latency percentiles it reports, µs per request."""

    sample: Sample
    p50_us: float
    p99_us: float


def c_client(
    server: RedisServer,
    command: Sequence[str],
    connections: int,
    pipeline: int,
    requests: int,
    meter: CpuMeter | None = None,
    cluster: bool = False,
) -> CRun:
    """``redis-benchmark`` (the C client) sending ``command`` ``requests`` times
    (``__rand_int__`` in it made random each time, out of 100,000; ``cluster``: to the
    masters of the cluster ``server`` belongs to), the servers' CPU read around it."""
    exe = _tool("redis-benchmark")
    if exe is None:
        raise SystemExit("redis-benchmark not found (redis-tools): it is the reference here")
    argv = [
        exe, "-h", "127.0.0.1", "-p", str(server.port), *(["--cluster"] if cluster else []),
        "-c", str(connections), "-n", str(requests), "-P", str(pipeline), "-r", "100000",
        "--csv", *command,
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = meter.read() if meter is not None else None
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    used = meter.since(start) if meter is not None and start is not None else UNMETERED
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",...
    rows = [line.split('","') for line in done.stdout.splitlines() if line.startswith('"')]
    if len(rows) < 2 or len(rows[-1]) < 7:
        raise SystemExit(f"redis-benchmark printed no rate: {done.stdout[-500:]}")
    rps, p50, p99 = (float(rows[-1][i].strip('"')) for i in (1, 4, 6))
    return CRun(Sample(requests, requests / rps, cpu, used), 1e3 * p50, 1e3 * p99)


def redis_benchmark(
    server: RedisServer,
    command: Sequence[str],
    connections: int,
    pipeline: int,
    requests: int,
    meter: CpuMeter | None = None,
    cluster: bool = False,
) -> Sample | None:
    """``c_client``'s ``Sample``; None without redis-benchmark."""
    if _tool("redis-benchmark") is None:
        return None
    return c_client(server, command, connections, pipeline, requests, meter, cluster).sample


def floor_command(sha: str, prefix: str, cluster: bool = False) -> list[str]:
    """The floor's EVALSHA as redis-benchmark sends it, on random keys under ``prefix``
    (on a cluster with redis-benchmark's ``{tag}``, a hash tag of each node's own)."""
    return ["EVALSHA", sha, "1", f"{prefix}:{'{tag}:' if cluster else ''}c:__rand_int__", "60000"]


# -- peers --------------------------------------------------------------------------------

LimitsImpl = Literal["coredis", "redispy"]


def limits_storage(url: str, implementation: LimitsImpl, prefix: str) -> Any:
    """``limits``' async Redis storage on ``url`` (its default client is coredis)."""
    from limits.aio.storage import RedisStorage

    return RedisStorage("async+" + url, implementation=implementation, key_prefix=prefix)


def limits_strategy(name: str, storage: Any) -> Any:
    """``limits``' async strategy ``name`` (``FixedWindow``, ``MovingWindow``,
    ``SlidingWindowCounter``) on ``storage``."""
    import limits.aio.strategies as strategies

    return getattr(strategies, f"{name}RateLimiter")(storage)


async def close_limits(storage: Any) -> None:
    """Close what a ``limits`` storage opened (it has no close of its own)."""
    from limits.aio.storage import MemoryStorage

    if isinstance(storage, MemoryStorage):
        await storage.reset()
        if storage.timer is not None and not storage.timer.done():
            storage.timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await storage.timer
        return
    client = storage.bridge.storage
    if hasattr(client, "aclose"):
        await client.aclose()
    else:  # coredis
        client.connection_pool.disconnect()


#: A lock's acquire and release as one contender uses them.
LockPair = tuple[Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[Any]]]


def our_lock(backend: arl.Backend, name: str, ttl: float) -> LockPair:
    lock = arl.Lock(name, ttl=ttl, backend=backend)

    async def release(lease: arl.Lease) -> None:
        await lease.release()

    return lock.acquire, release


def redispy_lock(client: aredis.Redis, name: str, ttl: float) -> LockPair:
    """redis-py's ``redis.asyncio.lock.Lock`` (it polls every 0.1 s while it waits)."""
    from redis.asyncio.lock import Lock

    lock = Lock(client, name, timeout=ttl)

    async def acquire() -> None:
        await lock.acquire()

    async def release(_: Any) -> None:
        await lock.release()

    return acquire, release


def python_redis_lock() -> Any:
    """The ``redis_lock`` module of python-redis-lock, or None where it is not installed."""
    try:
        return importlib.import_module("redis_lock")
    except ImportError:
        return None


# -- timing -------------------------------------------------------------------------------

perf = time.perf_counter


def _blocks(
    names: list[str], total: int, block: int, rotate: int
) -> Iterator[tuple[str, int, int]]:
    """The schedule: ``(case, first operation, count)`` in blocks of ``block``, the order
    of the cases rotating every block."""
    done, turn = 0, rotate
    while done < total:
        count = min(block, total - done)
        first = turn % len(names)
        for name in names[first:] + names[:first]:
            yield name, done, count
        done += count
        turn += 1


async def interleave(
    cases: Mapping[str, Op], total: int, block: int, rotate: int = 0, meter: Meters = None
) -> dict[str, Sample]:
    """``total`` operations of every case, in blocks of ``block`` whose order rotates
    every block (``rotate``, the repetition's number, shifts the start), so that all of
    them see the same drift of the machine; each case's ``Sample``, the servers' CPU
    read around each block where a meter is given."""
    samples = {name: Sample(0, 0.0, 0.0, Cpu()) for name in cases}
    for name, first, count in _blocks(list(cases), total, block, rotate):
        op, gauge = cases[name], _meter_of(meters=meter, name=name)
        before = gauge.read() if gauge is not None else None
        cpu, start = time.process_time(), perf()
        for i in range(first, first + count):
            await op(i)
        spent, cpu = perf() - start, time.process_time() - cpu
        used = gauge.since(before) if gauge is not None and before is not None else UNMETERED
        samples[name] += Sample(count, spent, cpu, used)
    return samples


def interleave_blocking(
    cases: Mapping[str, Callable[[], object]],
    total: int,
    block: int,
    rotate: int = 0,
    meter: Meters = None,
) -> dict[str, Sample]:
    """``interleave`` for synchronous operations (a blocking client's calls)."""
    samples = {name: Sample(0, 0.0, 0.0, Cpu()) for name in cases}
    for name, _, count in _blocks(list(cases), total, block, rotate):
        op, gauge = cases[name], _meter_of(meters=meter, name=name)
        before = gauge.read() if gauge is not None else None
        cpu, start = time.process_time(), perf()
        for _ in range(count):
            op()
        spent, cpu = perf() - start, time.process_time() - cpu
        used = gauge.since(before) if gauge is not None and before is not None else UNMETERED
        samples[name] += Sample(count, spent, cpu, used)
    return samples


def fan_out(op: Op, tasks: int, per_task: int) -> Op:
    """A crowd: ``chunk(c)`` runs ``tasks`` tasks at once, each awaiting ``per_task``
    operations of ``op``; operation numbers are distinct across chunks."""
    size = tasks * per_task

    async def worker(base: int) -> None:
        for i in range(base, base + per_task):
            await op(i)

    async def chunk(c: int) -> None:
        base = c * size
        await asyncio.gather(*(worker(base + t * per_task) for t in range(tasks)))

    return chunk


async def crowds(
    cases: Mapping[str, Op],
    tasks: int,
    per_task: int,
    chunks: int,
    rotate: int = 0,
    meter: Meters = None,
) -> dict[str, Sample]:
    """Every case as ``chunks`` crowds of ``tasks`` tasks x ``per_task`` operations,
    interleaved crowd by crowd: each case's ``Sample`` counts operations, not crowds."""
    size = tasks * per_task
    got = await interleave(
        {name: fan_out(op, tasks, per_task) for name, op in cases.items()},
        chunks,
        1,
        rotate,
        meter,
    )
    return {
        name: Sample(s.ops * size, s.seconds, s.client_cpu, s.server) for name, s in got.items()
    }


# -- statistics ---------------------------------------------------------------------------


def median(xs: Iterable[float]) -> float:
    values = list(xs)
    return statistics.median(values) if values else math.nan


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """The median over repetitions of ``num[i] / den[i]`` (both measured in repetition i)."""
    return median(a / b for a, b in zip(num, den, strict=True) if b)


class Reps:
    """Every repetition's ``Sample`` of every condition, by name."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Sample]] = []

    def append(self, samples: Mapping[str, Sample]) -> None:
        """One repetition's samples."""
        self.runs.append(dict(samples))

    def __contains__(self, name: str) -> bool:
        return bool(self.runs) and name in self.runs[0]

    def of(self, name: str) -> list[Sample]:
        return [run[name] for run in self.runs]

    def per_s(self, name: str) -> list[float]:
        return [s.per_s for s in self.of(name)]

    def speed(self, name: str, base: str | Sequence[float]) -> str:
        """The median per-repetition speed of ``name`` over ``base`` (a name or figures)."""
        den = self.per_s(base) if isinstance(base, str) else base
        return ratio(paired_ratio(self.per_s(name), den))

    def rate(self, name: str) -> str:
        """Operations per second, ``median (min-max)``."""
        return with_spread(self.per_s(name), 0)

    def latency(self, name: str, digits: int = 1) -> str:
        """Wall-clock µs per operation, ``median (min-max)``."""
        return with_spread([s.us for s in self.of(name)], digits)

    def client(self, name: str) -> str:
        """This process's CPU µs per operation (median)."""
        return fmt(median(s.client_us for s in self.of(name)))

    def server(self, name: str, main: bool = False) -> str:
        """The servers' CPU µs per operation (median); ``main``: ``process / main thread``."""
        total = median(s.server_us for s in self.of(name))
        if not main:
            return fmt(total)
        return f"{fmt(total)} / {fmt(median(s.server_main_us for s in self.of(name)))}"

    def main_share(self) -> str:
        """The main thread's share of the servers' CPU over every metered sample."""
        total = main = 0.0
        for run in self.runs:
            for sample in run.values():
                if not math.isnan(sample.server.main) and sample.server.total > 0:
                    total, main = total + sample.server.total, main + sample.server.main
        return f"{100 * main / total:.0f} %" if total else "-"


# -- output -------------------------------------------------------------------------------


def fmt(x: float, digits: int = 1) -> str:
    """A number for a table: thousands separators from 1,000 on, ``-`` for NaN."""
    if math.isnan(x):
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def with_spread(xs: Sequence[float], digits: int = 1) -> str:
    """``median (min-max)``."""
    if not xs:
        return "-"
    return f"{fmt(median(xs), digits)} ({fmt(min(xs), digits)}-{fmt(max(xs), digits)})"


def ratio(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def print_table(title: str, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """A Markdown table under a level-3 heading."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in header]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    print("\n".join(["", f"### {title}", "", line(header), rule, *map(line, cells)]), flush=True)


def print_notes(*notes: str) -> None:
    """Paragraphs of Markdown text."""
    for note in notes:
        print(f"\n{note}", flush=True)


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def print_header(
    title: str, lab: Lab, packages: Sequence[str], extra: Sequence[tuple[str, str]] = ()
) -> None:
    """The report's title, the machine, the servers the run started, versions and knobs."""
    with lab.redis.client() as client:
        server = client.info("server")
    servers = f"{server.get('redis_version', '?')} on 127.0.0.1"
    if lab.cluster is not None:
        servers += ", and a cluster of 3 masters and 3 replicas"
    print(f"# {title}")
    if REPS < MIN_REPS:
        print(f"\n**Smoke run** (REPS={REPS} < {MIN_REPS}): the figures below mean nothing.")
    rows = [
        ["date", time.strftime("%Y-%m-%d %H:%M %Z")],
        ["machine", f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs "
                    f"({_cpu_model()}), shared by the client and the servers"],
        ["python", f"{platform.python_version()} ({platform.python_implementation()})"],
        ["redis-server", servers + " (started by the run)"],
        *([p, version(p)] for p in packages),
        ["event loop", LOOP],
        ["server CPU", f"`INFO CPU` deltas around each measured block, less a reading's own "
                       f"{1e6 * lab.meter.overhead.total:.0f} µs"],
        *([k, v] for k, v in extra),
        ["knobs", f"REPS={REPS} SCALE={SCALE}"],
    ]  # fmt: skip
    print_table("Run", ["item", "value"], rows)
