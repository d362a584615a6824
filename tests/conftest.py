"""Shared fixtures: real redis-server processes on free loopback ports, and the backend matrix.

The suite never assumes a server is running: it starts its own from the ``redis-server``
binary (stopped by PID at the end). ``REDIS_URL`` points the shared-server tests at an
external server instead; tests that must kill or restart a server always start a private one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import hypothesis  # noqa: F401  (imported early: a late import trips a CPython 3.11 AST bug)
import pytest
import redis
from cluster_fixtures import (  # noqa: F401  (fixtures: the cluster and sentinel deployments)
    backend_kind,
    cluster_url,
    own_cluster,
    own_sentinel,
    sentinel_url,
    sync_client,
)
from tls_servers import mtls_redis, pki, plain_redis, tls_redis  # noqa: F401  (TLS, ACL servers)

import aioratelimit as arl

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


_SCRATCH: list[Path] = []


def scratch_dir() -> Path:
    """One temporary folder for every server this session starts, removed at its end."""
    if not _SCRATCH:
        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="arl-tests-")))
    return _SCRATCH[0]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the servers' folders (logs, cluster configs) once every server has stopped."""
    for path in _SCRATCH:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One real ``redis-server`` process on a loopback port, without persistence."""

    def __init__(self, port: int | None = None, *extra: str) -> None:
        self.port = port or free_port()
        self.extra = extra
        self.dir = Path(tempfile.mkdtemp(prefix="arl-redis-", dir=scratch_dir()))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"),
            *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5)
        try:
            while True:
                if self.proc.poll() is not None:
                    log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited at start on port {self.port}:\n{log}")
                try:
                    if client.ping():
                        return self
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the process by PID (SIGKILL if it does not exit promptly)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing answers."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Stop and start again on the same port (all data and loaded scripts are gone)."""
        self.stop()
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


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
