"""``aioratelimit doctor``: is this deployment ready? One line per check, in plain words,
then ``ready`` (exit 0) or ``not ready`` (exit 1), so it can run as a readiness probe. With
neither ``--url`` nor ``REDIS_URL`` it is not ready: there is no deployment to vouch for.

It asks the server through ``server_check`` (its clock, its INFO version and mode, whether
it lets a script touch an undeclared key) and runs the library's read-only scripts on probe
keys; it writes nothing. On a cluster it probes many hash tags, to reach every master.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass

from .._backend import Backend
from .._errors import AioRateLimitError, BackendError, BackendUnavailable
from .._limits.algorithms import FixedWindow, SlidingWindow, TokenBucket
from .._locks.lock import Lock, Semaphore
from .._scripts import MIN_CLUSTER_VERSION, MIN_REDIS_VERSION, ScriptCall
from .._stores.urls import CLUSTER_SCHEMES, SENTINEL_SCHEMES, redact
from .._version import __version__
from . import admin as _admin
from .output import NO_URL, CliError, open_backend, out

OK, WARN, FAIL = "ok", "warn", "FAIL"

#: Round trips timed for the latency line; hash tags probed on a cluster (32 reach every
#: master of a 3-master cluster but for a chance of about 1 in 100 000).
LATENCY_CALLS = 20
CLUSTER_PROBES = 32


#: What the server answers to credentials it refuses, or to none where it needs some.
_REFUSED_CREDENTIALS = ("WRONGPASS", "NOAUTH", "without any password configured")


@dataclass
class Report:
    """The lines printed so far and whether any failed."""

    failed: int = 0

    def line(self, status: str, topic: str, text: str) -> None:
        if status == FAIL:
            self.failed += 1
        out(f"  {status:<4}  {topic:<9} {text}")


def _mode_of(url: str) -> str:
    if url.startswith("memory://"):
        return "memory"
    if url.startswith(CLUSTER_SCHEMES):
        return "cluster"
    if url.startswith(SENTINEL_SCHEMES):
        return "sentinel"
    return "standalone"


def _version(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in text.split("-")[0].split(".")[:3])
    except ValueError:
        return None


def main(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise CliError(f"--timeout must be > 0, got {args.timeout}")
    if args.url_source == NO_URL:
        return _no_url()
    servers: list[str] = []

    def seen(call: ScriptCall) -> None:
        servers.append(call.server)

    backend = open_backend(
        args.url,
        args.prefix,
        args.url_source,
        timeout=args.timeout,
        connect_timeout=args.timeout,
        on_call=seen,
    )
    return asyncio.run(_doctor(args, backend, servers))


def _no_url() -> int:
    """Nothing names the deployment: "ready" would vouch for a store of this process."""
    out(f"aioratelimit {__version__} doctor")
    Report().line(
        FAIL,
        "url",
        "neither --url nor REDIS_URL is set: no deployment to check (an application"
        " configured so runs on memory://, limits per process); --url memory:// checks that",
    )
    out("not ready: 1 problem")
    return 1


async def _doctor(args: argparse.Namespace, backend: Backend, servers: list[str]) -> int:
    report = Report()
    mode = _mode_of(args.url)
    out(f"aioratelimit {__version__} doctor")
    report.line(OK, "url", f"{redact(args.url)} (from {args.url_source})")
    async with backend:
        try:
            await _checks(report, backend, mode, servers)
        except BackendUnavailable as exc:
            report.line(FAIL, "server", f"unreachable: {exc}")
        except BackendError as exc:
            if any(code in str(exc) for code in _REFUSED_CREDENTIALS):
                report.line(FAIL, "auth", str(exc))
            elif "MOVED" in str(exc) or "CLUSTERDOWN" in str(exc):
                report.line(
                    FAIL,
                    "mode",
                    "this server is a Redis Cluster node: give the cluster's nodes as"
                    " redis+cluster://host:port,host:port",
                )
            else:
                report.line(FAIL, "server", str(exc))
        except AioRateLimitError as exc:
            report.line(FAIL, "server", str(exc))
    if report.failed:
        out(f"not ready: {report.failed} problem{'s' if report.failed > 1 else ''}")
        return 1
    out("ready")
    return 0


async def _checks(report: Report, backend: Backend, mode: str, servers: list[str]) -> None:
    facts = await _admin.server_facts(backend, "probe")
    local = time.time()
    if mode == "memory":
        report.line(OK, "mode", "memory: the embedded store, no server; limits are per process")
    else:
        await _mode(report, backend, mode, facts, servers)
        await _server_version(report, facts.version, cluster=mode == "cluster")
    await _scripts(report, backend)
    await _clock(report, backend, facts.time_us, local)
    await _latency(report, backend)
    if mode == "memory":
        return
    if facts.undeclared_keys:
        report.line(
            OK,
            "keys",
            "scripts may touch keys they do not declare (every aioratelimit"
            " script declares all its keys anyway)",
        )
    else:
        report.line(
            OK,
            "keys",
            "the server refuses keys a script does not declare: fine, every"
            " aioratelimit script declares all its keys",
        )


async def _mode(
    report: Report, backend: Backend, mode: str, facts: _admin.ServerFacts, servers: list[str]
) -> None:
    said = facts.mode or "unknown (INFO is not allowed in scripts here)"
    if mode == "standalone" and facts.mode == "cluster":
        report.line(
            FAIL,
            "mode",
            "this server is a Redis Cluster node: give the cluster's nodes as"
            " redis+cluster://host:port,host:port",
        )
        return
    if mode == "cluster":
        probes = [_admin.server_facts(backend, f"probe-{i}") for i in range(CLUSTER_PROBES)]
        await asyncio.gather(*probes)
        masters = sorted(set(servers))
        report.line(OK, "mode", f"cluster: {len(masters)} masters answered: {', '.join(masters)}")
        return
    server = servers[-1] if servers else "?"
    if mode == "sentinel":
        report.line(OK, "mode", f"Sentinel: the master is {server} (it says: {said})")
        return
    report.line(OK, "mode", f"standalone: {server} (it says: {said})")


async def _server_version(report: Report, text: str, *, cluster: bool = False) -> None:
    minimum = MIN_CLUSTER_VERSION if cluster else MIN_REDIS_VERSION
    need = ".".join(map(str, minimum))
    version = _version(text)
    if version is None:
        report.line(WARN, "version", f"the server did not tell its version; {need}+ is needed")
    elif version < minimum:
        report.line(FAIL, "version", f"Redis {text} is too old: the scripts need {need} or newer")
    else:
        report.line(OK, "version", f"Redis {text} (the scripts need {need} or newer)")


async def _scripts(report: Report, backend: Backend) -> None:
    """Run every read-only script on probe keys (loaded by SHA, or sent after NOSCRIPT)."""
    key = "aioratelimit-doctor"
    lock, sem = Lock(key, backend=backend), Semaphore(key, backend=backend)
    reads = [
        FixedWindow("1/s", backend=backend).peek(key),
        SlidingWindow("1/s", backend=backend).peek(key),
        TokenBucket("1/s", backend=backend).peek(key),
        lock.locked(),
        sem.holders(),
        _admin.lock_state(lock),
        _admin.semaphore_state(sem),
        _admin.idempotency_state(key, backend=backend),
        _admin.server_facts(backend, key),
    ]
    for read in reads:
        await read
    report.line(OK, "scripts", f"{len(reads)} read-only scripts ran; the others load alike")


async def _clock(report: Report, backend: Backend, first_us: int, local: float) -> None:
    await asyncio.sleep(0.05)
    second = (await _admin.server_facts(backend, "probe")).time_us
    if second <= first_us:
        report.line(FAIL, "clock", "the server's clock (TIME) does not move")
        return
    skew = first_us / 1e6 - local
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(first_us / 1e6))
    report.line(
        OK,
        "clock",
        f"server TIME {stamp}, moving; {skew:+.3f} s from this machine's"
        " (decisions use the server's clock only)",
    )


async def _latency(report: Report, backend: Backend) -> None:
    took = []
    for _ in range(LATENCY_CALLS):
        began = time.perf_counter()
        await _admin.server_facts(backend, "probe")
        took.append((time.perf_counter() - began) * 1000)
    report.line(
        OK,
        "latency",
        f"round trip {statistics.median(took):.2f} ms median,"
        f" {max(took):.2f} ms max, over {LATENCY_CALLS} calls",
    )
