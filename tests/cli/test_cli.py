"""The ``aioratelimit`` command, run as the installed console script against real servers
(and memory://): demo, inspect, reset, doctor, bench; closed pipes, Ctrl-C, bad input."""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import pty
import re
import select
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from support import forkrun, jobs
from support.pace import asleep, until
from support.servers import free_port

import aioratelimit as arl
from aioratelimit._cli import admin as _admin
from aioratelimit._cli.doctor import Report, _server_version
from aioratelimit._cli.main import main, table
from aioratelimit._cli.state import reset_lock
from aioratelimit._idempotency.store import Claimed, IdempotencyStore
from aioratelimit._scripts import MIN_CLUSTER_VERSION, MIN_REDIS_VERSION

#: The installed console script (``[project.scripts]``), beside this interpreter.
SCRIPT = str(Path(sys.executable).with_name("aioratelimit"))
#: The fork server of ``cli`` (the foreground's; it starts while pytest collects).
RUNNER = forkrun.foreground()
#: Every deployment a command that reads a server's state runs on.
DEPLOYMENTS = ["redis", "cluster", "sentinel"]
T = TypeVar("T")

#: One row of the demo's burst table: label, admitted, denied, retry after.
ROW = re.compile(
    r"^\s+(?P<label>(?:FixedWindow|SlidingWindow|TokenBucket)\b.*?)\s+"
    r"(?P<admitted>\d+)\s+(?P<denied>\d+)\s+(?P<retry>\d+\.\d+) s$",
    re.MULTILINE,
)
WAITED = re.compile(r"gets through after (?P<waited>\d+\.\d+) s")


