"""Shared fixtures: real redis-server processes on free loopback ports, and the backend matrix.

The suite never assumes a server is running: it starts its own from the ``redis-server``
binary (stopped by PID at the end; the helpers are in servers.py and cluster_fixtures.py).
``REDIS_URL`` points the shared-server tests at an external server instead; tests that must
kill or restart a server always start a private one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import hypothesis  # noqa: F401  (imported early: a late import trips a CPython 3.11 AST bug)
import pytest
import redis
from cluster_fixtures import RedisClusterDeployment, SentinelDeployment, sync_client
from servers import RedisServer, remove_scratch

import aioratelimit as arl


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the servers' folders (logs, cluster configs) once every server has stopped."""
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
    callspec = getattr(request.node, "callspec", None)
    kind = callspec.params.get("backend") if callspec is not None else None
    return kind if isinstance(kind, str) else None


@pytest.fixture
def sync_redis(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """A plain synchronous client for inspecting keys: on the deployment the test's
    ``backend`` runs on (a cluster client, or the Sentinel master), else the shared server."""
    kind = backend_kind(request)
    if kind in ("cluster", "sentinel"):
        client = sync_client(request.getfixturevalue(f"{kind}_url"))
    else:
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def backend_url(request: pytest.FixtureRequest) -> str:
    """The URL of the store the test's ``backend`` uses (``memory://`` is a new store)."""
    kind = backend_kind(request) or "redis"
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


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    """A backend URL for an app the test serves: the embedded store, then the shared server."""
    if request.param == "memory":
        return "memory://"
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
def key() -> str:
    """A user key no other test uses (instead of flushing the server)."""
    return f"user-{uuid.uuid4().hex[:12]}"
