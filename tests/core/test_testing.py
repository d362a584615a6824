"""``aioratelimit.testing``: a fresh memory:// default per test, put back after, on a clock
that moves only when told; and the pytest plugin, run as a user's suite would run it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import jobs

import aioratelimit as arl
from aioratelimit import _backend
from aioratelimit.testing import ManualClock, default_backend, memory_backend, reset_default


@pytest.fixture(autouse=True)
def no_default_leak() -> object:
    """Each test here starts and ends with the process's default as it found it."""
    before = _backend._default, _backend._test_installed
    yield
    _backend.restore_default(before)


async def test_a_manual_clock_moves_the_store_only_when_advanced() -> None:
    """Denied now, still denied while the clock stands, admitted once it moves a window."""
    clock = ManualClock(start=1_700_000_000.0)
    backend = memory_backend(clock=clock)
    limiter = arl.FixedWindow("2/minute", backend=backend)
    assert [(await limiter.hit("k")).allowed for _ in range(3)] == [True, True, False]
    denied = await limiter.hit("k")
    assert denied.retry_after == pytest.approx(60.0, abs=0.002)  # no time has passed
    clock.advance(59.0)
    assert (await limiter.hit("k")).retry_after == pytest.approx(1.0, abs=0.002)
    clock.advance(1.0)
    assert (await limiter.hit("k")).allowed
    assert clock.now == pytest.approx(1_700_000_060.0)
    await backend.aclose()


async def test_lock_ttls_expire_on_the_manual_clock() -> None:
    """A lock left held is free once the clock passes its TTL, and not a moment before."""
    clock = ManualClock()
    backend = memory_backend(clock=clock)
    lk = arl.Lock("job", ttl=30.0, backend=backend)
    await lk.acquire(timeout=0)
    clock.advance(29.9)
    assert await lk.locked()
    clock.advance(0.2)
    assert not await lk.locked()
    await (await lk.acquire(timeout=0)).release()


async def test_each_memory_backend_has_its_own_store() -> None:
    """Two memory backends share nothing (a test's counts never reach the next test)."""
    one, two = memory_backend(), memory_backend()
    limiter_one = arl.FixedWindow("1/minute", backend=one)
    limiter_two = arl.FixedWindow("1/minute", backend=two)
    assert (await limiter_one.hit("k")).allowed
    assert (await limiter_two.hit("k")).allowed


async def test_default_backend_installs_and_restores_the_previous_default() -> None:
    """Inside: the default is the given backend; after: the previous one, even when the
    block raised."""
    outer = memory_backend()
    _backend.swap_default(outer)
    inner = memory_backend()
    seen = []
    try:
        with default_backend(inner) as got:
            seen += [got, arl.get_backend()]
            raise RuntimeError("the test failed")
    except RuntimeError:
        pass
    assert seen == [inner, inner]
    assert arl.get_backend() is outer
    with default_backend() as fresh:
        assert fresh is not outer
        assert fresh.url == "memory://"
        assert (await arl.FixedWindow("1/minute").hit("k")).allowed  # on the fresh store
    assert arl.get_backend() is outer


async def test_the_test_backend_wins_over_the_apps_configure() -> None:
    """While a test backend is installed, the app's ``configure()`` (a URL, REDIS_URL or a
    client) returns it and builds nothing, and the app's ``aclose()`` of it closes nothing
    (a memory store would forget its keys); bad arguments are still refused. After the
    block, ``configure()`` replaces the default again."""
    clock = ManualClock()
    test_backend = memory_backend(clock=clock)
    limiter = arl.FixedWindow("1/minute", name="app")
    with default_backend(test_backend):
        for app_config in ({"url": "redis://127.0.0.1:1/0"}, {}, {"prefix": "app"}):
            got = arl.configure(**app_config)
            assert got is test_backend
            assert arl.get_backend() is test_backend
        async with arl.configure("redis://127.0.0.1:1/0") as app_backend:
            assert (await limiter.hit("k")).allowed  # on the test's store: no server
        await app_backend.aclose()  # the app's shutdown, once more
        assert (await limiter.peek("k")).allowed is False  # the hit is still counted
        clock.advance(60)
        assert (await limiter.hit("k")).allowed  # the test's clock still rules
        with pytest.raises(ValueError, match="unsupported URL"):
            arl.configure("http://localhost")
        with pytest.raises(ValueError, match="not both"):
            arl.configure("memory://", client=object())
    assert arl.configure("memory://") is not test_backend
    assert arl.get_backend() is not test_backend