def environment(url_env: str | None) -> dict[str, str]:
    """This process's environment with ``REDIS_URL`` set to ``url_env``, or removed."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if url_env is not None:
        env["REDIS_URL"] = url_env
    return env


def run(
    *args: str, url_env: str | None = None, stdin: int | None = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    """Run a command with ``REDIS_URL`` set to ``url_env`` (or removed), outside the repo."""
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=60,
        env=environment(url_env),
        cwd=Path(__file__).parent,
        stdin=stdin,
    )


def cli(*args: str, url_env: str | None = None) -> subprocess.CompletedProcess[str]:
    """The installed ``aioratelimit`` with ``args``, its own argv, environment, stdin and
    output, run in a fork of a warm interpreter (tests/support/forkrun.py), so a command costs
    milliseconds rather than an interpreter's start. It starts cold, as ``SCRIPT`` or
    ``python -m aioratelimit``, in the tests that need a process of their own (the demo,
    --version, an unreachable server, closed pipes, Ctrl-C, a terminal): all but Ctrl-C
    (which sets the signal handler the child inherits) run as background jobs
    (tests/support/jobs.py)."""
    env = environment(url_env)
    return RUNNER.run(Path(SCRIPT), args=args, cwd=Path(__file__).parent, env=env, timeout=60)


def started(*args: str) -> subprocess.Popen[str]:
    """The installed ``aioratelimit`` with ``args`` in a process of its own, on memory://,
    its stdout and stderr piped (for the tests that signal it or close its pipe)."""
    return subprocess.Popen(
        [SCRIPT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=environment(None),
        text=True,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The command failed with status 2 and one line on stderr (no traceback): that line."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("aioratelimit: error: "), proc.stderr
    return lines[0]


def on(url: str, work: Callable[[arl.Backend], Awaitable[T]]) -> T:
    """Run ``work`` with a backend of ``url`` on a loop of its own, then close it."""

    async def go() -> T:
        async with arl.Backend.from_url(url) as backend:
            return await work(backend)

    return asyncio.run(go())


def server(request: pytest.FixtureRequest, deployment: str) -> str:
    """The URL of the shared ``deployment`` (redis, cluster, sentinel)."""
    return str(request.getfixturevalue(f"{deployment}_url"))


def check_demo(proc: subprocess.CompletedProcess[str], where: str) -> None:
    """The scene played to the end with the counts every backend must give."""
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert f"demo on {where}" in proc.stdout
    rows = {m["label"].split()[0]: m for m in ROW.finditer(proc.stdout)}
    assert sorted(rows) == ["FixedWindow", "SlidingWindow", "TokenBucket"], proc.stdout
    for m in rows.values():
        # Each limiter admits 5 per 2 s: exactly 5 of the 12 concurrent requests get through.
        assert (int(m["admitted"]), int(m["denied"])) == (5, 7), proc.stdout
        # A denied caller may retry within the window (one extra bucket for SlidingWindow).
        assert 0 < float(m["retry"]) <= 2.2 + 0.01, proc.stdout
    waited = WAITED.search(proc.stdout)
    assert waited is not None, proc.stdout
    assert 0 < float(waited["waited"]) < 30
    assert "Done in" in proc.stdout


def demo_on_memory() -> subprocess.CompletedProcess[str]:
    return run(SCRIPT, "demo")


@pytest.mark.early(job=demo_on_memory)
def test_demo_runs_on_memory_without_a_server(request: pytest.FixtureRequest) -> None:
    """`aioratelimit demo` plays the scene on the embedded store: 5 of 12 admitted per limiter."""
    check_demo(jobs.result(request), "memory://")


def test_demo_runs_on_a_real_server(redis_url: str) -> None:
    """`python -m aioratelimit demo --url` plays the same scene, with the same counts, on Redis."""
    proc = run(sys.executable, "-m", "aioratelimit", "demo", "--url", redis_url)
    check_demo(proc, redis_url)


def demo_on_a_closed_port() -> tuple[str, subprocess.CompletedProcess[str]]:
    url = f"redis://127.0.0.1:{free_port()}/0"
    return url, run(sys.executable, "-m", "aioratelimit", "demo", "--url", url)


@pytest.mark.early(job=demo_on_a_closed_port)
def test_unreachable_server_is_one_line_and_exit_2(request: pytest.FixtureRequest) -> None:
    """A refused connection prints one error line (no traceback) and exits with status 2."""
    url, proc = jobs.result(request)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"aioratelimit: error: backend {url} unavailable: ")


@pytest.mark.parametrize(
    "url", ["http://localhost", "redis://127.0.0.1:notaport/0", "", "redis+nope://x"]
)
def test_malformed_url_is_an_error_not_a_traceback(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL that cannot be parsed is reported as invalid, with status 2, before any I/O."""
    assert main(["demo", "--url", url]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("aioratelimit: error: invalid --url ")
    assert err.count("\n") == 1


def test_password_is_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """Error messages show the URL without its password."""
    assert main(["demo", "--url", f"redis://:hunter2@127.0.0.1:{free_port()}/0"]) == 2
    out, err = capsys.readouterr()
    assert "hunter2" not in out + err
    assert "***@127.0.0.1" in err


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--url", "redis://:hunter2/qzx9@127.0.0.1:6379/0"],
        ["inspect", "lock", "x", "--url", "redis+cluster://:hunter2?qzx9@127.0.0.1:7000"],
        ["doctor", "--url", "rediss://arl:hunter2#qzx9@127.0.0.1:6380/0"],
    ],
)
def test_a_malformed_url_is_echoed_without_any_part_of_its_password(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A password with an unencoded '/', '?' or '#': one error line, status 2, naming the
    fix, and neither the URL as echoed nor the reason quotes a piece of the password."""
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert (out, err.count("\n")) == ("", 1)
    assert [piece for piece in ("hunter2", "qzx9") if piece in err] == [], err
    assert "***@127.0.0.1" in err
    assert "percent-encoded" in err


def version() -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "aioratelimit", "--version")


@pytest.mark.early(job=version)
def test_version(request: pytest.FixtureRequest) -> None:
    """`python -m aioratelimit --version` prints the package version and exits 0."""
    proc = jobs.result(request)
    assert (proc.returncode, proc.stdout.strip()) == (0, f"aioratelimit {arl.__version__}")


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a command the usage is printed and the status is 2."""
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "usage: aioratelimit" in capsys.readouterr().err


def test_table_aligns_numbers_right() -> None:
    """The plain-text table left-aligns the first column and right-aligns the others."""
    text = table(["name", "n"], [["a", "5"], ["longer", "12"]], indent="")
    assert text.splitlines() == ["name     n", "------  --", "a        5", "longer  12"]


# -- demo honours REDIS_URL; closed pipes and Ctrl-C -----------------------------------------


def test_demo_honours_redis_url(redis_url: str) -> None:
    """Without ``--url`` the demo plays on ``REDIS_URL``, as the rest of the library does."""
    check_demo(cli("demo", url_env=redis_url), redis_url)


def read_one_line(*args: str) -> tuple[str, int, str]:
    """Start the command, read one line of its output and close the pipe (a reader that
    leaves, as ``| head -1``): that line, its exit status and its stderr."""
    with started(*args) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        line = proc.stdout.readline()
        proc.stdout.close()
        return line, proc.wait(timeout=60), proc.stderr.read()


@pytest.mark.early(job=functools.partial(read_one_line, "demo"))
def test_demo_into_a_closed_pipe_stops_quietly(request: pytest.FixtureRequest) -> None:
    """`aioratelimit demo | head -1`: the reader leaves after one line; no traceback,
    nothing on stderr, status 141 (what a shell reports for SIGPIPE)."""
    # (Once the line is read, the demo still has its table and its 2 s wait to print.)
    line, status, stderr = jobs.result(request)
    assert "demo on memory://" in line
    assert (status, stderr) == (141, "")


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(
            command, marks=pytest.mark.early(job=functools.partial(read_one_line, *command))
        )
        for command in [["doctor", "--url", "memory://"], ["bench", "--seconds", "0.1"]]
    ],
)
def test_every_command_survives_a_closed_pipe(
    command: list[str], request: pytest.FixtureRequest
) -> None:
    """The other commands too: whether or not the reader left before they wrote, they
    end with no traceback (status 0, or 141 if a write found the pipe closed)."""
    _, status, stderr = jobs.result(request)
    assert (status in (0, 141), stderr) == (True, "")


def test_ctrl_c_is_one_line_and_status_130() -> None:
    """Ctrl-C (SIGINT) while the demo runs: one line on stderr, status 130, no traceback."""
    # A child inherits an ignored SIGINT (a suite started in the background by a shell
    # without job control has one), never a handler: as at a terminal, it gets the default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = started("demo")
    finally:
        signal.signal(signal.SIGINT, previous)
    with proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.readline()  # it runs (the scene takes about 2 s more)
        proc.send_signal(signal.SIGINT)
        status = proc.wait(timeout=60)
        assert (status, proc.stderr.read()) == (130, "aioratelimit: error: interrupted\n")


