"""Shared fixtures: real redis-server processes on free loopback ports, and the backend matrix.

The suite never assumes a server is running: it starts its own from the ``redis-server``
binary (stopped by PID at the end; the helpers are in servers.py and cluster_fixtures.py).
``REDIS_URL`` points the shared-server tests at an external server instead; tests that must
kill or restart a server always start a private one.

Lanes. pytest_collection_modifyitems below marks every test by the servers it needs, read
from its fixtures and its ``backend``, ``store_url`` or ``deployment`` parameter (nobody
marks by hand): ``redis`` (a standalone server), ``cluster``, ``sentinel``, as many as it
uses, or ``memory`` when it needs none (memory:// parameters, pure unit tests). So:

    pytest -m memory               no server at all, on four pytest-xdist workers
                                   (MEMORY_LANE_WORKERS below), on the virtual clock
                                   (below): 21 s, where it took 27 s on the real clock
                                   (medians of six runs each, side by side, on two
                                   cores other work shared); in one process (-n 0, as
                                   the lanes run it) 18-21 s, where it took 32 s
    pytest -m "memory or redis"    the standalone lane
    pytest                         everything (scripts/test runs the lanes)

Time. A memory test runs on a virtual clock (support/virtual_clock.py): its async test and
fixtures on a ``VirtualClockLoop``, which jumps over the waits it idles in, and the memory
store's, the deny cache's and the metrics' clocks follow it, so a window, lease or retry it
waits out costs no real time, in every lane that runs it. Not on uvloop (the uvloop lane
runs its core on real uvloop), nor on a server (whose clock would not jump); a memory test
that waits on a thread or process its loop cannot see is marked ``real_time``.

Strength. pytest alone loads Hypothesis's ``quick`` profile (registered below: a fifth of
the oracle's histories, its branch checks left to the full count); every lane of scripts/test
runs ``--hypothesis-profile=full`` (pyproject.toml's [tool.tox]), the counts CI has always
run. Processes that need no fixture (the docs examples on memory://, the type checks, the
CLI's cold starts, a user's pytest run) start in the background when collection ends
(jobs.py), and the type checks keep mypy's cache in pytest's (typecheck.py): the same
checks, beside the foreground.

``AIORATELIMIT_TEST_LOOP=uvloop`` runs every async test and async fixture on uvloop instead
of asyncio's own loop (pytest-asyncio's loop factory hook, below), and the loops the tests
make themselves with loops.run / loops.new_loop; tests/core/test_loop.py pins both.

A test that starts a server its marks do not name fails at once (servers.check_permitted),
so the marks cannot drift from what the tests do: a server fixture that a test fetches with
``request.getfixturevalue`` must be named by one of those parameters.
"""

from __future__ import annotations

import asyncio
import os
import platform
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping

import hypothesis  # (imported early: a late import trips a CPython 3.11 AST bug)
import pytest
import redis
from support import jobs, loops, typecheck, virtual_clock
from support.cluster_fixtures import RedisClusterDeployment, SentinelDeployment, sync_client
from support.kinds import KINDS, Build
from support.replicas import primary, replica  # noqa: F401  (a master with one replica)
from support.servers import RedisServer, permit, remove_scratch
from support.tls_servers import mtls_redis, pki, plain_redis, tls_redis  # noqa: F401  (TLS, ACL servers)
from support.virtual_clock import VirtualClock, VirtualClockLoop

import aioratelimit as arl

#: Hypothesis profiles: ``full`` (its own default of 100 examples a test) is what scripts/test
#: runs in every lane; pytest alone loads ``quick``, a fifth of that (the oracle scales its
#: explicit counts by the profile's, test_oracle.examples).
hypothesis.settings.register_profile("full", max_examples=100)
hypothesis.settings.register_profile("quick", max_examples=20)
hypothesis.settings.load_profile("quick")  # --hypothesis-profile, read later, overrides it


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every async test on a new loop of the selected kind, or on a ``VirtualClockLoop`` if
    it runs on the virtual clock (one factory under the loop's name: the same test ids)."""
    return {loops.NAME: new_test_loop}


def new_test_loop() -> asyncio.AbstractEventLoop:
    """The loop of the running test: on its virtual clock if it has one, else of the
    selected kind."""
    clock = virtual_clock.current
    return VirtualClockLoop(clock) if clock is not None else loops.new_loop()


#: The workers of ``pytest -m memory`` (pyproject's ``-n auto``: pytest-xdist asks the hook
#: below): the lane's time is mostly timers that tests wait out, which workers wait side by
#: side; four keep two cores busy (three or six did no better, measured side by side).
MEMORY_LANE_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): ``MEMORY_LANE_WORKERS`` for exactly ``-m memory``,
    else none, so one process runs the tests (every lane with servers shares them per
    session; ``-n N`` on the command line still chooses for itself)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):  # pytest-xdist's own override
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return MEMORY_LANE_WORKERS if str(config.option.markexpr).strip() == "memory" else 0


