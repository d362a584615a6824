"""Every ``benchmarks/bench_*.py`` still runs: a smoke run of each (``SMOKE=1``: two
repetitions at a hundredth of the counts) on the servers it starts itself.

No timing is asserted: a smoke run only proves the script works end to end, prints its
Markdown tables with the server's CPU beside the figures that carry it, and stops every
process it started. The smoke runs are the main lane's (and any run outside scripts/test):
the other lanes of scripts/test (another Python, or uvloop; ``AIORATELIMIT_TEST_LANE``)
skip them, a minute or two of what the library's own tests already cover there. The
benchmarks start their own redis-server processes, so their marks are given here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import loops

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("bench_*.py"))
#: A Markdown table's header separator line, e.g. ``|------|---|``.
TABLE_RULE = re.compile(r"^\|(-+\|)+$", re.MULTILINE)
#: What the harness prints on stderr for each process it starts and stops.
STARTED = re.compile(r"^started .*, pid (\d+)$", re.MULTILINE)
STOPPED = re.compile(r"^stopped .*, pid (\d+)$", re.MULTILINE)

#: The smoke runs are the main lane's (tests/support/loops.py).
SMOKE = pytest.mark.skipif(
    not loops.MAIN_LANE, reason="the benchmarks' smoke runs are the main lane's"
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def smoke_run(argv: list[str]) -> str:
    """Run a benchmark tiny; check it exits 0 and stopped by PID every process it started
    (and none is left running); return what it printed on stdout."""
    done = subprocess.run(
        [sys.executable, *argv],
        env={**os.environ, "SMOKE": "1"},
        cwd=BENCHMARKS.parent,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    started = STARTED.findall(done.stderr)
    assert started, done.stderr[-3000:]
    assert sorted(STOPPED.findall(done.stderr)) == sorted(started), done.stderr[-3000:]
    assert not [pid for pid in started if alive(int(pid))]
    return done.stdout


def cells(stdout: str, row: str) -> list[str]:
    """The cells of the table row whose first cell is ``row``."""
    found = re.search(rf"^\| {re.escape(row)} +\|(.*)\|$", stdout, re.MULTILINE)
    assert found is not None, f"no row {row!r} in:\n{stdout[-3000:]}"
    return [cell.strip() for cell in found.group(1).split("|")]


def server_cpu(cell: str) -> list[float]:
    """The figures of a server-CPU cell (``8.1``, ``8.1 / 7.9``); "-" is none."""
    return [float(x.replace(",", "")) for x in cell.split(" / ") if x != "-"]


#: Per script, rows whose last cell is the server's CPU per operation: ours, the raw floor
#: and the peers each get a figure of their own.
SERVER_CPU_ROWS = {
    "bench_transport": [
        "redis-benchmark -c 50 -P 1 (C)",
        "raw redis.asyncio EVALSHA, sequential",
        "ours FixedWindow, sequential",
        "ours FixedWindow, 64 tasks",
        "FixedWindow.hit's EVALSHA",
    ],
    "bench_ratelimit": [
        "raw floor: redis.asyncio EVALSHA",
        "**ours SlidingWindow**",
        "limits coredis SlidingWindowCounter",
        "limits redispy FixedWindow",
    ],
    "bench_idempotency": ["raw floor: redis.asyncio EVALSHA", "**consume_token**"],
    "bench_locks": [
        "raw EVALSHA, redis.asyncio (the floor)",
        "aioratelimit `Lock.acquire` + `Lease.release`",
        "redis-py `redis.asyncio.lock.Lock`",
    ],
    "bench_rwlock": [
        "raw EVALSHA, redis.asyncio (the floor)",
        "`ReadWriteLock` read, beside another reader",
        "`FairLock` acquire + release, nobody waiting",
    ],
    "bench_cluster": [
        "standalone: ours",
        "cluster: ours",
        "cluster: raw redis.asyncio RedisCluster",
    ],
    "bench_attack": ["plain `FixedWindow`, 64 task(s)"],
    "bench_multikey": ["hit_all", "3 hits, chained"],
    "bench_settle": ["FixedWindow hit", "FixedWindow settle", "TokenBucket reserve + settle"],
    "bench_replicas": ["plain", "replicas=1"],
    "bench_web": ["RateLimitMiddleware, Redis"],
    "bench_server": [
        "C `-c 50 -P 16`, minimal script (the server's limit)",
        "ours FixedWindow, 64 tasks, distinct keys",
        "ours TokenBucket, sequential",
        "limits SlidingWindowCounter, 64 tasks, distinct keys",
        "cluster: ours FixedWindow, 64 tasks, distinct keys",
    ],
    "bench_lone": ["C", "raw", "ours"],
}
#: The benchmarks that start a cluster too.
CLUSTERED = {"bench_cluster", "bench_server"}


def marks(script: Path) -> list[pytest.MarkDecorator]:
    """The deployments a benchmark starts (conftest reads these marks for the lanes)."""
    return [pytest.mark.redis, *([pytest.mark.cluster] if script.stem in CLUSTERED else [])]


@pytest.mark.slow
@SMOKE
@pytest.mark.parametrize("script", [pytest.param(s, id=s.stem, marks=marks(s)) for s in SCRIPTS])
def test_benchmark_smoke_run(script: Path) -> None:
    """The script exits 0, prints Markdown tables with the server's CPU per operation for
    ours, the raw floor and the peers, and stops every server it started."""
    stdout = smoke_run([str(script)])
    assert stdout.startswith("# "), stdout[:500]
    assert TABLE_RULE.search(stdout), stdout[-2000:]
    for row in SERVER_CPU_ROWS.get(script.stem, []):
        figures = server_cpu(cells(stdout, row)[-1])
        assert figures, f"{row}: no server CPU figure"
        assert all(x >= 0 for x in figures), row
        assert any(x > 0 for x in figures), row
    if script.stem == "bench_attack":
        # Not a timing: its three measurements are all printed.
        for title in ("Denied decisions per second", "A flood of 64 tasks", "breaker open"):
            assert title in stdout, stdout[-3000:]
    if script.stem == "bench_server":
        # Not a timing: every goal's ratio is computed and printed.
        goals = stdout.partition("### Goals")[2]
        assert len(re.findall(r"\| (?:yes|no) +\|$", goals, re.MULTILINE)) == 14, goals
    if script.stem == "bench_idempotency":
        # Not a timing: one round trip per operation, counted on both sides.
        for operation in ("**consume_token**", "**idempotent replay**", "issue_token"):
            assert cells(stdout, operation)[-1] == "1.00 / 1.00", operation


@pytest.mark.slow
@pytest.mark.redis
@SMOKE
def test_profile_hit_smoke_run() -> None:
    """benchmarks/profile_hit.py (the CPU per decision) runs tiny, cProfile on, prints its
    line with the client's and the server's CPU and the profile, and stops its server."""
    argv = [str(BENCHMARKS / "profile_hit.py"), "--tasks", "4", "--decisions", "200",
            "--limiter", "sw", "--profile", "3"]  # fmt: skip
    stdout = smoke_run(argv)
    line = r"sw tasks=4 decisions=200 cpu_us=[0-9.]+ per_s=[0-9]+ .* server_us=([0-9.]+)$"
    found = re.search(line, stdout, re.MULTILINE)
    assert found is not None, stdout[-2000:]
    assert float(found.group(1)) > 0
    assert "tottime" in stdout, stdout[-2000:]


@pytest.mark.slow
@pytest.mark.redis
@SMOKE
@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="needs valgrind")
def test_callgrind_server_smoke_run() -> None:
    """benchmarks/callgrind_server.py (the server's instructions per decision) runs tiny
    under callgrind, prints a count for ours and for the C client, and stops its server."""
    argv = [str(BENCHMARKS / "callgrind_server.py"), "--decisions", "64", "--top", "3"]
    stdout = smoke_run(argv)
    for row in ("C -c 50 -P 16, minimal script", "ours FixedWindow, 64 tasks"):
        assert float(cells(stdout, row)[1].replace(",", "")) > 0, row
    assert "`luaCallFunction`" in stdout, stdout[-3000:]


def test_every_benchmark_is_found() -> None:
    """The smoke runs cover at least the hot-path benchmarks (the glob still matches), and
    every script that prints the server's CPU is among them."""
    stems = {s.stem for s in SCRIPTS}
    assert {"bench_transport", "bench_ratelimit"} <= stems
    assert SERVER_CPU_ROWS.keys() <= stems


def test_run_refuses_a_name_no_benchmark_has() -> None:
    """benchmarks/run.py (the one command for several benchmarks) refuses an unknown name
    before it runs anything, and lists the names it knows: every bench_*.py."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run.py"), "transport", "nosuch"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    listed = done.stderr.rpartition("the benchmarks: ")[2].strip().split(", ")
    assert listed == [s.stem.removeprefix("bench_") for s in SCRIPTS]