# -- inspect ---------------------------------------------------------------------------------

LIMIT_ROW = re.compile(
    r"^\s+(?P<label>\S+ \S+.*?)\s+(?P<used>\d+)\s+(?P<remaining>\d+)\s+(?P<reset>[\d.]+ s|-)$",
    re.MULTILINE,
)


def limit_rows(stdout: str) -> dict[str, tuple[int, int, str]]:
    return {
        m["label"]: (int(m["used"]), int(m["remaining"]), m["reset"])
        for m in LIMIT_ROW.finditer(stdout)
    }


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_inspect_limit_shows_used_remaining_and_reset(
    request: pytest.FixtureRequest, deployment: str, key: str
) -> None:
    """`inspect limit KEY --fixed ... --fixed ...`: one row per rate with the hits counted,
    those left and when the window resets; then what the next hit would get."""
    url = server(request, deployment)

    async def hits(backend: arl.Backend) -> None:
        limiter = arl.FixedWindow("10/minute", "100/hour", backend=backend)
        for _ in range(3):
            assert (await limiter.hit(key)).allowed

    on(url, hits)
    proc = cli("inspect", "limit", key, "--fixed", "10/minute", "--fixed", "100/hour", "--url", url)
    assert proc.returncode == 0, proc.stderr
    rows = limit_rows(proc.stdout)
    assert set(rows) == {"FixedWindow 10/minute", "FixedWindow 100/hour"}, proc.stdout
    used, remaining, reset = rows["FixedWindow 10/minute"]
    assert (used, remaining) == (3, 7)
    assert 0 < float(reset.split()[0]) <= 60
    used, remaining, reset = rows["FixedWindow 100/hour"]
    assert (used, remaining) == (3, 97)
    assert 60 < float(reset.split()[0]) <= 3600
    assert "next hit: allowed" in proc.stdout


def test_inspect_limit_under_sliding_and_token_specs(redis_url: str, key: str) -> None:
    """The same for ``--sliding`` (with its buckets) and ``--token`` (with its burst); a
    key with no hits shows nothing used and no reset, and a spent one the retry."""

    async def hits(backend: arl.Backend) -> None:
        for _ in range(4):
            await arl.SlidingWindow("5/minute", buckets=6, backend=backend).hit(key)
        for _ in range(3):
            await arl.TokenBucket("1/minute", burst=3, backend=backend).hit(key)

    on(redis_url, hits)
    sliding = cli(
        "inspect", "limit", key, "--sliding", "5/minute", "--buckets", "6", "--url", redis_url
    )
    assert limit_rows(sliding.stdout)["SlidingWindow 5/minute buckets=6"][:2] == (4, 1)
    other = cli("inspect", "limit", key, "--sliding", "5/minute", "--url", redis_url)
    assert limit_rows(other.stdout)["SlidingWindow 5/minute buckets=10"] == (0, 5, "-")
    token = cli("inspect", "limit", key, "--token", "1/minute", "--burst", "3", "--url", redis_url)
    assert limit_rows(token.stdout)["TokenBucket 1/minute burst=3"][:2] == (3, 0), token.stdout
    assert "next hit: denied, retry after" in token.stdout


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_inspect_shows_lock_and_semaphore_holders_by_fence_never_token(
    request: pytest.FixtureRequest, deployment: str, key: str
) -> None:
    """`inspect lock` shows the holder's fence and TTL, `inspect semaphore` each holder's;
    neither prints a holder's token (it would let the reader release the lock)."""
    url = server(request, deployment)

    async def hold(backend: arl.Backend) -> tuple[list[arl.Lease], str]:
        lease = await arl.Lock(key, ttl=60, backend=backend).acquire(timeout=0)
        sem = arl.Semaphore(key, limit=3, ttl=30, backend=backend)
        slots = [await sem.acquire(timeout=0), await sem.acquire(timeout=0)]
        return [lease, *slots], cli("inspect", "lock", key, "--url", url).stdout

    leases, held = on(url, hold)
    lock, *slots = leases
    assert re.search(rf"held: fence {lock.fencing_token}, TTL (\d+\.\d+) s", held), held
    sem = cli("inspect", "semaphore", key, "--limit", "3", "--url", url)
    assert sem.returncode == 0, sem.stderr
    assert f"semaphore {key!r}" in sem.stdout
    assert "2 of 3 held" in sem.stdout
    fences = re.findall(r"^\s+\d+\s+(\d+)\s+\d+\.\d+ s$", sem.stdout, re.MULTILINE)
    assert sorted(map(int, fences)) == sorted(s.fencing_token for s in slots), sem.stdout
    for lease in leases:
        assert lease._token not in held + sem.stdout
    free = cli("inspect", "lock", f"{key}-never", "--url", url)
    assert "free (no holder on record)" in free.stdout


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_inspect_and_reset_pause(request: pytest.FixtureRequest, deployment: str, key: str) -> None:
    """`inspect pause` says whether a shared pause runs and how long more; `reset pause`
    lifts it for every process (the server then holds none)."""
    url = server(request, deployment)

    async def start(backend: arl.Backend) -> float:
        return await arl.Pause(key, backend=backend).start(60)

    assert on(url, start) == 60.0
    shown = cli("inspect", "pause", key, "--url", url)
    assert shown.returncode == 0, shown.stderr
    left = re.search(rf"pause {key!r} on .*: paused, (\d+\.\d+) s left", shown.stdout)
    assert left is not None, shown.stdout
    assert 50 < float(left[1]) <= 60
    lifted = cli("reset", "pause", key, "--url", url)
    assert lifted.returncode == 0, lifted.stderr
    assert "lifted" in lifted.stdout

    async def remaining(backend: arl.Backend) -> float:
        return await arl.Pause(key, backend=backend).remaining()

    assert on(url, remaining) == 0.0
    assert "not paused" in cli("inspect", "pause", key, "--url", url).stdout