def pytest_configure(config: pytest.Config) -> None:
    """Refuse an event loop name this suite does not know (instead of silently using asyncio);
    keep the type checks' mypy cache in pytest's (tests/support/typecheck.py)."""
    if loops.NAME not in loops.NAMES:
        raise pytest.UsageError(
            f"AIORATELIMIT_TEST_LOOP={loops.NAME!r}: expected one of {', '.join(loops.NAMES)}"
        )
    typecheck.configure(config)


def pytest_report_header(config: pytest.Config) -> str:
    """The lane this run is (scripts/test's, or "main"): its Python, marks, loop, redis-py."""
    marks = str(config.option.markexpr).strip() or "every test"
    return (
        f"lane {loops.LANE}: Python {platform.python_version()}, {marks}, {loops.NAME} loop,"
        f" redis-py {redis.__version__}"
    )


#: The marks that name a deployment; a test with none of them is marked ``memory``.
SERVER_MARKS = ("redis", "cluster", "sentinel")

#: The fixtures that start (or share) a deployment, and the mark each one gives its tests.
SERVER_FIXTURES = {
    "redis_url": "redis",
    "own_redis": "redis",
    "cluster_url": "cluster",
    "own_cluster": "cluster",
    "sentinel_url": "sentinel",
    "own_sentinel": "sentinel",
    "tls_redis": "redis",
    "mtls_redis": "redis",
    "plain_redis": "redis",
}

#: The parameters whose value is the backend a test runs on: memory, redis, cluster, sentinel.
KIND_PARAMS = ("backend", "store_url", "deployment")


def backend_url_kind(kind: str | None) -> str:
    """Where ``backend_url`` points for a test whose ``backend`` parameter is ``kind``."""
    return kind or "redis"


def sync_redis_kind(kind: str | None) -> str:
    """What ``sync_redis`` inspects for a test whose ``backend`` parameter is ``kind``."""
    return kind if kind in ("cluster", "sentinel") else "redis"


#: The fixtures that choose their deployment from the test's ``backend`` parameter (the
#: fixtures below and the marks read these same functions, so the two cannot drift).
FOLLOWERS: dict[str, Callable[[str | None], str]] = {
    "backend_url": backend_url_kind,
    "sync_redis": sync_redis_kind,
}


def param(node: object, name: str) -> str | None:
    """The string value of the parameter ``name`` of a test item, if it has one."""
    callspec = getattr(node, "callspec", None)
    value = callspec.params.get(name) if callspec is not None else None
    return value if isinstance(value, str) else None