async def test_an_app_with_a_lifespan_runs_on_the_test_backend_not_on_redis_url(
    redis_url: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented pattern, ``configure()`` in a FastAPI lifespan, driven by
    ``TestClient`` with REDIS_URL naming a real server: the requests count on the test's
    store (200, 200, 429, and 200 once the test's clock moves a minute), and nothing is
    written to the server."""
    from fastapi import Depends, FastAPI
    from fastapi.testclient import TestClient

    from aioratelimit.fastapi import RateLimit

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backend = arl.configure()  # REDIS_URL, as in production
        yield
        await backend.aclose()

    app = FastAPI(lifespan=lifespan)
    limit = RateLimit(arl.FixedWindow("2/minute", name=key), client=lambda scope: key)

    @app.get("/search", dependencies=[Depends(limit)])
    async def search() -> dict[str, bool]:
        return {"ok": True}

    monkeypatch.setenv("REDIS_URL", redis_url)
    clock = ManualClock()

    def requests() -> list[int]:
        with default_backend(memory_backend(clock=clock)), TestClient(app) as client:
            codes = [client.get("/search").status_code for _ in range(3)]
            clock.advance(60)
            return [*codes, client.get("/search").status_code]

    assert await asyncio.to_thread(requests) == [200, 200, 429, 200]
    async with arl.Backend.from_url(redis_url) as server:
        untouched = await arl.FixedWindow("2/minute", name=key, backend=server).peek(key)
    assert untouched.remaining == 1  # 2 - the peeked hit: the server counted nothing


def test_reset_default_builds_it_anew_from_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """After ``reset_default()`` the next use builds a new default, as a fresh process does."""
    first = arl.configure("memory://")
    reset_default()
    monkeypatch.setenv("REDIS_URL", "memory://")
    second = arl.get_backend()
    assert second is not first
    assert arl.get_backend() is second


@pytest.mark.parametrize(
    ("bad", "error"),
    [(-1.0, ValueError), (math.nan, ValueError), (math.inf, ValueError), ("1", TypeError),
     (True, TypeError), (None, TypeError)],
)  # fmt: skip
def test_a_manual_clock_refuses_bad_seconds(bad: object, error: type[Exception]) -> None:
    """Going back, NaN, infinity or a non-number: refused, and the clock has not moved."""
    clock = ManualClock(start=10.0)
    with pytest.raises(error):
        clock.advance(bad)  # type: ignore[arg-type]
    with pytest.raises(error):
        ManualClock(start=bad if bad is not None else "x")  # type: ignore[arg-type]
    assert clock() == 10_000_000


def test_default_backend_refuses_what_is_not_a_backend() -> None:
    """A URL string is not a backend: TypeError, and the default is untouched."""
    before = _backend._default
    with pytest.raises(TypeError), default_backend("memory://"):  # type: ignore[arg-type]
        pass
    assert _backend._default is before


#: A user's suite: the plugin through pytest_plugins, async tests under pytest-asyncio and
#: anyio (the fixtures are plain ones, so they need no async plugin) and a sync test.
USER_CONFTEST = 'pytest_plugins = ["aioratelimit.testing"]\n'
USER_TESTS = """
import asyncio

import pytest

import aioratelimit as arl
from aioratelimit.testing import ManualClock

login = arl.FixedWindow("3/minute", name="login")  # the app's limiter: no backend=


async def attempt(user: str) -> bool:
    return (await login.hit(user)).allowed


@pytest.mark.asyncio
async def test_first(arl_backend: arl.Backend) -> None:
    assert arl.get_backend() is arl_backend
    assert [await attempt("ann") for _ in range(4)] == [True, True, True, False]


@pytest.mark.asyncio
async def test_second_starts_empty(arl_backend: arl.Backend) -> None:
    assert await attempt("ann")  # nothing left over from test_first


@pytest.mark.asyncio
async def test_clock(arl_backend: arl.Backend, arl_clock: ManualClock) -> None:
    assert [await attempt("bob") for _ in range(4)] == [True, True, True, False]
    arl_clock.advance(60)
    assert await attempt("bob")


@pytest.mark.anyio
async def test_under_anyio(arl_backend: arl.Backend, anyio_backend: str) -> None:
    assert await attempt("dee")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_sync(arl_backend: arl.Backend) -> None:
    assert asyncio.run(attempt("cy"))


def test_an_app_that_configures_itself(arl_backend: arl.Backend, arl_clock: ManualClock) -> None:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        backend = arl.configure("redis://127.0.0.1:1/0")  # a server that is not there
        yield
        await backend.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/login")
    async def login() -> dict[str, bool]:
        return {"allowed": await attempt("eve")}

    with TestClient(app) as client:
        answers = [client.post("/login").json()["allowed"] for _ in range(4)]
        arl_clock.advance(60)
        answers.append(client.post("/login").json()["allowed"])
    assert answers == [True, True, True, False, True]
    assert arl.get_backend() is arl_backend


def test_restored_after() -> None:
    from aioratelimit import _backend

    assert _backend._default is None  # every test above put the default back
"""


def users_suite(mode: str) -> subprocess.CompletedProcess[str]:
    """The user's suite run by pytest in a folder of its own, pytest-asyncio in ``mode``
    (a background job: tests/support/jobs.py)."""
    with tempfile.TemporaryDirectory(prefix="arl-users-suite-") as where:
        folder = Path(where)
        (folder / "conftest.py").write_text(USER_CONFTEST, encoding="utf-8")
        (folder / "test_app.py").write_text(textwrap.dedent(USER_TESTS), encoding="utf-8")
        (folder / "pytest.ini").write_text(
            f"[pytest]\nasyncio_mode = {mode}\nasyncio_default_fixture_loop_scope = function\n"
            "filterwarnings = error\n",
            encoding="utf-8",
        )
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        return subprocess.run(
            [sys.executable, "-W", "error", "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-p", "no:randomly", str(folder)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=folder,
            env=env,
        )  # fmt: skip


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(mode, marks=pytest.mark.early(job=functools.partial(users_suite, mode)))
        for mode in ["strict", "auto"]
    ],
)
def test_the_pytest_plugin_in_a_users_suite(mode: str, request: pytest.FixtureRequest) -> None:
    """The fixtures as a user's own pytest run sees them, under pytest-asyncio in either
    mode, anyio's plugin and a sync test: a fresh default per test (no count carries
    over), the clock moving only when advanced, an app's own ``configure()`` at start-up
    (a FastAPI lifespan under TestClient) giving way to them, the default put back."""
    proc = jobs.result(request)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "7 passed" in proc.stdout, proc.stdout