def test_inspect_leader_shows_the_leader_and_watches_its_changes(redis_url: str, key: str) -> None:
    """`inspect leader`: the identity, epoch and TTL of the term running; after it
    resigned, the last leader; `--watch` prints a line at each change until Ctrl-C."""

    async def lead(backend: arl.Backend) -> tuple[arl.Term, str]:
        async with arl.leader(key, ttl=60, identity="web-1:42", backend=backend) as term:
            return term, cli("inspect", "leader", key, "--url", redis_url).stdout

    term, held = on(redis_url, lead)
    assert f"leader {key!r}" in held
    assert re.search(rf"led by web-1:42: epoch {term.epoch}, TTL (\d+\.\d+) s", held), held
    after = cli("inspect", "leader", key, "--url", redis_url).stdout
    assert f"nobody leads (the last leader, web-1:42, had epoch {term.epoch})" in after
    never = cli("inspect", "leader", f"{key}-never", "--url", redis_url).stdout
    assert "nobody leads (no leader on record)" in never

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = started("inspect", "leader", key, "--watch", "--url", redis_url)
    finally:
        signal.signal(signal.SIGINT, previous)
    with proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        assert proc.stdout.readline().startswith(f"leader {key!r}")
        assert "nobody leads" in proc.stdout.readline()
        out = proc.stdout

        async def seen(backend: arl.Backend) -> tuple[arl.Term, str]:
            # The term ends only once the watcher has shown it.
            async with arl.leader(key, ttl=60, identity="web-1:42", backend=backend) as term:
                return term, await asyncio.to_thread(out.readline)

        second, began = on(redis_url, seen)
        ended = proc.stdout.readline()
        assert f"led by web-1:42: epoch {second.epoch}" in began, began
        assert f"nobody leads (the last leader, web-1:42, had epoch {second.epoch})" in ended
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130


async def _writers_waiting(rw: arl.ReadWriteLock) -> bool:
    return (await rw.state()).waiting_writers > 0


async def _queued(fair: arl.FairLock) -> bool:
    return await fair.waiters() > 0


def test_inspect_shows_rw_and_fair_locks_never_a_token(redis_url: str, key: str) -> None:
    """`inspect rwlock` shows the readers and the writers waiting (then the writer's fence),
    `inspect fair-lock` the holder and the queue's length; never a token."""

    async def hold(backend: arl.Backend) -> tuple[list[arl.Lease], list[str]]:
        rw = arl.ReadWriteLock(key, backend=backend)
        reader = await rw.acquire_read(timeout=0)
        writer = asyncio.create_task(rw.acquire_write())
        await until(lambda: _writers_waiting(rw), what="the writer's intent")
        fair = arl.FairLock(key, backend=backend)
        holder = await fair.acquire(timeout=0)
        waiter = asyncio.create_task(fair.acquire())
        await until(lambda: _queued(fair), what="the waiter queued")
        seen = [cli("inspect", "rwlock", key, "--url", redis_url).stdout]
        seen.append(cli("inspect", "fair-lock", key, "--url", redis_url).stdout)
        await reader.release()
        wrote = await writer
        seen.append(cli("inspect", "rwlock", key, "--url", redis_url).stdout)
        await holder.release()
        await wrote.release()
        await (await waiter).release()
        return [reader, wrote, holder], seen

    leases, (rw, fair, written) = on(redis_url, hold)
    assert "readers: 1" in rw, rw
    assert "writers waiting: 1" in rw, rw
    assert f"held: fence {leases[2].fencing_token}" in fair, fair
    assert "queue: 1 waiting" in fair, fair
    assert f"writer: fence {leases[1].fencing_token}" in written, written
    for lease in leases:
        assert lease._token not in rw + fair + written


def test_inspect_idempotency_never_prints_the_result_unless_asked(redis_url: str, key: str) -> None:
    """`inspect idempotency`: in progress (with its lease) or completed; the stored result
    (customer data) only with ``--show-result``."""

    async def states(backend: arl.Backend) -> None:
        store = IdempotencyStore(backend, ttl=600, lease=30)
        done = await store.claim(f"{key}-done")
        assert isinstance(done, Claimed)
        await store.complete(done, b'{"card": "4242-secret"}')
        assert isinstance(await store.claim(f"{key}-running"), Claimed)

    on(redis_url, states)
    done = cli("inspect", "idempotency", f"{key}-done", "--url", redis_url)
    assert done.returncode == 0, done.stderr
    assert "completed" in done.stdout
    assert "4242" not in done.stdout
    shown = cli("inspect", "idempotency", f"{key}-done", "--show-result", "--url", redis_url)
    assert 'result: {"card": "4242-secret"}' in shown.stdout
    running = cli("inspect", "idempotency", f"{key}-running", "--url", redis_url)
    assert "in progress" in running.stdout
    assert re.search(r"lease: (\d+\.\d+) s left", running.stdout), running.stdout
    unknown = cli("inspect", "idempotency", f"{key}-none", "--url", redis_url)
    assert "unknown: no record" in unknown.stdout


