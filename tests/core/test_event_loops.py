"""The event-loop contract: one Backend (and the configured default) serves successive event
loops, under asyncio and under uvloop, and what it opened on a loop is closed when that loop
shuts down; nothing of asyncio's or uvloop's private state is ever written.

Each case runs in a fresh interpreter with ``-W error`` (a ResourceWarning of an unclosed
transport, a "Task was destroyed" or "Event loop is closed" report fails it on stderr).
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from support import jobs

PACKAGE = Path(__file__).resolve().parents[2] / "aioratelimit"

PROGRAM = textwrap.dedent(
    """
    import asyncio, sys, time

    import redis
    import uvloop

    import aioratelimit as arl

    url, runner, default = sys.argv[1], sys.argv[2], sys.argv[3] == "default"
    run = asyncio.run if runner == "asyncio" else uvloop.run
    if default:
        arl.configure(url)
        backend = None
    else:
        backend = arl.Backend.from_url(url)
    limiter = arl.SlidingWindow("1000/minute", backend=backend)


    async def use(round: int) -> None:
        assert (await limiter.hit(f"k{round}")).allowed
        # A contended lock: the waiter is woken through the backend's subscriber.
        lock = arl.Lock(f"L{round}", backend=backend)
        lease = await lock.acquire()
        waiter = asyncio.ensure_future(lock.acquire(timeout=10))
        # Released once the waiter sleeps on its subscription (tests/support/pace.py's asleep, not
        # importable here): a fixed pause could end before it even tried.
        subs = (backend or arl.get_backend())._notifier._subs
        for _ in range(10_000):
            if waiter.done() or any(s._waiter is not None for e in subs.values() for s in e):
                break
            await asyncio.sleep(0.001)
        else:
            raise AssertionError("the waiter never slept on its subscription")
        await lease.release()
        await (await waiter).release()
        async with arl.semaphore(f"S{round}", limit=2, backend=backend):
            pass


    def clients() -> int:
        # Connected clients other than this inspector, once the server has seen the closes.
        with redis.Redis.from_url(url) as inspector:
            for _ in range(200):
                n = int(inspector.info("clients")["connected_clients"]) - 1
                if n == 0:
                    break
                time.sleep(0.01)
            return n


    for round in range(2):
        run(use(round))
        if url.startswith("redis://"):
            print("open after loop", round, clients())
    run((backend or arl.get_backend()).aclose())
    print("done")
    """
)


def start_program(
    url: str, runner: str, default: bool, where: Path
) -> subprocess.CompletedProcess[str]:
    program = where / "loops.py"
    program.write_text(PROGRAM, encoding="utf-8")
    argv = [sys.executable, "-W", "error", str(program), url, runner, "default" if default else ""]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=where)


def run_program(url: str, runner: str, default: bool, tmp_path: Path) -> str:
    return succeeded(start_program(url, runner, default, tmp_path))


def succeeded(proc: subprocess.CompletedProcess[str]) -> str:
    """The program ended well and silently on stderr: its output."""
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stdout + proc.stderr
    return proc.stdout


def on_memory(runner: str) -> subprocess.CompletedProcess[str]:
    """The program on memory:// in a folder of its own (a background job: tests/support/jobs.py)."""
    with tempfile.TemporaryDirectory(prefix="arl-loops-") as where:
        return start_program("memory://", runner, False, Path(where))


@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
@pytest.mark.parametrize("default", [False, True], ids=["backend", "configured-default"])
def test_one_backend_serves_successive_loops_on_a_server(
    redis_url: str, runner: str, default: bool, tmp_path: Path
) -> None:
    """Two successive runs use one backend; after each, the server has no connection of
    ours left open (its loop's shutdown closed them), and the backend closes cleanly."""
    out = run_program(redis_url, runner, default, tmp_path)
    assert "open after loop 0 0" in out, out
    assert "open after loop 1 0" in out, out
    assert out.endswith("done\n")


@pytest.mark.parametrize(
    "runner",
    [
        pytest.param(runner, marks=pytest.mark.early(job=functools.partial(on_memory, runner)))
        for runner in ["asyncio", "uvloop"]
    ],
)
def test_one_backend_serves_successive_loops_on_memory(
    runner: str, request: pytest.FixtureRequest
) -> None:
    """memory:// serves successive loops too (its wake-ups are in-process)."""
    assert succeeded(jobs.result(request)).endswith("done\n")


@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
@pytest.mark.parametrize("deployment", ["cluster", "sentinel"])
def test_one_backend_serves_successive_loops_on_cluster_and_sentinel(
    deployment: str, runner: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A cluster or Sentinel backend serves successive loops: the next loop discovers the
    topology afresh, and nothing of the ended loop is left to warn about."""
    url = str(request.getfixturevalue(f"{deployment}_url"))
    assert run_program(url, runner, False, tmp_path).endswith("done\n")


def test_no_private_transport_state_is_written() -> None:
    """No module writes (or names) the private attributes of asyncio or uvloop transports."""
    pattern = re.compile(r"_closing|_sock\b|_ssl_protocol")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found