def deployments(item: pytest.Item) -> set[str]:
    """The servers ``item`` needs: its server fixtures, its backend parameters, and where the
    fixtures that follow its ``backend`` parameter point (memory:// needs none)."""
    names = set(getattr(item, "fixturenames", ()))
    kinds = {SERVER_FIXTURES[name] for name in names & SERVER_FIXTURES.keys()}
    kinds.update(kind for name in KIND_PARAMS if (kind := param(item, name)) is not None)
    backend = param(item, "backend")
    kinds.update(follow(backend) for name, follow in FOLLOWERS.items() if name in names)
    kinds.discard("memory")
    return kinds


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test ``memory``, or by each deployment it needs (see the module doc)."""
    for item in items:
        # A module may name its deployment itself (pytestmark), for servers it reaches
        # through request.getfixturevalue, which the fixture names cannot show.
        given = {mark.name for mark in item.iter_markers() if mark.name in SERVER_MARKS}
        # A string marker name goes through pytest.mark, so --strict-markers checks it.
        for kind in sorted(deployments(item) - given) or ([] if given else ["memory"]):
            item.add_marker(kind)


def on_virtual_clock(item: pytest.Item) -> bool:
    """Whether ``item`` runs on the virtual clock: a memory test on asyncio's loop (not
    uvloop's), unless it is marked ``real_time``."""
    return (
        loops.NAME == "asyncio"
        and item.get_closest_marker("memory") is not None
        and item.get_closest_marker("real_time") is None
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """While a test runs (its fixtures too), only the deployments its marks name may start,
    and a memory test runs on a virtual clock (support/virtual_clock.py)."""
    permit(frozenset(mark.name for mark in item.iter_markers() if mark.name in SERVER_MARKS))
    try:
        if not on_virtual_clock(item):
            return (yield)
        with virtual_clock.running(VirtualClock()):
            return (yield)
    finally:
        permit(None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the selected tests' background jobs (jobs.py), and run those tests last."""
    jobs.start(session.items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the servers' folders (logs, cluster configs) once every server has stopped."""
    jobs.stop()
    remove_scratch()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of the suite's shared server: ``REDIS_URL`` if set, else one started here."""
    external = os.environ.get("REDIS_URL")
    if external:
        yield external
        return
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A private server for this test alone (to kill, pause or restart)."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.resume()
        server.stop()


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    """The URL of the session's shared Redis Cluster (started on first use)."""
    deployment = RedisClusterDeployment().start()
    try:
        yield deployment.url
    finally:
        deployment.stop()


@pytest.fixture(scope="session")
def sentinel_url() -> Iterator[str]:
    """The URL of the session's shared Sentinel group (started on first use)."""
    deployment = SentinelDeployment().start()
    try:
        yield deployment.url
    finally:
        deployment.stop()


@pytest.fixture
def own_cluster() -> Iterator[RedisClusterDeployment]:
    """A private cluster for this test alone (to kill masters in)."""
    deployment = RedisClusterDeployment().start()
    try:
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture
def own_sentinel() -> Iterator[SentinelDeployment]:
    """A private Sentinel group for this test alone (to kill its master)."""
    deployment = SentinelDeployment().start()
    try:
        yield deployment
    finally:
        deployment.stop()


def backend_kind(request: pytest.FixtureRequest) -> str | None:
    """The ``backend`` parameter of the running test (memory, redis, cluster, sentinel)."""
    return param(request.node, "backend")


@pytest.fixture
def sync_redis(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """A plain synchronous client for inspecting keys: on the deployment the test's
    ``backend`` runs on (a cluster client, or the Sentinel master), else the shared server."""
    kind = sync_redis_kind(backend_kind(request))
    if kind == "redis":
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    else:
        client = sync_client(request.getfixturevalue(f"{kind}_url"))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def backend_url(request: pytest.FixtureRequest) -> str:
    """The URL of the store the test's ``backend`` uses (``memory://`` is a new store)."""
    kind = backend_url_kind(backend_kind(request))
    return "memory://" if kind == "memory" else str(request.getfixturevalue(f"{kind}_url"))


@pytest.fixture(params=["memory", "redis", "cluster", "sentinel"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[arl.Backend]:
    """Every backend the conformance suite runs on, one test per backend: the embedded
    store, a standalone server, a 3+3-node Redis Cluster and a Sentinel-managed master."""
    b = arl.Backend.from_url(request.getfixturevalue("backend_url"))
    try:
        yield b
    finally:
        await b.aclose()


@pytest.fixture
async def other(backend: arl.Backend, backend_url: str) -> AsyncIterator[arl.Backend]:
    """Another process's backend on the same server (memory:// has one process: itself)."""
    if backend.url.startswith("memory://"):
        yield backend
        return
    b = arl.Backend.from_url(backend_url)
    try:
        yield b
    finally:
        await b.aclose()


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    """A backend URL for an app the test serves: the embedded store, then the shared server."""
    if request.param == "memory":
        return "memory://"
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture(params=sorted(KINDS))
def build(request: pytest.FixtureRequest) -> Build:
    """A limiter factory for each algorithm: ``build("5/hour", backend=b, ban=...)``."""
    return KINDS[request.param]


@pytest.fixture
def key() -> str:
    """A user key no other test uses (instead of flushing the server)."""
    return f"user-{uuid.uuid4().hex[:12]}"