def test_show_result_escapes_what_a_terminal_would_obey(redis_url: str, key: str) -> None:
    """A stored result with terminal escapes (a colour, a title change, a bell), a
    bidirectional override, newlines and a C1 control is printed on one line with each of
    them escaped, never raw; bytes that are not UTF-8 as a bytes literal."""
    stored = b'{"n": "\x1b[2J\x1b]0;pwned\x07\xe2\x80\xae\xc2\x9b\\ok\r\nnext", "e": "\xc3\xa9"}'

    async def states(backend: arl.Backend) -> None:
        store = IdempotencyStore(backend, ttl=600, lease=30)
        for suffix, result in (("text", stored), ("binary", b"\x80\x1b[2J")):
            claim = await store.claim(f"{key}-{suffix}")
            assert isinstance(claim, Claimed)
            await store.complete(claim, result)

    on(redis_url, states)
    text = cli("inspect", "idempotency", f"{key}-text", "--show-result", "--url", redis_url)
    binary = cli("inspect", "idempotency", f"{key}-binary", "--show-result", "--url", redis_url)
    for proc in (text, binary):
        assert proc.returncode == 0, proc.stderr
        controls = [c for c in proc.stdout if not c.isprintable() and c != "\n"]
        assert controls == [], proc.stdout
        assert "\u202e" not in proc.stdout
    (line,) = [line for line in text.stdout.splitlines() if "result:" in line]
    assert line == (
        '  result: {"n": "\\x1b[2J\\x1b]0;pwned\\x07\\u202e\\x9b\\\\ok\\r\\nnext", "e": "é"}'
    )
    assert "  result: b'\\x80\\x1b[2J'" in binary.stdout


# -- reset -----------------------------------------------------------------------------------


def test_reset_limit_forgets_the_key_under_every_rate(redis_url: str, key: str) -> None:
    """`reset limit KEY --fixed ...` forgets the key's hits under each rate of the spec."""

    def limiter(backend: arl.Backend) -> arl.FixedWindow:
        return arl.FixedWindow("2/minute", "5/hour", backend=backend)

    async def spend(backend: arl.Backend) -> bool:
        for _ in range(2):
            await limiter(backend).hit(key)
        return (await limiter(backend).peek(key)).allowed

    assert on(redis_url, spend) is False
    proc = cli(
        "reset", "limit", key, "--fixed", "2/minute", "--fixed", "5/hour", "--url", redis_url
    )
    assert proc.returncode == 0, proc.stderr

    async def peek(backend: arl.Backend) -> arl.Decision:
        return await limiter(backend).peek(key)

    assert on(redis_url, peek).remaining == 1  # (after the peeked hit: 2 - 1)


def lock_held(url: str, key: str) -> tuple[bool, int]:
    async def state(backend: arl.Backend) -> tuple[bool, int]:
        s = await _admin.lock_state(arl.Lock(key, backend=backend))
        return s.holder is not None, s.last_fence

    return on(url, state)


def test_reset_lock_without_confirmation_writes_nothing(redis_url: str, key: str) -> None:
    """`reset lock --force` with no terminal to ask on and no ``--yes``, or without
    ``--force``: one error line, status 2, and the lock is still held by the same holder."""

    async def take(backend: arl.Backend) -> int:
        return (await arl.Lock(key, ttl=60, backend=backend).acquire(timeout=0)).fencing_token

    fence = on(redis_url, take)
    line = one_error_line(cli("reset", "lock", key, "--force", "--url", redis_url))
    assert "--yes" in line
    line = one_error_line(cli("reset", "lock", key, "--url", redis_url))
    assert "--force" in line
    assert lock_held(redis_url, key) == (True, fence)


def reset_args(url: str, name: str, *, yes: bool = False) -> argparse.Namespace:
    return argparse.Namespace(url=url, prefix="arl", name=name, force=True, yes=yes)


def test_reset_lock_asks_and_a_no_writes_nothing(redis_url: str, key: str) -> None:
    """At the prompt, anything but yes leaves the lock to its holder; yes frees it."""

    async def take(backend: arl.Backend) -> int:
        return (await arl.Lock(key, ttl=60, backend=backend).acquire(timeout=0)).fencing_token

    fence = on(redis_url, take)
    asked: list[str] = []

    def answer(reply: str) -> Callable[[str], str]:
        def ask(prompt: str) -> str:
            asked.append(prompt)
            return reply

        return ask

    backend = arl.Backend.from_url(redis_url)
    assert reset_lock(reset_args(redis_url, key), backend, ask=answer("n\n")) == 1
    assert lock_held(redis_url, key) == (True, fence)
    backend = arl.Backend.from_url(redis_url)
    assert reset_lock(reset_args(redis_url, key), backend, ask=answer("yes\n")) == 0
    assert lock_held(redis_url, key) == (False, fence)
    assert len(asked) == 2
    assert "[y/N]" in asked[0]


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
async def test_reset_lock_force_frees_a_crashed_holder_and_wakes_its_waiter(
    request: pytest.FixtureRequest, deployment: str, key: str
) -> None:
    """`reset lock --force --yes` frees a lock whose holder is gone and wakes its waiters as
    a release does (a message on the lock's wake-up channel); the waiter then gets a
    greater fence, and the old lease, should its process come back, no longer holds."""
    url = server(request, deployment)
    async with arl.Backend.from_url(url) as backend:
        lock = arl.Lock(key, ttl=60, backend=backend)
        crashed = await lock.acquire(timeout=0)
        waiter = asyncio.create_task(lock.acquire(timeout=30))
        channel = lock._names(backend).channel
        async with backend._notifier.subscribe(channel) as wake_up:
            await asleep(backend, waiter=waiter)  # it has tried, subscribed and sleeps
            assert not waiter.done()
            proc = await asyncio.to_thread(
                cli, "reset", "lock", key, "--force", "--yes", "--url", url
            )
            assert proc.returncode == 0, proc.stderr
            assert f"freed (fence {crashed.fencing_token})" in proc.stdout
            assert await wake_up.wait(30), "the forced release woke nobody"
        lease = await waiter
        assert lease.fencing_token > crashed.fencing_token
        with pytest.raises(arl.LockNotOwned):
            await crashed.extend()
        await lease.release()


def test_reset_lock_of_a_free_lock_does_nothing(redis_url: str, key: str) -> None:
    """Nothing holds it: nothing to ask, nothing written, status 0."""
    proc = cli("reset", "lock", key, "--force", "--url", redis_url)
    assert proc.returncode == 0
    assert "is free: nothing to do" in proc.stdout
    assert lock_held(redis_url, key) == (False, 0)


# -- doctor ----------------------------------------------------------------------------------

DOCTOR_MODE = {
    "redis": "standalone: ",
    "cluster": "cluster: 3 masters answered",
    "sentinel": "Sentinel: the master is",
}


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_doctor_reports_a_ready_deployment(request: pytest.FixtureRequest, deployment: str) -> None:
    """`doctor` on a working deployment: every line ok, the mode named, status 0."""
    url = server(request, deployment)
    proc = cli("doctor", url_env=url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "ready"
    topics = re.findall(r"^  (ok|warn|FAIL)\s+(\w+)", proc.stdout, re.MULTILINE)
    assert [t for _, t in topics] == [
        "url",
        "mode",
        "version",
        "scripts",
        "clock",
        "latency",
        "keys",
    ]
    assert {s for s, _ in topics} == {"ok"}, proc.stdout
    assert "(from REDIS_URL)" in proc.stdout
    assert DOCTOR_MODE[deployment] in proc.stdout
    minimum = MIN_CLUSTER_VERSION if deployment == "cluster" else MIN_REDIS_VERSION
    need = re.escape(".".join(map(str, minimum)))
    assert re.search(rf"Redis \d+\.\d+\.\d+ \(the scripts need {need} or newer\)", proc.stdout)


def test_doctor_on_memory_is_ready() -> None:
    """``--url memory://`` asked for: ready, and it says its limits are per process."""
    proc = cli("doctor", "--url", "memory://")
    assert proc.returncode == 0, proc.stdout
    assert "memory: the embedded store" in proc.stdout
    assert "per process" in proc.stdout


def test_doctor_without_a_url_is_not_ready() -> None:
    """Neither ``--url`` nor ``REDIS_URL``: a readiness probe missing its setting must not
    pass on a throw-away in-process store: one FAIL line saying so, "not ready", status 1."""
    proc = cli("doctor")
    assert proc.returncode == 1, proc.stdout
    topics = re.findall(r"^  (ok|warn|FAIL)\s+(\w+)", proc.stdout, re.MULTILINE)
    assert topics == [("FAIL", "url")], proc.stdout
    assert "neither --url nor REDIS_URL is set" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "not ready: 1 problem"


def test_doctor_not_ready_when_unreachable_and_hides_the_password() -> None:
    """An unreachable server: a FAIL line in plain words, status 1 (a readiness probe's
    "not ready"), and the URL shown without its password."""
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    proc = cli("doctor", "--timeout", "1", url_env=url)
    assert proc.returncode == 1
    assert "FAIL  server    unreachable" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "not ready: 1 problem"
    assert "hunter2" not in proc.stdout + proc.stderr
    assert "***@127.0.0.1" in proc.stdout


def test_doctor_says_a_cluster_node_needs_a_cluster_url(cluster_url: str) -> None:
    """A redis:// URL naming one node of a cluster: not ready, and how to fix the URL."""
    node = cluster_url.removeprefix("redis+cluster://").split(",")[0]
    proc = cli("doctor", "--url", f"redis://{node}/0")
    assert proc.returncode == 1, proc.stdout
    assert "redis+cluster://" in proc.stdout
    assert "FAIL  mode" in proc.stdout


def test_doctor_fails_a_server_older_than_the_minimum(capsys: pytest.CaptureFixture[str]) -> None:
    """The version line compares with the one constant ``MIN_REDIS_VERSION``."""
    report = Report()
    need = ".".join(map(str, MIN_REDIS_VERSION))
    older = "6.0.16"  # older than every minimum this library had (7.0, then 6.2)
    asyncio.run(_server_version(report, older))
    asyncio.run(_server_version(report, f"{need}.0"))
    asyncio.run(_server_version(report, "8.0.1"))
    asyncio.run(_server_version(report, f"{need}.0", cluster=True))  # a 6.2 cluster: too old
    out = capsys.readouterr().out
    assert report.failed == 2
    assert f"Redis {older} is too old: the scripts need {need} or newer" in out
    assert f"Redis {need}.0 is too old: the scripts need 7.0 or newer" in out


# -- bench -----------------------------------------------------------------------------------

BENCH_ROW = re.compile(r"^\s+(aioratelimit|redis-py), (sequential|concurrent \(\d+\))\s+[\d,]+\s")


def test_bench_against_the_redis_py_floor(redis_url: str) -> None:
    """`bench` on one server: ours and the redis-py floor, sequential and concurrent, in a
    table; no progress bar when stderr is not a terminal."""
    proc = cli("bench", "--seconds", "0.2", "--concurrency", "4", url_env=redis_url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    rows = [m.groups() for line in proc.stdout.splitlines() if (m := BENCH_ROW.match(line))]
    assert rows == [
        ("aioratelimit", "sequential"),
        ("redis-py", "sequential"),
        ("aioratelimit", "concurrent (4)"),
        ("redis-py", "concurrent (4)"),
    ], proc.stdout
    assert "vs redis-py" in proc.stdout


def bench_on_a_terminal() -> tuple[subprocess.CompletedProcess[bytes], str]:
    """``bench`` with its stderr on a terminal: how it ended, and what the terminal got."""
    main_fd, tty_fd = pty.openpty()
    try:
        proc = subprocess.run(
            [SCRIPT, "bench", "--seconds", "0.3"],
            stdout=subprocess.PIPE,
            stderr=tty_fd,
            stdin=subprocess.DEVNULL,
            env=environment(None),
            timeout=60,
        )
        ready, _, _ = select.select([main_fd], [], [], 5)
        drawn = os.read(main_fd, 65536).decode() if ready else ""
    finally:
        os.close(main_fd)
        os.close(tty_fd)
    return proc, drawn


@pytest.mark.early(job=bench_on_a_terminal)
def test_bench_draws_a_progress_bar_on_a_terminal(request: pytest.FixtureRequest) -> None:
    """With stderr on a terminal, a progress bar is drawn there (and wiped at the end)."""
    proc, drawn = jobs.result(request)
    assert proc.returncode == 0
    assert "[###" in drawn, drawn
    assert "aioratelimit, sequential" in drawn, drawn


# -- bad input: one line, status 2, nothing written --------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "limit", "k", "--fixed", "100/fortnight", "--url", "memory://"],
        ["inspect", "limit", "k"],
        ["inspect", "limit", "k", "--fixed", "5/s", "--token", "5/s"],
        ["inspect", "limit", "", "--fixed", "5/s", "--url", "memory://"],
        ["inspect", "gauge", "k"],
        ["inspect", "limit", "k", "--token", "0/second", "--url", "memory://"],
        ["reset", "limit", "k", "--sliding", "5/minute", "--buckets", "0", "--url", "memory://"],
        ["bench", "--url", "redis+cluster://127.0.0.1:1,127.0.0.1:2"],
        ["bench", "--url", "redis+sentinel://127.0.0.1:1/mymaster"],
        ["bench", "--seconds", "0"],
        ["doctor", "--url", "redis://127.0.0.1:notaport/0"],
        ["inspect", "lock", "x", "--url", "http://localhost"],
        ["reset", "lock", "x", "--force", "--yes", "--url", "redis+nope://x"],
    ],
)
def test_bad_input_is_one_line_and_status_2(args: list[str]) -> None:
    """Unknown or missing limiter specs, malformed URLs, a cluster URL for the one-server
    bench, usage errors: one line, status 2, before anything is sent."""
    one_error_line(cli(*args))


def test_a_bad_spec_resets_nothing(redis_url: str, key: str) -> None:
    """`reset limit` with one bad rate among good ones forgets nothing."""

    async def hit(backend: arl.Backend) -> int:
        return (await arl.FixedWindow("5/minute", backend=backend).hit(key)).remaining

    assert on(redis_url, hit) == 4
    one_error_line(
        cli("reset", "limit", key, "--fixed", "5/minute", "--fixed", "5/eon", "--url", redis_url)
    )
    assert on(redis_url, hit) == 3


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["inspect", "limit", "k", "--fixed", "5/minute"], "next hit: allowed"),
        (["inspect", "limit", "k", "--token", "5/minute", "--burst", "2"], "burst=2"),
        (["inspect", "lock", "jobs"], "free (no holder on record)"),
        (["inspect", "semaphore", "api"], "0 held"),
        (["inspect", "rwlock", "doc"], "readers: 0"),
        (["inspect", "fair-lock", "jobs"], "queue: 0 waiting"),
        (["inspect", "idempotency", "order-1"], "unknown: no record"),
        (["reset", "limit", "k", "--sliding", "5/minute"], "forgotten"),
        (["reset", "lock", "jobs", "--force"], "is free: nothing to do"),
    ],
)
def test_inspect_and_reset_run_on_memory(args: list[str], says: str) -> None:
    """With ``--url memory://`` they run there (a store of their own process, so empty)."""
    proc = cli(*args, "--url", "memory://")
    assert proc.returncode == 0, proc.stderr
    assert "memory:// (the embedded store: per process)" in proc.stdout
    assert says in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "limit", "k", "--fixed", "5/minute"],
        ["inspect", "lock", "jobs"],
        ["inspect", "semaphore", "api"],
        ["inspect", "rwlock", "doc"],
        ["inspect", "fair-lock", "jobs"],
        ["inspect", "idempotency", "order-1"],
        ["reset", "limit", "k", "--sliding", "5/minute"],
        ["reset", "lock", "jobs", "--force", "--yes"],
    ],
)
def test_inspect_and_reset_refuse_to_run_without_a_url(args: list[str]) -> None:
    """Neither ``--url`` nor ``REDIS_URL``: no "free", "unknown" or "forgotten" about a
    store that starts empty and ends with the command; one line saying so, status 2."""
    proc = cli(*args)
    line = one_error_line(proc)
    assert proc.stdout == ""
    assert "neither --url nor REDIS_URL is set" in line
    assert f"{args[0]} {args[1]} needs the deployment's URL" in line


def test_a_malformed_redis_url_is_named_as_such() -> None:
    """A bad ``REDIS_URL`` is reported as that, not as ``--url``: one line, status 2."""
    line = one_error_line(cli("doctor", url_env="redis://127.0.0.1:notaport/0"))
    assert line.startswith("aioratelimit: error: invalid REDIS_URL 'redis://127.0.0.1:notaport/0'")


def test_inspect_limit_shows_a_block(redis_url: str, key: str) -> None:
    """A key under ``block()``: the "blocked until" line (the instant and the time left),
    no counts (a peek answers the block), and the next hit denied; reset lifts it."""

    async def block(backend: arl.Backend) -> None:
        limiter = arl.FixedWindow("10/minute", backend=backend, blockable=True)
        await limiter.hit(key)
        await limiter.block(key, 120)

    on(redis_url, block)
    proc = cli("inspect", "limit", key, "--fixed", "10/minute", "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    found = re.search(r"blocked until: \S+Z \(for (\d+\.\d+) s more", proc.stdout)
    assert found is not None, proc.stdout
    assert 0 < float(found[1]) <= 120
    assert re.search(r"^\s+FixedWindow 10/minute\s+-\s+0\s+-$", proc.stdout, re.MULTILINE)
    assert "next hit: denied, retry after" in proc.stdout
    cli("reset", "limit", key, "--fixed", "10/minute", "--url", redis_url)
    after = cli("inspect", "limit", key, "--fixed", "10/minute", "--url", redis_url)
    assert "blocked until" not in after.stdout
    assert limit_rows(after.stdout)["FixedWindow 10/minute"] == (0, 10, "-")


def test_policy_commands_change_what_a_limiter_obeys(redis_url: str, key: str) -> None:
    """`policy set|get|list|assign|unassign|delete` change a limiter's policies in the
    store (its process sees them), and `inspect limit --policies` shows a key's effective
    policy and its counts under it; bad input is one line, status 2, nothing written."""
    name = f"api-{key}"
    bad = cli("policy", "set", name, "pro", "0/minute", "--url", redis_url)
    assert "invalid policy" in one_error_line(bad)
    bad = cli("policy", "set", name, "pro", "10/minute", "--rule", "often", "--url", redis_url)
    assert "unknown rule" in one_error_line(bad)
    assert "unknown policy" in one_error_line(
        cli("policy", "assign", name, key, "gold", "--url", redis_url)
    )
    assert "policies of" in cli("policy", "list", name, "--url", redis_url).stdout
    assert cli("policy", "get", name, "pro", "--url", redis_url).returncode == 1

    proc = cli("policy", "set", name, "pro", "10/minute", "100/hour", "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    assert "version 1" in proc.stdout
    assert cli("policy", "assign", name, key, "pro", "--url", redis_url).returncode == 0
    listed = cli("policy", "list", name, "--url", redis_url).stdout
    assert re.search(r"pro\s+10/60s, 100/3600s\s+keep", listed), listed

    async def hits(backend: arl.Backend) -> None:
        limiter = arl.FixedWindow("2/minute", backend=backend, name=name, policies=arl.Policies())
        for _ in range(3):
            assert (await limiter.hit(key)).policy == "pro"

    on(redis_url, hits)
    shown = cli(
        "inspect",
        "limit",
        key,
        "--fixed",
        "2/minute",
        "--name",
        name,
        "--policies",
        "--url",
        redis_url,
    )
    assert shown.returncode == 0, shown.stderr
    assert "policy: pro: 10/60s, 100/3600s, rule keep" in shown.stdout
    assert re.search(r"^\s+10\s+3\s+7\s", shown.stdout, re.MULTILINE), shown.stdout

    own = cli("policy", "assign", name, key, "--rates", "5/minute", "--url", redis_url)
    assert "its own 5/60s" in own.stdout
    shown = cli(
        "inspect",
        "limit",
        key,
        "--fixed",
        "2/minute",
        "--name",
        name,
        "--policies",
        "--url",
        redis_url,
    )
    assert "policy: key: 5/60s" in shown.stdout
    assert cli("policy", "unassign", name, key, "--url", redis_url).returncode == 0
    assert cli("policy", "unassign", name, key, "--url", redis_url).returncode == 1
    assert cli("policy", "delete", name, "pro", "--url", redis_url).returncode == 0
    shown = cli(
        "inspect",
        "limit",
        key,
        "--fixed",
        "2/minute",
        "--name",
        name,
        "--policies",
        "--url",
        redis_url,
    )
    assert "policy: default: 2/60s" in shown.stdout
